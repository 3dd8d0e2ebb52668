"""The interface every unlabeled objective of stage 1 follows (stage 2 adds LC to the same one): the
student's loss on the unlabeled images given a network's outputs on their weak views, which network
that is, whether the student sees a strong view, what it adds to an epoch's record, and the state a
checkpoint keeps of it. One objective is one file beside this one (mean_teacher.py, fixmatch.py);
a third (FlexMatch, SoftMatch) is a new file and a line in objectives/__init__.py. A fitted objective
(probe.py, self_training.py) trains no step: on a frozen trunk's kept features its linear head is
fitted in closed form (fit), once (train/fitted.py).
"""
import torch


class Objective:
    """One objective on one training device. Subclasses set the class attributes and unlabeled_loss."""
    name = ""                # its --consistency name
    title = ""               # how reports name it
    help = ""                # what it does, in --consistency's help
    strong_view = False      # the student sees a strong view of the unlabeled images (views.StrongAugment)
    defaults = {}            # its own defaults of the run's settings (cons_weight, unlabeled_batch, ...)
    frozen_defaults = {}     # those that differ for a head on a frozen pretrained trunk's features
    # What it adds to every epoch's record, {key: (the epoch line's label, the TensorBoard group)}: the
    # epoch's mean of the values unlabeled_loss returns, in this order.
    metrics = {}
    # What LC on top of it did in this project's measurements, where stage 2's default lambda2 is to be
    # doubted (finetune_lc.py says so); None where LC helped or was level.
    lc_on_top = None
    # The head it trains on a frozen trunk (pretrained.HEADS); fitted: by fit, not by steps.
    head = "mlp"
    fitted = False

    def __init__(self, config, device, world=1):
        self.config, self.device, self.world = config, device, world

    def targets_from(self):
        """Whose outputs on the weak view the student learns from: "teacher" (the EMA teacher), or
        "student" (its own, without gradient)."""
        return "teacher"

    def unlabeled_loss(self, logits, target_logits, n_labeled):
        """(the unlabeled loss, the unlabeled images' classes by the targets' network, a float tensor
        of one value per key of `metrics`) of a step: logits of the student on its views (labeled images
        first), target_logits of the network targets_from names on the weak views (no gradient)."""
        raise NotImplementedError

    def fit(self, labeled, labels, unlabeled):
        """A fitted objective's linear head (linear_heads.LinearHead) of float arrays: the labeled images'
        features and classes, the unlabeled images' features."""
        raise NotImplementedError

    def no_metrics(self):
        return torch.zeros(0, device=self.device)

    def state_dict(self):
        """What a checkpoint keeps of it (its "adaptive_threshold" key), None where nothing changes."""
        return None

    def load_state_dict(self, state):
        """Set its state (state_dict's, from a checkpoint) in place."""

    @classmethod
    def state_problem(cls, state, num_classes):
        """Why a checkpoint's state of this objective is not what it writes, or None."""
        return None if state is None else "it holds a state its objective does not keep"

    @classmethod
    def options(cls):
        """The command-line options of the settings it alone takes (train_mt.py's), each defaulting to
        None: its own default (defaults) where not given, refused with another objective."""
        return []

    @classmethod
    def default_help(cls, key):
        """'[default: fixmatch adaptive]': the default of a setting only this objective takes."""
        return f"[default: {cls.name} {cls.defaults[key]}]"

    @classmethod
    def describe(cls, config):
        """How reports name a run of it: its title and the settings that tell its runs apart."""
        return cls.title
