"""The promise made for the images' own class proportions, where they are not the held-out images'.

Under label shift (the classes in other proportions, each class's images alike: Lipton, Wang and
Smola, "Detecting and correcting for label shift with black box predictors", ICML 2018) the error of
the images accepted at a threshold t is the mixture of the classes' errors above t in the images'
proportions above t, not the held-out images': sum over classes c of q_c(t) e_c(t), where e_c(t) is
class c's error among the held-out images at confidence >= t (the same in both sets) and q_c(t) the
share of class c among the images at confidence >= t. Those classes are unknown, but the images'
predicted classes above t are seen, and the held-out images above t say how a class is predicted
there: the confusion C(t) (C_ij: the share of class j predicted i), so the predicted shares mu(t) =
C(t) q(t), solved for q(t) >= 0 by non-negative least squares (black-box shift estimation, within the
region a threshold accepts: near the top C(t) is nearly the identity, so the estimate is stable).
Images predicted a class that no held-out image above t is predicted are unexplained and counted wrong.

The bound on that standardized error is Fay and Feuer's ("Confidence intervals for directly
standardized rates: a method based on the gamma distribution", Statistics in Medicine 1997): the
errors are a sum of weighted counts, weight q_c / n_c for each of the n_c held-out images of class c
above t, and the gamma bound on it is conservative whatever the weights (with equal weights it is the
exact Poisson bound, a little above Clopper-Pearson's). It is wide where a class many images are
predicted has few held-out images above t: that class's error is known from those few alone. Where
the images' mix is no harder than the held-out images' (their standardized error over all of them, where
the errors are many, at most the held-out images' own), the held-out images' Clopper-Pearson bound at t
holds for the images too and the lower of the two is taken: the search then accepts at least what it
accepted in the held-out proportions. The estimate of q(t) is not in the bound: the promise so made is
checked by simulation (tools/simulate_label_shift.py), with the many classes the easy ones and the hard
ones, where the held-out proportions' promise broke in up to 10% of draws.

It is used only where class_shift.py sees the shift (the promise is otherwise as calibration.py makes
it, unchanged), and the search over thresholds is calibration.py's, each place tested with this bound.
"""
import numpy as np

from .calibration import error_upper_bound
from .class_shift import class_shift


