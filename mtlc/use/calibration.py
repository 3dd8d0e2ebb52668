"""Confidences one can take at their word, and how many predictions to accept.

Temperature scaling (Guo et al., "On calibration of modern neural networks", ICML 2017): one scalar
T divides the logits; T is fitted by the negative log-likelihood of held-out labeled images, so the
predicted classes stay as they are and only their probabilities change. The expected calibration
error (ECE) is measured with 15 equal-width confidence bins, and by 2-fold cross-fitting (T fitted on
one half of the held-out images, scored on the other) so that the number is not fitted to itself.

Acceptance: the held-out images ranked by confidence give the error of the most confident k of them;
a threshold is accepted only where a one-sided Clopper-Pearson upper bound on that error is at most
the error asked for, so that a handful of lucky images cannot set it. Choosing the lowest of many
thresholds whose bounds pass would spend the confidence level on the search (with every confidence
5.5% wrong, a search for 5% at 95% per threshold accepted something in 12% of draws), so the
places a threshold can cut are tested in a fixed order, from the most confident down (Learn then
Test: Angelopoulos, Bates, Candes, Jordan and Lei 2021), by the fallback procedure (Wiens 2003): the
5% the promise may fail in is shared out, before any error is looked at, among a few restart places
set by counts alone; each place is tested at the share of its own restart plus everything carried
by an unbroken run of passes above it, and a place that fails carries nothing down. The threshold is
the lowest place that passed. A fixed sequence that stops at its first failure is the case of one
share: a few confident mistakes among the first hundred of 3,000 held-out images then ended it,
whatever followed (outdoor scenes: 5.6% accepted where the binary search before it took 66%); with
restarts the run begins again at twice, four times... the first count. The fallback procedure holds
its level whatever the dependence between the tests (it is a closed Bonferroni procedure). Restarts
cost where the top is clean and the held-out images few, so they are made only where the held-out
images hold at least four times the first count; the first place takes half the 5% (the rest in equal
shares), the fewest images whose bound passes at that share with one of them wrong, where the
held-out images are at least twice as many (one unlucky error then ends nothing), else the fewest that
pass with none wrong. Simulated in tools/bench_acceptance.py (docs/label-the-rest.md) against the
fixed sequence and the binary search of selection with guaranteed risk (Geifman and El-Yaniv 2017),
with few and many held-out images and with confident mistakes near the top.

The promise is about images like the held-out ones. The unlabeled images were trained on (Mean
Teacher's consistency, LC): the network is more confident on them, so at the same threshold their
error can be higher than the held-out images'.

Held-out images relabeled from a model's own suggestion (the audit flags the test images its teacher
disagrees with, and one key confirms the suggestion) are no evidence for the model: their new label
agrees with it because it came from it. Leaving them out is no cure either, as they are the model's
disagreements: what is left is the images it already agreed with (simulated, bench_acceptance.py:
either way the promise breaks in nearly every draw). So an image label.py relabeled is counted as an
error of the model whatever it predicts: an upper bound on its true error, which keeps the promise
(and costs acceptance in proportion to the images relabeled). The temperature is fitted on the others.

A confidence is never higher than the held-out images can vouch for: at most (1 - 0.95)^(1/n), the
one-sided 95% lower bound on the accuracy of a network that got all n trusted held-out images right
(Clopper-Pearson; 0.861 from 20 images, 0.997 from 1,000; with fewer than 20 no temperature is fitted
and the raw softmax is said to be uncalibrated). A temperature fitted on a few images whose mistakes
are near ties (T 0.09 from 20 gave 1.0000) would otherwise claim an error no held-out result of that
size can show. It is the Clopper-Pearson bound and no looser: a network exactly that accurate gets
all n right in 5% of draws (simulated in tests/test_calibration.py).
"""
import math
from dataclasses import dataclass

import numpy as np
import torch

ECE_BINS = 15
COVERAGES = tuple(range(10, 101, 10))  # % of the held-out images, most confident first
CONFIDENCE_LEVEL = 0.95                # of the promise an acceptance threshold makes, the search included
DECIMALS = 4                           # confidences are compared as the CSV writes them
MIN_CALIBRATION_IMAGES = 20            # held-out images below which no temperature is fitted
TEMPERATURE_BOUNDS = (0.01, 100.0)


