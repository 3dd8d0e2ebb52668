"""A stage's schedule: its settings (Stage), the learning rate (constant, then a linear decay to 0) and
the sigmoid ramp-ups of lambda1 and lambda2 (Mean Teacher's), all in epochs.
"""
import math
from dataclasses import dataclass


def sigmoid_rampup(progress, length):
    """exp(-5 (1 - t)^2), t = progress / length clipped to [0, 1] (Mean Teacher's ramp-up); 1 if length is 0."""
    if length <= 0:
        return 1.0
    t = min(max(progress / length, 0.0), 1.0)
    return math.exp(-5.0 * (1.0 - t) ** 2)


def learning_rate(progress, lr, constant_epochs, decay_epochs):
    """lr for `constant_epochs`, then linearly down to 0 over `decay_epochs` (progress in epochs)."""
    if progress < constant_epochs:
        return lr
    if decay_epochs <= 0:
        return 0.0
    return lr * max(0.0, 1.0 - (progress - constant_epochs) / decay_epochs)


@dataclass
class Stage:
    name: str                 # "mt" or "lc"
    epochs: int               # constant-lr epochs of this stage
    decay_epochs: int         # then linear decay of the lr to 0
    lr: float
    ema: float
    cons_weight: float        # lambda1
    cons_rampup: float        # epochs, counted from the start of stage 1
    eval_every: int
    first_step: int           # global step at which this stage starts
    lc_eps: float = 0.0       # stage 2 only
    lc_weight: float = 0.0    # lambda2
    lc_rampup: float = 0.0    # epochs, counted from the start of stage 2
    lc_eps_scale: str = "fixed"  # the LC form: fixed (the paper's), relative or normalized (neighbours.lc_term)
    lc_eps_ratio: float = None  # relative and normalized: eps = this x the batch's mean d2 (lc_eps: its value at the start)
    lc_loss_unit: float = 1.0   # relative: the LC loss is divided by this (the features' mean d2 when LC started)
    lc_pairs: str = "all"       # all (the paper's), same-prediction (labels, the teacher's classes) or true-class


def stage_of(config, name):
    """Stage 1 ("mt") or stage 2 ("lc") of a run, as its config sets it."""
    common = dict(ema=config["ema"], cons_weight=config["cons_weight"], cons_rampup=config["cons_rampup"])
    if name == "mt":
        return Stage(name="mt", epochs=config["epochs"], decay_epochs=config["decay_epochs"], lr=config["lr"],
                     eval_every=config["eval_every"], first_step=0, **common)
    lc = config["lc"]
    return Stage(name="lc", epochs=lc["epochs"], decay_epochs=lc["decay_epochs"], lr=lc["lr"], eval_every=lc["eval_every"],
                 first_step=lc["mt_step"], lc_eps=lc["eps"], lc_weight=lc["lam"], lc_rampup=lc["lc_rampup"],
                 lc_eps_scale=lc["eps_scale"], lc_eps_ratio=lc["eps_ratio"], lc_loss_unit=lc["loss_unit"],
                 lc_pairs=lc["pairs"], **common)
