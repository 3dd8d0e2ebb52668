"""Your own images: the labeled/ unlabeled/ test/ layout through all three stages, bad files and
folders, --image-size (the decode cache: test_cache_identity.py; other and hidden files:
test_folder_leftovers.py)."""
import json
import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image

from mtlc.data import files

import train_mt
from mtlc.data.datasets import load_dataset
from mtlc.data.files import find_images
from mtlc.errors import UserError
from mtlc.train.checkpoints import check_same_files
from conftest import invoke, run
from fakedata import SMALL, no_decoding, quiet, rows, write_own_folder


@pytest.mark.slow
def test_own_images_through_all_three_stages_and_predict(tmp_path):
    size = 64  # not the default: the size must reach every stage and the predictions
    data = tmp_path / "d"
    write_own_folder(data)
    out = tmp_path / "run"
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", data, "--image-size", size, *SMALL, "--out", out)
    assert res.returncode == 0, res.stderr
    assert "18 labeled / 30 unlabeled / 0 validation / 9 test" in res.stdout and f"{size} px" in res.stdout
    state = torch.load(out / "mt.pt", weights_only=True)
    assert state["config"]["image_size"] == size and state["config"]["labels"] == 18
    assert state["config"]["files"]["train"][0] == "labeled/cat/0.png"
    assert sum(name.startswith("unlabeled/") for name in state["config"]["files"]["train"]) == 30
    res = run("finetune_lc.py", "--ckpt", out / "mt.pt", "--epochs", "1", "--decay-epochs", "1", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    ev = run("evaluate.py", "--ckpt", out / "lc.pt", "--json")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout.splitlines()[-1])["n_test"] == 9
    pred = run("evaluate.py", "--ckpt", out / "lc.pt", "--predict", data / "unlabeled")
    assert pred.returncode == 0, pred.stderr
    predicted = rows(pred.stdout)
    assert len(predicted) == 30 and {r[1] for r in predicted} <= {"cat", "dog", "owl"}


@pytest.mark.slow
def test_unlabeled_images_carry_no_label(tmp_path):
    """The same pixels in unlabeled/, once flat as PNG and once as BMP inside class-named folders
    (what a label-inventing loader would read as labels): bitwise the same models."""
    write_own_folder(tmp_path / "a", unlabeled_dirs=("x",))
    write_own_folder(tmp_path / "b", unlabeled_dirs=("x",))
    moved = tmp_path / "b" / "unlabeled" / "x"
    for i, png in enumerate(sorted(moved.iterdir())):
        target = moved / ("cat" if i < 15 else "dog") / (png.stem + ".bmp")  # the same order
        target.parent.mkdir(exist_ok=True)
        Image.open(png).save(target)
        png.unlink()
    data = load_dataset("folder", tmp_path / "b", echo=lambda line: None)
    assert data.classes == ["cat", "dog", "owl"] and (data.train_y == -1).sum() == 30
    finals = []
    for name in ("a", "b"):
        res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", tmp_path / name, *SMALL, "--out", tmp_path / f"r{name}")
        assert res.returncode == 0, res.stderr
        finals.append(torch.load(tmp_path / f"r{name}" / "mt_final.pt", weights_only=True))
    for model in ("student", "teacher"):
        assert all(torch.equal(finals[0][model][k], finals[1][model][k]) for k in finals[0][model])


@pytest.mark.slow
def test_validation_hold_out_from_labeled_and_no_test_folder(tmp_path):
    write_own_folder(tmp_path / "d", n_labeled=6, n_test=0)
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", tmp_path / "d", "--val", "6", *SMALL,
              "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr
    assert "no test error" in res.stdout and res.stdout.count("no test error") == 1
    assert "val error student" in res.stdout and "test error" not in res.stdout.replace("no test error", "")
    state = torch.load(tmp_path / "r" / "mt_final.pt", weights_only=True)
    val, lab = state["val_idx"], state["labeled_idx"]
    assert len(val) == 6 and len(lab) == 12 and not set(val.tolist()) & set(lab.tolist())
    labels = load_dataset("folder", tmp_path / "d", echo=lambda line: None).train_y
    assert torch.bincount(labels[val]).tolist() == [2, 2, 2]  # stratified by class
    ev = run("evaluate.py", "--ckpt", tmp_path / "r" / "mt_final.pt", "--json")
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout.splitlines()[-1])
    assert result["n_test"] == 0 and result["teacher_error"] is None


