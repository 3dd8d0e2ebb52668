"""The paper's protocol per dataset (Section 5.1) as default settings, and their --help text.

An epoch is one pass over the unlabeled set. Schedules are in epochs for the paper's datasets and
digits; for folder, a user's own images, whose count sets how long an epoch is, they are in steps
(FOLDER_STEPS) and become epochs once the data is known.
"""


PRESETS = {
    # The paper's values, fixed eps included (Section 5.1), and the authors' separate forward passes
    # of labeled and unlabeled images. lc_start_epoch: the MT epoch whose state LC starts from
    # (mt.pt); CIFAR-10 starts LC from epoch 600 with either label count (the authors' config:
    # lc_start_loss_epoch = 600), and trains at lr 0.05 until epoch 800 (2,000 labels) or 1,000
    # (4,000) before 200 epochs of decay.
    "svhn": dict(labels=1000, epochs=300, decay_epochs=200, ema=0.995, cons_rampup=5, bn_momentum=0.001,
                 forward="split", lc_start_epoch=None, lc_epochs=100, lc_decay_epochs=200, lc_rampup=50, eps=50.0,
                 eps_scale="fixed", lam=20.0, lc_pairs="all", eval_every=10),
    "cifar10": dict(labels=4000, epochs=800, decay_epochs=200, ema=0.99, cons_rampup=5, bn_momentum=0.001,
                    forward="split", lc_start_epoch=600, lc_epochs=400, lc_decay_epochs=200, lc_rampup=100,
                    eps=50.0, eps_scale="fixed", lam=10.0, lc_pairs="all", eval_every=10),
    # digits: ~1440 training images, ~10 steps per epoch. MT needs a consistency ramp of several
    # hundred steps on data this small (a ramp of tens of steps makes it worse than supervised-only)
    # and a schedule of ~1500 steps to pull ahead. The paper gives no eps for data other than its
    # own, and a fixed one lets LC shrink the space until every pair is a neighbour: eps is chosen
    # from the features and follows their scale. lc_start_epoch None: LC starts from the end of MT's
    # constant-lr phase (--epochs). LC's form for digits and folder (docs/lc-control.md): relative eps
    # with the loss in units of the features' scale at LC's start (lambda2 then weighs it alike on any
    # data: in the features' units lambda2 1 made LC's gradient 0.18x the cross-entropy's on a CIFAR-10
    # folder and up to 5.3x on digits), and only pairs whose classes agree (labels, the teacher's
    # predictions), since many neighbour pairs join different true classes (a quarter on digits, 82%
    # on a CIFAR-10 folder). Checked on two folders kept apart (letters, CIFAR-10): no LC setting,
    # perfect pairs included, beat its control there by more than the noise, and this one cost nothing.
    "digits": dict(labels=100, epochs=100, decay_epochs=50, ema=0.99, cons_rampup=30, bn_momentum=0.02,
                   forward="joint", lc_start_epoch=None, lc_epochs=20, lc_decay_epochs=30, lc_rampup=10, eps="auto",
                   eps_scale="relative", lam=8.0, lc_pairs="same-prediction", eval_every=10),
    # folder: epochs, ramps and eval_every come from FOLDER_STEPS.
    "folder": dict(labels=None, epochs=None, decay_epochs=None, ema=0.99, cons_rampup=None, bn_momentum=0.001,
                   forward="joint", lc_start_epoch=None, lc_epochs=None, lc_decay_epochs=None, lc_rampup=None,
                   eps="auto", eps_scale="relative", lam=8.0, lc_pairs="same-prediction", eval_every=None),
}
# folder's schedule in steps. The ramps are a share of their stage's steps, never under
# MIN_RAMP_STEPS: on small data a ramp of tens of steps made MT worse than supervised-only. On a
# CIFAR-10 folder (250 labels, 10,000 unlabeled, width 1/8) MT was ahead of supervised-only after
# 4,000 steps and level after 12,000, as supervised-only kept improving (docs/own-images.md).
FOLDER_STEPS = dict(epochs=4000, decay_epochs=1000, lc_epochs=1000, lc_decay_epochs=1000, eval_every=500)
RAMP_SHARE = dict(cons_rampup=0.2, lc_rampup=0.25)
# folder's default schedule (FOLDER_STEPS) in epochs of as many passes over the unlabeled set as make
# at least this many steps: every epoch ends with a checkpoint, a metrics line and the metrics file
# written again, and a folder left with 64 unlabeled images after label.py accepted the rest made
# 5,000 one-step epochs of them (233 s for a head's 25 s of steps). Nothing changes where a pass has
# 10 steps (1,280 unlabeled images) or more, nor where --epochs is given (an epoch is then one pass).
MIN_EPOCH_STEPS = 10
MIN_RAMP_STEPS = 300
# A folder's head on a frozen pretrained trunk's kept features trains its schedule this many times
# shorter (--compress's default there): on six photo folders, 3 draws each, half the steps left the
# labels 0.2 points worse on average (food +0.7, se 0.6; the others within 0.4), and the heads of
# stage 1, stage 2 and --predict's unseen heads take half the time (docs/pretrained.md).
FROZEN_HEAD_COMPRESS = 2.0
# CIFAR-10 with 2,000 labels: MT for 600 epochs, LC from epoch 600 until 800 (Section 5.1), eps 40.
CIFAR10_2000 = dict(epochs=600, lc_epochs=200, eps=40.0)
# The stage-1 objective of each dataset (--consistency; each objective's own defaults are in its file). The paper's
# presets keep Mean Teacher; a folder trains FixMatch, ahead of MT at equal time on digits and on rendered
# letters (three seeds each) and level with it on CIFAR-10 folders. Its adaptive threshold and the
# teacher's pseudo-labels: ahead of 0.95 and of the student's by 2.9 and 1.6 points on a development
# CIFAR-10 folder (docs/better-labels.md).
CONSISTENCY = dict(svhn="mt", cifar10="mt", digits="mt", folder="fixmatch")
# The network of each dataset (--backbone): the paper's ConvLarge from scratch for the paper's presets;
# for a folder, auto: an ImageNet-pretrained trunk for colour photos, ConvLarge for grey images
# (train/pretrained.py: auto_backbone; docs/pretrained.md).
BACKBONE = dict(svhn="convlarge", cifar10="convlarge", digits="convlarge", folder="auto")
# --compress F: the schedule's lengths divided by F, the paper's shape on a budget (a rented GPU's
# minutes): the epochs at constant lr and of decay of both stages, LC's start, the evaluation
# interval (whole epochs, at least one; a decay may reach 0) and the ramp-ups (at least
# MIN_RAMP_STEPS steps or their own length, as on small data, never longer than their stage). Chosen as a shape, not
# tuned: no setting of it was tried on any test set.
COMPRESSED_EPOCHS = ("epochs", "decay_epochs", "lc_start_epoch", "lc_epochs", "lc_decay_epochs", "eval_every")
COMPRESSED_RAMPS = dict(cons_rampup=("epochs", "decay_epochs"), lc_rampup=("lc_epochs", "lc_decay_epochs"))


