"""Are the images predicted in the held-out images' class proportions?

The promise `--max-error` makes (calibration.py) is for images like the held-out ones. Where a folder's
classes come in other proportions than its test/ (a test/ of 100 a class beside a long-tailed
unlabeled folder), the images accepted can be less or more wrong than the held-out images showed
(label_shift.py then makes the promise for the images' own proportions):
under label shift the error at a confidence depends on which classes are many (Lipton, Wang and Smola,
"Detecting and correcting for label shift with black box predictors", ICML 2018), and nothing in the
promise says which way. The images' classes are unknown, but their predicted classes are seen, by the
same heads as the held-out images': where the two come from one distribution, so do their predicted
classes, and Pearson's chi-square test of homogeneity applies. It is said only where it is both
unlikely by chance (p under SHIFT_P) and large (a total variation distance of at least
SHIFT_DISTANCE: a tenth of the images in other classes); simulated in tests/test_class_shift.py
(false alarms with equal proportions; found for the unbalanced food's 400-to-31 profile).
"""
from dataclasses import dataclass

import numpy as np

SHIFT_P = 1e-3
SHIFT_DISTANCE = 0.1
SHOWN = 3  # classes named in the line, most apart first


@dataclass
class ClassShift:
    distance: float  # total variation between the predicted classes' proportions
    p_value: float
    apart: list      # [(class, its share among the images predicted, among the held-out)], most apart first

    def line(self, source):
        shares = ", ".join(f"{name} {100 * mine:.0f}% against {100 * held:.0f}%" for name, mine, held in self.apart)
        return (f"the images' predicted classes are not in the held-out {source} images' proportions ({shares}; "
                f"a total variation of {self.distance:.2f}, p = {self.p_value:.1g}): the promise is made for the "
                f"images' own proportions, estimated from their predicted classes, and costs held-out evidence "
                f"where a class many images are predicted has few held-out images; held-out images drawn as the "
                f"images are make it cheaper")

    def summary(self):
        return dict(total_variation=round(self.distance, 4), p_value=float(f"{self.p_value:.3g}"),
                    most_apart={name: [round(mine, 4), round(held, 4)] for name, mine, held in self.apart})


def class_shift(held_out_predicted, predicted_counts, classes):
    """A ClassShift where the images' predicted classes (predicted_counts: images a class, in the order of
    classes) are not in the proportions of the held-out images' (held_out_predicted: a class index an
    image), else None."""
    from scipy.stats import chi2_contingency  # here: scipy's import takes seconds
    held = np.bincount(np.asarray(held_out_predicted, int), minlength=len(classes)).astype(float)
    mine = np.asarray(predicted_counts, float)
    seen = held + mine > 0
    if not held.sum() or not mine.sum() or seen.sum() < 2:
        return None
    held_share, my_share = held / held.sum(), mine / mine.sum()
    distance = 0.5 * float(np.abs(held_share - my_share).sum())
    p_value = float(chi2_contingency(np.stack([held[seen], mine[seen]]), correction=False).pvalue)
    if p_value >= SHIFT_P or distance < SHIFT_DISTANCE:
        return None
    order = np.argsort(-np.abs(my_share - held_share), kind="stable")[:SHOWN]
    return ClassShift(distance, p_value, [(classes[c], float(my_share[c]), float(held_share[c])) for c in order])
