"""What --max-error's promise costs and keeps, by simulation: held-out images drawn with known error
rates, the acceptance threshold searched on them (calibration.acceptance_threshold, a fixed sequence
of tests, which pays for its search) beside the lowest of all thresholds whose bound passes at 95%
(which does not) and the binary search of selection with guaranteed risk that it replaced; and a
held-out set relabeled from the model's own suggestions (the audit's, confirmed with one key), kept,
left out or counted as errors. Prints the four tables of docs/label-the-rest.md.

    python tools/bench_acceptance.py
"""
import math
import sys
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc, kernels, the scripts
from mtlc.use.calibration import acceptance_threshold, error_upper_bound, ranked  # noqa: E402


def lowest_passing(confidence, correct, max_error):
    """The share of the held-out images the lowest passing threshold accepts (0: none passes)."""
    order = np.argsort(-confidence, kind="stable")
    conf = confidence[order]
    errors, counts = np.cumsum(~correct[order]), np.arange(1, len(correct) + 1)
    ends = np.flatnonzero(np.r_[conf[1:] != conf[:-1], True])  # never inside a group of equal confidences
    passing = ends[error_upper_bound(errors[ends], counts[ends]) <= max_error]
    return counts[passing[-1]] / len(correct) if len(passing) else 0.0


def binary_search(confidence, correct, max_error, level=0.95):
    """The threshold the project searched before the fixed sequence: selection with guaranteed risk's
    binary search over the m places, each test at 1 - (1 - level) / ceil(log2(m + 1)); None: none."""
    conf, errors, counts = ranked(confidence, correct)
    per_test = 1 - (1 - level) / math.ceil(math.log2(len(conf) + 1))
    low = int(np.searchsorted(counts, math.ceil(math.log(1 - per_test) / math.log1p(-max_error / 100) - 1e-9)))
    high, best = len(conf) - 1, None
    while low <= high:
        middle = (low + high) // 2
        if error_upper_bound(errors[middle], counts[middle], per_test) <= max_error:
            best, low = middle, middle + 1
        else:
            high = middle - 1
    return None if best is None else float(conf[best])


def profile(name, rng, n):
    """Calibrated confidences (each image right with the probability of its confidence) of a model."""
    shapes = {"mostly confident (1 - 0.9 Beta(1, 12))": (1, 12), "13% wrong (1 - 0.9 Beta(0.6, 3.5))": (0.6, 3.5),
              "23% wrong (1 - 0.9 Beta(0.8, 2))": (0.8, 2.0)}
    confidence = (1 - rng.beta(*shapes[name], n) * 0.9).round(4)
    return confidence, rng.random(n) < confidence


def sequence_against_binary(rng, name, n, max_error, draws=300):
    """(accepted share, share of draws whose promise broke) of the fixed sequence and of the binary
    search, against the true error of the images at or above each threshold (a large draw of the
    same model)."""
    population = np.sort(profile(name, rng, 300_000)[0])[::-1]
    wrong = np.cumsum(1 - population)

    def truth(t):  # (share accepted, true error %) at threshold t
        k = int(np.searchsorted(-population, -t, side="right"))
        return k / len(population), 100 * wrong[k - 1] / k if k else 0.0
    results = {"fixed sequence": [], "binary search": []}
    for _ in range(draws):
        confidence, correct = profile(name, rng, n)
        found = acceptance_threshold(confidence, correct, max_error)
        for key, t in (("fixed sequence", found.confidence if found else None),
                       ("binary search", binary_search(confidence, correct, max_error))):
            results[key].append(truth(t) if t is not None else (0.0, 0.0))
    return {key: (np.mean([s for s, _ in r]), np.mean([e > max_error for _, e in r])) for key, r in results.items()}


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
    print()
    print("| calibrated model | held-out images | --max-error | accepted: fixed sequence | binary search (before) | "
          "promise broken: fixed sequence | binary search |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in ("mostly confident (1 - 0.9 Beta(1, 12))", "13% wrong (1 - 0.9 Beta(0.6, 3.5))",
                 "23% wrong (1 - 0.9 Beta(0.8, 2))"):
        for n, max_error in ((372, 5), (1000, 5), (1000, 2)):
            r = sequence_against_binary(rng, name, n, max_error)
            print(f"| {name} | {n:,} | {max_error} | {100 * r['fixed sequence'][0]:.1f}% | "
                  f"{100 * r['binary search'][0]:.1f}% | {100 * r['fixed sequence'][1]:.1f}% | "
                  f"{100 * r['binary search'][1]:.1f}% |")


if __name__ == "__main__":
    main()
