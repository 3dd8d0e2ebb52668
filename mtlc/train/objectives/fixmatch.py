"""FixMatch's objective (Sohn et al. 2020; --consistency fixmatch) beside Mean Teacher's EMA teacher: a
network's class for the weak view of an unlabeled image is the target of the student's cross-entropy
on a strong view of it (data/views.py) wherever that network's confidence clears a threshold; the
loss is the mean over every unlabeled image of the step, those below the threshold counting 0.

The threshold is fixed (FixMatch's 0.95) or adaptive: FreeMatch's self-adaptive threshold (Wang et
al. 2023, Eq. 6-9): a global confidence tau, the EMA over steps of the batches' mean top
probability, and per-class means p~ of the predicted distribution; class c's threshold is
tau * p~(c) / max p~. Both start at 1 / classes, so the first steps keep nearly every image and the
threshold rises as the network grows confident, per class as fast as that class is predicted.
FreeMatch's fairness loss is left out. The per-class part lowers the threshold of a class the network
predicts less often, which pushes its pseudo-labels towards equal classes: adaptive-global keeps
FreeMatch's tau alone, the same for every class.
"""
import click
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..options import Number
from .base import Objective

# FreeMatch's EMA momentum of tau and p~ per step.
ADAPTIVE_MOMENTUM = 0.999
PSEUDO_LABEL_SOURCES = ("teacher", "student")
# FreeMatch's threshold: per class, or its global tau alone (module docstring)
ADAPTIVE = ("adaptive", "adaptive-global")


def is_threshold(value):
    """A fixed threshold in (0, 1], or one of ADAPTIVE."""
    return value in ADAPTIVE or (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1)


class ThresholdParam(click.ParamType):
    """--threshold: a number in (0, 1], or one of ADAPTIVE."""
    name = "FLOAT|" + "|".join(ADAPTIVE)

    def convert(self, value, param, ctx):
        if value in ADAPTIVE or (is_threshold(value) and not isinstance(value, str)):
            return value
        try:
            float(value)
        except ValueError:
            self.fail(f"{value!r} is neither a number nor {' nor '.join(map(repr, ADAPTIVE))}", param, ctx)
        return Number(min=0, max=1, min_open=True).convert(value, param, ctx)


def is_probabilities(value):
    """A float tensor of finite values in [0, 1] (the adaptive threshold's state)."""
    return (isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.dim() <= 1
            and bool(((value >= 0) & (value <= 1)).all()))


class FixMatch(Objective):
    """The unlabeled loss and, for an adaptive threshold, its state (tau, p~) on the training device:
    tensors updated in place, so that a captured step updates them on every replay."""
    name, title = "fixmatch", "FixMatch"
    help = ("pseudo-labels (FixMatch): the class given to a weak view (shift, flip) is the target of the student's "
            "cross-entropy on a strong view of the same image (torchvision's RandAugment and Cutout) wherever its "
            "confidence clears --threshold.")
    strong_view = True
    defaults = dict(cons_weight=1.0, unlabeled_batch=128, threshold="adaptive", pseudo_labels="teacher")
    # On a frozen trunk's features FreeMatch's per-class thresholds pushed the labels of an unbalanced
    # folder towards equal classes (HAM10000: 15 points worse than FixMatch's 0.95, and worse than the
    # linear probe); 0.95 was ahead of adaptive-global on 4 of 6 folders, 0.9 points on average
    # (docs/pretrained.md).
    frozen_defaults = dict(threshold=0.95)
    metrics = {"above_threshold": ("above", "pseudo_labels")}  # the share of unlabeled images it trains on
    lc_on_top = "on top of FixMatch LC has not helped in this project's measurements (docs/better-labels.md)"

    def __init__(self, config, device, world=1):
        super().__init__(config, device, world)
        self.threshold, num_classes = config.threshold, config.num_classes
        self.adaptive = self.threshold in ADAPTIVE
        self.confidence = torch.full((), 1.0 / num_classes, device=device)  # tau
        self.class_means = torch.full((num_classes,), 1.0 / num_classes, device=device)  # p~

    @classmethod
    def options(cls):
        return [
            click.option("--threshold", type=ThresholdParam(), default=None,
                         help="fixmatch: the confidence a pseudo-label needs: a number in (0, 1] (FixMatch's 0.95), "
                              "adaptive: FreeMatch's self-adaptive threshold, global and per class, starting low and "
                              "rising with the network's confidence (a class predicted less often gets a lower one), or "
                              "adaptive-global: its global part alone, the same for every class. "
                              f"[default: fixmatch adaptive; on a frozen pretrained trunk "
                              f"{cls.frozen_defaults['threshold']}]"),
            click.option("--pseudo-labels", type=click.Choice(PSEUDO_LABEL_SOURCES), default=None,
                         help="fixmatch: the network whose prediction on the weak view is the pseudo-label: the EMA "
                              "teacher, or the student itself (FixMatch's), without gradient. "
                              f"{cls.default_help('pseudo_labels')}"),
        ]

    def targets_from(self):
        return self.config.pseudo_labels

    def state_dict(self):
        if not self.adaptive:
            return None
        return dict(confidence=self.confidence.detach().cpu().clone(), class_means=self.class_means.detach().cpu().clone())

    def load_state_dict(self, state):
        if state is not None:
            self.confidence.copy_(state["confidence"])
            self.class_means.copy_(state["class_means"])

    @classmethod
    def state_problem(cls, state, num_classes):
        if state is None:
            return None
        if not (isinstance(state, dict) and set(state) == {"confidence", "class_means"}
                and all(is_probabilities(t) for t in state.values()) and state["confidence"].dim() == 0):
            return "its adaptive threshold's state is not what this project writes"
        if state["class_means"].shape != (num_classes,):
            return f"its adaptive threshold's class means do not fit its class count ({num_classes})"
        return None

    @classmethod
    def describe(cls, config):
        source = ", the student's pseudo-labels" if config.pseudo_labels == "student" else ""
        return f"FixMatch (threshold {config.threshold}{source})"

    def thresholds(self, probs, confidence):
        """Each class's threshold this step, after FreeMatch's update with the batch (the processes' mean)."""
        stats = torch.cat([confidence.mean().view(1), probs.mean(0)])
        if self.world > 1:
            dist.all_reduce(stats)
            stats = stats / self.world
        m = ADAPTIVE_MOMENTUM
        self.confidence.mul_(m).add_(stats[0], alpha=1 - m)
        self.class_means.mul_(m).add_(stats[1:], alpha=1 - m)
        if self.threshold == "adaptive-global":
            return self.confidence.expand(len(self.class_means))
        return self.confidence * self.class_means / self.class_means.max()

    def unlabeled_loss(self, logits, target_logits, n_labeled):
        """The pseudo-label loss of the unlabeled images: the student's logits on their strong views, the
        targets' network's on their weak views; its metric, the share above the threshold."""
        probs = F.softmax(target_logits[n_labeled:].detach().float(), 1)
        confidence, targets = probs.max(1)
        if self.adaptive:
            kept = confidence >= self.thresholds(probs, confidence)[targets]
        else:
            kept = confidence >= self.threshold
        kept = kept.float()
        loss = (F.cross_entropy(logits[n_labeled:].float(), targets, reduction="none") * kept).mean()
        return loss, targets, kept.mean().view(1)