@pytest.mark.slow
def test_a_changed_folder_is_a_clear_error(tmp_path):
    write_own_folder(tmp_path / "d")
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", tmp_path / "d", *SMALL, "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr
    (tmp_path / "d" / "unlabeled" / "u0000.png").unlink()
    Image.new("RGB", (8, 8)).save(tmp_path / "d" / "unlabeled" / "new.png")
    res = run("finetune_lc.py", "--ckpt", tmp_path / "r" / "mt.pt", "--out", tmp_path / "lc", "--device", "cpu")
    assert res.returncode == 2 and "changed since the checkpoint was trained" in res.stderr
    assert "1 missing (unlabeled/u0000.png)" in res.stderr and "1 new (unlabeled/new.png)" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "lc").exists()


# Bad files and folders ----------------------------------------------------------------------------

def spoil(folder, names):
    for name in names:
        (folder / name).write_bytes(b"this is no image")


@pytest.mark.parametrize("prepare, message", [
    (lambda d: spoil(d / "unlabeled", ["u0001.png"]), "1 image file cannot be read: "),
    (lambda d: spoil(d / "unlabeled", [f"u{i:04d}.png" for i in range(0, 24, 3)] + ["a/u0001.png"]),
     "9 image files cannot be read"),
    (lambda d: (d / "unlabeled" / "u0002.png").write_bytes(b""), "u0002.png (an empty file (0 bytes))"),
    (lambda d: [p.unlink() for p in (d / "labeled" / "dog").iterdir()], "labeled/dog holds no images; put images of the class in it, or remove the folder"),
    (lambda d: [p.rename(p.with_suffix(".HEIC")) for p in (d / "labeled" / "dog").iterdir()],
     "labeled/dog holds no images: left out 6 files in"),
    (lambda d: [p.rename(p.with_suffix(".HEIC")) for c in ("dog", "owl") for p in (d / "labeled" / c).iterdir()],
     "holds no images (nor do 1 other class folders): left out 12 files in"),
    (lambda d: [p.unlink() for p in d.glob("unlabeled/**/*.png")] and (d / "unlabeled" / ".DS_Store").write_bytes(b""),
     "unlabeled holds no images (put the images without labels there, any nesting)\n"),
    (lambda d: [p.unlink() for p in d.glob("unlabeled/**/*.png")], "unlabeled holds no images"),
    (lambda d: [subprocess.run(["rm", "-r", str(d / "labeled" / c)]) for c in ("dog", "owl")],
     "holds one class folder (cat)"),
    (lambda d: subprocess.run(["rm", "-r", str(d / "unlabeled")]), "unlabeled is missing"),
    (lambda d: Image.new("RGB", (8, 8)).save(d / "labeled" / "loose.png"), "holds images outside class folders"),
    (lambda d: (d / "test" / "emu").mkdir() or Image.new("RGB", (8, 8)).save(d / "test" / "emu" / "0.png"),
     "class folders that"),
])
def test_bad_folders_exit_2_and_write_nothing(tmp_path, prepare, message):
    """Nothing is written, except the decode cache where files were decoded to find the bad ones:
    that work is kept (test_a_rerun_skipping_bad_files_decodes_nothing)."""
    data = tmp_path / "d"
    write_own_folder(data)
    prepare(data)
    result = invoke(train_mt, ["--dataset", "folder", "--backbone", "convlarge", "--data-dir", data, *SMALL, "--out", tmp_path / "run"])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 3
    assert not (tmp_path / "run").exists()
    assert (data / "mtlc-cache").exists() == ("cannot be read" in result.output)


def test_many_bad_files_are_named_then_counted(tmp_path):
    write_own_folder(tmp_path / "d")
    spoil(tmp_path / "d" / "unlabeled", [f"u{i:04d}.png" for i in range(0, 30, 3)])
    result = invoke(train_mt, ["--dataset", "folder", "--backbone", "convlarge", "--data-dir", tmp_path / "d", *SMALL, "--out", tmp_path / "r"])
    assert result.exit_code == 2
    assert "10 image files cannot be read" in result.output and "and 5 more" in result.output
    assert "u0000.png" in result.output and "--skip-bad-images" in result.output