class StandardizedBound:
    """The bound at a place of the threshold search: held-out images (confidence, class, predicted class,
    right or not) and the images the threshold is for (confidence, predicted class), n_classes classes."""

    def __init__(self, held_confidence, held_labels, held_predicted, correct, confidence, predicted, n_classes):
        order = np.argsort(-np.asarray(held_confidence), kind="stable")
        self.labels, self.predicted = np.asarray(held_labels)[order], np.asarray(held_predicted)[order]
        self.wrong = ~np.asarray(correct, bool)[order]
        mine = np.argsort(-np.asarray(confidence), kind="stable")
        self.confidence, self.mine = np.asarray(confidence)[mine], np.asarray(predicted)[mine]
        self.k = n_classes
        self.above, self.counts = 0, np.zeros(n_classes, np.int64)  # counted_above's last count
        # Whether the images' mix of classes is no harder than the held-out images', judged once on all of
        # them (where the errors are many, not by the few near the top)
        self.no_harder = self.estimate(len(self.labels), -np.inf)[0] <= self.wrong.mean()

    def counted_above(self, above):
        """The images a predicted class among the first `above` (most confident first): from the count
        before where the search goes down, so a search over the places reads each image once."""
        if above < self.above:
            self.above, self.counts = 0, np.zeros(self.k, np.int64)
        self.counts = self.counts + np.bincount(self.mine[self.above:above], minlength=self.k)
        self.above = above
        return self.counts

    def shares(self, count, threshold):
        """(q: the classes' estimated shares among the images at or above threshold, the share of them
        unexplained, the held-out images a class among the first count), or None where no image is there."""
        from scipy.optimize import nnls
        above = int(np.searchsorted(-self.confidence, -threshold, side="right"))
        if not above:
            return None
        mu = self.counted_above(above) / above
        labels, predicted = self.labels[:count], self.predicted[:count]
        n_class = np.bincount(labels, minlength=self.k)
        present = np.flatnonzero(n_class)
        confusion = np.zeros((self.k, self.k))
        np.add.at(confusion, (predicted, labels), 1.0)
        confusion = confusion[:, present] / n_class[present]
        seen = confusion.sum(1) > 0  # predicted classes some held-out image above t is predicted
        unexplained = float(mu[~seen].sum())
        q = np.zeros(self.k)
        if unexplained < 1:
            solved = nnls(confusion[seen], mu[seen] / (1 - unexplained))[0]
            q[present] = solved / solved.sum() if solved.sum() > 0 else n_class[present] / count
        return q, unexplained, n_class

    def estimate(self, count, threshold):
        """(the standardized error, as a share, of the images at or above threshold from the first count
        held-out images; Fay and Feuer's v and w_max; the share unexplained), or None where no image is there."""
        found = self.shares(count, threshold)
        if found is None:
            return None
        q, unexplained, n_class = found
        errors = np.bincount(self.labels[:count], weights=self.wrong[:count], minlength=self.k)
        weight = np.divide(q, n_class, out=np.zeros(self.k), where=n_class > 0)
        y = unexplained + (1 - unexplained) * float(weight @ errors)
        return y, float(weight ** 2 @ errors), float(weight.max()), unexplained

    def upper(self, count, threshold, level):
        """The one-sided upper bound (%) at the level on the error of the images at or above threshold
        (module docstring), from the first count held-out images; 0 where no image is there (accepting
        none, the place breaks no promise), 100 where no held-out image speaks for them."""
        from scipy.stats import gamma
        found = self.estimate(count, threshold)
        if found is None:
            return 0.0
        if found[2] == 0:
            return 100.0
        y, v, w_max, unexplained = found
        y = (y - unexplained) / (1 - unexplained)
        bound = gamma.ppf(level, (y + w_max) ** 2 / (v + w_max ** 2), scale=(v + w_max ** 2) / (y + w_max))
        standardized = 100.0 * min(1.0, unexplained + (1 - unexplained) * bound)
        if self.no_harder:  # the held-out images' own bound then holds for the images too
            return float(min(standardized, error_upper_bound(int(self.wrong[:count].sum()), count, level)))
        return float(standardized)


def standardized_bound(cal, confidence, predicted, classes):
    """A StandardizedBound for the images (their confidences and predicted class indices) where
    class_shift.py sees their predicted classes in other proportions than the held-out images', else None."""
    predicted = np.asarray(predicted, int)
    if cal.labels is None or class_shift(cal.predicted, np.bincount(predicted, minlength=len(classes)), classes) is None:
        return None
    return StandardizedBound(cal.confidence, cal.labels, cal.predicted, cal.correct, confidence, predicted, len(classes))


def threshold_for(cal, predictions, classes, max_error):
    """(the --max-error Threshold for these Prediction rows or None, the confidence a row needs to be
    accepted): in their own class proportions where class_shift.py sees them apart from the held-out
    images' (the rows never accepted, unreadable or like no class, left out)."""
    index = {c: k for k, c in enumerate(classes)}
    kept = np.fromiter(((index[p.label], p.confidence) for p in predictions if p.label is not None
                        and not p.like_no_class), dtype=[("predicted", np.int64), ("confidence", np.float64)])
    predicted, confidence = kept["predicted"], kept["confidence"]  # two arrays, not a row object an image
    found = cal.threshold(max_error, standardized_bound(cal, confidence, predicted, classes))
    if found is not None and found.standardized and not (confidence >= found.confidence).any():
        found = None  # a place above every image passed only as it accepts none of them
    return found, found.confidence if found else float("inf")
