"""A run's settings as one typed object, from the command line through the checkpoint and back:
train_mt.py makes a RunSettings from its options and the dataset's preset (presets.py), finetune_lc.py
adds stage 2's LCSettings to it, every checkpoint keeps it as plain data (as_dict, loaded without
running code) and gives it back checked (from_checkpoint), with what runs from before a setting
existed did not write filled in as those runs behaved. Each setting's check stands beside its name,
here and nowhere else. And each stage's schedule (Stage): its lengths, the learning rate (constant,
then a linear decay to 0) and the sigmoid ramp-ups of lambda1 and lambda2 (Mean Teacher's), in epochs.
"""
import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Union

from ..data.batches import epoch_steps
from ..data.datasets import DATASETS
from ..data.framing import Framing
from .model import MIN_IMAGE_SIZE
from .objectives import CONSISTENCIES
from .objectives.fixmatch import PSEUDO_LABEL_SOURCES, is_threshold
from .pretrained import BACKBONE_NAMES, CONVLARGE, MAX_STRONG_VIEWS, TRUNKS

# The largest image size a run may take or a checkpoint name: each image is decoded at it (3 x size^2
# bytes: 3 MB at 1,024 px), and no network here gains beyond it (a pretrained trunk's own side is 224-260,
# ConvLarge's 32).
MAX_IMAGE_SIZE = 1024
# The widest network a checkpoint may name (the paper's is 1): each layer is built before its weights load.
MAX_WIDTH = 16
# What a metrics record may hold that the scripts read, by name: a number (or None: an error not measured).
METRIC_NUMBERS = ("neighbour_fraction", "d2_ratio", "d2_mean", "student_error", "teacher_error")
EPS_SCALES = ("fixed", "relative", "normalized")
LC_PAIRS = ("all", "same-prediction", "true-class")
LC_SCOPES = ("local", "global")
FORWARDS = ("joint", "split")
NEVER = object()  # a setting every run has written
# Stage 2 and a folder's stage 1 clip the gradient's norm at this (RunSettings.stage); the paper's
# datasets train stage 1 unclipped, as the paper does (at width 1 their early steps reach about 20).
# SGD can overshoot and diverge within a few steps: in stage 2 with a large lambda2 (measured: norms
# 2 -> 26 -> 172 -> 4e7 -> NaN, eps 50 and lambda2 20 on a network at chance level), in stage 1 on a
# folder of a few dozen images whose labels the network has memorized (norms below 2.5 for 160 steps,
# then 17 -> 85 -> 178 -> 1.7e3 -> 1e10 -> NaN, the weight-norm gains at 2e7). A folder's normal steps
# stay far below it (the largest measured: docs/reference.md), and a clip that does not act
# multiplies by exactly 1, so those runs are bitwise unchanged.
MAX_GRAD_NORM = 10.0


def is_int(value, low=None):
    return isinstance(value, int) and not isinstance(value, bool) and (low is None or value >= low)


def is_number(value, low=None):
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (low is None or value >= low))


def is_names(value):
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def is_part_dict(value, check):
    """{"train": ..., "test": ...}, each part passing check (a folder's files or their fingerprints)."""
    return isinstance(value, dict) and set(value) == {"train", "test"} and all(check(v) for v in value.values())


def integer(low=None, high=None):
    return lambda v: is_int(v, low) and (high is None or v <= high)


def number(low=None, above=None, high=None):
    return lambda v: is_number(v, low) and (above is None or v > above) and (high is None or v <= high)


def one_of(choices):
    return lambda v: isinstance(v, str) and v in choices


def optional(check):
    return lambda v: v is None or check(v)


def text(v):
    return isinstance(v, str)


def flag(v):
    return isinstance(v, bool)


def channel_values(positive):
    return lambda v: isinstance(v, list) and len(v) == 3 and all(is_number(x) and (x > 0 or not positive) for x in v)


def framing_dict(v):
    try:
        Framing.of(v)
    except (ValueError, TypeError):
        return False
    return True


def setting(check, *, before=NEVER):
    """A field with its check; before: its value in runs from before it was written (NEVER: always was)."""
    return dataclasses.field(metadata=dict(check=check, before=before))