def test_a_rerun_skipping_bad_files_decodes_nothing(tmp_path, monkeypatch):
    write_own_folder(tmp_path / "d")
    spoil(tmp_path / "d" / "unlabeled", ["u0001.png"])
    assert invoke(train_mt, ["--dataset", "folder", "--backbone", "convlarge", "--data-dir", tmp_path / "d", *SMALL, "--out", tmp_path / "r"]).exit_code == 2
    no_decoding(monkeypatch)
    data = load_dataset("folder", tmp_path / "d", skip_bad=True, echo=quiet)
    assert "unlabeled/u0001.png" not in data.files["train"]
    assert len(data.train_y) == len(data.train_x) == len(data.files["train"]) == sum(len(find_images(tmp_path / "d" / part)[0]) for part in ("labeled", "unlabeled")) - 1
    assert data.skipped[0][0] == "unlabeled/u0001.png"


@pytest.mark.slow
def test_skip_bad_images_trains_without_them(tmp_path):
    data = tmp_path / "d"
    write_own_folder(data)
    spoil(data / "unlabeled", ["u0000.png", "a/u0001.png"])
    spoil(data / "labeled" / "cat", ["0.png"])
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", data, "--skip-bad-images", *SMALL, "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr
    assert "skipped (--skip-bad-images) 3 image files cannot be read" in res.stdout
    assert "17 labeled / 28 unlabeled" in res.stdout
    state = torch.load(tmp_path / "r" / "mt.pt", weights_only=True)
    assert "unlabeled/u0000.png" not in state["config"]["files"]["train"]
    assert sorted(state["config"]["skipped"]) == ["labeled/cat/0.png", "unlabeled/a/u0001.png", "unlabeled/u0000.png"]
    res = run("evaluate.py", "--ckpt", tmp_path / "r" / "mt.pt")
    assert res.returncode == 0, res.stderr  # later stages load the same files (data.restore_data)
    # a file moved as label.py moves them: the skipped files are not called new
    (data / "unlabeled" / "u0003.png").rename(data / "labeled" / "dog" / "u0003.png")
    res = run("evaluate.py", "--ckpt", tmp_path / "r" / "mt.pt")
    assert res.returncode == 2 and "1 moved to another folder" in res.stderr and " new " not in res.stderr, res.stderr


def test_decompression_bomb_is_a_bad_file(tmp_path, monkeypatch):
    write_own_folder(tmp_path)
    Image.new("RGB", (200, 200)).save(tmp_path / "unlabeled" / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 150 * 150)  # over the limit, under twice it: PIL warns
    with pytest.raises(UserError, match=r"1 image file cannot be read: .*huge.png \(too large to decode safely"), \
            pytest.warns(Image.DecompressionBombWarning):
        load_dataset("folder", tmp_path, echo=quiet)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100 * 100)  # twice over the limit: PIL's error
    with pytest.raises(UserError, match="too large to decode safely"):
        load_dataset("folder", tmp_path, echo=quiet)


def test_linked_folders_are_followed(tmp_path):
    write_own_folder(tmp_path / "d")
    write_own_folder(tmp_path / "elsewhere", n_unlabeled=5)
    (tmp_path / "d" / "unlabeled" / "ext").symlink_to(tmp_path / "elsewhere" / "unlabeled", target_is_directory=True)
    found, *_ = find_images(tmp_path / "d" / "unlabeled")
    assert len(found) == 35 and sum("/ext/" in str(p) for p in found) == 5


