"""Stage 2: continue a Mean Teacher checkpoint with the local-clustering loss (paper Eq. 4-6).

    python finetune_lc.py --ckpt mt.pt --eps 50 --lam 20
    torchrun --nproc_per_node 4 finetune_lc.py --ckpt mt.pt --lc-scope global   # neighbours across 4 GPUs

Loads student, teacher, optimizer and the labeled split from the MT checkpoint, then minimizes
CE + lambda1 * consistency + lambda2 * r2 * L_lc, where L_lc acts on the student's features of
the labeled and unlabeled images of each batch and r2 ramps up over --lc-rampup epochs from the
start of fine-tuning. Writes lc.pt, lc_metrics.jsonl and lc_last.pt (the state after the latest
epoch, for --resume) to --out (default: the checkpoint's folder).
"""
import math
import os
from pathlib import Path

import click

from mtlc.data.batches import Batches
from mtlc.data.splits import true_classes
from mtlc.disk.command_line import Command, given_options
from mtlc.disk.console import robust_streams
from mtlc.disk.outputs import STAGE_OUTPUTS, check_output_folder, check_outputs
from mtlc.disk.runs import check_resume_flags, existing_outputs, run_folder
from mtlc.errors import UserError
from mtlc.train.benchmark import report_benchmark
from mtlc.train.checkpoints import checkpoint_split, load_checkpoint, restore_data, restore_training, resume_checkpoint
from mtlc.train.curves import check_folder
from mtlc.train.devices import processes, resolve_precision
from mtlc.train.epochs import run_stage
from mtlc.train.lc import MIN_LOSS_UNIT, neighbourhood_at_start
from mtlc.train.objectives import OBJECTIVES
from mtlc.train.model import ModelConfig
from mtlc.train.options import (Number, moved_inputs, note_ignored_by_resume, resumed_curves, run_options,
                                speed_options, tensorboard_option)
from mtlc.train.presets import preset, preset_help, stage_lengths
from mtlc.train.settings import LCSettings
from mtlc.train.trainer import make_trainer

OUTPUTS = STAGE_OUTPUTS["lc"]


# The forms of LC and the pairs it acts on (neighbours.lc_term), as --help explains them.
EPS_SCALE_HELP = ("fixed: eps stays as given, in the features' units (the paper's). relative: eps follows the feature "
                  "scale, as the same multiple of each batch's mean d2 (detached) that it is at LC's start, so LC "
                  "cannot make every pair a neighbour by shrinking the space (the loss still falls as the space "
                  "shrinks). normalized: the features divided by their batch's scale inside the loss, so a common "
                  "factor changes nothing; not a default: on CIFAR-10 folders it pulled most images together and a "
                  f"few far out (docs/lc-control.md). {preset_help('eps_scale')}")
LC_PAIRS_HELP = ("Which pairs within eps LC pulls together. all: every one (the paper's). same-prediction: only "
                 "pairs whose classes agree, a labeled image's class being its label and an unlabeled image's the "
                 "teacher's prediction on the step's view: LC never pulls together images the teacher tells "
                 "apart. true-class: only pairs of one true class, from the unlabeled images' own labels "
                 "(svhn, cifar10, digits; a folder needs --truth): a measurement of what perfect neighbours "
                 f"would give, not for real use. {preset_help('lc_pairs')}")


class EpsParam(click.ParamType):
    """A number, or 'auto'."""
    name = "FLOAT|auto"

    def convert(self, value, param, ctx):
        if value == "auto" or isinstance(value, float):
            return value
        try:
            float(value)
        except ValueError:
            self.fail(f"{value!r} is neither a number nor 'auto'", param, ctx)
        return Number(min=0, min_open=True).convert(value, param, ctx)


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--ckpt", type=click.Path(dir_okay=False), required=True,
              help="The MT checkpoint to start from (mt.pt: the state LC starts from, train_mt.py --lc-start-epoch).")
@click.option("--eps", type=EpsParam(), default=None,
              help="LC cut-off on the mean squared feature distance d2, or auto: chosen from the MT checkpoint's "
                   "features where the labeled images' same-class and different-class distances part (printed "
                   "with the neighbour fraction it gives; `evaluate.py --distances` shows the distributions). "
                   f"{preset_help('eps')}")
@click.option("--eps-scale", type=click.Choice(["fixed", "relative", "normalized"]), default=None,
              help=EPS_SCALE_HELP)
