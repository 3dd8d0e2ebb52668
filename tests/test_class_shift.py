"""Images predicted in other class proportions than the held-out images are said to be (class_shift.py):
rarely by chance, nearly always for the unbalanced food's profile, and in --predict's lines and JSON."""
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mtlc.use.class_shift import class_shift
from conftest import read_rows, run

CLASSES = [f"c{k}" for k in range(10)]
UNBALANCED_FOOD = np.array([400, 301, 226, 170, 128, 96, 72, 54, 41, 31], float)  # data/photo-foodlt's unlabeled


def predicted_classes(rng, prior, n, right=0.8):
    """n images of classes drawn from prior, each predicted right with probability `right`, else as any
    other class alike (a head's confusions, the same for the held-out images and the others)."""
    truth = rng.choice(len(prior), n, p=prior / prior.sum())
    wrong = rng.random(n) > right
    other = (truth + rng.integers(1, len(prior), n)) % len(prior)
    return np.where(wrong, other, truth)


@pytest.mark.parametrize("held_out, images", [(24, 240), (240, 860), (1000, 3900), (1000, 100_000)])
def test_equal_proportions_are_rarely_called_apart(held_out, images):
    rng, equal = np.random.default_rng(held_out), np.ones(10)
    alarms = sum(class_shift(predicted_classes(rng, equal, held_out),
                             np.bincount(predicted_classes(rng, equal, images), minlength=10), CLASSES) is not None
                 for _ in range(400))
    assert alarms <= 3  # p < 0.001 alone allows 0.4 of 400; the distance of a tenth cuts more


@pytest.mark.parametrize("held_out, images, found", [(100, 1000, 0.85), (1000, 1419, 0.99)])
def test_a_long_tail_beside_a_balanced_test_folder_is_found(held_out, images, found):
    rng = np.random.default_rng(images)
    hits = [class_shift(predicted_classes(rng, np.ones(10), held_out),
                        np.bincount(predicted_classes(rng, UNBALANCED_FOOD, images), minlength=10), CLASSES)
            for _ in range(200)]
    assert np.mean([h is not None for h in hits]) >= found
    assert Counter(h.apart[0][0] for h in hits if h).most_common(1)[0][0] == "c0"  # the largest class, most apart


def test_a_small_difference_among_many_images_is_not_said():
    held, mine = np.repeat(np.arange(10), 1000), np.full(10, 10_000)
    mine[0], mine[1] = 11_500, 8_500  # 1.5% of the images in another class: certain, but small
    assert class_shift(held, mine, CLASSES) is None


@pytest.mark.slow
def test_predict_says_so_and_its_json_holds_it(trained, tmp_path):
    data, ckpt = trained
    alike = run("evaluate.py", "--ckpt", ckpt, "--predict", data / "test", "--csv", tmp_path / "p.csv",
                "--max-error", "60", "--json")
    assert alike.returncode == 0, alike.stderr
    assert json.loads(alike.stdout.splitlines()[-1])["class_shift"] is None  # the held-out images themselves
    rows = read_rows((tmp_path / "p.csv").read_text(), ["accepted"])
    rarest = min(Counter(r["prediction"] for r in rows).items(), key=lambda kv: kv[1])[0]
    copies = tmp_path / "copies"
    copies.mkdir()
    for r in rows:
        if r["prediction"] == rarest:
            for k in range(30):
                shutil.copyfile(r["path"], copies / f"{k}-{Path(r['path']).name}")
    apart = run("evaluate.py", "--ckpt", ckpt, "--predict", copies, "--csv", tmp_path / "c.csv", "--max-error", "60",
                "--json")
    assert apart.returncode == 0, apart.stderr
    summary = json.loads(apart.stdout.splitlines()[-1])
    shift = summary["class_shift"]
    # the threshold is then for the images' own proportions (label_shift.py), and the line says so
    assert ("the images' error in their own class proportions" in apart.stderr) == (summary["threshold"] is not None)
    held_share = sum(r["prediction"] == rarest for r in rows) / len(rows)
    assert shift["most_apart"][rarest] == [1.0, pytest.approx(held_share, abs=1e-4)]
    assert shift["total_variation"] >= 0.5 and shift["p_value"] < 1e-3
    assert "not in the held-out test images' proportions" in apart.stderr
