"""What --max-error's promise costs and keeps, by simulation: held-out images drawn with known error
rates, the acceptance threshold searched on them (calibration.acceptance_threshold, the fallback
procedure, which pays for its search) beside the lowest of all thresholds whose bound passes at 95%
(which does not), and beside the two searches it replaced: the fixed sequence that stopped at its
first failure and the binary search of selection with guaranteed risk before it, with and without
confident mistakes among the most confident images; and a held-out set relabeled from the model's
own suggestions (the audit's, confirmed with one key), kept, left out or counted as errors. Prints
the four tables of docs/label-the-rest.md.

    python tools/bench_acceptance.py
"""
import math
import sys
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc, kernels, the scripts
from mtlc.use.calibration import acceptance_threshold, error_upper_bound, first_place, ranked  # noqa: E402


def lowest_passing(confidence, correct, max_error):
    """The share of the held-out images the lowest passing threshold accepts (0: none passes)."""
    order = np.argsort(-confidence, kind="stable")
    conf = confidence[order]
    errors, counts = np.cumsum(~correct[order]), np.arange(1, len(correct) + 1)
    ends = np.flatnonzero(np.r_[conf[1:] != conf[:-1], True])  # never inside a group of equal confidences
    passing = ends[error_upper_bound(errors[ends], counts[ends]) <= max_error]
    return counts[passing[-1]] / len(correct) if len(passing) else 0.0


def binary_search(confidence, correct, max_error, level=0.95):
    """The threshold the project searched first: selection with guaranteed risk's binary search over
    the m places, each test at 1 - (1 - level) / ceil(log2(m + 1)); None: none."""
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


def fixed_sequence(confidence, correct, max_error, level=0.95):
    """The threshold the project searched next: one run of tests at the whole level from the first
    place (calibration.first_place), down until the first that fails; None: none."""
    conf, errors, counts = ranked(confidence, correct)
    best = None
    for place in range(int(np.searchsorted(counts, first_place(len(correct), max_error, level))), len(conf)):
        if error_upper_bound(errors[place], counts[place], level) > max_error:
            break
        best = float(conf[place])
    return best


def fallback(confidence, correct, max_error):
    found = acceptance_threshold(confidence, correct, max_error)
    return found.confidence if found else None


SEARCHES = {"fallback procedure (now)": fallback, "fixed sequence (before)": fixed_sequence,
            "binary search (before that)": binary_search}


def profile(name, rng, n):
    """Calibrated confidences (each image right with the probability of its confidence) of a model."""
    shapes = {"mostly confident (1 - 0.9 Beta(1, 12))": (1, 12), "13% wrong (1 - 0.9 Beta(0.6, 3.5))": (0.6, 3.5),
              "23% wrong (1 - 0.9 Beta(0.8, 2))": (0.8, 2.0)}
    confidence = (1 - rng.beta(*shapes[name], n) * 0.9).round(4)
    return confidence, rng.random(n) < confidence


def with_top_mistakes(confidence, correct, share):
    """The same images with the `share` most confident of them wrong: confident mistakes at the top
    (a mislabeled or truly ambiguous image the model is sure of)."""
    correct = correct.copy()
    correct[np.argsort(-confidence, kind="stable")[:round(share * len(correct))]] = False
    return confidence, correct


def compare_searches(rng, name, n, max_error, top_mistakes=0.0, draws=300):
    """{search: (accepted share, share of draws whose promise broke)} against the true error of the
    images at or above each threshold (a large draw of the same model, its top as wrong)."""
    population = with_top_mistakes(*profile(name, rng, 300_000), top_mistakes)
    order = np.argsort(-population[0], kind="stable")
    confident, wrong = population[0][order], np.cumsum(~population[1][order])

    def truth(t):  # (share accepted, true error %) at threshold t
        k = int(np.searchsorted(-confident, -t, side="right"))
        return k / len(confident), 100 * wrong[k - 1] / k if k else 0.0
    results = {key: [] for key in SEARCHES}
    for _ in range(draws):
        confidence, correct = with_top_mistakes(*profile(name, rng, n), top_mistakes)
        for key, search in SEARCHES.items():
            t = search(confidence, correct, max_error)
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
    """Print the four tables of docs/label-the-rest.md (seeded: the same numbers each time; a few
    minutes on one core): how often the searched threshold and the lowest passing one accept anything
    at a true error above --max-error, what each accepts of two confidence profiles, how often the
    promise breaks when audited mistakes relabeled to the model's suggestion are kept, left out, or
    counted as errors, and the search against the two it replaced (--max-error 5)."""
    rng = np.random.default_rng(0)
    print("| held-out images | --max-error | true error | accepted anything: this search | the lowest passing threshold |")
    print("| --- | --- | --- | --- | --- |")
    settings = ((200, 5, 0.055), (1000, 5, 0.055), (3000, 5, 0.055), (5000, 5, 0.055), (1000, 10, 0.12))
    for n, max_error, error in settings:
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
    print("| calibrated model | held-out images | confident mistakes at the top | accepted: fallback procedure (now) "
          "| fixed sequence (before) | binary search (before that) | promise broken: now | fixed | binary |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in ("mostly confident (1 - 0.9 Beta(1, 12))", "13% wrong (1 - 0.9 Beta(0.6, 3.5))",
                 "23% wrong (1 - 0.9 Beta(0.8, 2))"):
        for n, top in ((200, 0.0), (372, 0.0), (1000, 0.0), (1000, 0.0015), (3000, 0.0), (3000, 0.0015)):
            r = list(compare_searches(rng, name, n, 5, top).values())
            print(f"| {name} | {n:,} | {100 * top:g}% | " + " | ".join(f"{100 * a:.1f}%" for a, _ in r) + " | "
                  + " | ".join(f"{100 * b:.1f}%" for _, b in r) + " |")


if __name__ == "__main__":
    main()