@click.option("--lc-pairs", type=click.Choice(["all", "same-prediction", "true-class"]), default=None,
              help=LC_PAIRS_HELP)
@click.option("--truth", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --lc-pairs true-class on a folder: a CSV with columns path,class for its unlabeled/ images.")
@click.option("--lam", type=Number(), default=None,
              help="LC weight lambda2; 0 runs LC's control (MT trained on for the same schedule). With fixed eps it "
                   "weighs the loss in the features' units (the paper's); with relative eps the loss is first divided "
                   "by the features' mean d2 at LC's start, so that lambda2 means the same on any data; the "
                   f"normalized loss is unit-free. {preset_help('lam')}")
@click.option("--lc-rampup", type=Number(min=0), default=None,
              help=f"Epochs of the sigmoid ramp-up of lambda2, from the start of fine-tuning. {preset_help('lc_rampup')}")
@click.option("--epochs", type=click.IntRange(min=1), default=None,
              help=f"Epochs at constant lr. {preset_help('lc_epochs')}")
@click.option("--decay-epochs", type=click.IntRange(min=0), default=None,
              help=f"Epochs of linear lr decay to 0 after that. {preset_help('lc_decay_epochs')}")
@click.option("--lr", type=Number(min=0, min_open=True), default=None, help="SGD learning rate. [default: the checkpoint's]")
@click.option("--eval-every", type=click.IntRange(min=1), default=None,
              help="Test errors every this many epochs (and at the end). [default: the checkpoint's]")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Dataset folder. [default: the checkpoint's]")
@click.option("--seed", type=int, default=None,
              help="Seed of batch order, augmentation and dropout. [default: the checkpoint's]")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", help="auto: CUDA when available.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Output folder. [default: the checkpoint's folder]")
@click.option("--unfinished", is_flag=True,
              help="Start from a stage 1 that has not reached its --lc-start-epoch (an interrupted run's "
                   "mt_last.pt); refused without it, since LC is meant to start from MT's state at that epoch.")
@run_options("lc")
@click.option("--lc-scope", type=click.Choice(["local", "global"]), default="local",
              help="Under torchrun: local finds each process's neighbours in its own share of the batch; global "
                   "gathers the features of all processes (gradients flow back to each) so neighbours are "
                   "found across the whole global batch, as on one device. No effect in one process.")
@speed_options("lc")
@tensorboard_option("lc")
def main(**options):
    """Stage 2: fine-tune an MT checkpoint with the local-clustering loss. Under torchrun, every
    process trains on its share of each batch (DistributedDataParallel); rank 0 writes the files."""
    o = given_options(options)
    robust_streams()
    check_resume_flags(o.resume, overwrite=o.overwrite, benchmark=o.benchmark, unfinished=o.unfinished)
    check_output_folder("--out", o.out if o.out is not None else Path(o.ckpt).parent)
    check_output_folder("--tensorboard", o.tensorboard)
    if o.tensorboard:
        check_folder(o.tensorboard)  # before any work
    outputs = ("lc_benchmark.json",) * (o.out is not None) if o.benchmark else OUTPUTS
    out = Path(o.out) if o.out is not None else Path(o.ckpt).parent
    with processes(o.device) as (procs, device), run_folder(out, "finetune_lc.py", hold=procs.main and bool(outputs)):
        if o.resume:
            state, path = resume_checkpoint(out, "lc", write=procs.main)
            lc = state["config"].lc
            same_ckpt = Path(o.ckpt).resolve() == Path(lc.mt_checkpoint)  # --ckpt only finds --out's default
            read = ("out", "device", "tensorboard", "data_dir") + ("truth",) * (lc.pairs == "true-class")
            note_ignored_by_resume({**state["config"].as_dict(), **lc.as_dict(), "ckpt": o.ckpt if same_ckpt else lc.mt_checkpoint},
                                   read, procs.echo)
            state["config"] = moved_inputs(state["config"], o.data_dir, o.truth if "truth" in read else None)
            data = procs.main_first(lambda: restore_data(state, echo=procs.echo, strong=True))
            procs.echo(f"finetune_lc: resuming {path} after epoch {state['epoch']}")
            trainer = stage_two(state["config"], data, state, restore_training(state, device), device, procs,
                                reference_spread=state["reference_spread"])
            run_stage(trainer, out, milestones(state["config"]), start_epoch=state["epoch"],
                      tensorboard=resumed_curves(state["config"], o.tensorboard, procs.echo))
            return
        state = load_checkpoint(o.ckpt)
        if state.get("stage") != "mt":
            raise UserError(f"{o.ckpt} is not a Mean Teacher checkpoint (stage {state.get('stage')!r})")
        check_finished(o.ckpt, state, o.unfinished)
        config = state["config"].replace(seed=o.seed if o.seed is not None else state["config"].seed)
        steps_per_epoch = config.steps_per_epoch(len(state["unlabeled_idx"]))
        defaults = preset(config.dataset, config.labels, steps_per_epoch, config.compress)
        chosen = lc_choices(o, defaults)
        check_outputs({name: out / name for name in outputs}, inputs={"--ckpt": o.ckpt, "--truth": o.truth},
                      its_own=True)
        existing = existing_outputs(out, outputs, o.overwrite)
        data = procs.main_first(lambda: restore_data(state, o.data_dir, procs.echo, strong=True))
        if chosen["pairs"] == "true-class":
            true_classes(data, o.truth)  # every unlabeled image's class known, before any work
        training = restore_training(state, device)
        precision = resolve_precision(o.precision, device, convolutions=not ModelConfig.of_run(config).keeps_features)
        config = config.replace(precision=precision, compile=o.compile_, step_mode=o.step_mode, processes=procs.world,
                                tensorboard=os.path.abspath(o.tensorboard) if o.tensorboard else None)
        batches = Batches(data, checkpoint_split(state), config, device)
        eps, start = procs.from_main(neighbourhood_at_start(chosen["eps"], training[0], batches,
                                                            config.forward == "split"))
        config = config.replace(lc=lc_config(o, chosen, eps, start, state, defaults, steps_per_epoch))
        describe_stage_two(o, config, state, steps_per_epoch, device, procs)
        trainer = stage_two(config, data, state, training, device, procs)
        if o.benchmark:
            report_benchmark(trainer, o.benchmark, out if outputs else None)
            return
        run_stage(trainer, out, milestones(config), start_epoch=0, replacing=existing, tensorboard=config.tensorboard)


def check_finished(ckpt, state, unfinished):
    """A stage 1 short of its --lc-start-epoch (an interrupted run's mt_last.pt) is refused unless asked for."""
    start = state["config"].lc_start_epoch
    if state["epoch"] < start and not unfinished:
        raise UserError(f"{ckpt} is stage 1 at epoch {state['epoch']} of the {start} before LC's start (an interrupted "
                        f"run: train_mt.py --resume finishes it, and writes mt.pt at epoch {start}); give --unfinished "
                        f"to start stage 2 from it anyway")


def lc_choices(o, defaults):
    """LC's eps (a number or auto), eps scale, lambda2 and pairs: those given, else the preset's; checked."""
    chosen = dict(eps=o.eps if o.eps is not None else defaults["eps"], eps_scale=o.eps_scale or defaults["eps_scale"],
                  lam=o.lam if o.lam is not None else defaults["lam"], pairs=o.lc_pairs or defaults["lc_pairs"])
    if o.truth and chosen["pairs"] != "true-class":
        raise UserError("--truth goes with --lc-pairs true-class")
    if chosen["eps"] != "auto" and not (math.isfinite(chosen["eps"]) and chosen["eps"] > 0):
        raise UserError(f"--eps must be finite and > 0, got {chosen['eps']}")
    if not (math.isfinite(chosen["lam"]) and chosen["lam"] >= 0):
        raise UserError(f"--lam must be finite and >= 0, got {chosen['lam']}")
    return chosen


def lc_config(o, chosen, eps, start, state, defaults, steps_per_epoch):
    """The LCSettings of a new stage 2: LC's form, its schedule and where it starts from."""
    mt_record = state["metrics"][-1] if state.get("metrics") else {}
    start.update({k: mt_record[k] for k in ("student_error", "teacher_error") if k in mt_record})
    epochs, decay_epochs, lc_rampup = stage_lengths(o.epochs, o.decay_epochs, o.lc_rampup, defaults,
                                                    keys=("lc_epochs", "lc_decay_epochs", "lc_rampup"),
                                                    steps_per_epoch=steps_per_epoch)
    scale, config = chosen["eps_scale"], state["config"]
    if OBJECTIVES[config.consistency].fitted:  # one epoch of one step: the same fit (train/fitted.py)
        epochs, decay_epochs, lc_rampup = 1, 0, 0.0
    return LCSettings(eps=eps, eps_auto=start["eps_auto"], eps_scale=scale,
                      eps_ratio=eps / start["d2_mean"] if scale != "fixed" else None, start=start,
                      loss_unit=max(start["d2_mean"], MIN_LOSS_UNIT) if scale == "relative" else 1.0,
                      pairs=chosen["pairs"], truth=str(Path(o.truth).resolve()) if o.truth else None,
                      lam=chosen["lam"], lc_rampup=lc_rampup, epochs=epochs, decay_epochs=decay_epochs,
                      lr=o.lr or config.lr, eval_every=o.eval_every or config.eval_every, scope=o.lc_scope,
                      mt_checkpoint=str(Path(o.ckpt).resolve()), mt_epoch=state["epoch"], mt_step=state["step"])


def describe_stage_two(o, config, state, steps_per_epoch, device, procs):
    """What stage 2 will do, in two lines, and what to know of its eps (lambda2 0: LC's control)."""
    lc, start = config.lc, config.lc.start
    steps = (lc.epochs + lc.decay_epochs) * steps_per_epoch
    procs.echo(f"finetune_lc: {config.dataset} from {o.ckpt} (MT epoch {state['epoch']}, step {state['step']}), "
               f"lambda2 {lc.lam}, LC pairs {lc.pairs}, {lc.epochs}+{lc.decay_epochs} epochs of "
               f"{steps_per_epoch} steps ({steps:,} steps, LC ramp {round(lc.lc_rampup * steps_per_epoch):,}), "
               f"device {device} x {procs.world}, {config.precision}, LC scope {o.lc_scope}")
    objective = OBJECTIVES[config.consistency]
    if objective.fitted:
        procs.echo(f"finetune_lc: LC acts on the features a head trains; the {objective.title} is a linear head "
                   f"fitted on the frozen trunk's features, which nothing trains: stage 2 fits it again as stage 1 "
                   f"did, and lc.pt predicts as {Path(o.ckpt).name} does")
        return
    procs.echo(f"finetune_lc: eps {lc.eps:.4g} ({'auto' if start['eps_auto'] else 'given'}, {lc.eps_scale}"
               + (f": {lc.eps_ratio:.3g} x the batch's mean d2" if lc.eps_ratio else "") + ") gives a "
               f"neighbour fraction of {start['neighbour_fraction']:.3f} at LC's start"
               + (" (of all pairs; LC keeps those of one class: nbr in the epoch lines)"
                  if lc.pairs == "same-prediction" else "") + "; labeled pairs' median d2: "
               f"same class {start['d2_same_median']:.3g}, different classes {start['d2_different_median']:.3g}; "
               f"mean d2 {start['d2_mean']:.3g}")
    if lc.lam == 0:
        procs.echo("finetune_lc: lambda2 0: LC is off; this run is LC's control, stage 1's objective trained on for "
                   "stage 2's schedule (evaluate.py names it \"..., continued\")")
    if lc.lam > 0 and o.lam is None and objective.lc_on_top:
        procs.echo(f"finetune_lc: note: this checkpoint was trained by {objective.title}, and {objective.lc_on_top}; "
                   f"--lam 0 continues without it")
    if lc.lam > 0 and start["neighbour_fraction"] >= 1.0 and procs.main:
        click.echo(f"warning: with eps {lc.eps:.4g} every LC pair is a neighbour at LC's start: eps is too large "
                   f"for these features, LC acts on all pairs (see evaluate.py --distances)", err=True)


def stage_two(config, data, state, training, device, procs, reference_spread=None):
    """Stage 2's trainer; with --lc-pairs true-class it also holds every training image's true class."""
    pairs_truth = true_classes(data, config.lc.truth) if config.lc.pairs == "true-class" else None
    return make_trainer("lc", config, data, checkpoint_split(state), training, device, procs,
                        reference_spread=reference_spread, true_classes=pairs_truth,
                        objective_state=state["adaptive_threshold"])


def milestones(config):
    """{epoch: checkpoints written after it}: lc.pt at the end."""
    return {config.lc.epochs + config.lc.decay_epochs: ["lc.pt"]}


if __name__ == "__main__":
    main()
