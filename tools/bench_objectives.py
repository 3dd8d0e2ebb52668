"""Stage-1 objectives compared at equal training time, and LC against its control on top of each
(docs/better-labels.md). For each seed and objective: train_mt.py with the objective's options, then
finetune_lc.py from its mt.pt with LC and with lambda2 0 (LC's control). Then the teacher of every
final checkpoint (mt_final.pt, the control's and LC's lc.pt) is measured: its test error, the error of
its labels for the unlabeled training images (their true classes: the dataset's, or --truth's for a
folder), and what --max-error accepts of those images (the threshold found on the held-out images, as
evaluate.py --predict finds it: the unlabeled images never calibrate it) with the accepted images'
actual error. Paired by seed: each objective minus the first, and LC minus its control, with standard
errors. Runs --jobs trainings at a time, each on one thread (the thread count changes bf16 sums);
a run whose checkpoint exists is not run again, so the command goes on where it stopped.

    python tools/bench_objectives.py --dataset digits --seeds 1 --seeds 2 --seeds 3 --out runs/cmp-digits \\
        --objective mt= --objective "fixmatch=--consistency fixmatch --compress 1.09" --record docs/x.json

Equal time: give each objective's --compress as its step's cost over the first objective's: the
same schedule's shape, that many times fewer steps, stage 2 included (finetune_lc.py shortens its
defaults alike). --time-steps N measures those costs instead of training: train_mt.py --benchmark N
of each objective in turn (its --compress left out), --time-rounds times, one thread each, and prints
the median seconds a step and the ratio to the first objective's.
"""
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc
from mtlc.use.calibration import confidences  # noqa: E402
from mtlc.train.checkpoints import load_checkpoint, restore_data  # noqa: E402
from mtlc.use.classifier import Classifier  # noqa: E402
from mtlc.train.inference import outputs  # noqa: E402
from mtlc.data.splits import true_classes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STAGES = {"mt": "mt_final.pt", "control": "control/lc.pt", "lc": "lc/lc.pt"}


def merged(base, options):
    """The options of base (each with its value) but those that an objective's options give again (its
    own --width), then those options: each option once, as train_mt.py takes them."""
    given = {option for option in options if option.startswith("--")}
    kept = [pair for pair in zip(base[::2], base[1::2]) if pair[0] not in given]
    return [item for pair in kept for item in pair] + list(options)


def training_data(dataset, data_dir):
    """train_mt.py's data options; a folder trains the paper's network unless an objective names a
    --backbone (the measurements here were made from scratch before a folder's default became auto)."""
    return ["--dataset", dataset, *(["--data-dir", str(data_dir)] if data_dir else []),
            *(["--backbone", "convlarge"] if dataset == "folder" else [])]


def run_plan(dataset, data_dir, width, seeds, objectives, out, stage_two=True):
    """[(name, command, the file it makes, the file it needs)] of every training (stage 1 alone
    without stage_two)."""
    plan = []
    for name, options in objectives.items():
        for seed in seeds:
            run = Path(out) / f"{name}-{seed}"
            data = training_data(dataset, data_dir)
            split = ["--split-seed", str(seed)] if dataset != "folder" else []
            base = [*data, "--width", str(width), "--seed", str(seed), *split]
            plan.append((f"{name}-{seed} stage 1", ["train_mt.py", *merged(base, shlex.split(options)), "--out", str(run)],
                         run / "mt_final.pt", None))
            for stage, lam in (("control", ["--lam", "0"]), ("lc", [])) if stage_two else ():
                command = ["finetune_lc.py", "--ckpt", str(run / "mt.pt"), *lam, "--out", str(run / stage)]
                plan.append((f"{name}-{seed} {stage}", command, run / stage / "lc.pt", run / "mt.pt"))
    return plan