class NoTemperature(Exception):
    """No temperature can be fitted: the message says why."""


def fit_temperature(logits, labels):
    """The T > 0 minimizing the mean NLL of softmax(logits / T) on the labeled logits (n, classes):
    a bounded 1-d search over log T, deterministic. NoTemperature where there are fewer than
    MIN_CALIBRATION_IMAGES, or the search did not converge inside its bounds (the held-out images
    all right with a margin, or all wrong: no finite temperature fits them)."""
    from scipy.optimize import minimize_scalar  # here: scipy's import takes seconds that training never needs
    from scipy.special import log_softmax
    logits, labels = np.asarray(logits, np.float64), np.asarray(labels)
    if len(labels) < MIN_CALIBRATION_IMAGES:
        raise NoTemperature(f"{len(labels)} held-out images are too few to fit a temperature "
                            f"(at least {MIN_CALIBRATION_IMAGES})")
    right = logits.argmax(1) == labels
    if right.all() or not right.any():  # the likelihood then keeps rising towards T = 0 or T = infinity
        raise NoTemperature(f"the network gets all {len(labels)} held-out images {'right' if right.all() else 'wrong'}: "
                            f"no temperature fits them")

    def nll(log_t):
        return -log_softmax(logits / np.exp(log_t), axis=1)[np.arange(len(labels)), labels].mean()

    low, high = np.log(TEMPERATURE_BOUNDS[0]), np.log(TEMPERATURE_BOUNDS[1])
    result = minimize_scalar(nll, bounds=(low, high), method="bounded", options=dict(xatol=1e-6))
    if not result.success or min(result.x - low, high - result.x) < 1e-3:
        raise NoTemperature(f"no temperature between {TEMPERATURE_BOUNDS[0]:g} and {TEMPERATURE_BOUNDS[1]:g} fits "
                            f"the {len(labels)} held-out images")
    return float(np.exp(result.x))


def fitted_or_one(logits, labels):
    """fit_temperature, or 1 (the raw softmax) where none can be fitted."""
    try:
        return fit_temperature(logits, labels)
    except NoTemperature:
        return 1.0


def confidences(logits, temperature=1.0, ceiling=1.0):
    """(predicted class, its probability) per row of logits after dividing them by the temperature,
    the probability at most the ceiling (supported_confidence) and rounded as the CSV writes it."""
    probs = torch.softmax(torch.as_tensor(logits, dtype=torch.float64) / temperature, 1)
    top = probs.max(1)
    return top.indices.numpy(), np.round(np.minimum(top.values.numpy(), ceiling), DECIMALS)


def supported_confidence(n, level=CONFIDENCE_LEVEL):
    """The highest confidence n held-out images support (module docstring): (1 - level)^(1/n), rounded
    down as the CSV writes confidences; 1 with fewer than MIN_CALIBRATION_IMAGES, whose confidences are
    the raw softmax, said as such (and a ceiling under 0.5 would tie a top class with the next)."""
    if n < MIN_CALIBRATION_IMAGES:
        return 1.0
    return math.floor((1 - level) ** (1 / n) * 10 ** DECIMALS) / 10 ** DECIMALS


def expected_calibration_error(confidence, correct, bins=ECE_BINS):
    """sum over equal-width confidence bins of (share of images in the bin) x |accuracy - mean
    confidence| in the bin, in %."""
    confidence, correct = np.asarray(confidence, np.float64), np.asarray(correct, np.float64)
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    gap = 0.0
    for b in range(bins):
        mine = which == b
        if mine.any():
            gap += mine.mean() * abs(correct[mine].mean() - confidence[mine].mean())
    return float(100.0 * gap)


