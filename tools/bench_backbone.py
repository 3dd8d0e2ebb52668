"""The pretrained trunks' inference on this machine's CPU, engine by engine, in one call: torch (fp32,
channels last), torch under bf16 autocast, and onnxruntime on the trunk exported in memory (what
TrunkEngine runs on a CPU), each at the image sizes given, on the same random batch; images/s as the
median of --rounds timed batches after a warm-up one, and each engine's largest difference from
torch fp32's features. Prints one JSON line (docs/pretrained.md).

    OMP_NUM_THREADS=2 python tools/bench_backbone.py --threads 2 --sizes 128 --sizes 224 --record docs/x.json
"""
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc
from mtlc.train.pretrained import BACKBONES, onnx_session, trunk  # noqa: E402


def timed(run, x, rounds):
    """(median images/s over `rounds` calls after a warm-up call, the output of the last)."""
    out = run(x)
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        out = run(x)
        seconds.append(time.perf_counter() - start)
    return len(x) / statistics.median(seconds), out


def cpu_name():
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


@click.command()
@click.option("--backbone", "backbones", multiple=True, default=tuple(BACKBONES), show_default=True)
@click.option("--sizes", multiple=True, type=int, default=(128, 224), show_default=True)
@click.option("--batch", type=int, default=64, show_default=True)
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--threads", type=int, default=2, show_default=True, help="torch's and onnxruntime's threads.")
@click.option("--record", type=click.Path(dir_okay=False), default=None, help="Also write the JSON here.")
def main(backbones, sizes, batch, rounds, threads, record):
    torch.set_num_threads(threads)
    result = dict(cpu=cpu_name(), threads=threads, batch=batch, torch=torch.__version__, runs=[])
    for name in backbones:
        model = trunk(name)
        for size in sizes:
            x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(size))
            with torch.no_grad():
                fp32, reference = timed(lambda v: model(v.contiguous(memory_format=torch.channels_last)), x, rounds)

                def bf16(v):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        return model(v.contiguous(memory_format=torch.channels_last)).float()
                bf16_rate, bf16_out = timed(bf16, x, rounds)
            session = onnx_session(model, size)
            ort_rate, ort_out = timed(lambda v: torch.from_numpy(session.run(None, {"x": v.numpy()})[0]), x, rounds)
            result["runs"].append(dict(
                backbone=name, image_size=size, torch_fp32=round(fp32, 1), torch_bf16=round(bf16_rate, 1),
                onnxruntime=round(ort_rate, 1), bf16_max_difference=float((bf16_out - reference).abs().max()),
                onnxruntime_max_difference=float((ort_out - reference).abs().max())))
            click.echo(json.dumps(result["runs"][-1]), err=True)
    line = json.dumps(result)
    if record:
        Path(record).write_text(line + "\n")
    click.echo(line)


if __name__ == "__main__":
    main()