def train_all(plan, jobs, log_dir):
    """Run the plan's commands, `jobs` at a time, each once what it needs exists; skip those done."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    waiting = [step for step in plan if not step[2].exists()]
    running = []
    while waiting or running:
        for step in [s for s in waiting if s[3] is None or s[3].exists()][:max(0, jobs - len(running))]:
            waiting.remove(step)
            log = open(Path(log_dir) / (step[0].replace(" ", "-") + ".log"), "w")
            click.echo(f"start {step[0]}: python {shlex.join(step[1])}", err=True)
            running.append((step, subprocess.Popen([sys.executable, *step[1]], cwd=ROOT, env=env, stdout=log,
                                                   stderr=subprocess.STDOUT), log))
        time.sleep(2)
        for item in [r for r in running if r[1].poll() is not None]:
            running.remove(item)
            item[2].close()
            if item[1].returncode != 0:
                raise click.ClickException(f"{item[0][0]} failed (exit {item[1].returncode}): see {item[2].name}")
            click.echo(f"done {item[0][0]}", err=True)
        if waiting and not running and not any(s[3] is None or s[3].exists() for s in waiting):
            raise click.ClickException(f"nothing can start: {waiting[0][3]} is missing")


def step_costs(dataset, data_dir, width, objectives, steps, rounds):
    """{objective: [seconds a step of each round]}: train_mt.py --benchmark of each objective in turn
    (one thread, its --compress left out), so that a slower minute of the machine falls on every one."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    data = training_data(dataset, data_dir)
    costs = {name: [] for name in objectives}
    for _ in range(rounds):
        for name, options in objectives.items():
            options = shlex.split(options)
            if "--compress" in options:
                at = options.index("--compress")
                options = options[:at] + options[at + 2:]
            res = subprocess.run([sys.executable, "train_mt.py", *merged([*data, "--width", str(width)], options),
                                  "--benchmark", str(steps)], cwd=ROOT, env=env, capture_output=True, text=True)
            if res.returncode != 0:
                raise click.ClickException(f"the benchmark of {name} failed: {res.stderr.strip().splitlines()[-1:]}")
            costs[name].append(json.loads(res.stdout.strip().splitlines()[-1])["sec_per_step"])
    return costs


def measure(path, truth, max_error):
    """The teacher of a checkpoint: test error, error on the unlabeled training images, and of those
    what --max-error accepts (the share) and the accepted images' error, all in %."""
    state = load_checkpoint(path)
    classifier = Classifier(state, device="cpu")
    cal = classifier.calibrate()
    data = restore_data(state, echo=lambda line: None)
    unlabeled = state["unlabeled_idx"]
    y = true_classes(data, truth)[unlabeled].numpy()
    logits = outputs(classifier.model, data.inputs("train"), classifier.mean, classifier.std, unlabeled)[1]
    predicted, confidence = confidences(logits, classifier.temperature)
    test_logits = outputs(classifier.model, data.inputs("test"), classifier.mean, classifier.std)[1]
    return scored(predicted, confidence, y, test_logits, data.test_y, cal.threshold(max_error) if cal else None)


def scored(predicted, confidence, y, test_logits, test_y, found):
    """measure's numbers of the unlabeled images' predictions and confidences (their classes y), the
    test images' logits and the --max-error threshold found (None: none)."""
    accepted = confidence >= found.confidence if found else confidence > 1
    wrong = predicted != y
    return dict(test_error=100 * float((test_logits.argmax(1) != test_y).float().mean()),
                unlabeled_error=100 * float(wrong.mean()), accepted_share=100 * float(accepted.mean()),
                accepted_error=100 * float(wrong[accepted].mean()) if accepted.any() else None,
                accepted=int(accepted.sum()), unlabeled=len(y))


def summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return dict(mean=statistics.mean(values), std=statistics.stdev(values) if len(values) > 1 else 0.0, n=len(values))


def paired(a, b):
    """b minus a, seed by seed: mean, std and standard error."""
    d = [y - x for x, y in zip(a, b) if x is not None and y is not None]
    if not d:
        return None
    std = statistics.stdev(d) if len(d) > 1 else 0.0
    return dict(mean=statistics.mean(d), std=std, se=std / len(d) ** 0.5, n=len(d), each=d)


def compare(results, objectives, seeds):
    """Means per objective and stage, and the paired differences (module docstring)."""
    keys = ("test_error", "unlabeled_error", "accepted_share", "accepted_error")
    stages = list(results[f"{next(iter(objectives))}-{seeds[0]}"])
    table = {f"{name} {stage}": {k: summary([results[f"{name}-{s}"][stage][k] for s in seeds]) for k in keys}
             for name in objectives for stage in stages}
    first = next(iter(objectives))
    differences = {}
    for name in objectives:
        column = {k: [results[f"{name}-{s}"]["mt"][k] for s in seeds] for k in keys}
        if name != first:
            base = {k: [results[f"{first}-{s}"]["mt"][k] for s in seeds] for k in keys}
            differences[f"{name} minus {first} (stage 1)"] = {k: paired(base[k], column[k]) for k in keys}
        if "lc" not in stages:
            continue
        lc = {k: [results[f"{name}-{s}"]["lc"][k] for s in seeds] for k in keys}
        control = {k: [results[f"{name}-{s}"]["control"][k] for s in seeds] for k in keys}
        differences[f"{name}: LC minus its control"] = {k: paired(control[k], lc[k]) for k in keys}
    return table, differences


