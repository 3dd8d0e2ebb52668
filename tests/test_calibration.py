"""Temperature scaling, the expected calibration error and the acceptance threshold against
independent references: labels drawn from known probabilities, scipy's exact binomial intervals,
hand-made rankings."""
import numpy as np
import pytest
from scipy.stats import binomtest

from calibration import (Calibration, acceptance_threshold, confidences, cross_fitted_ece, error_upper_bound,
                         errors_at_coverage, expected_calibration_error, fit_temperature)


def calibrated_logits(n, classes=10, seed=0):
    """Logits and labels drawn from softmax(logits): a perfectly calibrated model."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, (n, classes))
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = (probs.cumsum(1) > rng.random((n, 1))).argmax(1)
    return logits, labels


@pytest.mark.parametrize("temperature", [0.4, 1.0, 2.5])
def test_temperature_fitting_recovers_a_known_temperature(temperature):
    logits, labels = calibrated_logits(6000, seed=1)
    assert fit_temperature(logits * temperature, labels) == pytest.approx(temperature, rel=0.05)


def test_a_calibrated_model_has_a_small_ece_an_overconfident_one_a_large_one():
    logits, labels = calibrated_logits(6000, seed=2)
    predicted, confidence = confidences(logits)
    assert expected_calibration_error(confidence, predicted == labels) < 2.5
    predicted, confidence = confidences(logits * 3)
    assert expected_calibration_error(confidence, predicted == labels) > 15
    before, after = cross_fitted_ece(logits * 3, labels)
    assert before > 15 and after < 3


def test_ece_by_hand():
    # bin [0.6, 0.667): two images at 0.6 and 0.65, one right: |0.5 - 0.625|; bin [0.933, 1]: 0.95, right: 0.05
    ece = expected_calibration_error([0.6, 0.65, 0.95], [True, False, True])
    assert ece == pytest.approx(100 * (2 / 3 * 0.125 + 1 / 3 * 0.05))


def test_the_upper_bound_is_the_exact_binomial_one():
    for errors, count in [(0, 1), (0, 30), (3, 40), (17, 200), (5, 5)]:
        reference = binomtest(errors, count).proportion_ci(confidence_level=0.90, method="exact").high  # 5% per side
        assert error_upper_bound(errors, count) == pytest.approx(100 * reference, abs=1e-9)


def brute_force_threshold(confidence, correct, max_error):
    best = None
    for t in sorted(set(confidence), reverse=True):
        above = [c for conf, c in zip(confidence, correct) if conf >= t]
        wrong = sum(not c for c in above)
        if 100 * binomtest(wrong, len(above)).proportion_ci(confidence_level=0.90, method="exact").high <= max_error:
            best = (t, len(above), 100 * wrong / len(above))
    return best


def test_the_threshold_on_a_hand_made_ranking():
    # the 60 most confident are right, then every other one is wrong
    confidence = [round(1 - i / 200, 4) for i in range(100)]
    correct = [i < 60 or i % 2 == 0 for i in range(100)]
    for max_error in (5, 10, 20, 40):
        found = acceptance_threshold(confidence, correct, max_error)
        t, count, error = brute_force_threshold(confidence, correct, max_error)
        assert (found.confidence, found.held_out) == (t, count) and found.error == pytest.approx(error)
        assert found.bound <= max_error
    assert acceptance_threshold(confidence, correct, 10).held_out == 65  # 2 wrong of 65: bound 9.4%


def test_a_handful_of_images_cannot_set_a_threshold():
    # 5 right of 5: a point error of 0%, but up to 45% with 95% confidence; 29 right: up to 9.8%
    assert acceptance_threshold([0.99, 0.98, 0.97, 0.96, 0.95], [True] * 5, 10) is None
    found = acceptance_threshold(np.linspace(0.99, 0.9, 29).round(4), [True] * 29, 10)
    assert found.held_out == 29 and found.error == 0 and found.bound < 10


def test_equal_confidences_are_cut_together():
    confidence = [0.9] * 40 + [0.8] * 40
    correct = [True] * 40 + [True] * 20 + [False] * 20
    found = acceptance_threshold(confidence, correct, 10)
    assert (found.confidence, found.held_out) == (0.9, 40)
    assert errors_at_coverage(confidence, correct, (10, 50, 60, 100)) == {10: 0.0, 50: 0.0, 60: 25.0, 100: 25.0}


def test_calibration_summary():
    logits, labels = calibrated_logits(2000, seed=3)
    cal = Calibration.fit(logits * 2, labels, "test")
    summary = cal.summary()
    assert summary["temperature"] == pytest.approx(2, rel=0.1) and summary["n_held_out"] == 2000
    assert summary["ece_after"] < summary["ece_before"]
    assert list(summary["error_at_coverage"]) == [str(c) for c in range(10, 101, 10)]
    errors = list(summary["error_at_coverage"].values())
    assert errors[0] < errors[-1]  # the most confident are the most often right
    assert errors[-1] == pytest.approx(100 * np.mean(logits.argmax(1) != labels))
