"""The linear probe (--consistency probe): a logistic regression on the labeled images' features of a
frozen trunk, the unlabeled images unused: the floor every semi-supervised head is measured against
(docs/pretrained.md)."""
from ..linear_heads import linear_probe
from .base import Objective


class Probe(Objective):
    name, title = "probe", "linear probe"
    help = ("a logistic regression on the labeled images' features of a frozen pretrained trunk, fitted once "
            "(the unlabeled images unused): the floor a semi-supervised head must beat.")
    defaults = dict(cons_weight=0.0, unlabeled_batch=128)
    head, fitted = "linear", True
    lc_on_top = "a fitted linear head on a frozen trunk trains no features for LC to act on"

    def fit(self, labeled, labels, unlabeled):
        return linear_probe(labeled, labels, unlabeled, self.config.num_classes)