def preset(dataset, labels, steps_per_epoch=None, compress=1.0):
    """The protocol's defaults for a dataset, and for CIFAR-10 with 2,000 labels its own. For folder,
    given steps_per_epoch, the schedule of FOLDER_STEPS in whole epochs (the ramps stay None: see
    ramp_epochs). compress: that schedule `compress` times shorter (COMPRESSED_EPOCHS, COMPRESSED_RAMPS;
    the ramps' floor needs steps_per_epoch)."""
    values = dict(PRESETS[dataset])
    if dataset == "cifar10" and labels == 2000:
        values.update(CIFAR10_2000)
    if dataset == "folder" and steps_per_epoch:
        values.update({key: max(0 if "decay" in key else 1, round(steps / steps_per_epoch))
                       for key, steps in FOLDER_STEPS.items()})
    if compress != 1:
        values.update({key: max(0 if "decay" in key else 1, round(values[key] / compress))
                       for key in COMPRESSED_EPOCHS if values[key] is not None})
        floor = MIN_RAMP_STEPS / steps_per_epoch if steps_per_epoch else 0
        # the floor never lengthens a ramp beyond its own length (digits' 100-step LC ramp stays 100)
        values.update({key: min(max(values[key] / compress, min(floor, values[key])), values[a] + values[b])
                       for key, (a, b) in COMPRESSED_RAMPS.items() if values[key] is not None})
    return values


def ramp_epochs(key, stage_epochs, steps_per_epoch):
    """folder's ramp (cons_rampup or lc_rampup) in epochs: its share of the stage's epochs, at least
    MIN_RAMP_STEPS steps and at most the whole stage."""
    steps = max(RAMP_SHARE[key] * stage_epochs * steps_per_epoch, MIN_RAMP_STEPS)
    return min(steps, stage_epochs * steps_per_epoch) / steps_per_epoch


def stage_lengths(epochs, decay_epochs, rampup, defaults, *, keys, steps_per_epoch):
    """(epochs, decay_epochs, rampup) of a stage: each given (None where not), else its default; keys:
    the names of the three in defaults (a preset's), the ramp's also in RAMP_SHARE (ramp_epochs)."""
    epochs = epochs or defaults[keys[0]]
    decay_epochs = decay_epochs if decay_epochs is not None else defaults[keys[1]]
    if rampup is None:
        rampup = (defaults[keys[2]] if defaults[keys[2]] is not None
                  else ramp_epochs(keys[2], epochs + decay_epochs, steps_per_epoch))
    return epochs, decay_epochs, rampup


def preset_help(key):
    """'[default: svhn 300, cifar10 800, ...]' for an option's --help, from PRESETS (folder's in steps)."""
    values = ", ".join(f"{name} {p[key]}" for name, p in PRESETS.items() if p[key] is not None)
    extra = f"; cifar10 with 2000 labels {CIFAR10_2000[key]}" if key in CIFAR10_2000 else ""
    if key in FOLDER_STEPS:
        extra += f"; folder: the epochs nearest {FOLDER_STEPS[key]:,} steps"
    elif key in RAMP_SHARE:
        extra += f"; folder: {RAMP_SHARE[key]:.0%} of the stage's steps, at least {MIN_RAMP_STEPS}"
    return f"[default: {values}{extra}]"

