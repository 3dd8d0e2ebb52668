"""The graphed step against the eager step on one device: two trainers from the same initial state,
and before every step the graphed one is set to the eager one's state (weights, teacher, BN running
means, momentum) and the random generators to the eager step's seed, so that both see the same
inputs and draws. Compared after every step: its losses and every tensor of the state. Then the
graphed step's own draws: its augmentation replayed twice must differ. On a GPU the graphed step is
a replayed CUDA graph (after its uncaptured warm-up steps; CAPTURED names the runs that must be); tools/gpu_check.py runs this there, a
test runs it on a CPU. Prints one JSON line; exits 1 where a difference passes the tolerance.

    python tools/step_equivalence.py --device cuda --width 1 --precision bf16 --steps 12

The data: scikit-learn's bundled digits at 32 px (offline), flipped as CIFAR-10 is; the split
forward of the CIFAR-10 protocol; a stage 2 run adds LC with the paper's fixed eps and its clip; the
fixmatch run is stage 2 on the pseudo-label objective (strong views, adaptive threshold).
"""
import json
import sys
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc, kernels
from mtlc.data.batches import channel_stats, seed_step  # noqa: E402
from mtlc.data.datasets import load_digits  # noqa: E402
from mtlc.train.devices import Processes, pick_device  # noqa: E402
from mtlc.train.model import ModelConfig  # noqa: E402
from mtlc.train.networks import build_models  # noqa: E402
from mtlc.data.splits import balanced_split  # noqa: E402
from mtlc.train.settings import MAX_GRAD_NORM, RunSettings, Stage  # noqa: E402
from mtlc.train.graphed import WARMUP_STEPS  # noqa: E402
from mtlc.train.trainer import Trainer, make_optimizer  # noqa: E402

# torch.testing's defaults for the dtypes the steps compute in (bf16: two of its ulps).
TOLERANCES = {"fp32": dict(rtol=1e-5, atol=1e-6), "bf16": dict(rtol=1.6e-2, atol=1e-5)}
SEED = 3


# The runs compared: the stage, and the unlabeled objective's settings of the run.
RUNS = dict(mt=("mt", {}), lc=("lc", {}),
            # the pseudo-label objective (strong views, the adaptive threshold's state) with LC on top
            fixmatch=("lc", dict(consistency="fixmatch", threshold="adaptive", pseudo_labels="student", cons_weight=1.0)))
# The runs whose step a GPU must capture (where more steps run than the uncaptured warm-up's). The strong view cannot be captured (torchvision's RandAugment
# puts each op's affine matrix and fill on the device from the host, a copy a capture refuses): on
# an H200 the fixmatch step ran uncaptured, as the graphed step does wherever its capture fails.
CAPTURED = ("mt", "lc")


def stage_named(name):
    """MT, or stage 2 from global step 40 with LC ramping up (the paper's fixed eps, all pairs)."""
    common = dict(epochs=2, decay_epochs=1, lr=0.05, ema=0.99, cons_weight=100.0, cons_rampup=5, eval_every=1)
    if name == "mt":
        return Stage(name="mt", first_step=0, **common)
    return Stage(name="lc", first_step=40, lc_eps=50.0, lc_weight=10.0, lc_rampup=1, max_grad_norm=MAX_GRAD_NORM, **common)


def trainer_pair(stage, device, width, precision, labeled_batch, unlabeled_batch, objective=None):
    """(eager, graphed) trainers from one initial state on digits."""
    data = load_digits()
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    mean, std = channel_stats(data.train_x)
    config = RunSettings.of(dict(
        dict(dataset="digits", data_dir=".", labels=100, seed=SEED, labeled_batch=labeled_batch,
             unlabeled_batch=unlabeled_batch, width=width, num_classes=10, classes=data.classes, bn_momentum=0.001,
             mean=mean.tolist(), std=std.tolist(), precision=precision, forward="split", lr=stage.lr, ema=stage.ema,
             cons_weight=stage.cons_weight, cons_rampup=stage.cons_rampup, epochs=stage.epochs,
             decay_epochs=stage.decay_epochs, lc_start_epoch=stage.epochs, eval_every=stage.eval_every),
        **(objective or {})))
    split = dict(labeled_idx=labeled, unlabeled_idx=unlabeled, val_idx=torch.zeros(0, dtype=torch.long))
    pair = []
    for mode in ("eager", "graphed"):
        torch.manual_seed(SEED)
        student, teacher = build_models(ModelConfig.of_run(config), device)
        student.data_init(torch.randn(labeled_batch, 3, 32, 32, device=device))
        teacher.load_state_dict(student.state_dict())
        trainer = Trainer(student, teacher, make_optimizer(student, stage.lr), data, split,
                          config.replace(step_mode=mode), stage, device, Processes())
        trainer.batches.flip = True  # CIFAR-10's augmentation
        pair.append(trainer)
    return pair


def training_state(trainer):
    """Every tensor a step changes: student and teacher (weights and BN running means), momentum, and
    the objective's state (FixMatch's adaptive threshold)."""
    state = {f"{part}.{k}": v for part in ("student", "teacher") for k, v in getattr(trainer, part).state_dict().items()}
    state.update({f"momentum.{i}": trainer.optimizer.state[p]["momentum_buffer"]
                  for i, p in enumerate(trainer.student.parameters()) if "momentum_buffer" in trainer.optimizer.state[p]})
    state.update({f"objective.{k}": v for k, v in (trainer.objective.state_dict() or {}).items()})
    return state