def test_images_are_listed_in_the_order_paths_sort_in(tmp_path):
    """The scan (strings, for speed) keeps the order of sorted Path objects, part by part: a checkpoint
    made before it names its files in the same order."""
    names = ["a.png", "b/x.png", "a-b/y.png", "B.png", "z.png", "a/c/q.png", "a/r.png", "A/s.jpg", "a b.png",
             "a0.png", "a/c.png", "a.b/t.png"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    found, *_ = find_images(tmp_path)
    assert found == sorted(tmp_path / name for name in names)
    assert [entry[0] for entry in files.scan_images(tmp_path)[0]] == [p.relative_to(tmp_path).as_posix() for p in found]


def test_a_folder_linked_twice_is_listed_under_its_first_name(tmp_path):
    # The checkpoint names the files it trained on: a name that changed between runs would read as a
    # changed folder. Walked in sorted order, "a" comes first on every run, whatever order the file
    # system lists the folder and its five other names in.
    write_own_folder(tmp_path / "d", n_unlabeled=4, unlabeled_dirs=("real",))
    unlabeled = tmp_path / "d" / "unlabeled"
    for name in "qkfca":
        (unlabeled / name).symlink_to(unlabeled / "real", target_is_directory=True)
    found, *_ = find_images(unlabeled)
    assert len(found) == 4 and all(p.parent.name == "a" for p in found), found


def test_symbolic_link_loop_does_not_hang(tmp_path):
    write_own_folder(tmp_path)
    (tmp_path / "unlabeled" / "a" / "loop").symlink_to(tmp_path / "unlabeled", target_is_directory=True)
    (tmp_path / "unlabeled" / "self.png").symlink_to(tmp_path / "unlabeled" / "self.png")  # a file link loop
    found, *_ = find_images(tmp_path / "unlabeled")
    assert len(found) == 31  # the 30 images once each, and the looping link
    with pytest.raises(UserError, match=r"self.png \("):
        load_dataset("folder", tmp_path, echo=quiet)
    data = load_dataset("folder", tmp_path, skip_bad=True, echo=quiet)
    assert (data.train_y == -1).sum() == 30


def test_labels_with_own_layout_is_an_error(tmp_path):
    write_own_folder(tmp_path / "d")
    result = invoke(train_mt, ["--dataset", "folder", "--backbone", "convlarge", "--data-dir", tmp_path / "d", "--labels", "9", "--out", tmp_path / "r"])
    assert result.exit_code == 2 and "leave --labels out" in result.output
    assert not (tmp_path / "r").exists()


def test_image_size_is_refused_where_it_cannot_apply(tmp_path):
    result = invoke(train_mt, ["--dataset", "svhn", "--image-size", "64", "--out", tmp_path / "r"])
    assert result.exit_code == 2 and "svhn is the paper's 32 x 32" in result.output
    result = invoke(train_mt, ["--image-size", "8", "--out", tmp_path / "r"])
    assert result.exit_code == 2 and "--image-size" in result.output


def test_folder_ramps_are_a_share_of_the_stage_with_a_floor():
    from mtlc.train.presets import MIN_RAMP_STEPS, ramp_epochs
    assert ramp_epochs("cons_rampup", 100, 100) * 100 == pytest.approx(0.2 * 100 * 100)  # 20% of 10,000 steps
    assert ramp_epochs("lc_rampup", 40, 100) * 100 == pytest.approx(0.25 * 40 * 100)
    assert ramp_epochs("cons_rampup", 50, 10) * 10 == MIN_RAMP_STEPS  # 20% of 500 steps is under the floor
    assert ramp_epochs("cons_rampup", 3, 2) * 2 == pytest.approx(6)  # never longer than the stage


def test_augmentation_shift_scales_with_image_size():
    from mtlc.data.views import max_shift
    assert (max_shift(32), max_shift(64), max_shift(96), max_shift(16)) == (2, 4, 6, 1)


def write_truth(path, classes=("cat", "dog", "owl"), n_unlabeled=30, dirs=("", "a", "a/b"), skip=()):
    """The truth file of write_own_folder's unlabeled images (u<i> is of class i mod 3), rows in `skip` left out."""
    lines = ["path,class"] + [f"unlabeled/{dirs[i % len(dirs)] + '/' if dirs[i % len(dirs)] else ''}u{i:04d}.png,"
                              f"{classes[i % len(classes)]}" for i in range(n_unlabeled) if i not in skip]
    Path(path).write_text("\n".join(lines) + "\n")


def test_true_classes_of_a_folder_come_from_the_truth_file(tmp_path):
    from mtlc.data.splits import true_classes
    write_own_folder(tmp_path / "d")
    data = load_dataset("folder", tmp_path / "d", echo=lambda *a, **k: None)
    with pytest.raises(UserError, match="30 unlabeled images of this folder have no known classes"):
        true_classes(data)
    write_truth(tmp_path / "truth.csv")
    y = true_classes(data, tmp_path / "truth.csv")
    names = data.files["train"]
    assert (y >= 0).all() and torch.equal(y[data.train_y >= 0], data.train_y[data.train_y >= 0])
    assert all(data.classes[y[i]] == ("cat", "dog", "owl")[int(n.split("/u")[-1][:4]) % 3]
               for i, n in enumerate(names) if n.startswith("unlabeled/"))
    assert (data.train_y[[i for i, n in enumerate(names) if n.startswith("unlabeled/")]] == -1).all()  # untouched
    write_truth(tmp_path / "partial.csv", skip=(4, 7))
    with pytest.raises(UserError, match="no known class for 2 unlabeled images"):
        true_classes(data, tmp_path / "partial.csv")


@pytest.mark.slow
def test_true_class_pairs_and_pool_error_on_a_folder(tmp_path):
    """LC on pairs of one true class (a measurement): refused without the truth, run with it; the
    error on the unlabeled images from the same file."""
    data = tmp_path / "d"
    write_own_folder(data)
    write_truth(tmp_path / "truth.csv")
    out = tmp_path / "run"
    assert run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", data, *SMALL, "--out", out).returncode == 0
    lc = ["finetune_lc.py", "--ckpt", out / "mt.pt", "--epochs", "1", "--decay-epochs", "0", "--device", "cpu",
          "--lc-pairs", "true-class"]
    res = run(*lc)
    assert res.returncode == 2 and "give --truth" in res.stderr and not (out / "lc.pt").exists()
    res = run(*lc, "--truth", tmp_path / "truth.csv")
    assert res.returncode == 0, res.stderr
    assert torch.load(out / "lc.pt", weights_only=True)["config"]["lc"]["pairs"] == "true-class"
    ev = run("evaluate.py", "--ckpt", out / "lc.pt", "--json", "--pool-error", "--truth", tmp_path / "truth.csv")
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout.splitlines()[-1])
    assert result["n_pool"] == 30 and 0 <= result["teacher_pool_error"] <= 100
    assert run("evaluate.py", "--ckpt", out / "lc.pt", "--pool-error").returncode == 2


