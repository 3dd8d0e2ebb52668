"""What a folder, a checkpoint or a file name from a stranger can do, tried through the scripts:
nothing in them runs code (a crafted CIFAR-10 batch or checkpoint), opens a program (PostScript
named .png), hangs a run (a pipe named like an image), or ends in a traceback (a config without its
keys, names that are not UTF-8 under a strict output encoding); and what the labeling loop needs of
a folder after label.py has changed it."""
import csv
import errno
import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from mtlc.data import datasets as data_module
from mtlc.disk import runs
import evaluate
import train_mt
from conftest import ROOT, invoke, read_rows, run
from fakedata import write_cifar10
from mtlc.errors import UserError


class RunsCode:
    """Pickled, it asks the unpickler to call os.system: a file appears if it does."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_cifar10_batch_runs_nothing(tmp_path):
    write_cifar10(tmp_path / "c")
    marker = tmp_path / "ran"
    with open(tmp_path / "c" / "cifar-10-batches-py" / "data_batch_2", "wb") as f:
        pickle.dump({b"data": RunsCode(marker), b"labels": []}, f, protocol=2)
    res = run("train_mt.py", "--dataset", "cifar10", "--data-dir", tmp_path / "c", "--epochs", "1", "--out", tmp_path / "r")
    assert res.returncode == 2 and "Traceback" not in res.stderr and not marker.exists()
    assert "data_batch_2" in res.stderr and "could run code" in res.stderr and "system" in res.stderr


@pytest.mark.slow
def test_a_checkpoint_naming_a_crafted_cifar10_folder_runs_nothing(tmp_path):
    write_cifar10(tmp_path / "c")
    res = run("train_mt.py", "--dataset", "cifar10", "--data-dir", tmp_path / "c", "--labels", "20", "--width", "0.0625",
              "--epochs", "1", "--decay-epochs", "0", "--unlabeled-batch", "64", "--labeled-batch", "10", "--device", "cpu",
              "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr
    marker = tmp_path / "ran"
    with open(tmp_path / "c" / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({b"data": RunsCode(marker), b"labels": []}, f, protocol=2)
    res = run("evaluate.py", "--ckpt", tmp_path / "r" / "mt_final.pt")
    assert res.returncode == 2 and "Traceback" not in res.stderr and not marker.exists() and "test_batch" in res.stderr


def test_cifar10_batches_as_python_2_wrote_them_are_read(tmp_path):
    """The real files come from Python 2's pickle of numpy arrays (numpy.core.multiarray, str data):
    the allow-list reads them."""
    written = write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    path.write_bytes(path.read_bytes().replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    x, y = data_module.read_cifar10_batch(path)
    assert np.array_equal(x.reshape(len(x), -1), written["data_batch_1"][0]) and y.tolist() == written["data_batch_1"][1]


@pytest.mark.parametrize("batch, message", [
    ({b"data": np.zeros((2, 3072), object), b"labels": [0, 1]}, "not a uint8 array"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, "one class 0-9"),
    ([1, 2, 3], "TypeError"),
])
def test_a_cifar10_batch_of_the_wrong_form_is_refused(tmp_path, batch, message):
    path = tmp_path / "b"
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)
    with pytest.raises(UserError, match=message):
        data_module.read_cifar10_batch(path)


def write_postscript(path):
    path.write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nnewpath 0 0 moveto 10 10 lineto stroke\n"
                     b"showpage\n%%EOF\n")


@pytest.mark.slow
def test_postscript_named_png_is_a_bad_file_not_a_ghostscript_run(trained, tmp_path):
    data, ckpt = trained
    (tmp_path / "p").mkdir()
    write_postscript(tmp_path / "p" / "x.png")
    with Image.open(tmp_path / "p" / "x.png") as img:  # what Pillow would do by itself: EPS, through Ghostscript
        assert img.format == "EPS"
    Image.new("RGB", (20, 20)).save(tmp_path / "p" / "ok.png")
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", tmp_path / "p", "--skip-bad-images")
    assert res.returncode == 0 and "x.png: not an image in a format read here" in res.stderr, res.stderr
    rows = {os.path.basename(r["path"]): r["prediction"] for r in csv.DictReader(io.StringIO(res.stdout))}
    assert rows["x.png"] == "" and rows["ok.png"] in ("cat", "dog", "owl")
    assert run("evaluate.py", "--ckpt", ckpt, "--predict", tmp_path / "p").returncode == 1  # without the flag: 1


@pytest.mark.slow
def test_a_pipe_named_like_an_image_never_hangs(trained, tmp_path):
    data, ckpt = trained
    (tmp_path / "p").mkdir()
    os.mkfifo(tmp_path / "p" / "pipe.png")
    Image.new("RGB", (20, 20)).save(tmp_path / "p" / "ok.png")
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", tmp_path / "p", timeout=120)
    assert res.returncode == 0 and "1 file that is not an image ignored" in res.stderr, res.stderr
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", tmp_path / "p" / "pipe.png", timeout=120)
    assert res.returncode == 1 and "not a regular file" in res.stderr


@pytest.mark.slow
def test_a_checkpoint_that_runs_code_or_lacks_keys_is_one_line(trained, tmp_path):
    _, ckpt = trained
    state = torch.load(ckpt, weights_only=True)
    marker = tmp_path / "ran"
    torch.save(dict(state, extra=RunsCode(marker)), tmp_path / "evil.pt")
    res = run("evaluate.py", "--ckpt", tmp_path / "evil.pt")
    assert res.returncode == 2 and not marker.exists() and "Traceback" not in res.stderr
    assert "system" in res.stderr and "could run code" in res.stderr, res.stderr  # the reason, not torch's advice
    for broken in (dict(state["config"], mean=None), {k: v for k, v in state["config"].items() if k != "classes"}):
        torch.save(dict(state, config=broken), tmp_path / "broken.pt")
        for script in (("evaluate.py", "--ckpt"), ("finetune_lc.py", "--ckpt")):
            res = run(*script, tmp_path / "broken.pt")
            assert res.returncode == 2 and "Traceback" not in res.stderr and "its config lacks" in res.stderr, res.stderr


def test_a_file_system_without_locks_is_one_line(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    monkeypatch.setattr(runs.fcntl, "flock", no_locks)
    with pytest.raises(UserError, match="No locks available"):
        with runs.run_folder(tmp_path / "out", "test"):
            pass
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_names_that_are_not_utf8_predict_losslessly_under_a_strict_encoding(trained, tmp_path):
    data, ckpt = trained
    (tmp_path / "p").mkdir()
    bad = os.fsencode(tmp_path / "p") + b"/bad\xff.png"
    Image.new("RGB", (20, 20), (200, 10, 10)).save(bad)
    (tmp_path / "p" / "broken\udcfe.png").write_bytes(b"not an image")
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", tmp_path / "p", "--skip-bad-images",
              env=dict(PYTHONIOENCODING="utf-8:strict"))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert str(tmp_path / "p" / "bad\udcff.png") in res.stdout  # the name's own bytes, read back by surrogateescape
    assert "cannot read" in res.stderr and "broken" in res.stderr
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", tmp_path / "p", "--csv", tmp_path / "p.csv",
              env=dict(PYTHONIOENCODING="utf-8:strict"))
    assert res.returncode == 1 and bad in (tmp_path / "p.csv").read_bytes()


def copy_of(folder, tmp_path):
    shutil.copytree(folder, tmp_path / "d", ignore=shutil.ignore_patterns("mtlc-cache"))
    return tmp_path / "d"


@pytest.mark.slow
def test_after_label_py_the_test_images_still_calibrate(trained, tmp_path):
    """label.py moved files from unlabeled/ to labeled/: the checkpoint's training files changed, but
    its held-out test/ did not, so --max-error calibrates on it; when test/ changed too, the reason
    is said."""
    data, ckpt = trained
    folder = copy_of(data, tmp_path)
    (tmp_path / "l.csv").write_text("path,label\nunlabeled/u0000.png,cat\nunlabeled/u0003.png,dog\n")
    assert run("label.py", "--data-dir", folder, "--apply", tmp_path / "l.csv").returncode == 0
    res = run("evaluate.py", "--ckpt", ckpt, "--data-dir", folder, "--predict", folder / "unlabeled", "--max-error", "60",
              "--csv", tmp_path / "p.csv")
    assert res.returncode == 0 and "on 24 held-out test images" in res.stderr and "accepted" in res.stderr, res.stderr
    (folder / "test" / "cat" / "0.png").unlink()
    res = run("evaluate.py", "--ckpt", ckpt, "--data-dir", folder, "--predict", folder / "unlabeled", "--max-error", "60")
    assert res.returncode == 2 and "need the checkpoint's held-out labeled images" in res.stderr
    assert "1 missing (test/cat/0.png)" in res.stderr, res.stderr


@pytest.mark.slow
def test_an_image_edited_in_place_with_its_time_put_back_is_noticed(trained, tmp_path):
    data, ckpt = trained
    folder = copy_of(data, tmp_path)
    path = folder / "labeled" / "cat" / "1.png"
    stamp = path.stat()
    Image.new("RGB", (40, 30), (1, 2, 3)).save(path)  # one colour: far smaller than the noisy original
    with open(path, "ab") as f:
        f.write(b"\0" * (stamp.st_size - path.stat().st_size))  # same size: PNG ignores bytes after IEND
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert path.stat().st_size == stamp.st_size and path.stat().st_mtime_ns == stamp.st_mtime_ns
    res = run("evaluate.py", "--ckpt", ckpt, "--data-dir", folder, "--json")
    assert res.returncode == 2 and "hold other bytes" in res.stderr, res.stderr
    res = run("finetune_lc.py", "--ckpt", ckpt, "--data-dir", folder, "--epochs", "1", "--out", tmp_path / "lc")
    assert res.returncode == 2 and "hold other bytes" in res.stderr


def test_the_checkpoint_records_its_contents(trained):
    _, ckpt = trained
    config = torch.load(ckpt, weights_only=True)["config"]
    assert set(config["contents"]) == {"train", "test"} and all(len(v) == 64 for v in config["contents"].values())
    json.dumps(config["contents"])


def test_an_output_never_replaces_an_input_or_another_output(tmp_path):
    """--csv naming the checkpoint, --csv and --review naming one file, a figure over --truth: each
    refused in one line before any work, every file as it was."""
    ckpt = tmp_path / "mt.pt"
    ckpt.write_bytes(b"a checkpoint")
    (tmp_path / "p").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "p" / "x.png")
    for args, message in (
            (["--ckpt", ckpt, "--predict", tmp_path / "p", "--csv", ckpt], "--csv"),
            (["--ckpt", ckpt, "--predict", tmp_path / "p", "--csv", tmp_path / "out.html", "--review", tmp_path / "out.html"],
             "--csv and --review name the same file"),
            (["--ckpt", ckpt, "--predict", tmp_path / "p" / "x.png", "--csv", tmp_path / "p" / "x.png"], "--predict")):
        res = invoke(evaluate, args)
        assert res.exit_code == 2 and message in res.output, res.output
    assert ckpt.read_bytes() == b"a checkpoint" and not (tmp_path / "out.html").exists()


@pytest.mark.parametrize("make", ["link", "fifo"])
def test_a_run_lock_that_is_not_a_regular_file_is_refused(tmp_path, make):
    """The lock file in an output folder (finetune_lc.py writes into the checkpoint's folder, which may
    come from someone else): a link to a file elsewhere is never truncated, a pipe never hangs."""
    out = tmp_path / "run"
    out.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    if make == "link":
        (out / runs.LOCK_NAME).symlink_to(target)
    else:
        os.mkfifo(out / runs.LOCK_NAME)
    res = invoke(train_mt, ["--dataset", "digits", "--epochs", "1", "--out", out])
    assert res.exit_code == 2 and "run lock" in res.output, res.output
    assert target.read_text() == "keep me" and sorted(p.name for p in out.iterdir()) == [runs.LOCK_NAME]


CHECKPOINT_DAMAGE = {
    "no stage": lambda s: {k: v for k, v in s.items() if k != "stage"},
    "leaked_test a number": lambda s: dict(s, config=dict(s["config"], leaked_test=3)),
    "labeled_idx a list": lambda s: dict(s, labeled_idx=s["labeled_idx"].tolist()),
    "image_size a string": lambda s: dict(s, config=dict(s["config"], image_size="32")),
    "mean of strings": lambda s: dict(s, config=dict(s["config"], mean=["0.5"] * 3)),
    "negative split": lambda s: dict(s, labeled_idx=-s["labeled_idx"] - 1),
    "lc without metrics": lambda s: {**{k: v for k, v in s.items() if k != "metrics"}, "stage": "lc",
                                     "config": dict(s["config"], lc=dict(
                                         eps=2.0, eps_auto=False, eps_scale="fixed", start={}, lam=1.0, lc_rampup=1.0,
                                         epochs=1, decay_epochs=0, lr=0.05, eval_every=1, mt_step=0, mt_checkpoint="x"))},
    "metrics of strings": lambda s: dict(s, metrics=[dict(r, teacher_error="low") for r in s["metrics"]]),
    "unknown objective": lambda s: dict(s, config=dict(s["config"], consistency="vat")),
    "threshold state of another class count": lambda s: dict(s, adaptive_threshold=dict(
        confidence=torch.tensor(0.5), class_means=torch.full((5,), 0.2))),
    "threshold state out of range": lambda s: dict(s, adaptive_threshold=dict(
        confidence=torch.tensor(2.0), class_means=torch.full((3,), 0.3))),
    "threshold confidence of another shape": lambda s: dict(s, adaptive_threshold=dict(
        confidence=torch.full((3,), 0.5), class_means=torch.full((3,), 0.3))),
    "bn momentum a string": lambda s: dict(s, model_args=dict(s["model_args"], bn_momentum="x")),
    "a width no machine holds": lambda s: dict(s, model_args=dict(s["model_args"], width=1e6),
                                               config=dict(s["config"], width=1e6)),
    "weights of NaN": lambda s: dict(s, teacher={k: v.float() * float("nan") if v.is_floating_point() else v
                                                 for k, v in s["teacher"].items()}),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(CHECKPOINT_DAMAGE))
def test_every_key_read_from_a_checkpoint_is_checked(trained, tmp_path, damage):
    _, ckpt = trained
    state = torch.load(ckpt, weights_only=True)
    torch.save(CHECKPOINT_DAMAGE[damage](state), tmp_path / "broken.pt")
    for args in (("evaluate.py", "--ckpt", tmp_path / "broken.pt", "--json"),
                 ("evaluate.py", "--ckpt", tmp_path / "broken.pt", "--predict", tmp_path / "broken.pt")):
        res = run(*args)
        assert res.returncode == 2 and "Traceback" not in res.stderr and "not a checkpoint" in res.stderr, res.stderr


@pytest.mark.slow
def test_a_checkpoint_never_downloads_nor_makes_a_folder(trained, tmp_path):
    """A checkpoint naming svhn in a folder that does not exist: --predict and the errors say the files
    are missing; nothing is created there, nothing downloaded."""
    _, ckpt = trained
    state = torch.load(ckpt, weights_only=True)
    elsewhere = tmp_path / "elsewhere" / "svhn"
    torch.save(dict(state, config=dict(state["config"], dataset="svhn", data_dir=str(elsewhere), files=None,
                                       contents=None)), tmp_path / "svhn.pt")
    (tmp_path / "p").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "p" / "x.png")
    res = run("evaluate.py", "--ckpt", tmp_path / "svhn.pt", "--predict", tmp_path / "p")
    assert res.returncode == 0 and "only train_mt.py downloads" in res.stderr, res.stderr
    assert run("evaluate.py", "--ckpt", tmp_path / "svhn.pt").returncode == 2
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_predict_writes_names_label_py_reads_back_whatever_the_console(trained, tmp_path, encoding):
    """PYTHONIOENCODING=ascii or latin-1: --predict on chat-é.png ends without a traceback, its CSV on
    stdout holds the name's UTF-8 bytes, and label.py --accepted moves exactly the accepted rows' files,
    that one among them. (Which rows --max-error 99 accepts is the tiny network's outcome, and differs
    with the CPU's arithmetic: the test holds the rows to the threshold the run printed, and names the
    most confident image, accepted wherever anything is.)"""
    data, ckpt = trained
    folder = copy_of(data, tmp_path)
    rows = read_rows(run("evaluate.py", "--ckpt", ckpt, "--predict", folder / "unlabeled").stdout)
    os.rename(max(rows, key=lambda r: float(r["confidence"]))["path"], folder / "unlabeled" / "chat-é.png")
    res = subprocess.run([sys.executable, "evaluate.py", "--ckpt", ckpt, "--predict", folder / "unlabeled", "--max-error",
                          "99"], cwd=ROOT, capture_output=True, env=dict(os.environ, PYTHONIOENCODING=encoding))
    assert res.returncode == 0 and b"Traceback" not in res.stderr, res.stderr
    assert "chat-é.png".encode() in res.stdout
    # A threshold is found: the bound on the 24 held-out images is under 99% up to 20 of them wrong (chance: 16)
    found = re.search(rb"(\d+) of 24 accepted at an expected error of at most 99% \(threshold ([0-9.]+),", res.stderr)
    assert found, res.stderr
    rows = read_rows(res.stdout.decode(), more=("accepted",))
    accepted = {r["path"] for r in rows if r["accepted"] == "1"}
    assert [r["accepted"] for r in rows] == [str(int(float(r["confidence"]) >= float(found.group(2)))) for r in rows]
    assert len(accepted) == int(found.group(1)) and str(folder / "unlabeled" / "chat-é.png") in accepted
    (tmp_path / "p.csv").write_bytes(res.stdout)
    moved = run("label.py", "--data-dir", folder, "--apply", tmp_path / "p.csv", "--accepted", env=dict(PYTHONIOENCODING=encoding))
    assert moved.returncode == 0, moved.stderr
    left = {str(p) for p in (folder / "unlabeled").rglob("*.png")}
    assert left == {r["path"] for r in rows} - accepted and not (folder / "unlabeled" / "chat-é.png").exists()


def test_an_output_never_replaces_an_image_of_the_checkpoints_folder(trained, tmp_path):
    """--audit, --confusion or --csv naming an image of the folder the checkpoint reads: refused."""
    data, ckpt = trained
    image = data / "test" / "cat" / "0.png"
    before = image.read_bytes()
    for args in (["--audit", image], ["--confusion", image], ["--predict", data / "unlabeled" / "u0000.png", "--csv", image]):
        res = invoke(evaluate, ["--ckpt", ckpt, *args])
        assert res.exit_code == 2 and "one of the images of" in res.output, res.output
    assert image.read_bytes() == before


def test_a_figure_is_never_written_among_the_images_a_run_reads(trained, tmp_path):
    """A figure (an image file) named inside the checkpoint's folder or a folder --predict reads would
    be taken for one of its images next time: refused, nothing written; a CSV there is no image."""
    data, ckpt = trained
    new_photos = tmp_path / "new"
    new_photos.mkdir()
    shutil.copy(data / "unlabeled" / "u0000.png", new_photos)
    for figure, args, where in ((data / "unlabeled" / "confusion.png", ["--confusion"], f"the images of {ckpt}'s folder"),
                                (new_photos / "coverage.png", ["--predict", new_photos, "--max-error", "5", "--coverage"],
                                 f"--predict {new_photos}")):
        res = invoke(evaluate, ["--ckpt", ckpt, *args, figure])
        assert res.exit_code == 2 and f"lies in {where}: a figure written there" in res.output, res.output
        assert not figure.exists()
    res = invoke(evaluate, ["--ckpt", ckpt, "--predict", new_photos, "--csv", new_photos / "predictions.csv"])
    assert res.exit_code == 0, res.output
