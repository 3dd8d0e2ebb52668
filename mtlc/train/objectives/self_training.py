"""Self-training of the linear probe (--consistency self-training): rounds of the logistic regression
fitted on the labeled images and the most confident unlabeled ones under the previous round's classes,
the class prior of the unlabeled images estimated and corrected for in each round (linear_heads.py:
a few labels a class say nothing of how common each class is)."""
from ..linear_heads import self_trained
from .base import Objective


class SelfTraining(Objective):
    name, title = "self-training", "self-trained probe"
    help = ("the linear probe, then rounds of it refitted with the unlabeled images it is surest of under its own "
            "classes (no quota per class), the unlabeled images' class prior estimated and corrected for.")
    defaults = dict(cons_weight=1.0, unlabeled_batch=128)
    head, fitted = "linear", True
    lc_on_top = "a fitted linear head on a frozen trunk trains no features for LC to act on"

    def fit(self, labeled, labels, unlabeled):
        return self_trained(labeled, labels, unlabeled, self.config.num_classes, correct_prior=True)