def cell(s, digits=2):
    return "-" if s is None else f"{s['mean']:.{digits}f} +- {s['std']:.{digits}f}"


def difference_cell(d):
    return "-" if d is None else f"{d['mean']:+.2f} (se {d['se']:.2f})"


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--dataset", type=click.Choice(["digits", "folder"]), default="folder",
              help="What train_mt.py trains on.")
@click.option("--data-dir", type=click.Path(exists=True, file_okay=False), default=None, help="A folder's images.")
@click.option("--truth", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A folder's CSV of path,class for its unlabeled/ images.")
@click.option("--objective", "objectives", multiple=True, required=True, metavar="NAME=OPTIONS",
              help="An objective and the train_mt.py options that make it (and its equal-time --compress); the "
                   "first is the one the others are compared with.")
@click.option("--seeds", type=int, multiple=True, default=(1, 2, 3), help="Seeds (give --seeds once per seed).")
@click.option("--width", type=float, default=0.125, help="The network's width.")
@click.option("--max-error", type=float, default=2.0, help="The acceptance's --max-error, in %.")
@click.option("--jobs", type=click.IntRange(min=1), default=2, help="Trainings at a time, one thread each.")
@click.option("--stage-one-only", is_flag=True, help="Train and measure stage 1 alone (no LC, no control).")
@click.option("--redraw", is_flag=True,
              help="A folder of examples/own_images.py photos: each seed is also the draw of its labeled images "
                   "(own_images.py redraw --seed, in place: the same files, their features kept), trained and "
                   "measured before the next draw.")
@click.option("--out", type=click.Path(file_okay=False), default="runs/objectives", help="Where the runs go.")
@click.option("--record", type=click.Path(dir_okay=False), default=None, help="Write the results as JSON here.")
@click.option("--time-steps", type=click.IntRange(min=1), default=None, metavar="N",
              help="Instead of training: the cost of each objective's step (train_mt.py --benchmark N, in turn).")
@click.option("--time-rounds", type=click.IntRange(min=1), default=5,
              help="With --time-steps: rounds over the objectives.")
def main(dataset, data_dir, truth, objectives, seeds, width, max_error, jobs, stage_one_only, redraw, out, record,
         time_steps, time_rounds):
    """Train every objective and seed (with LC and its control on top), then measure and compare them."""
    torch.set_num_threads(1)
    objectives = dict(o.split("=", 1) for o in objectives)
    if time_steps:
        costs = step_costs(dataset, data_dir, width, objectives, time_steps, time_rounds)
        base = next(iter(costs))
        for name, seconds in costs.items():
            median = statistics.median(seconds)
            click.echo(f"{name:28s} {median:.4f} s a step (median of {', '.join(f'{s:.4f}' for s in seconds)}), "
                       f"{median / statistics.median(costs[base]):.3f} x {base}'s")
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    stages = {"mt": STAGES["mt"]} if stage_one_only else STAGES
    results = {}
    for draw in [[s] for s in seeds] if redraw else [seeds]:
        if redraw:
            subprocess.run([sys.executable, "examples/own_images.py", "redraw", "--data-dir", str(data_dir), "--truth",
                            str(truth), "--seed", str(draw[0])], cwd=ROOT, check=True)
        train_all(run_plan(dataset, data_dir, width, draw, objectives, out, not stage_one_only), jobs, out)
        results.update({f"{name}-{s}": {stage: measure(Path(out) / f"{name}-{s}" / file, truth, max_error)
                                        for stage, file in stages.items()} for name in objectives for s in draw})
    table, differences = compare(results, objectives, seeds)
    click.echo(f"teacher, mean +- std over seeds {', '.join(map(str, seeds))} (%): test error | error of the labels "
               f"for unlabeled images | --max-error {max_error:g} accepts | their actual error")
    for name, row in table.items():
        click.echo(f"{name:28s} " + " | ".join(cell(row[k]) for k in row))
    click.echo("paired by seed (points; negative: lower):")
    for name, row in differences.items():
        click.echo(f"{name:40s} " + " | ".join(difference_cell(row[k]) for k in row))
    if record:
        Path(record).write_text(json.dumps(dict(dataset=dataset, data_dir=data_dir, seeds=seeds, width=width,
                                                max_error=max_error, objectives=objectives, results=results,
                                                table=table, differences=differences), indent=1) + "\n")


if __name__ == "__main__":
    main()