@pytest.mark.slow
def test_a_resumed_true_class_stage_two_reads_the_truth_where_it_now_is(tmp_path, monkeypatch):
    """A stage 2 on true-class pairs stopped, its --truth file moved: --resume --truth names the new
    place (read as now), and the run ends naming it."""
    import signal
    import finetune_lc
    from conftest import invoke
    from test_resume import interrupt_write
    write_own_folder(tmp_path / "d")
    write_truth(tmp_path / "truth.csv")
    out = tmp_path / "run"
    assert run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", tmp_path / "d", *SMALL, "--out", out).returncode == 0
    lc = ["--ckpt", out / "mt.pt", "--epochs", "2", "--decay-epochs", "0", "--device", "cpu", "--lc-pairs",
          "true-class", "--out", out / "lc"]
    interrupt_write(monkeypatch, "lc_last.pt", 2)
    stopped = invoke(finetune_lc, [*lc, "--truth", tmp_path / "truth.csv"])
    assert stopped.exit_code == 128 + signal.SIGTERM, stopped.output
    monkeypatch.undo()
    (tmp_path / "truth.csv").rename(tmp_path / "moved.csv")
    res = invoke(finetune_lc, ["--resume", *lc, "--truth", tmp_path / "moved.csv"])
    assert res.exit_code == 0 and "ignored" not in res.output, res.output
    config = torch.load(out / "lc" / "lc.pt", weights_only=True)["config"]
    assert config["lc"]["truth"] == str((tmp_path / "moved.csv").resolve())


def test_files_label_py_moved_are_said_to_have_moved():
    """A checkpoint's folder after label.py: the files that moved to another folder under their own
    name are said as moved (with how to go on), apart from those missing and those new."""
    then = dict(train=["labeled/cat/a.png", "unlabeled/u1.png", "unlabeled/u2.png", "unlabeled/x/u3.png"], test=[])
    now = dict(train=["labeled/cat/a.png", "labeled/cat/u2.png", "labeled/dog/u1.png", "unlabeled/new.png"], test=[])
    with pytest.raises(UserError) as raised:
        check_same_files(then, now, "d")
    message = raised.value.message
    assert "2 moved to another folder under their names (labeled/cat/u2.png, labeled/dog/u1.png)" in message
    assert "1 missing (unlabeled/x/u3.png)" in message and "1 new (unlabeled/new.png)" in message
    assert "train again from stage 1 to learn from the labels given since" in message and "label.py --undo" in message
