"""The GPU check in one command: the device and its versions, the LC-loss tests with real Triton, the
kernel benchmark and its targets, the training step's speed against its FLOP floor, and CIFAR-10
end to end (supervised-only, MT, LC's control, MT+LC, and MT+LC with eps chosen from the features
and following their scale, on a shortened schedule).

    python tools/gpu_check.py --out gpu_check                     # a CUDA machine: all of it, about 10 min on an H200
    python tools/gpu_check.py --out gpu_check --part step         # one part again; the others' results are kept
    python tools/gpu_check.py --out /tmp/g --tiny --device cpu    # all of it in miniature on a CPU (a test runs this)
    python tools/gpu_check.py --out gpu_check --part cifar10 --cifar-seconds 300   # CIFAR-10 sized to 5 minutes

CIFAR-10 comes from --archive, the JPEG copy (train/<class>/*, test/<class>/*) as a .tar.xz. Writes
at most 8 files under --out: summary.json (each part's results, rewritten as each part ends, so a
run cut short keeps what it measured), summary.md, a log per part and cifar10_curves.png. Datasets
and training runs go to --work. Exits 1 when a part fails or misses a target.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc, kernels, the scripts
from mtlc.devices import conv_rate, device_name, pick_device  # noqa: E402
from mtlc.errors import UserError  # noqa: E402
from mtlc.runs import atomic_write, read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]  # the project's root: the scripts run there
PARTS = ("env", "kernel-tests", "kernel-bench", "step", "cifar10-data", "cifar10")
# The step part's runs, in the order they run: eager bf16 first (the floor is measured against it).
STEP_RUNS = {"bf16": ["--precision", "bf16"], "bf16-compile": ["--precision", "bf16", "--compile"],
             "fp32": ["--precision", "fp32"]}
# Per setting: the kernel tests and benchmark sizes, the step benchmark, and the CIFAR-10 runs
# (4,000 labels, the paper's protocol on a schedule shortened to fit: LC from MT's last
# constant-lr epoch, the preset's eps and lambda2).
SETTINGS = {
    "full": dict(test_args=[], bench_args=[], step_width=1.0, step_steps=20, step_compile=True, rate_batch=160,
                 cifar=dict(width=1.0, labels=4000, bench_steps=30, epochs=5, decay=2, cons_rampup=2, lc_epochs=3,
                            lc_decay=2, lc_rampup=1, compile=True)),
    "tiny": dict(test_args=["-k", "by_hand"], bench_args=["--sizes", "160", "--repeat", "1", "--skip", "compiled ref"],
                 step_width=0.0625,
                 step_steps=2, step_compile=False, rate_batch=8,
                 cifar=dict(width=0.0625, labels=20, bench_steps=2, epochs=1, decay=1, cons_rampup=1, lc_epochs=1,
                            lc_decay=0, lc_rampup=1, compile=False)),
}


class Check:
    """Where a check writes, on what it runs, and the summary it keeps."""

    def __init__(self, out, work, device, setting, archive, *, cifar_seconds=None, step_runs=tuple(STEP_RUNS)):
        self.out, self.work, self.device, self.setting, self.archive = out, work, device, setting, archive
        self.cifar_seconds, self.step_runs = cifar_seconds, step_runs
        self.ran = set()  # the parts this process recorded
        self.summary_path = out / "summary.json"
        self.summary = json.loads(self.summary_path.read_text()) if self.summary_path.exists() else {}

    def run(self, log, *args, timeout=540, fail_ok=False):
        """Run our Python with args from the repository root, its output streamed into the part's
        log (so a part cut short by a time limit keeps what it printed); returns that output. A
        non-zero exit raises with the output's last line, unless fail_ok."""
        cmd = [sys.executable, *map(str, args)]
        start = time.perf_counter()
        with open(self.out / log, "a") as f:
            f.write(f"$ {' '.join(cmd[1:])}\n")
            f.flush()
            begin = f.tell()
            returncode = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
            f.write(f"# exit {returncode}, {time.perf_counter() - start:.1f} s\n\n")
        with open(self.out / log) as f:
            f.seek(begin)
            output = f.read().rsplit("# exit", 1)[0]
        if returncode and not fail_ok:
            last = (output.strip() or "no output").splitlines()[-1]
            raise RuntimeError(f"{cmd[1]} exited {returncode}: {last}")
        return output

    def run_together(self, log, runs, timeout=540):
        """Run several of our scripts at once on the one device ({name: args}); their outputs go
        into the part's log, one after the other. Raises if one fails."""
        procs = {name: subprocess.Popen([sys.executable, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
                 for name, args in runs.items()}
        for name, proc in procs.items():
            output, _ = proc.communicate(timeout=timeout)
            with open(self.out / log, "a") as f:
                f.write(f"$ {' '.join(map(str, runs[name]))}   # {name}, exit {proc.returncode}\n{output}\n")
            if proc.returncode:
                raise RuntimeError(f"{name} exited {proc.returncode}: {output.strip().splitlines()[-1]}")

    def record(self, part, result):
        """Keep a part's result in summary.json and summary.md. The file is read again first: a part
        run meanwhile by another process (the session prepares CIFAR-10 beside the step) keeps its own."""
        if self.summary_path.exists():
            self.summary = json.loads(self.summary_path.read_text()) | {
                name: value for name, value in self.summary.items() if name in self.ran}
        self.ran.add(part)
        self.summary[part] = result
        self.save()

    def save(self):
        atomic_write(self.summary_path, lambda f: f.write(json.dumps(self.summary, indent=1).encode()))
        lines = []
        for part, result in self.summary.items():
            lines.append(f"## {part}: {'ok' if result['ok'] else 'FAILED'} ({result['seconds']:.0f} s)\n")
            lines += [f"- {key}: {json.dumps(value)}" for key, value in result.items() if key not in ("ok", "seconds")]
            lines.append("")
        atomic_write(self.out / "summary.md", lambda f: f.write("\n".join(lines).encode()))


def env(check):
    """The device, and the versions of torch, triton and CUDA."""
    import triton
    result = dict(device=device_name(check.device), torch=torch.__version__, triton=triton.__version__,
                  cuda=torch.version.cuda, python=sys.version.split()[0])
    if check.device.type == "cuda":
        props = torch.cuda.get_device_properties(check.device)
        result.update(capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory / 2**30, 1),
                      cudnn=torch.backends.cudnn.version())
    return result


def kernel_tests(check):
    """tests/test_lc_loss.py: every dtype and shape against the reference, gradients, determinism;
    with real Triton on a GPU (its interpreter on a CPU)."""
    # Triton compiles each kernel configuration on the CPU: spread over the cores where pytest-xdist is there.
    workers = ["-n", "8"] if check.device.type == "cuda" and importlib.util.find_spec("xdist") else []
    out = check.run("kernel_tests.log", "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, "tests/test_lc_loss.py",
                    *check.setting["test_args"], fail_ok=True)
    counts = {kind.rstrip("s"): int(n) for n, kind in re.findall(r"(\d+) (passed|failed|errors?|skipped)",
                                                                 out.strip().splitlines()[-1])}
    return dict(ok=counts.get("passed", 0) > 0 and not counts.get("failed") and not counts.get("error"),
                triton="real" if check.device.type == "cuda" else "interpreter", **counts)


def kernel_bench(check):
    """kernels/bench.py (fp32 features, forward + backward) and, on a GPU, its targets."""
    out = check.run("kernel_bench.log", "kernels/bench.py", "--device", check.device.type, *check.setting["bench_args"])
    targets = dict(re.findall(r"^target: (.*): (PASS|FAIL|n/a)$", out, re.M))
    rows = [line for line in out.splitlines() if re.match(r"^\s*\d+\s+\d+\s+\w", line)]
    return dict(ok="FAIL" not in targets.values(), targets=targets, rows=rows)


def step(check):
    """A training step at the setting's width on the CIFAR-10 protocol's forward, the runs asked for
    (bf16 eager, torch.compile, fp32; each kept in the summary as it ends, so a run cut short costs
    only itself); the data path's share; the bf16 step against the FLOP floor at the device's
    measured rate on conv-large's widest 3x3 convolution."""
    s = check.setting
    runs = [name for name in check.step_runs if s["step_compile"] or name != "bf16-compile"]
    result = {}
    for name in runs:
        out = check.run("step.log", "train_mt.py", "--dataset", "digits", "--forward", "split", "--width",
                        s["step_width"], "--benchmark", s["step_steps"], "--device", check.device.type,
                        *STEP_RUNS[name])
        result[name] = {k: v for k, v in json.loads(out.strip().splitlines()[-1]).items()
                        if k in ("sec_per_step", "images_per_sec", "gflops_per_sec", "data_share", "gflop_per_step")}
        check.record("step", dict(result, ok=False, seconds=0, unfinished=[r for r in runs if r not in result]))
    if "bf16" not in result:
        return result
    rate = conv_rate(check.device, torch.bfloat16, repeats=5 if check.device.type == "cpu" else 50,
                     batch=s["rate_batch"])
    floor = result["bf16"]["gflop_per_step"] / rate
    result.update(conv_gflops_per_sec_bf16=rate, floor_sec_per_step_bf16=floor,
                  bf16_vs_floor=result["bf16"]["sec_per_step"] / floor,
                  targets={"data share under 5%": result["bf16"]["data_share"] < 0.05,
                           "bf16 step within 2x of the FLOP floor": result["bf16"]["sec_per_step"] <= 2 * floor})
    if "bf16-compile" in result:
        result["bf16_compile_vs_floor"] = result["bf16-compile"]["sec_per_step"] / floor
    result["ok"] = all(result["targets"].values()) or check.device.type == "cpu"  # targets are the GPU's
    return result


def extract_cifar10(check):
    """The JPEG archive extracted once under --work; returns the folder holding train/ and test/."""
    data_dir = check.work / "cifar10"
    if not (data_dir / "test").is_dir():
        with tarfile.open(check.archive) as tar:  # the "data" filter where this Python has it
            tar.extractall(check.work / "extract", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        tops = [p.parent for p in (check.work / "extract").rglob("train") if (p.parent / "test").is_dir()]
        if not tops:
            raise UserError(f"{check.archive} holds no train/ and test/ folders")
        tops[0].rename(data_dir)
    return data_dir


def cifar10_data(check):
    """CIFAR-10 extracted from the archive and its images decoded into the memory-mapped cache, all
    on the CPU (the session runs it beside the step, on the other half of the cores); the cifar10
    part then starts training at once."""
    from mtlc.data import load_dataset
    data = load_dataset("cifar10", extract_cifar10(check), echo=lambda message: None)
    return dict(train=len(data.train_y), test=len(data.test_y))  # its time: the part's seconds


def shortened_schedule(seconds, epoch_s, *, decay_share, ramp_share):
    """(constant epochs, decay epochs, ramp-up epochs) of a stage that fits `seconds` at `epoch_s`
    seconds an epoch: at least 1 + 1 epochs, the decay and the ramp-up the given shares."""
    total = max(2, int(seconds // epoch_s))
    decay = max(1, round(total * decay_share))
    constant = total - decay
    return constant, decay, max(1, round(constant * ramp_share))


# Sizing the CIFAR-10 runs to --cifar-seconds: stage 1 gets this share of the time left after the
# step measurement, stage 2 what is left after stage 1; time kept for evaluate.py and the plot; a
# process's start (imports, the memory-mapped cache, the model); the slowdown of two processes
# sharing one GPU until stage 1 has measured it (on an H200 at width 1 the step is launch-bound: 53-58
# ms alone, 55-62 ms with two at once); LC's step over MT's; stage 2's third run beside the two
# (measured on an H200: 19-20 s an epoch with three at once, 15 s for MT with two); torch.compile's
# start in a training process (on an H200: 39 s in the first process, 23 s with inductor's cache
# warm, 9 s for stage 2), which makes the step 1.8x faster there (CIFAR-10: 0.021 s against 0.038).
STAGE1_SHARE, EVALUATE_S, STARTUP_S, TOGETHER_SLOWDOWN, LC_STEP_COST, THIRD_RUN_COST = 0.5, 45, 20, 1.25, 1.15, 1.15
COMPILE_S = 30
# Stage 2's runs from the same mt.pt, same schedule: {name: (output folder, its options)}. Beside the
# paper's MT+LC and its control, LC with the eps this project defaults to on folders: chosen from
# the MT checkpoint's features and following their scale (the paper's fixed eps 50 made every pair a
# neighbour after a short stage 1, docs/gpu-check.md).
STAGE2_RUNS = {"MT+LC": ("lc", []), "control": ("control", ["--lam", 0]),
               "MT+LC relative eps": ("lc_relative", ["--eps", "auto", "--eps-scale", "relative"])}


def cifar10(check):
    """On CIFAR-10 from the archive, 4,000 labels: a training step on the real data path (the
    memory-mapped cache); supervised-only and MT at once on the device; then from MT's mt.pt, at
    once, MT+LC and its control (the same stage 2 with lambda2 0, same schedule). With --cifar-seconds
    the schedules are sized to fit, from the measured step and then from stage 1's own epochs. Test
    errors of the final weights (no test-set selection), LC's diagnostics, the curves."""
    c, start = check.setting["cifar"], time.perf_counter()
    data_dir = extract_cifar10(check)
    compiled = ["--compile"] if c["compile"] else []
    startup = STARTUP_S + (COMPILE_S if compiled else 0)
    common = ["--dataset", "cifar10", "--data-dir", data_dir, "--labels", c["labels"], "--width", c["width"],
              "--device", check.device.type, *compiled]
    bench = json.loads(check.run("cifar10.log", "train_mt.py", *common, "--forward", "split", "--benchmark",
                                 c["bench_steps"]).strip().splitlines()[-1])
    result = dict(step={k: bench[k] for k in ("sec_per_step", "data_share", "images_per_sec", "precision",
                                               "steps_per_epoch", "compile")})

    def left():
        return check.cifar_seconds - (time.perf_counter() - start) - EVALUATE_S

    if check.cifar_seconds:
        epoch_s = bench["steps_per_epoch"] * bench["sec_per_step"] * TOGETHER_SLOWDOWN
        epochs, decay, cons_rampup = shortened_schedule(left() * STAGE1_SHARE - startup, epoch_s,
                                                        decay_share=0.3, ramp_share=0.4)
    else:
        epochs, decay, cons_rampup = c["epochs"], c["decay"], c["cons_rampup"]
    runs = {name: check.work / "runs" / name for name in ("supervised", "mt", *(d for d, _ in STAGE2_RUNS.values()))}
    stage1 = ["--epochs", epochs, "--decay-epochs", decay, "--cons-rampup", cons_rampup, "--eval-every", 1,
              "--overwrite"]
    stage1_start = time.perf_counter()
    check.run_together("cifar10.log", {
        "supervised": ["train_mt.py", *common, *stage1, "--cons-weight", 0, "--out", runs["supervised"]],
        "MT": ["train_mt.py", *common, *stage1, "--out", runs["mt"]]})
    stage1_epoch_s = (time.perf_counter() - stage1_start - startup) / (epochs + decay)
    if check.cifar_seconds:
        lc_epochs, lc_decay, lc_rampup = shortened_schedule(left() - startup,
                                                            stage1_epoch_s * LC_STEP_COST * THIRD_RUN_COST,
                                                            decay_share=0.4, ramp_share=1 / 3)
    else:
        lc_epochs, lc_decay, lc_rampup = c["lc_epochs"], c["lc_decay"], c["lc_rampup"]
    stage2 = ["finetune_lc.py", "--ckpt", runs["mt"] / "mt.pt", "--epochs", lc_epochs, "--decay-epochs", lc_decay,
              "--lc-rampup", lc_rampup, "--eval-every", 1, "--device", check.device.type, "--overwrite", *compiled]
    check.run_together("cifar10.log", {name: [*stage2, *options, "--out", runs[folder]]
                                       for name, (folder, options) in STAGE2_RUNS.items()})
    stage2_runs = [runs[folder] for folder, _ in STAGE2_RUNS.values()]
    out = check.run("cifar10.log", "evaluate.py", "--ckpt", runs["supervised"] / "mt_final.pt", runs["mt"] / "mt_final.pt",
                    *(run / "lc.pt" for run in stage2_runs), "--json", "--device", check.device.type,
                    "--curves", runs["mt"] / "mt_metrics.jsonl", *(a for run in stage2_runs
                                                                   for a in ("--curves", run / "lc_metrics.jsonl")),
                    "--plot", check.out / "cifar10_curves.png")
    checkpoints = [json.loads(line) for line in out.splitlines() if line.startswith("{") and "checkpoint" in line]
    result.update(zip(("supervised", "MT", *STAGE2_RUNS), checkpoints))
    result["schedule"] = {"supervised and MT": f"{epochs}+{decay} epochs, consistency ramp-up {cons_rampup}",
                          ", ".join(STAGE2_RUNS): f"{lc_epochs}+{lc_decay} epochs from MT's epoch {epochs}, "
                                               f"LC ramp-up {lc_rampup}"}
    result["curves"] = {name: [[r["global_epoch"], r["student_error"], r["teacher_error"], r["time_s"]]
                               for r in read_metrics(path / f"{'mt' if name in ('supervised', 'mt') else 'lc'}_metrics.jsonl")
                               if "teacher_error" in r]
                        for name, path in runs.items()}
    return result


PART_FUNCTIONS = {"env": env, "kernel-tests": kernel_tests, "kernel-bench": kernel_bench, "step": step,
                  "cifar10-data": cifar10_data, "cifar10": cifar10}


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="Folder for summary.json, summary.md, the parts' logs and cifar10_curves.png (at most 8 files).")
@click.option("--part", "parts", type=click.Choice(PARTS), multiple=True,
              help="Run only this part (repeat for several); the other parts' results in --out are kept. [default: all]")
@click.option("--archive", type=click.Path(dir_okay=False), default="data/cifar10-jpeg.tar.xz",
              help="CIFAR-10 as a .tar.xz of train/<class>/* and test/<class>/* (the JPEG copy).")
@click.option("--work", type=click.Path(file_okay=False), default=None,
              help="Where the extracted dataset and the training runs go. [default: a temporary folder]")
@click.option("--cifar-seconds", type=click.IntRange(min=60), default=None,
              help="Size the cifar10 part's schedules to end within this many seconds, from the measured step "
                   "(then from stage 1's own epochs). [default: the fixed schedule: 5+2 epochs, LC 3+2]")
@click.option("--step-run", "step_runs", type=click.Choice(list(STEP_RUNS)), multiple=True,
              help="The step part's runs (repeat for several), in the order bf16, bf16-compile, fp32; the FLOP "
                   "floor and the targets need bf16. [default: all three]")
@click.option("--tiny", is_flag=True, help="Miniature settings that run on a CPU in a minute or two.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", help="auto: CUDA when available.")
def main(out, parts, archive, work, cifar_seconds, step_runs, tiny, device):
    """Run the GPU check's parts one after the other and write what they measured."""
    parts = parts or PARTS
    if {"cifar10-data", "cifar10"} & set(parts) and not Path(archive).is_file():
        raise UserError(f"--archive {archive} does not exist (copy ../shared/data/cifar10-jpeg.tar.xz there)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        check = Check(out, Path(work or scratch), pick_device(device), SETTINGS["tiny" if tiny else "full"],
                      Path(archive).resolve(), cifar_seconds=cifar_seconds,
                      step_runs=[name for name in STEP_RUNS if name in step_runs] if step_runs else tuple(STEP_RUNS))
        check.work.mkdir(parents=True, exist_ok=True)
        for part in parts:
            (out / f"{part.replace('-', '_')}.log").unlink(missing_ok=True)
            click.echo(f"gpu_check: {part} ...")
            start = time.perf_counter()
            try:
                result = dict(ok=True) | PART_FUNCTIONS[part](check)
            except Exception as exc:  # a failed part is recorded and the next one runs
                result = dict(ok=False, error=f"{type(exc).__name__}: {exc}")
            check.record(part, dict(result, seconds=round(time.perf_counter() - start, 1)))
            click.echo(f"gpu_check: {part} {'ok' if result['ok'] else 'FAILED'} "
                       f"({check.summary[part]['seconds']:.0f} s): {json.dumps(result)[:400]}")
    if not all(check.summary[p]["ok"] for p in parts):
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
