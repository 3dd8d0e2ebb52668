"""Chance level is judged in counts of wrong images, with one wording for one situation: no better
than always answering the most frequent class, or too few images to tell; and every finding of the
audit that rests on a network says so when that network is at chance."""
import numpy as np
import pytest
import torch

from conftest import run
from fakedata import write_own_folder
from mtlc.train.inference import chance_verdict, chance_words
from mtlc.use import audit as audit_module


def test_exactly_chance_is_no_better_whatever_the_float():
    labels = np.repeat([0, 1, 2, 3], [40, 30, 30, 20])  # chance: 80 of 120 wrong
    error = 100 * float(np.mean(np.arange(120) < 80))  # 66.666...%: a float a hair under 200/3
    assert chance_verdict(error, labels) == chance_verdict(200 / 3, labels) == "no better"
    lines = []  # networks that always answer the most frequent class: train the folds longer
    audit_module.warn_at_chance(torch.nn.functional.one_hot(torch.zeros(120, dtype=torch.long), 4).float(), labels,
                                600, lines.append)
    assert len(lines) == 1 and "no better than" in lines[0] and "--audit-steps more than 600" in lines[0], lines


def test_three_labels_are_too_few_to_tell_not_nothing_learned():
    labels = [0, 1, 2]  # one image a class: chance 2 of 3 wrong
    assert chance_verdict(100 / 3, labels) == "unclear" and chance_verdict(0.0, labels) is None
    assert chance_verdict(200 / 3, labels) == "no better"
    words = chance_words("unclear", 100 / 3, labels)
    assert words.startswith("33.3% wrong, which cannot be told from") and "on 3 images" in words


@pytest.mark.parametrize("right, verdict", [(0.0, "no better"), (1.0, None)])
def test_the_audit_warns_where_the_checkpoints_teacher_is_at_chance_on_test(right, verdict):
    labels = np.repeat([0, 1, 2], 8)
    predicted = np.where(np.arange(24) < 24 * right, labels, (labels + 1) % 3)
    lines = []
    audit_module.warn_teacher_at_chance("test/", torch.nn.functional.one_hot(torch.from_numpy(predicted), 3).float(),
                                        labels, lines.append)
    assert len(lines) == (verdict is not None)
    assert all("the checkpoint's teacher is 100.0% wrong, no better than" in line and "on test/" in line
               and "outliers by its features are a guess" in line for line in lines), lines


@pytest.mark.slow
def test_an_audit_of_a_checkpoint_at_chance_says_so(tmp_path):
    """A teacher trained at a learning rate that moves nothing answers one class: the audit's doubtful
    test/ labels are said to rest on a network at chance."""
    write_own_folder(tmp_path / "d", n_labeled=4, n_unlabeled=12, n_test=4)
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--consistency", "mt", "--data-dir", tmp_path / "d", "--width",
              "0.125", "--labeled-batch", "8", "--unlabeled-batch", "8", "--epochs", "1", "--decay-epochs", "0",
              "--lr", "1e-9", "--device", "cpu", "--out", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    res = run("evaluate.py", "--ckpt", tmp_path / "run" / "mt_final.pt", "--audit", tmp_path / "audit.csv",
              "--audit-folds", "2", "--audit-steps", "10")
    assert res.returncode == 0, res.stderr
    assert "warning: audit: the checkpoint's teacher is" in res.stderr and "on test/" in res.stderr, res.stderr
