"""What training reads: file formats, folders, bad options, offline SVHN; never unlabeled labels or the hold-out."""
import json

import pytest
import torch

from mtlc.data.datasets import load_dataset, load_digits
from mtlc.data.splits import balanced_split, hold_out
from mtlc.train.epochs import fit
from mtlc.errors import UserError
from mtlc.train.settings import Stage
import train_mt
from conftest import invoke, run
from fakedata import SMALL, lines, tiny_trainer, write_cifar10, write_folder, write_own_folder, write_svhn
from test_cli import TINY

# Any dataset's smallest run, for the runs that check files, lines and exit codes (test_cli.py's TINY: digits').
ANY_DATASET = ["--width", "0.0625", "--unlabeled-batch", "256", "--epochs", "1", "--decay-epochs", "1", "--seed", "1",
               "--device", "cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("dataset, writer", [("svhn", write_svhn), ("cifar10", write_cifar10)])
def test_train_mt_reads_real_file_formats(tmp_path, dataset, writer):
    writer(tmp_path / "data")
    res = run("train_mt.py", "--dataset", dataset, "--data-dir", tmp_path / "data", "--labels", "20", *ANY_DATASET,
              "--out", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    assert "20 labeled / 180 unlabeled / 0 validation / 50 test" in res.stdout


@pytest.mark.slow
def test_folder_dataset(tmp_path):
    write_folder(tmp_path / "data", n_train=12)
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", tmp_path / "data", "--labels", "6",
              "--unlabeled-batch", "16", "--width", "0.0625", "--epochs", "1", "--decay-epochs", "0",
              "--out", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    ev = run("evaluate.py", "--ckpt", tmp_path / "run" / "mt_final.pt", "--json")
    assert json.loads(ev.stdout.splitlines()[-1])["n_test"] == 9
    # test/ was looked through for copies of training images and none was found: [] (digits: None, below)
    assert torch.load(tmp_path / "run" / "mt_final.pt", weights_only=True)["config"]["leaked_test"] == []


@pytest.mark.parametrize("args, message", [
    (["--labels", "15"], "multiple of the 10 classes"),
    (["--labels", "5000"], "needs 500 images of class 0,"),
    (["--dataset", "folder", "--backbone", "convlarge"], "--labels is required"),
    (["--dataset", "imagenet"], "Invalid value for '--dataset'"),
    (["--labeled-batch", "0"], "Invalid value for '--labeled-batch'"),
    (["--unlabeled-batch", "0"], "Invalid value for '--unlabeled-batch'"),
])
def test_train_mt_bad_input(tmp_path, args, message):
    result = invoke(train_mt, [*args, "--out", tmp_path / "run"])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "run").exists()  # nothing written


def test_parts_named_almost_right_are_named_before_anything_else(tmp_path):
    """Labeled/ and unlabelled/ are read as no layout at all: a message about them, not about --labels."""
    write_own_folder(tmp_path / "data", n_unlabeled=6)
    (tmp_path / "data" / "labeled").rename(tmp_path / "data" / "Labeled")
    (tmp_path / "data" / "unlabeled").rename(tmp_path / "data" / "unlabelled")
    result = invoke(train_mt, ["--dataset", "folder", "--data-dir", tmp_path / "data", "--out", tmp_path / "run"])
    assert result.exit_code == 2, result.output
    assert "Labeled/ (name it labeled/), unlabelled/ (name it unlabeled/)" in result.output
    assert "--labels" not in result.output and not (tmp_path / "run").exists()
    (tmp_path / "data" / "unlabelled").rename(tmp_path / "data" / "unlabeled")  # Labeled/ beside unlabeled/: said too
    with pytest.raises(UserError, match=r"holds Labeled/ \(name it labeled/\): "):
        load_dataset("folder", tmp_path / "data")
    (tmp_path / "data" / "Labeled").rename(tmp_path / "data" / "labeled")
    (tmp_path / "data" / "Test").write_text("a file, not a part")  # only folders are parts
    assert len(load_dataset("folder", tmp_path / "data").classes) == 3


def test_a_class_of_one_labeled_image_is_warned_of_and_named_where_val_cannot_hold_it_out(tmp_path):
    write_own_folder(tmp_path / "data", n_unlabeled=6)
    for image in sorted((tmp_path / "data" / "labeled" / "owl").iterdir())[1:]:
        image.unlink()
    args = ["--dataset", "folder", "--data-dir", tmp_path / "data", "--backbone", "convlarge", *SMALL[:6],
            "--epochs", "1", "--decay-epochs", "0", "--device", "cpu"]
    result = invoke(train_mt, [*args, "--val", "3", "--out", tmp_path / "refused"])
    assert result.exit_code == 2 and "1 in the smallest class, owl)" in result.output, result.output
    result = invoke(train_mt, [*args, "--out", tmp_path / "run"])
    assert result.exit_code == 0, result.output
    assert f"warning: {tmp_path / 'data' / 'labeled' / 'owl'} (1): a class with fewer than 2" in result.output
    assert "labeled/cat" not in result.output.split("warning:")[1].split("\n")[0]  # 6 of them: not thin


def test_the_validation_hold_out_holds_no_copy_of_a_training_image(tmp_path):
    """Images 0-3 of each class have a copy beside them (another name, another format): --val 3 is
    drawn from images 4 and 5 only, and the run says why."""
    from PIL import Image
    write_own_folder(tmp_path / "data", n_unlabeled=6)
    for c in ("cat", "dog", "owl"):
        for i in range(4):
            Image.open(tmp_path / "data" / "labeled" / c / f"{i}.png").save(tmp_path / "data" / "labeled" / c / f"{i}_x.bmp")
    result = invoke(train_mt, ["--dataset", "folder", "--data-dir", tmp_path / "data", "--backbone", "convlarge",
                               *SMALL[:6], "--epochs", "1", "--decay-epochs", "0", "--device", "cpu", "--val", "3",
                               "--out", tmp_path / "run"])
    assert result.exit_code == 0, result.output
    assert "--val was drawn again without the" in result.output and "that copy a training image" in result.output
    state = torch.load(tmp_path / "run" / "mt.pt", weights_only=True)
    held = sorted(state["config"]["files"]["train"][i].split("/")[-1] for i in state["val_idx"].tolist())
    assert len(held) == 3 and set(held) <= {"4.png", "5.png"}, held


def test_svhn_offline_names_the_files(tmp_path, monkeypatch):
    import torchvision

    def offline(*a, **k):
        raise OSError("no network")
    monkeypatch.setattr(torchvision.datasets, "SVHN", offline)
    result = invoke(train_mt, ["--dataset", "svhn", "--data-dir", tmp_path, "--out", tmp_path / "run"])
    assert result.exit_code == 2 and "train_32x32.mat" in result.output and "test_32x32.mat" in result.output


def test_unlabeled_labels_are_never_used(tmp_path):
    """Two runs that differ only in the labels of the unlabeled images end bitwise equal."""
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    config = dict(seed=3, labeled_batch=16, unlabeled_batch=256, dataset="digits", num_classes=10, width=0.0625,
                  bn_momentum=0.02, mean=[0.2] * 3, std=[0.3] * 3)
    stage = Stage(name="lc", epochs=1, decay_epochs=0, lr=0.05, ema=0.9, cons_weight=10.0, cons_rampup=1,
                         eval_every=5, first_step=0, lc_eps=50.0, lc_weight=5.0, lc_rampup=0)
    finals = []
    for scramble in (False, True):
        if scramble:
            data.train_y[unlabeled] = (data.train_y[unlabeled] + 1 + torch.randint(0, 9, (len(unlabeled),))) % 10
        trainer = tiny_trainer(data, labeled, unlabeled, config, stage)
        (tmp_path / f"m{scramble}").mkdir()
        fit(trainer, tmp_path / f"m{scramble}", {}, echo=lambda line: None)
        finals.append(trainer.student.state_dict())
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def test_the_validation_hold_out_is_never_trained_on(tmp_path):
    """Noise for the hold-out's images and other labels: bitwise the same students and teachers
    (running means included), while the validation errors it reports change."""
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    unlabeled, val = hold_out(unlabeled, 200, seed=0)
    config = dict(seed=3, labeled_batch=16, unlabeled_batch=256, dataset="digits", num_classes=10, width=0.0625,
                  bn_momentum=0.02, mean=[0.2] * 3, std=[0.3] * 3)
    stage = Stage(name="mt", epochs=2, decay_epochs=0, lr=0.05, ema=0.9, cons_weight=10.0, cons_rampup=1,
                  eval_every=2, first_step=0)
    finals, records = [], []
    for noise in (False, True):
        if noise:
            data.train_x[val] = torch.randint(0, 256, data.train_x[val].shape, dtype=torch.uint8)
            data.train_y[val] = (data.train_y[val] + 1) % 10
        trainer = tiny_trainer(data, labeled, unlabeled, config, stage, val=val)
        (tmp_path / f"m{noise}").mkdir()
        records.append(fit(trainer, tmp_path / f"m{noise}", {}, echo=lambda line: None))
        finals.append({f"{name}.{k}": v for name in ("student", "teacher")
                       for k, v in getattr(trainer, name).state_dict().items()})
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    assert records[0]["teacher_val_error"] != records[1]["teacher_val_error"]


@pytest.mark.slow
def test_validation_hold_out(tmp_path):
    res = run("train_mt.py", "--dataset", "digits", *TINY, "--val", "200", "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    state = torch.load(tmp_path / "mt_final.pt", weights_only=True)
    val, unl, lab = (set(state[k].tolist()) for k in ("val_idx", "unlabeled_idx", "labeled_idx"))
    assert len(val) == 200 and not val & unl and not val & lab and len(val | unl | lab) == 1437
    last = lines(tmp_path / "mt_metrics.jsonl")[-1]
    assert 0 <= last["teacher_val_error"] <= 100 and "val error student" in res.stdout
    assert invoke(train_mt, ["--val", "2000", "--out", tmp_path / "x"]).exit_code == 2
    res = run("finetune_lc.py", "--ckpt", tmp_path / "mt.pt", "--epochs", "1", "--decay-epochs", "0", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    last = lines(tmp_path / "lc_metrics.jsonl")[-1]
    assert 0 <= last["teacher_val_error"] <= 100 and 0 <= last["student_val_error"] <= 100
    assert "val error student" in res.stdout
