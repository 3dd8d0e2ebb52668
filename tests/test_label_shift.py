"""The promise in the images' own class proportions (mtlc/use/label_shift.py): the standardized error,
its bound, the rule that takes the held-out images' bound too, and the promise simulated."""
from types import SimpleNamespace

import numpy as np
import pytest

from mtlc.use.calibration import acceptance_threshold, error_upper_bound
from mtlc.use.classifier import Prediction
from mtlc.use.label_shift import StandardizedBound, standardized_bound, threshold_for
from tools.simulate_label_shift import simulated

CLASSES = ["a", "b"]


def two_classes(images_a, images_b):
    """100 held-out images of a (10 wrong, taken for b, the least confident) and of b (none wrong), all at
    confidence 0.99 but a's mistakes at 0.6; images_a images of a and images_b of b, predicted as the
    held-out ones are (a tenth of a taken for b)."""
    labels = np.repeat([0, 1], 100)
    correct = np.ones(200, bool)
    correct[:10] = False
    confidence = np.where(correct, 0.99, 0.6)
    predicted = np.where(correct, labels, 1 - labels)
    images = np.repeat([0, 1], [images_a * 9 // 10, images_a // 10 + images_b])
    return StandardizedBound(confidence, labels, predicted, correct, np.full(len(images), 0.99), images, 2)


@pytest.mark.parametrize("images_a, images_b, expected", [(100, 900, 0.01), (900, 100, 0.09), (500, 500, 0.05)])
def test_the_error_is_the_classes_errors_in_the_images_proportions(images_a, images_b, expected):
    bound = two_classes(images_a, images_b)
    assert bound.estimate(200, 0.5)[0] == pytest.approx(expected, abs=0.005)  # the held-out images' own: 5%
    assert bound.no_harder == (images_a <= images_b)


def test_the_bound_is_the_held_out_ones_where_the_mix_is_no_harder_else_wider():
    easy, hard = two_classes(100, 900), two_classes(900, 100)
    held_out = float(error_upper_bound(10, 200, 0.95))
    assert easy.upper(200, 0.5, 0.95) <= held_out  # the lower of the two
    assert hard.upper(200, 0.5, 0.95) > held_out  # the hard class's 10% counts nine times over
    assert 9.0 < hard.upper(200, 0.5, 0.95) < 100


def test_images_predicted_a_class_no_held_out_image_is_predicted_count_wrong():
    labels, correct = np.repeat([0, 1], 50), np.ones(100, bool)
    bound = StandardizedBound(np.full(100, 0.9), labels, labels, correct, np.full(10, 0.9),
                              np.array([0] * 8 + [2] * 2), 3)
    q, unexplained, _ = bound.shares(100, 0.9)
    assert unexplained == pytest.approx(0.2) and q[0] == pytest.approx(1.0)
    assert bound.estimate(100, 0.9)[0] == pytest.approx(0.2)


def test_a_place_above_every_image_accepts_none_and_passes():
    assert two_classes(10, 10).upper(200, 0.995, 0.95) == 0.0


def calibration(rng, n=400):
    labels = np.repeat([0, 1], n // 2)
    confidence = np.round(rng.uniform(0.6, 1.0, n), 4)
    correct = rng.random(n) < confidence
    return SimpleNamespace(labels=labels, predicted=np.where(correct, labels, 1 - labels), confidence=confidence,
                           correct=correct, threshold=lambda e, s=None: acceptance_threshold(confidence, correct, e,
                                                                                             standardized=s))


def test_only_where_the_shift_is_seen_and_for_readable_images_alike_a_class():
    rng = np.random.default_rng(0)
    cal = calibration(rng)
    assert standardized_bound(cal, np.full(200, 0.9), np.repeat([0, 1], 100), CLASSES) is None
    assert standardized_bound(cal, np.full(200, 0.9), np.repeat([0, 1], [180, 20]), CLASSES) is not None
    rows = [Prediction(f"{k}.png", "a", 0.95, "b") for k in range(180)] + \
           [Prediction(f"b{k}.png", "b", 0.95, "a") for k in range(20)]
    found, needed = threshold_for(cal, rows, CLASSES, 20)
    assert found is not None and found.standardized and needed == found.confidence
    alike = rows[:20] + rows[180:] + [Prediction("x.png", "a", 0.9, "b", outlier_ratio=99.0)] * 80 + \
        [Prediction("y.png", None, None, None, reason="unreadable")] * 80
    found, _ = threshold_for(cal, alike, CLASSES, 20)
    assert found is not None and not found.standardized  # like no class and unreadable rows left out
    assert threshold_for(cal, [], CLASSES, 10)[0] == cal.threshold(10)
    high = [p._replace(confidence=0.61) for p in rows]
    assert threshold_for(cal, high, CLASSES, 10) == (None, float("inf"))  # none reaches a place that passes


@pytest.mark.parametrize("setting", ["long tail, many hard; 100 held-out a class",
                                     "long tail, many easy; 100 held-out a class"])
def test_the_promise_simulated(setting):
    table, seen, fewer, _ = simulated(setting, draws=100)
    assert seen == 1.0
    assert table["now"][1] <= 0.05  # the share of draws whose accepted images were more than 5% wrong
    if "many easy" in setting:
        assert fewer == 0.0 and table["now"][0] >= table["held-out proportions"][0]
