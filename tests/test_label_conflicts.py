"""The same image under two labels is a label conflict, not a plain copy: training says so, the audit
names both classes in a row of its own kind, and label.py's --set-aside of the copies leaves both."""
import csv
import io
import shutil

import numpy as np
import pytest

from conftest import run, snapshot
from fakedata import write_own_folder
from mtlc.data.copies import label_conflicts
from mtlc.data.datasets import load_dataset

TRAIN = ["--dataset", "folder", "--backbone", "convlarge", "--consistency", "mt", "--width", "0.125", "--labeled-batch", "8",
         "--unlabeled-batch", "8", "--epochs", "2", "--decay-epochs", "1", "--device", "cpu"]


def conflicted_folder(root):
    """A folder whose labeled/cat/0.png is also labeled/dog/same.png (the same bytes), whose test/owl/0.png
    is also labeled/cat/from-test.png, and whose unlabeled/u0000.png is also unlabeled/again.png."""
    write_own_folder(root, n_labeled=4, n_unlabeled=12, n_test=2)
    shutil.copyfile(root / "labeled/cat/0.png", root / "labeled/dog/same.png")
    shutil.copyfile(root / "test/owl/0.png", root / "labeled/cat/from-test.png")
    shutil.copyfile(root / "unlabeled/u0000.png", root / "unlabeled/again.png")
    return root


def test_copies_that_disagree_on_their_class_are_found_and_copies_that_agree_are_not(tmp_path):
    folder = conflicted_folder(tmp_path / "d")
    shutil.copyfile(folder / "labeled/owl/1.png", folder / "labeled/owl/twice.png")  # one class: a plain copy
    data = load_dataset("folder", folder, echo=lambda *a, **k: None)
    found = {frozenset([(a, ca), (b, cb)]) for a, ca, b, cb, _ in label_conflicts(data)}
    assert found == {frozenset([("labeled/cat/0.png", "cat"), ("labeled/dog/same.png", "dog")]),
                     frozenset([("labeled/cat/from-test.png", "cat"), ("test/owl/0.png", "owl")])}


@pytest.mark.slow
def test_training_says_so_the_audit_names_both_classes_and_nothing_sets_one_aside(tmp_path):
    folder = conflicted_folder(tmp_path / "d")
    res = run("train_mt.py", *TRAIN, "--data-dir", folder, "--out", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    assert "warning: 2 labeled or test images are copies of one under another class" in res.stdout
    assert "labeled/dog/same.png (dog) and labeled/cat/0.png (cat)" in res.stdout, res.stdout
    res = run("evaluate.py", "--ckpt", tmp_path / "run" / "mt_final.pt", "--audit", tmp_path / "audit.csv",
              "--audit-folds", "2", "--audit-steps", "20")
    assert res.returncode == 0, res.stderr
    assert "audit: 2 copies under two labels (one of the two is wrong)" in res.stderr, res.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "audit.csv").read_text())))
    conflicts = {r["path"].split("/d/")[-1]: r for r in rows if r["kind"] == "conflict"}
    assert set(conflicts) == {"labeled/dog/same.png", "test/owl/0.png"}, rows
    same = conflicts["labeled/dog/same.png"]
    assert same["given"] == "dog" and same["suggestion"].endswith("labeled/cat/0.png")
    assert "exact: the same bytes" in same["detail"] and "dog" in same["detail"] and "cat" in same["detail"]
    copied = [r for r in rows if r["kind"] in ("duplicate", "leak")]
    assert len(copied) == 1 and {copied[0][k].split("/d/")[-1] for k in ("path", "suggestion")} == {
        "unlabeled/again.png", "unlabeled/u0000.png"}, copied
    before = snapshot(folder)[0]
    res = run("label.py", "--data-dir", folder, "--apply", tmp_path / "audit.csv", "--set-aside", "duplicate,leak")
    assert res.returncode == 0 and "moved 1 image into set-aside/ (1)" in res.stdout, res.stdout + res.stderr
    after = snapshot(folder)[0]
    assert {p for p in before if p not in after} == {copied[0]["path"].split("/d/")[-1]}


def test_the_labeled_images_are_read_a_batch_at_a_time_never_gathered_at_once(monkeypatch):
    """900,000 labeled images (label.py accepted most of a million) gathered at once held 2.7 GB: the
    labeled ones are a subset of the images, read a batch at a time as a search asks for them."""
    import torch

    from mtlc.data import batches
    from mtlc.data.batches import ImageRows
    train, test = (torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8) for n in (50, 7))
    everything, at = torch.cat([train, test]), np.array([1, 4, 9, 30, 49, 50, 56])
    subset = ImageRows(train, test).subset(at)
    assert len(subset) == 7 and torch.equal(subset.gather([6, 0]), everything[[56, 1]])
    monkeypatch.setattr(batches, "PASS_BYTES", 3 * 192)  # 3 images a batch
    assert [len(b) for b in subset.batches()] == [3, 3, 1]
    assert torch.equal(torch.cat(list(subset.batches())), everything[at])
    assert torch.equal(subset.subset([2, 5]).gather([1, 0]), everything[[50, 9]])
