"""The GPU check in one command: the device and its versions, the LC-loss tests with real Triton, the
kernel benchmark and its targets, the training step's speed against its FLOP floor (eager, compiled,
graphed, at the paper's batch and at 4x) and the graphed step checked against the eager one, and
CIFAR-10 with 4,000 labels end to end (MT, then from its state MT+LC and its control) compressed to the time given.

    python tools/gpu_check.py --out gpu_check                     # a CUDA machine: all of it, about 10 min on an H200
    python tools/gpu_check.py --out gpu_check --part step         # one part again; the others' results are kept
    python tools/gpu_check.py --out /tmp/g --tiny --device cpu    # all of it in miniature on a CPU (a test runs this)
    python tools/gpu_check.py --out gpu_check --part cifar10 --cifar-seconds 500   # CIFAR-10 sized to 500 s

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
from mtlc.train.devices import conv_rate, device_name, pick_device  # noqa: E402
from mtlc.errors import UserError  # noqa: E402
from mtlc.use.figures import plot_curves, training_seconds  # noqa: E402
from mtlc.train.presets import preset  # noqa: E402
from mtlc.disk.runs import atomic_write, read_metrics  # noqa: E402
from mtlc.train.checkpoints import load_checkpoint, restore_data, restore_models  # noqa: E402
from mtlc.use.report import evaluate_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]  # the project's root: the scripts run there
PARTS = ("env", "kernel-tests", "kernel-bench", "step", "cifar10-data", "cifar10")
# The step part's runs, in the order they run: eager bf16 first (the floor is measured against it).
# The eager runs name --step-mode eager (auto is graphed on a GPU); 4x: the paper's batch x4.
BATCH_4X = ["--labeled-batch", 128, "--unlabeled-batch", 512]
STEP_RUNS = {"bf16": ["--precision", "bf16", "--step-mode", "eager"],
             "bf16-compile": ["--precision", "bf16", "--step-mode", "eager", "--compile"],
             "bf16-graphed": ["--precision", "bf16", "--step-mode", "graphed"],
             "bf16-graphed-compile": ["--precision", "bf16", "--step-mode", "graphed", "--compile"],
             "bf16-graphed-4x": ["--precision", "bf16", "--step-mode", "graphed", *BATCH_4X],
             "bf16-4x": ["--precision", "bf16", "--step-mode", "eager", *BATCH_4X],
             "fp32": ["--precision", "fp32", "--step-mode", "eager"]}
DEFAULT_STEP_RUNS = tuple(name for name in STEP_RUNS if name != "fp32")
# Per setting: the kernel tests and benchmark sizes, the step benchmark (its images' side: the protocol's
# 32, or a quarter of the pixels in miniature) and the equivalence check's arguments, and the CIFAR-10
# runs (4,000 labels; without --cifar-seconds the paper's schedule compressed `compress` times; compiled
# unless the step part measured otherwise: on an H200 the graphed step took 3.5 ms so, 8.6 without).
SETTINGS = {
    "full": dict(test_args=[], bench_args=[], step_width=1.0, step_size=32, step_steps=20, step_compile=True,
                 rate_batch=160,
                 equivalence_args=["--width", 1, "--precision", "bf16", "--steps", 12],
                 cifar=dict(width=1.0, labels=4000, bench_steps=30, compress=100, compile=True)),
    "tiny": dict(test_args=["-k", "by_hand"], bench_args=["--sizes", "160", "--repeat", "1", "--skip", "compiled ref"],
                 step_width=0.0625, step_size=16, step_steps=2, step_compile=False, rate_batch=8,
                 equivalence_args=["--width", 0.0625, "--precision", "fp32", "--steps", 2, "--labeled-batch", 8,
                                   "--unlabeled-batch", 32],
                 cifar=dict(width=0.0625, labels=20, bench_steps=2, compress=1000, compile=False)),
}


class Check:
    """Where a check writes, on what it runs, and the summary it keeps."""

    def __init__(self, out, work, device, setting, archive, *, cifar_seconds=None, step_runs=DEFAULT_STEP_RUNS):
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
    """tools/bench_kernels.py (fp32 features, forward + backward) and, on a GPU, its targets."""
    out = check.run("kernel_bench.log", "tools/bench_kernels.py", "--device", check.device.type, *check.setting["bench_args"])
    targets = dict(re.findall(r"^target: (.*): (PASS|FAIL|n/a)$", out, re.M))
    rows = [line for line in out.splitlines() if re.match(r"^\s*\d+\s+\d+\s+\w", line)]
    return dict(ok="FAIL" not in targets.values(), targets=targets, rows=rows)


def step(check):
    """A training step at the setting's width on the CIFAR-10 protocol's forward, the runs asked for
    (STEP_RUNS; each kept in the summary as it ends, so a run cut short costs only itself); the data
    path's share; every run against its FLOP floor at the device's measured rate on conv-large's widest
    3x3 convolution; and the graphed step against the eager one (tools/step_equivalence.py)."""
    s = check.setting
    runs = [name for name in check.step_runs if s["step_compile"] or "compile" not in name]
    result = {}
    for name in runs:
        out = check.run("step.log", "train_mt.py", "--dataset", "digits", "--forward", "split", "--width",
                        s["step_width"], "--image-size", s["step_size"], "--benchmark", s["step_steps"],
                        "--device", check.device.type, *STEP_RUNS[name])
        result[name] = {k: v for k, v in json.loads(out.strip().splitlines()[-1]).items()
                        if k in ("sec_per_step", "images_per_sec", "gflops_per_sec", "data_share", "gflop_per_step",
                                 "batch", "step_mode", "captured")}
        check.record("step", dict(result, ok=False, seconds=0, unfinished=[r for r in runs if r not in result]))
    out = check.run("step.log", "tools/step_equivalence.py", "--device", check.device.type, *s["equivalence_args"],
                    fail_ok=True)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    result["equivalence"] = json.loads(lines[-1]) if lines else dict(ok=False, error=out.strip()[-300:])
    if not any(name.startswith("bf16") for name in result if name != "equivalence"):
        return result
    rate = conv_rate(check.device, torch.bfloat16, repeats=5 if check.device.type == "cpu" else 50,
                     batch=s["rate_batch"])
    result["conv_gflops_per_sec_bf16"] = rate
    for name in runs:
        if name.startswith("bf16") and name in result:
            run = result[name]
            run["floor_sec_per_step"] = run["gflop_per_step"] / rate
            run["vs_floor"] = run["sec_per_step"] / run["floor_sec_per_step"]
    graphed = [result[name] for name in ("bf16-graphed", "bf16-graphed-compile") if name in result]
    targets = {"the graphed step computes the eager step (bf16's tolerance), draws anew on replay":
               result["equivalence"]["ok"]}
    if graphed:
        best = min(graphed, key=lambda run: run["sec_per_step"])
        targets.update({"graphed bf16 step captured as a CUDA graph": bool(best.get("captured")),
                        "graphed bf16 step within 2x of the FLOP floor (32 + 128)": best["vs_floor"] <= 2,
                        "graphed data share under 5%": best["data_share"] < 0.05})
    result["targets"] = targets
    # The speed targets are the GPU's; the equivalence holds on any device.
    result["ok"] = result["equivalence"]["ok"] and (all(targets.values()) or check.device.type == "cpu")
    atomic_write(check.work / "step.json", lambda f: f.write(json.dumps(result).encode()))  # for a later cifar10
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
    from mtlc.data.datasets import load_dataset
    data = load_dataset("cifar10", extract_cifar10(check), echo=lambda message: None)
    return dict(train=len(data.train_y), test=len(data.test_y))  # its time: the part's seconds


# Sizing the CIFAR-10 runs to --cifar-seconds, from the step measured on CIFAR-10 itself: the time
# kept for the final evaluation and the plot; a training process's start (imports, the memory-mapped cache,
# the model, the steps before the capture); torch.compile's start (on an H200: 39 s in the first
# process, 23 s with inductor's cache warm, 9 s for stage 2); LC's step over MT's (measured eager);
# the slowdown of each of stage 2's two runs sharing the GPU (2: a graphed step keeps the GPU busy by
# itself, assumed until measured; the eager step, launch-bound, measured 1.25); the evaluations a run
# makes (each over the 10,000 test images, the labeled images and 2,560 for the BN means).
EVALUATE_S, STARTUP_S, COMPILE_S, LC_STEP_COST, STAGE2_TOGETHER, EVALUATIONS = 45, 20, 30, 1.15, 2.0, 10
# The paper's CIFAR-10 schedule in epochs (4,000 labels): MT 800 + 200, stage 2 from MT's epoch 600
# for 400 + 200 (presets.PRESETS), which --compress divides.
PAPER_MT_EPOCHS, PAPER_STAGE2_EPOCHS = 1000, 600
# Stage 2's runs from the same mt.pt, same schedule: {name: (output folder, its options)}: the paper's
# MT+LC (eps 50, lambda2 10, all pairs: the preset) and its control.
STAGE2_RUNS = {"MT+LC": ("lc", []), "control": ("control", ["--lam", 0])}


def compression(seconds, epoch_s):
    """--compress that fits MT and then stage 2's two runs at once into `seconds` at `epoch_s` seconds
    an MT epoch (at least 1: the paper's schedule)."""
    work = epoch_s * (PAPER_MT_EPOCHS + PAPER_STAGE2_EPOCHS * LC_STEP_COST * STAGE2_TOGETHER)
    return max(1.0, round(work / max(seconds, 1), 2))


def fitted_stage2(seconds, epoch_s, constant, decay, rampup):
    """Stage 2's (constant, decay, ramp-up) epochs as compressed, or, when they would not end within
    `seconds` at `epoch_s` seconds an epoch, shortened alike (at least 1 + 1 epochs)."""
    if (constant + decay) * epoch_s <= seconds:
        return constant, decay, rampup
    scale = seconds / ((constant + decay) * epoch_s)
    return max(1, int(constant * scale)), max(1, int(decay * scale)), rampup * scale


def use_compile(check, seconds):
    """Whether the CIFAR-10 runs compile: where the step part (this call's, or an earlier one's with the
    same --work) measured the graphed step both ways and compiling saves more than its starts (three
    processes) over `seconds` of training."""
    saved = check.work / "step.json"
    step = check.summary.get("step") or (json.loads(saved.read_text()) if saved.is_file() else {})
    plain, compiled = (step.get(name, {}).get("sec_per_step") for name in ("bf16-graphed", "bf16-graphed-compile"))
    if not (plain and compiled):
        return check.setting["cifar"]["compile"]
    return seconds * (1 - compiled / plain) > 3 * COMPILE_S


def cifar10(check):
    """On CIFAR-10 from the archive, 4,000 labels, width 1: the step on the real data path; MT on the
    paper's schedule compressed (with --cifar-seconds, as far as the measured step lets the three
    runs end in time; stage 2 shortened further only if MT's own epochs say it would not); then from
    MT's mt.pt, at once, MT+LC and its control (the same stage 2 with lambda2 0). Teacher errors of
    the final weights (no test-set selection), LC's diagnostics, the curves over training seconds."""
    c, start = check.setting["cifar"], time.perf_counter()
    data_dir = extract_cifar10(check)

    def left():
        return check.cifar_seconds - (time.perf_counter() - start) - EVALUATE_S

    compiled = ["--compile"] if use_compile(check, left() if check.cifar_seconds else 0) else []
    startup = STARTUP_S + (COMPILE_S if compiled else 0)
    common = ["--dataset", "cifar10", "--data-dir", data_dir, "--labels", c["labels"], "--width", c["width"],
              "--device", check.device.type, *compiled]
    bench = json.loads(check.run("cifar10.log", "train_mt.py", *common, "--benchmark", c["bench_steps"])
                       .strip().splitlines()[-1])
    result = dict(step={k: bench[k] for k in ("sec_per_step", "data_share", "images_per_sec", "precision",
                                               "steps_per_epoch", "compile", "step_mode")})
    epoch_s = bench["steps_per_epoch"] * bench["sec_per_step"]
    compress = compression(left() - 2 * startup, epoch_s) if check.cifar_seconds else c["compress"]
    mt_epochs = max(1, round(PAPER_MT_EPOCHS / compress))
    runs = {"mt": check.work / "runs" / "mt", **{folder: check.work / "runs" / folder for folder, _ in STAGE2_RUNS.values()}}
    stage1_start = time.perf_counter()
    check.run("cifar10.log", "train_mt.py", *common, "--compress", compress, "--eval-every",
              max(1, round(mt_epochs / EVALUATIONS)), "--overwrite", "--out", runs["mt"])
    mt_config = torch.load(runs["mt"] / "mt.pt", weights_only=True, map_location="cpu")["config"]
    stage1_epoch_s = (time.perf_counter() - stage1_start - startup) / (mt_config["epochs"] + mt_config["decay_epochs"])
    defaults = preset("cifar10", c["labels"], bench["steps_per_epoch"], compress)
    lc_epochs, lc_decay, lc_rampup = defaults["lc_epochs"], defaults["lc_decay_epochs"], defaults["lc_rampup"]
    if check.cifar_seconds:
        lc_epochs, lc_decay, lc_rampup = fitted_stage2(left() - startup, stage1_epoch_s * LC_STEP_COST * STAGE2_TOGETHER,
                                                       lc_epochs, lc_decay, lc_rampup)
    shortened = (lc_epochs, lc_decay) != (defaults["lc_epochs"], defaults["lc_decay_epochs"])
    stage2 = ["finetune_lc.py", "--ckpt", runs["mt"] / "mt.pt", "--epochs", lc_epochs, "--decay-epochs", lc_decay,
              "--lc-rampup", round(lc_rampup, 3), "--eval-every", max(1, round((lc_epochs + lc_decay) / EVALUATIONS)),
              "--device", check.device.type, "--overwrite", *compiled]
    check.run_together("cifar10.log", {name: [*stage2, *options, "--out", runs[folder]]
                                       for name, (folder, options) in STAGE2_RUNS.items()})
    stage2_runs = [runs[folder] for folder, _ in STAGE2_RUNS.values()]
    result.update(zip(("MT", *STAGE2_RUNS), (final_result(check, path) for path in [runs["mt"] / "mt_final.pt",
                                                                                   *(run / "lc.pt" for run in stage2_runs)])))
    result["schedule"] = {"compress": compress, "MT": f"{mt_config['epochs']}+{mt_config['decay_epochs']} epochs, "
                          f"consistency ramp-up {mt_config['cons_rampup']:.2f}, mt.pt after epoch "
                          f"{mt_config['lc_start_epoch']}",
                          ", ".join(STAGE2_RUNS): f"{lc_epochs}+{lc_decay} epochs from MT's epoch "
                          f"{mt_config['lc_start_epoch']}, LC ramp-up {lc_rampup:.2f}"
                          + (" (shortened to fit the time left)" if shortened else ""),
                          "compile": bool(compiled)}
    metrics = {name: read_metrics(path / f"{'mt' if name == 'mt' else 'lc'}_metrics.jsonl") for name, path in runs.items()}
    result["curves"] = {name: [[r["global_epoch"], r["student_error"], r["teacher_error"], round(seconds, 1)]
                               for r, seconds in zip(records, training_seconds(records, metrics["mt"]))
                               if "teacher_error" in r]
                        for name, records in metrics.items()}
    plot_curves([runs["mt"] / "mt_metrics.jsonl", *(run / "lc_metrics.jsonl" for run in stage2_runs)],
                check.out / "cifar10_curves.png", over="seconds")
    teacher = {name: result[name]["teacher_error"] for name in ("MT", *STAGE2_RUNS) if name in result}
    result["goal"] = {"MT+LC teacher error at or under 10%": teacher.get("MT+LC", 100) <= 10.0}
    return result


def final_result(check, path):
    """evaluate.py --json's result of a checkpoint, from its library call in this process (its command
    line needs cloup, which the lent GPU hosts lack); also written to the part's log."""
    state = load_checkpoint(path)
    models = dict(zip(("student", "teacher"), restore_models(state, check.device)))
    result, _ = evaluate_checkpoint(path, state, restore_data(state, echo=lambda m: None), models, check.device)
    with open(check.out / "cifar10.log", "a") as f:
        f.write(f"evaluated: {json.dumps(result)}\n")
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
              help="Size the cifar10 part to end within this many seconds: the paper's schedule compressed as "
                   "far as the step measured on CIFAR-10 needs (stage 2 shortened further only if MT's own epochs "
                   "say so). [default: the paper's schedule compressed 100 times: MT 8+2 epochs, LC 4+2]")
@click.option("--step-run", "step_runs", type=click.Choice(list(STEP_RUNS)), multiple=True,
              help=f"The step part's runs (repeat for several), in the order {', '.join(STEP_RUNS)}; the "
                   f"targets need a bf16-graphed one. [default: all but fp32]")
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
                      step_runs=[name for name in STEP_RUNS if name in step_runs] if step_runs else DEFAULT_STEP_RUNS)
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
