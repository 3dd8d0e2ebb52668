"""Confidences one can take at their word, and how many predictions to accept.

Temperature scaling (Guo et al., "On calibration of modern neural networks", ICML 2017): one scalar
T divides the logits; T is fitted by the negative log-likelihood of held-out labeled images, so the
predicted classes stay as they are and only their probabilities change. The expected calibration
error (ECE) is measured with 15 equal-width confidence bins, and by 2-fold cross-fitting (T fitted on
one half of the held-out images, scored on the other) so that the number is not fitted to itself.

Acceptance: the held-out images ranked by confidence give the error of the most confident k of them;
a threshold is accepted only where a one-sided 95% Clopper-Pearson upper bound on that error is at
most the error asked for, so that a handful of lucky images cannot set it.
"""
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax
from scipy.stats import beta

from runs import atomic_write

ECE_BINS = 15
COVERAGES = tuple(range(10, 101, 10))  # % of the held-out images, most confident first
CONFIDENCE_LEVEL = 0.95                # of the upper bound that guards an acceptance threshold
DECIMALS = 4                           # confidences are compared as the CSV writes them


def fit_temperature(logits, labels):
    """The T > 0 minimizing the mean NLL of softmax(logits / T) on the labeled logits (n, classes):
    a bounded 1-d search over log T, deterministic."""
    logits, labels = np.asarray(logits, np.float64), np.asarray(labels)

    def nll(log_t):
        return -log_softmax(logits / np.exp(log_t), axis=1)[np.arange(len(labels)), labels].mean()

    return float(np.exp(minimize_scalar(nll, bounds=(np.log(0.01), np.log(100.0)), method="bounded",
                                        options=dict(xatol=1e-6)).x))


def confidences(logits, temperature=1.0):
    """(predicted class, its probability) per row of logits after dividing them by the temperature,
    the probability rounded as the CSV writes it."""
    probs = torch.softmax(torch.as_tensor(logits, dtype=torch.float64) / temperature, 1)
    top = probs.max(1)
    return top.indices.numpy(), np.round(top.values.numpy(), DECIMALS)


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
    T fitted on the other half (a fixed random split): the calibration a new image can expect."""
    logits, labels = np.asarray(logits, np.float64), np.asarray(labels)
    order = np.random.default_rng(seed).permutation(len(labels))
    halves = order[: len(order) // 2], order[len(order) // 2:]
    predicted, before = confidences(logits)
    after = np.empty_like(before)
    for fit, score in (halves, halves[::-1]):
        after[score] = confidences(logits[score], fit_temperature(logits[fit], labels[fit]))[1]
    correct = predicted == labels
    return expected_calibration_error(before, correct), expected_calibration_error(after, correct)


def error_upper_bound(errors, count, level=CONFIDENCE_LEVEL):
    """One-sided Clopper-Pearson upper bound (%) on an error rate seen as errors of count."""
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


def acceptance_threshold(confidence, correct, max_error, level=CONFIDENCE_LEVEL):
    """The lowest confidence t such that the held-out images at confidence >= t are at most
    max_error % wrong with the given one-sided confidence (Clopper-Pearson): (t, count above it,
    their error %, its upper bound %), or None where no threshold qualifies."""
    conf, errors, counts = ranked(confidence, correct)
    ok = np.flatnonzero(error_upper_bound(errors, counts, level) <= max_error)
    if not len(ok):
        return None
    i = ok[-1]
    return Threshold(float(conf[i]), int(counts[i]), float(100.0 * errors[i] / counts[i]),
                     float(error_upper_bound(errors[i], counts[i], level)))


@dataclass
class Threshold:
    confidence: float   # accept a prediction whose (calibrated, rounded) confidence is at least this
    held_out: int       # held-out images at or above it
    error: float        # their error, %
    bound: float        # its one-sided upper bound, %


@dataclass
class Calibration:
    """What the held-out images say about a model's confidences: the temperature that calibrates
    them, the ECE before and after (cross-fitted), and the error at each coverage."""
    source: str          # which held-out images: "test", "validation"
    n: int
    temperature: float
    ece_before: float
    ece_after: float
    coverage_errors: dict
    confidence: np.ndarray  # calibrated, rounded, per held-out image
    correct: np.ndarray

    @classmethod
    def fit(cls, logits, labels, source):
        logits, labels = np.asarray(logits, np.float64), np.asarray(labels)
        temperature = fit_temperature(logits, labels)
        predicted, confidence = confidences(logits, temperature)
        correct = predicted == labels
        before, after = cross_fitted_ece(logits, labels)
        return cls(source, len(labels), temperature, before, after, errors_at_coverage(confidence, correct),
                   confidence, correct)

    def threshold(self, max_error):
        return acceptance_threshold(self.confidence, self.correct, max_error)

    def summary(self):
        return dict(held_out=self.source, n_held_out=self.n, temperature=self.temperature,
                    ece_before=self.ece_before, ece_after=self.ece_after,
                    error_at_coverage={str(c): e for c, e in self.coverage_errors.items()})


def plot_coverage(cal, max_error, threshold, out, title):
    """The error of the most confident images against their share of the held-out images (the
    error-coverage curve), with the error asked for and the threshold chosen for it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    conf, errors, counts = ranked(cal.confidence, cal.correct)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.plot(100.0 * counts / counts[-1], 100.0 * errors / counts, label="error of the most confident")
    ax.plot(100.0 * counts / counts[-1], error_upper_bound(errors, counts), lw=0.8, ls="--",
            label=f"its {CONFIDENCE_LEVEL:.0%} upper bound")
    if max_error is not None:
        ax.axhline(max_error, color="grey", lw=0.8, label=f"--max-error {max_error:g}%")
    if threshold is not None:
        ax.plot(100.0 * threshold.held_out / counts[-1], threshold.error, "o", color="k",
                label=f"threshold {threshold.confidence:.4f}")
    ax.set_xlabel(f"coverage: % of the {cal.n:,} held-out {cal.source} images, most confident first")
    ax.set_ylabel("error %")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, None)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)
