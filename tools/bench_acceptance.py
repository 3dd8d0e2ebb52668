"""What --max-error's promise costs and keeps, by simulation: held-out images drawn with known error
rates, the acceptance threshold searched on them (calibration.acceptance_threshold, which pays for
its search) beside the lowest of all thresholds whose bound passes at 95% (which does not); and a
held-out set relabeled from the model's own suggestions (the audit's, confirmed with one key), kept,
left out or counted as errors. Prints the three tables of docs/label-the-rest.md.

    python tools/bench_acceptance.py
"""
import sys
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc, kernels, the scripts
from mtlc.use.calibration import acceptance_threshold, error_upper_bound  # noqa: E402


def lowest_passing(confidence, correct, max_error):
    """The share of the held-out images the lowest passing threshold accepts (0: none passes)."""
    order = np.argsort(-confidence, kind="stable")
    conf = confidence[order]
    errors, counts = np.cumsum(~correct[order]), np.arange(1, len(correct) + 1)
    ends = np.flatnonzero(np.r_[conf[1:] != conf[:-1], True])  # never inside a group of equal confidences
    passing = ends[error_upper_bound(errors[ends], counts[ends]) <= max_error]
    return counts[passing[-1]] / len(correct) if len(passing) else 0.0


def searched(confidence, correct, max_error):
    found = acceptance_threshold(confidence, correct, max_error)
    return found.held_out / len(correct) if found else 0.0


def flat(rng, n, error):
    return rng.random(n).round(4), rng.random(n) >= error


def uniform(rng, n):
    confidence = rng.uniform(0.5, 1, n).round(4)
    return confidence, rng.random(n) < confidence


def mostly_confident(rng, n):
    confidence = (1 - rng.beta(1, 12, n) * 0.9).round(4)
    return confidence, rng.random(n) < confidence


def audited(rng, n, share):
    """A held-out set after the audit: calibrated confidences uniform in [0.5, 1] (2 classes: each
    image right with the probability of its confidence, its true error above a threshold t is
    (1 - t) / 2), the model's mistakes flagged (its predicted class is not the label), and the
    `share` of them most doubtful (most confident) relabeled to the model's suggestion. Returns
    (confidences, right against the true labels, relabeled)."""
    confidence = rng.uniform(0.5, 1, n).round(4)
    right = rng.random(n) < confidence
    flagged = np.flatnonzero(~right)
    relabeled = np.zeros(n, bool)
    relabeled[flagged[np.argsort(-confidence[flagged], kind="stable")][:round(share * len(flagged))]] = True
    return confidence, right, relabeled


def broken(found, max_error):
    """Whether a threshold accepts images whose true error is above max_error (audited's model)."""
    return found is not None and (1 - found.confidence) / 2 > max_error / 100


def relabeled_promise(rng, n, share, max_error, trials):
    """The share of draws that break the promise, for the relabeled images kept as held out (their
    new label: right), left out, or counted as errors (calibration.py's way)."""
    counts = np.zeros(3)
    for _ in range(trials):
        confidence, right, relabeled = audited(rng, n, share)
        kept = right | relabeled
        counts += [broken(acceptance_threshold(confidence, kept, max_error), max_error),
                   broken(acceptance_threshold(confidence[~relabeled], right[~relabeled], max_error), max_error),
                   broken(acceptance_threshold(confidence, right & ~relabeled, max_error), max_error)]
    return counts / trials


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Print the three tables of docs/label-the-rest.md (seeded: the same numbers each time; about a
    minute on one core): how often the searched threshold and the lowest passing one accept anything
    at a true error above --max-error, what each accepts of two confidence profiles, and how often
    the promise breaks when audited mistakes relabeled to the model's suggestion are kept, left out,
    or counted as errors."""
    rng = np.random.default_rng(0)
    print("| held-out images | --max-error | true error | accepted anything: this search | the lowest passing threshold |")
    print("| --- | --- | --- | --- | --- |")
    for n, max_error, error in ((200, 5, 0.055), (1000, 5, 0.055), (5000, 5, 0.055), (1000, 10, 0.12)):
        draws = [flat(rng, n, error) for _ in range(1500)]
        ours = np.mean([searched(c, r, max_error) > 0 for c, r in draws])
        theirs = np.mean([lowest_passing(c, r, max_error) > 0 for c, r in draws])
        print(f"| {n:,} | {max_error} | {100 * error:g}% | {100 * ours:.1f}% | {100 * theirs:.1f}% |")
    print()
    print("| confidences | held-out images | --max-error 5 | --max-error 10 |")
    print("| --- | --- | --- | --- |")
    for name, draw in (("uniform in [0.5, 1]", uniform), ("mostly confident (1 - 0.9 Beta(1, 12))", mostly_confident)):
        for n in (1000, 5000):
            draws = [draw(rng, n) for _ in range(200)]
            cells = [f"{100 * np.mean([searched(c, r, e) for c, r in draws]):.1f}% against "
                     f"{100 * np.mean([lowest_passing(c, r, e) for c, r in draws]):.1f}%" for e in (5, 10)]
            print(f"| {name} | {n:,} | {cells[0]} | {cells[1]} |")
    print()
    print("| held-out images | --max-error | mistakes relabeled to the model's suggestion | promise broken: kept | "
          "left out | counted as errors |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n, max_error, share in ((1000, 5, 1.0), (1000, 5, 0.25), (1000, 10, 0.25), (5000, 5, 0.1)):
        kept, left_out, counted = relabeled_promise(rng, n, share, max_error, 1000)
        print(f"| {n:,} | {max_error} | {100 * share:g}% (most doubtful first) | {100 * kept:.1f}% | "
              f"{100 * left_out:.1f}% | {100 * counted:.1f}% |")


if __name__ == "__main__":
    main()
