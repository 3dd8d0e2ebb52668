"""Images a second through a pretrained trunk, by engine: what train/pretrained.TrunkEngine runs on a CPU
is chosen by this measurement (docs/pretrained.md).

    python tools/bench_trunk.py                                    # Lite0 and Lite2 at their own sides
    python tools/bench_trunk.py --backbone efficientnet-lite2 --size 224 --batch 64

Engines: torch eager in fp32 (channels last), torch with bf16 autocast (channels last), and
onnxruntime on the trunk exported in memory. Each is timed on random images of one batch size, the
median of --repeat runs after a warm-up, with the machine's thread count; the outputs of the others
are compared with fp32 torch's (largest absolute difference of the pooled features).
"""
import platform
import statistics
import sys
import time
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mtlc.train.pretrained import BACKBONES, default_image_size, onnx_session, trunk  # noqa: E402


def engines(name):
    """{engine: a function of a normalized (N, 3, S, S) batch giving fp32 features}."""
    model = trunk(name)
    sessions = {}

    def torch_fp32(x):
        with torch.no_grad():
            return model(x.contiguous(memory_format=torch.channels_last))

    def torch_bf16(x):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x.contiguous(memory_format=torch.channels_last)).float()

    def onnxruntime(x):
        size = x.shape[-1]
        if size not in sessions:
            sessions[size] = onnx_session(model, size)
        return torch.from_numpy(sessions[size].run(None, {"x": x.numpy()})[0])
    return {"torch fp32": torch_fp32, "torch bf16": torch_bf16, "onnxruntime": onnxruntime}


def images_per_second(run, x, repeat):
    run(x)  # warm-up: an export, oneDNN's kernels chosen
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run(x)
        times.append(time.perf_counter() - start)
    return len(x) / statistics.median(times)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--backbone", "backbones", type=click.Choice(list(BACKBONES)), multiple=True,
              help="Repeat for several. [default: efficientnet-lite0 and efficientnet-lite2]")
@click.option("--size", type=click.IntRange(min=32), default=None,
              help="Image side. [default: each backbone's default image size]")
@click.option("--batch", type=click.IntRange(min=1), default=32, help="Images a call.")
@click.option("--repeat", type=click.IntRange(min=1), default=5, help="Timed calls of each engine.")
def main(backbones, size, batch, repeat):
    """Print one line per backbone and engine: images a second and the features' largest difference."""
    backbones = backbones or ("efficientnet-lite0", "efficientnet-lite2")
    click.echo(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
               f"{torch.__version__}, batch {batch}, median of {repeat}")
    for name in backbones:
        side = size or default_image_size(name)
        x = torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(0))
        runs = engines(name)
        reference = runs["torch fp32"](x)
        for engine, run in runs.items():
            rate = images_per_second(run, x, repeat)
            difference = (run(x) - reference).abs().max().item()
            click.echo(f"{name} {side} px  {engine:12s} {rate:7.1f} images/s  max |features - fp32 torch's| "
                       f"{difference:.2e}")


if __name__ == "__main__":
    main()