class Settings:
    """What RunSettings and LCSettings share: plain data out, checked data in."""

    def as_dict(self):
        """What a checkpoint keeps (plain data: torch.load(weights_only=True) reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def wrong_fields(cls, values):
        """The names of the fields whose value in `values` (older runs' filled in) fails its check."""
        return [f.name for f in dataclasses.fields(cls) if "check" in f.metadata
                and not f.metadata["check"](values.get(f.name, f.metadata["before"]))]

    @classmethod
    def of(cls, values):
        """From a checkpoint's dict whose fields passed wrong_fields; keys of no field are left out."""
        fields = {f.name: f.metadata.get("before", NEVER) for f in dataclasses.fields(cls)}
        return cls(**{name: values[name] if name in values else copy.copy(before)
                      for name, before in fields.items() if name in values or before is not NEVER})

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class LCSettings(Settings):
    """Stage 2's settings (a checkpoint's config["lc"]): LC's form and schedule, and where it started."""
    eps: float = setting(number(above=0))             # the cut-off on d2 at LC's start (Eq. 4)
    eps_auto: bool = setting(flag)                     # chosen from the features (--eps auto)
    eps_scale: str = setting(one_of(EPS_SCALES))       # fixed (the paper's), relative or normalized (lc.lc_term)
    eps_ratio: Optional[float] = setting(optional(number()), before=None)  # relative, normalized: eps / mean d2
    start: dict = setting(lambda v: isinstance(v, dict) and all(is_number(v[k]) for k in METRIC_NUMBERS if k in v))
    loss_unit: float = setting(number(above=0), before=1.0)  # relative: L_lc is divided by this
    pairs: str = setting(one_of(LC_PAIRS), before="all")
    truth: Optional[str] = setting(optional(text), before=None)  # --truth of lc_pairs true-class
    lam: float = setting(number(0))                    # lambda2
    lc_rampup: float = setting(number(0))
    epochs: int = setting(integer(1))
    decay_epochs: int = setting(integer(0))
    lr: float = setting(number())
    eval_every: int = setting(integer(1))
    scope: str = setting(one_of(LC_SCOPES), before="local")
    mt_checkpoint: str = setting(text)                 # the stage 1 it started from, resolved
    mt_epoch: Optional[int] = setting(optional(integer(0)), before=None)
    mt_step: int = setting(integer(0))                 # the global step it started at


@dataclass(frozen=True)
class RunSettings(Settings):
    """Every setting of a run (a checkpoint's config): its data, split, network, objective, schedule
    and how it computes; stage 2's in `lc`."""
    dataset: str = setting(one_of(DATASETS))
    data_dir: str = setting(lambda v: isinstance(v, str) and bool(v) and "\0" not in v)
    labels: int = setting(integer())
    split_seed: int = setting(integer(), before=0)
    val: int = setting(integer(0), before=0)
    labeled_batch: int = setting(integer(1))
    unlabeled_batch: int = setting(integer(1))
    width: float = setting(number(above=0, high=MAX_WIDTH))
    num_classes: int = setting(integer(2))
    classes: list = setting(lambda v: is_names(v) and len(set(v)) == len(v))
    mean: list = setting(channel_values(positive=False))   # the training images' per-channel statistics
    std: list = setting(channel_values(positive=True))
    image_size: int = setting(integer(MIN_IMAGE_SIZE, MAX_IMAGE_SIZE), before=32)
    framing: Optional[dict] = setting(framing_dict, before=None)  # how images become squares (None: squashed)
    skip_bad_images: bool = setting(flag, before=False)
    skipped: list = setting(is_names, before=[])        # the files --skip-bad-images left out (unreadable)
    files: Optional[dict] = setting(optional(lambda v: is_part_dict(v, is_names)), before=None)  # a folder's
    contents: Optional[dict] = setting(optional(lambda v: is_part_dict(v, text)), before=None)  # their bytes'
    leaked_test: Optional[list] = setting(optional(is_names), before=None)  # test images that copy training ones
    relabeled: list = setting(is_names, before=[])      # images label.py relabeled (label-log.csv)
    accepted_as_labels: bool = setting(flag, before=True)  # label.py --accepted's images trained as labels
    seed: int = setting(integer())
    lr: float = setting(number())
    ema: float = setting(number())
    consistency: str = setting(one_of(CONSISTENCIES), before="mt")
    threshold: Union[float, str] = setting(is_threshold, before=0.95)        # FixMatch's (objectives/fixmatch.py)
    pseudo_labels: str = setting(one_of(PSEUDO_LABEL_SOURCES), before="teacher")
    cons_weight: float = setting(number())               # lambda1
    epochs: int = setting(integer(1))
    decay_epochs: int = setting(integer(0))
    cons_rampup: float = setting(number())
    lc_start_epoch: int = setting(integer(1))            # the epoch mt.pt holds (older runs: --epochs)
    forward: str = setting(one_of(FORWARDS), before="joint")
    bn_momentum: float = setting(number(above=0, high=1))
    eval_every: int = setting(integer(1))
    min_epoch_steps: int = setting(integer(1), before=1)  # an epoch: passes over the unlabeled set, at least this many steps
    compress: float = setting(number(above=0), before=1.0)
    precision: str = setting(one_of(("fp32", "bf16")), before="fp32")  # as resolved for the device
    compile: bool = setting(flag, before=False)
    step_mode: str = setting(text, before="eager")
    tensorboard: Optional[str] = setting(optional(text), before=None)
    processes: int = setting(integer(1), before=1)
    backbone: str = setting(one_of(BACKBONE_NAMES), before=CONVLARGE)  # the paper's network, or a pretrained trunk
    trunk: str = setting(one_of(TRUNKS), before="frozen")  # a pretrained trunk's: kept features, or trained whole
    strong_views: int = setting(integer(0, MAX_STRONG_VIEWS), before=0)  # FixMatch's, embedded ahead (embeddings.py)
    lc: Optional[LCSettings] = None

    @classmethod
    def from_checkpoint(cls, config, stage):
        """The settings a checkpoint's config (a dict) holds, for its stage ("mt" or "lc"); ValueError
        naming what it lacks or holds of another type or value than this project writes."""
        values = dict(config)
        values.setdefault("lc_start_epoch", values.get("epochs"))  # older runs: the end of the constant lr
        wrong = cls.wrong_fields(values)
        lc = values.get("lc")
        if stage == "lc":
            wrong += ["lc"] if not isinstance(lc, dict) else [f"lc.{k}" for k in LCSettings.wrong_fields(lc)]
        if wrong:
            raise ValueError(f"its config lacks {', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''} (or holds "
                             f"another type or value there)")
        if len(values["classes"]) != values["num_classes"]:
            raise ValueError(f"its config's {len(values['classes'])} classes do not fit its class count "
                             f"({values['num_classes']})")
        values["lc"] = LCSettings.of(lc) if stage == "lc" else None
        return cls.of(values)

    def as_dict(self):
        """What a checkpoint keeps; stage 1's without an "lc" key, as it always was."""
        values = super().as_dict()
        if values["lc"] is None:
            del values["lc"]
        return values

    def steps_per_epoch(self, n_unlabeled):
        """The steps of this run's epoch over n_unlabeled images (batches.epoch_steps)."""
        return epoch_steps(n_unlabeled, self.unlabeled_batch, self.min_epoch_steps)

    @property
    def framed(self):
        """The Framing its images are decoded with (data/framing.py)."""
        return Framing.of(self.framing)

    @property
    def decode_size(self):
        """The side its images are decoded at: image_size, but SVHN's and CIFAR-10's own 32 px, which a
        pretrained trunk sees upscaled to image_size (embeddings.trunk_input)."""
        return 32 if self.dataset in ("svhn", "cifar10") else self.image_size

    def stage(self, name):
        """Stage 1 ("mt") or stage 2 ("lc") of this run."""
        common = dict(ema=self.ema, cons_weight=self.cons_weight, cons_rampup=self.cons_rampup)
        if name == "mt":  # stage 1 of the paper's datasets as the paper trains it; a folder's clipped
            return Stage(name="mt", epochs=self.epochs, decay_epochs=self.decay_epochs, lr=self.lr,
                         eval_every=self.eval_every, first_step=0,
                         max_grad_norm=MAX_GRAD_NORM if self.dataset == "folder" else None, **common)
        lc = self.lc
        return Stage(name="lc", epochs=lc.epochs, decay_epochs=lc.decay_epochs, lr=lc.lr, eval_every=lc.eval_every,
                     first_step=lc.mt_step, lc_eps=lc.eps, lc_weight=lc.lam, lc_rampup=lc.lc_rampup,
                     lc_eps_scale=lc.eps_scale, lc_eps_ratio=lc.eps_ratio, lc_loss_unit=lc.loss_unit,
                     lc_pairs=lc.pairs, lc_scope=lc.scope, max_grad_norm=MAX_GRAD_NORM, **common)


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
    """The schedule of the stage a Trainer trains (RunSettings.stage)."""
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
    lc_eps_scale: str = "fixed"  # the LC form: fixed (the paper's), relative or normalized (lc.lc_term)
    lc_eps_ratio: float = None  # relative and normalized: eps = this x the batch's mean d2 (lc_eps: its value at the start)
    lc_loss_unit: float = 1.0   # relative: the LC loss is divided by this (the features' mean d2 when LC started)
    lc_pairs: str = "all"       # all (the paper's), same-prediction (labels, the teacher's classes) or true-class
    lc_scope: str = "local"     # under torchrun: neighbours in each process's share of the batch, or global
    max_grad_norm: float = None  # the gradient's norm clipped at this (None: not clipped; RunSettings.stage)