@torch.no_grad()
def set_training_state(trainer, state):
    """The trainer's tensors set to `state` in place (a captured step keeps their addresses)."""
    for part in ("student", "teacher"):
        getattr(trainer, part).load_state_dict({k[len(part) + 1:]: v for k, v in state.items() if k.startswith(part)})
    for i, p in enumerate(trainer.student.parameters()):
        if f"momentum.{i}" in state:
            trainer.optimizer.state[p].setdefault("momentum_buffer", torch.zeros_like(p)).copy_(state[f"momentum.{i}"])
    objective = {k[len("objective."):]: v for k, v in state.items() if k.startswith("objective.")}
    trainer.objective.load_state_dict(objective or None)


def excess(actual, expected, rtol, atol):
    """How far the worst element is past the tolerance |a - e| <= atol + rtol |e| (<= 0: within)."""
    diff = (actual.double() - expected.double()).abs()
    return (diff - atol - rtol * expected.double().abs()).max().item()


def compare_steps(eager, graphed, steps, rtol, atol):
    """Run `steps` steps of both from the same state and draws (see the module's docstring); returns
    {quantity: the largest excess over the tolerance and the largest absolute difference}, the
    quantities being 'losses' (the step's loss, ce, cons, lc, neighbour fraction, the objective's
    metrics) and 'state'."""
    worst = {"losses": [-float("inf"), 0.0], "state": [-float("inf"), 0.0]}
    first = eager.stage.first_step
    graphed.steps.start_epoch(first)
    for step in range(first, first + steps):
        set_training_state(graphed, {k: v.clone() for k, v in training_state(eager).items()})
        expected = eager.train_step(step, *eager.batches.views(step))
        seed_step(SEED, step)
        before = graphed.steps.sums.clone()
        graphed.steps.step(step)
        kept = [0, 1, 2, 3, 4, *range(6, len(expected))]  # the all-neighbour flag aside: 0 or 1
        pairs = [("losses", (graphed.steps.sums - before)[kept], expected[kept])]
        actual_state = training_state(graphed)
        pairs += [("state", actual_state[k], v) for k, v in training_state(eager).items()]
        for name, actual, wanted in pairs:
            worst[name][0] = max(worst[name][0], excess(actual, wanted, rtol, atol))
            worst[name][1] = max(worst[name][1], (actual.double() - wanted.double()).abs().max().item())
    return {name: dict(excess=e, max_abs_difference=d) for name, (e, d) in worst.items()}


def fresh_draws(graphed):
    """Whether the graphed step's augmentation draws anew each time it runs (a replayed graph must not
    repeat its random numbers): the data path run twice on the same images."""
    indices = graphed.steps.tables.indices[0]
    first, second = graphed.steps.views(indices), graphed.steps.views(indices)
    if graphed.steps.graph is not None:  # the step was captured: the data path's own graph, replayed twice
        from mtlc.train.graphed import capture, on_side_stream
        outputs = []
        on_side_stream(lambda: graphed.steps.views(indices))
        graph = capture(lambda: outputs.append(graphed.steps.views(indices)))
        graph.replay()
        first = tuple(v.clone() for v in outputs[0])
        graph.replay()
        second = outputs[0]
    return not torch.equal(first[0], second[0]) and not torch.equal(first[1], second[1])


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", help="auto: CUDA when available.")
@click.option("--width", type=click.FloatRange(min=0, min_open=True), default=1.0, help="The network's width.")
@click.option("--precision", type=click.Choice(list(TOLERANCES)), default="bf16",
              help="The networks' precision; it sets the tolerance (torch.testing's for the dtype).")
@click.option("--steps", type=click.IntRange(min=1), default=12,
              help="Steps compared per stage; the graphed step captures after its first 3, so more than 4 compare "
                   "replays.")
@click.option("--labeled-batch", type=click.IntRange(min=1), default=32, help="Labeled images per step.")
@click.option("--unlabeled-batch", type=click.IntRange(min=1), default=128, help="Unlabeled images per step.")
def main(device, width, precision, steps, labeled_batch, unlabeled_batch):
    """Compare the graphed step with the eager step, MT and stage 2, and print the result as JSON."""
    device = pick_device(device)
    tolerance = TOLERANCES[precision]
    result = dict(device=str(device), precision=precision, steps=steps, **tolerance)
    for name, (stage, objective) in RUNS.items():
        eager, graphed = trainer_pair(stage_named(stage), device, width, precision, labeled_batch, unlabeled_batch,
                                      objective)
        result[name] = compare_steps(eager, graphed, steps, **tolerance)
        result[name]["captured"] = graphed.steps.graph is not None
        result[name]["fresh_draws"] = fresh_draws(graphed)
        # Each run's result as it ends: a check cut short keeps the runs it finished.
        click.echo(f"run {name}: {json.dumps(result[name])}")
    result["ok"] = all(result[name][q]["excess"] <= 0 for name in RUNS for q in ("losses", "state")) and \
        all(result[name]["fresh_draws"] for name in RUNS) and \
        (device.type != "cuda" or steps <= WARMUP_STEPS or all(result[name]["captured"] for name in CAPTURED))
    click.echo(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
