"""The promise of --max-error where the images' classes come in other proportions than the held-out
images' (mtlc/use/label_shift.py), by simulation: ten classes from easy to hard, each a calibrated
network's confidences on it (a class's accuracy from about 97% down to about 70%), held-out images in
equal proportions, the images in a long tail (400 to 31 a class, as the unbalanced food), its many
classes the easy ones or the hard ones, or in equal proportions. Per draw: the threshold as
`--predict` now finds it (standardized where class_shift.py sees the shift) and as it did before (the
held-out images' proportions), what each accepts of the images and how wrong that is expected to be
(each image's confidence is its chance of being right), beside what a search knowing that could
accept. Prints one table row per setting (docs/label-in-rounds.md).

    python tools/simulate_label_shift.py --draws 400
"""
import sys
from pathlib import Path
from types import SimpleNamespace

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc
from mtlc.use.calibration import DECIMALS, acceptance_threshold  # noqa: E402
from mtlc.use.label_shift import standardized_bound  # noqa: E402

CLASSES = [f"c{k}" for k in range(10)]
EASE = np.linspace(3.6, 0.9, len(CLASSES))  # a class's mean logit of its confidence: easy first
LONG_TAIL = 400 * (31 / 400) ** (np.arange(len(CLASSES)) / (len(CLASSES) - 1))
MAX_ERROR = 5.0


def drawn(rng, per_class):
    """(class, predicted class, confidence, right) of images, per_class of each class."""
    y = np.repeat(np.arange(len(CLASSES)), per_class)
    confidence = 1 / (1 + np.exp(-(EASE[y] + rng.normal(0, 1.3, len(y)))))
    confidence = np.round(np.maximum(confidence, 1 / len(CLASSES)), DECIMALS)
    right = rng.random(len(y)) < confidence  # calibrated within each class
    other = (y + rng.integers(1, len(CLASSES), len(y))) % len(CLASSES)
    return y, np.where(right, y, other), confidence, right


def outcomes(rng, held_per_class, images_per_class):
    """{search: (share of the images accepted, their actual error %)} for one draw."""
    held_y, held_predicted, held_confidence, held_right = drawn(rng, held_per_class)
    _, predicted, confidence, right = drawn(rng, images_per_class)
    cal = SimpleNamespace(labels=held_y, predicted=held_predicted, confidence=held_confidence, correct=held_right)
    standardized = standardized_bound(cal, confidence, predicted, CLASSES)
    found = {"now": acceptance_threshold(held_confidence, held_right, MAX_ERROR, standardized=standardized),
             "held-out proportions": acceptance_threshold(held_confidence, held_right, MAX_ERROR)}
    result = {}
    for name, threshold in found.items():
        accepted = confidence >= threshold.confidence if threshold else np.zeros(len(confidence), bool)
        result[name] = (accepted.mean(), 100 * (1 - confidence[accepted]).mean() if accepted.any() else 0.0)
    result["shift seen"] = (float(standardized is not None), 0.0)
    # the most a search that knew the truth could accept: the lowest threshold whose images' error is at most 5%
    ranked_error = np.cumsum(1 - np.sort(confidence)[::-1]) / np.arange(1, len(confidence) + 1)
    result["knowing the truth"] = ((ranked_error <= MAX_ERROR / 100).nonzero()[0].max(initial=-1) + 1) / len(confidence), 0.0
    return result


SETTINGS = {  # name: (held-out images a class, the images a class)
    "long tail, many easy; 100 held-out a class": (100, np.round(LONG_TAIL).astype(int)),
    "long tail, many hard; 100 held-out a class": (100, np.round(LONG_TAIL[::-1]).astype(int)),
    "long tail, many easy; 30 held-out a class": (30, np.round(LONG_TAIL).astype(int)),
    "long tail, many hard; 30 held-out a class": (30, np.round(LONG_TAIL[::-1]).astype(int)),
    "long tail x7, many hard; 100 held-out a class": (100, np.round(7 * LONG_TAIL[::-1]).astype(int)),
    "mild tail (200 to 100), many hard; 100 held-out a class": (100, np.round(np.geomspace(100, 200, 10)).astype(int)),
    "equal proportions; 100 held-out a class": (100, np.full(len(CLASSES), 142)),
}


def simulated(name, draws, seed=0):
    """{search: (mean share accepted, share of draws whose accepted images were more than MAX_ERROR wrong)}
    and the share of draws the shift was seen in, for one setting."""
    rng = np.random.default_rng(seed)
    runs = [outcomes(rng, *SETTINGS[name]) for _ in range(draws)]
    table = {search: (np.mean([r[search][0] for r in runs]), np.mean([r[search][1] > MAX_ERROR for r in runs]))
             for search in ("now", "held-out proportions")}
    fewer = np.mean([r["now"][0] < r["held-out proportions"][0] for r in runs])
    return table, np.mean([r["shift seen"][0] for r in runs]), fewer, np.mean([r["knowing the truth"][0] for r in runs])


@click.command()
@click.option("--draws", default=400, show_default=True)
def main(draws):
    print("| setting | shift seen | accepted: now | promise broken: now | accepted: held-out proportions "
          "| promise broken: held-out proportions | draws now accepted fewer | knowing the truth |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in SETTINGS:
        table, seen, fewer, best = simulated(name, draws)
        (now, now_broken), (before, before_broken) = table["now"], table["held-out proportions"]
        print(f"| {name} | {seen:.0%} | {now:.1%} | {now_broken:.1%} | {before:.1%} | {before_broken:.1%} | {fewer:.1%} | {best:.1%} |")


if __name__ == "__main__":
    main()