def cross_fitted_ece(logits, labels, seed=0):
    """ECE (%) before and after temperature scaling, each half of the held-out images scored with the
    T fitted on the other half (a fixed random split): the calibration a new image can expect. After
    is None where a half has no temperature (too few images: below 2 x MIN_CALIBRATION_IMAGES), never
    the raw softmax's ECE again under its name."""
    logits, labels = np.asarray(logits, np.float64), np.asarray(labels)
    order = np.random.default_rng(seed).permutation(len(labels))
    halves = order[: len(order) // 2], order[len(order) // 2:]
    predicted, before = confidences(logits)
    correct = predicted == labels
    after = np.empty_like(before)
    for fit, score in (halves, halves[::-1]):
        try:
            after[score] = confidences(logits[score], fit_temperature(logits[fit], labels[fit]))[1]
        except NoTemperature:
            return expected_calibration_error(before, correct), None
    return expected_calibration_error(before, correct), expected_calibration_error(after, correct)


def error_upper_bound(errors, count, level=CONFIDENCE_LEVEL):
    """One-sided Clopper-Pearson upper bound (%) on an error rate seen as errors of count."""
    from scipy.stats import beta
    errors, count = np.asarray(errors), np.asarray(count)
    bound = beta.ppf(level, errors + 1, np.maximum(count - errors, 1))
    return 100.0 * np.where(errors >= count, 1.0, bound)


def ranked(confidence, correct):
    """Held-out images most confident first: (confidences, cumulative errors, counts) at the end of
    each group of equal confidence, the only places a threshold can cut."""
    order = np.argsort(-np.asarray(confidence), kind="stable")
    conf = np.asarray(confidence)[order]
    errors = np.cumsum(~np.asarray(correct, bool)[order])
    ends = np.flatnonzero(np.r_[conf[1:] != conf[:-1], True])
    return conf[ends], errors[ends], ends + 1


def errors_at_coverage(confidence, correct, coverages=COVERAGES):
    """{coverage %: error % of the most confident coverage% of the images (ties kept together)}."""
    conf, errors, counts = ranked(confidence, correct)
    result = {}
    for c in coverages:
        i = np.searchsorted(counts, int(np.ceil(c / 100 * counts[-1])))
        result[c] = float(100.0 * errors[i] / counts[i])
    return result


def images_needed(max_error, level=CONFIDENCE_LEVEL, wrong=0):
    """The fewest held-out images at or above a threshold whose bound passes with `wrong` of them
    wrong (with none: 1 - (1 - level)^(1/n) <= max_error, the fewest that can ever pass)."""
    n = math.ceil(math.log(1 - level) / math.log1p(-max_error / 100) - 1e-9)
    while wrong and error_upper_bound(wrong, n, level) > max_error:
        n += 1
    return n


def first_place(n_held_out, max_error, level=CONFIDENCE_LEVEL):
    """The count a run of tests starts at, by counts alone (module docstring)."""
    one_wrong = images_needed(max_error, level, wrong=1)
    return one_wrong if n_held_out >= 2 * one_wrong else images_needed(max_error, level)


RESTARTS_FROM = 4  # the held-out images, in first counts, from which the tests start again after a failure


def restart_places(n_held_out, max_error, level=CONFIDENCE_LEVEL):
    """[(count, share of 1 - level)] of the fallback procedure (module docstring), by counts alone: the
    whole level at the first place where the held-out images are fewer than RESTARTS_FROM times its
    count, else half there and the other half in equal shares at twice, four times... that count."""
    alpha = 1 - level
    first = first_place(n_held_out, max_error, 1 - alpha / 2)
    if n_held_out < RESTARTS_FROM * first:
        return [(first_place(n_held_out, max_error, level), alpha)]
    counts = [first]
    while 2 * counts[-1] <= n_held_out:
        counts.append(2 * counts[-1])
    rest = alpha / 2 / (len(counts) - 1)
    return [(counts[0], alpha / 2)] + [(c, rest) for c in counts[1:]]


def acceptance_threshold(confidence, correct, max_error, level=CONFIDENCE_LEVEL, standardized=None):
    """The lowest confidence t that the fallback procedure's tests (module docstring) pass, such that
    the held-out images at confidence >= t are at most max_error % wrong, with the given confidence:
    (t, count above it, their error %, its upper bound % at the level it was tested at), or None
    where no threshold qualifies. standardized: a label_shift.StandardizedBound, whose bound on the
    error in the images' own class proportions each place is then tested with."""
    conf, errors, counts = ranked(confidence, correct)
    restarts = restart_places(len(correct), max_error, level)
    carried, best, next_restart = 0.0, None, 0
    for place in range(int(np.searchsorted(counts, restarts[0][0])), len(conf)):
        share = carried
        while next_restart < len(restarts) and restarts[next_restart][0] <= counts[place]:
            share += restarts[next_restart][1]
            next_restart += 1
        if share <= 0:
            bound = 100.0
        elif standardized is None:
            bound = float(error_upper_bound(errors[place], counts[place], 1 - share))
        else:
            bound = standardized.upper(int(counts[place]), float(conf[place]), 1 - share)
        if bound <= max_error:
            best, carried = (place, bound), share
        else:
            carried = 0.0
    if best is None:
        return None
    place, bound = best
    return Threshold(float(conf[place]), int(counts[place]), float(100.0 * errors[place] / counts[place]), bound,
                     standardized is not None)


@dataclass
class Threshold:
    confidence: float   # accept a prediction whose (calibrated, rounded) confidence is at least this
    held_out: int       # held-out images at or above it
    error: float        # their error, %
    bound: float        # its one-sided upper bound, %, at the level its test had (a share of 1 - CONFIDENCE_LEVEL)
    standardized: bool = False  # the bound is on the error in the images' own class proportions (label_shift.py)


@dataclass
class Calibration:
    """What the held-out images say about a model's confidences: the temperature that calibrates
    them, the ECE before and after (cross-fitted), and the error at each coverage."""
    source: str          # which held-out images: "test", "validation"
    n: int
    temperature: float   # 1 where none could be fitted (uncalibrated says why)
    ece_before: float
    ece_after: float
    coverage_errors: dict
    confidence: np.ndarray  # calibrated, rounded, per held-out image
    correct: np.ndarray     # False for every relabeled image (module docstring)
    uncalibrated: str = None  # why no temperature was fitted, if none was
    relabeled: int = 0      # held-out images relabeled with label.py, counted as errors
    predicted: np.ndarray = None  # the class predicted for each held-out image (class_shift.py compares them)
    labels: np.ndarray = None     # each held-out image's class (label_shift.py: the classes' errors)

    @classmethod
    def fit(cls, logits, labels, source, doubted=None):
        """The calibration on held-out images; doubted: which of them were relabeled from a model's
        suggestion (counted as errors, left out of the temperature's fit and the ECE)."""
        logits, labels = np.asarray(logits, np.float64), np.asarray(labels)
        trusted = np.ones(len(labels), bool) if doubted is None else ~np.asarray(doubted, bool)
        try:
            temperature, uncalibrated = fit_temperature(logits[trusted], labels[trusted]), None
        except NoTemperature as exc:
            temperature, uncalibrated = 1.0, str(exc)
        ceiling = supported_confidence(int(trusted.sum()))  # as Calibration.ceiling: the held-out images trusted
        predicted, confidence = confidences(logits, temperature, ceiling)
        correct = (predicted == labels) & trusted
        before, after = (cross_fitted_ece(logits[trusted], labels[trusted]) if uncalibrated is None else (np.nan, np.nan))
        return cls(source, len(labels), temperature, before, after, errors_at_coverage(confidence, correct),
                   confidence, correct, uncalibrated, int((~trusted).sum()), predicted, labels)

    @property
    def ceiling(self):
        """The highest confidence these held-out images support (supported_confidence)."""
        return supported_confidence(self.n - self.relabeled)

    def threshold(self, max_error, standardized=None):
        """acceptance_threshold on these held-out images (standardized: as there)."""
        return acceptance_threshold(self.confidence, self.correct, max_error, standardized=standardized)

    def summary(self):
        return dict(held_out=self.source, n_held_out=self.n, relabeled_counted_wrong=self.relabeled,
                    temperature=None if self.uncalibrated else self.temperature, uncalibrated=self.uncalibrated,
                    confidence_ceiling=self.ceiling,
                    ece_before=None if self.uncalibrated else self.ece_before,
                    ece_after=None if self.uncalibrated else self.ece_after,
                    error_at_coverage={str(c): e for c, e in self.coverage_errors.items()})
