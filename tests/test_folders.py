"""Your own images: the labeled/ unlabeled/ test/ layout through all three stages, the decode cache,
bad files and folders, --image-size."""
import collections
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image

from mtlc.data import files

from mtlc.data import images
import train_mt
from mtlc.data.datasets import load_dataset
from mtlc.data.cache import DecodeCache, cache_dir
from mtlc.data.files import find_images
from mtlc.errors import UserError
from conftest import invoke, run
from fakedata import write_own_folder

SMALL = ["--width", "0.0625", "--labeled-batch", "6", "--unlabeled-batch", "12", "--epochs", "2", "--decay-epochs",
         "1", "--seed", "1", "--device", "cpu"]


def rows(csv_text):
    lines = csv_text.strip().splitlines()
    assert lines[0] == "path,prediction,confidence,runner_up,blake2b"  # the image each row is for, last
    return [line.split(",") for line in lines[1:]]


@pytest.mark.slow
def test_own_images_through_all_three_stages_and_predict(tmp_path):
    size = 64  # not the default: the size must reach every stage and the predictions
    data = tmp_path / "d"
    write_own_folder(data)
    out = tmp_path / "run"
    res = run("train_mt.py", "--dataset", "folder", "--data-dir", data, "--image-size", size, *SMALL, "--out", out)
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
        res = run("train_mt.py", "--dataset", "folder", "--data-dir", tmp_path / name, *SMALL, "--out", tmp_path / f"r{name}")
        assert res.returncode == 0, res.stderr
        finals.append(torch.load(tmp_path / f"r{name}" / "mt_final.pt", weights_only=True))
    for model in ("student", "teacher"):
        assert all(torch.equal(finals[0][model][k], finals[1][model][k]) for k in finals[0][model])


@pytest.mark.slow
def test_validation_hold_out_from_labeled_and_no_test_folder(tmp_path):
    write_own_folder(tmp_path / "d", n_labeled=6, n_test=0)
    res = run("train_mt.py", "--dataset", "folder", "--data-dir", tmp_path / "d", "--val", "6", *SMALL,
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
    res = run("train_mt.py", "--dataset", "folder", "--data-dir", tmp_path / "d", *SMALL, "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr
    (tmp_path / "d" / "unlabeled" / "u0000.png").unlink()
    Image.new("RGB", (8, 8)).save(tmp_path / "d" / "unlabeled" / "new.png")
    res = run("finetune_lc.py", "--ckpt", tmp_path / "r" / "mt.pt", "--out", tmp_path / "lc", "--device", "cpu")
    assert res.returncode == 2 and "changed since the checkpoint was trained" in res.stderr
    assert "1 missing (unlabeled/u0000.png)" in res.stderr and "1 new (unlabeled/new.png)" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "lc").exists()


# The decode cache ---------------------------------------------------------------------------------

def quiet(line):
    pass


def no_decoding(monkeypatch):
    def refuse(data, size):
        raise AssertionError("decoded an image")
    monkeypatch.setattr(images, "decode_bytes", refuse)


def test_cache_hit_skips_decoding(tmp_path, monkeypatch):
    write_own_folder(tmp_path)
    first = load_dataset("folder", tmp_path, echo=quiet)
    assert sorted(p.name.split("-")[0] + "".join(p.suffixes[-2:]) for p in (tmp_path / "mtlc-cache").iterdir()) == [
        "test.files.json", "test.json", "test.u8", "train.files.json", "train.json", "train.u8"]
    no_decoding(monkeypatch)
    second = load_dataset("folder", tmp_path, echo=quiet)
    assert torch.equal(first.train_x, second.train_x) and torch.equal(first.test_x, second.test_x)
    assert first.files == second.files


def test_stale_cache_is_rebuilt(tmp_path):
    write_own_folder(tmp_path)
    before = load_dataset("folder", tmp_path, echo=quiet)
    Image.new("RGB", (30, 30), (255, 0, 0)).save(tmp_path / "labeled" / "cat" / "0.png")  # same name, new pixels
    after = load_dataset("folder", tmp_path, echo=quiet)
    assert not torch.equal(before.train_x[0], after.train_x[0])
    assert (after.train_x[0, 0] == 255).all() and (after.train_x[0, 1:] == 0).all()
    assert len(list((tmp_path / "mtlc-cache").glob("train-*"))) == 3  # the stale .u8, .files.json and .json are gone


def test_corrupted_cache_is_rebuilt(tmp_path):
    write_own_folder(tmp_path)
    good = load_dataset("folder", tmp_path, echo=quiet).train_x.clone()  # a copy: the map reads the file
    for cache in (tmp_path / "mtlc-cache").glob("*.u8"):
        cache.write_bytes(cache.read_bytes()[:200])
    said = []
    again = load_dataset("folder", tmp_path, echo=said.append)
    assert torch.equal(good, again.train_x)
    assert sum("is unusable" in line for line in said) == 2


def test_a_cache_of_other_files_is_never_used(tmp_path):
    """Folder b's cache files replaced by folder a's (other pixels, same file names), the images alone
    or with their .json: b decodes again."""
    for name, seed in (("a", 1), ("b", 2)):
        write_own_folder(tmp_path / name, seed=seed)
    a, b = (load_dataset("folder", tmp_path / name, echo=quiet).train_x.clone() for name in ("a", "b"))
    for suffixes in ((".u8",), (".u8", ".json")):
        for part in ("train", "test"):
            for suffix in suffixes:
                (b_cache,) = (p for p in (tmp_path / "b" / "mtlc-cache").glob(f"{part}-*") if p.suffixes[-1:] == [suffix]
                              and not p.name.endswith(".files.json"))
                (a_cache,) = (p for p in (tmp_path / "a" / "mtlc-cache").glob(f"{part}-*") if p.suffixes[-1:] == [suffix]
                              and not p.name.endswith(".files.json"))
                b_cache.write_bytes(a_cache.read_bytes())
        said = []
        again = load_dataset("folder", tmp_path / "b", echo=said.append)
        assert torch.equal(again.train_x, b) and not torch.equal(again.train_x, a)
        assert sum("is unusable" in line for line in said) == 2


def test_cache_key_covers_size_and_image_size(tmp_path):
    write_own_folder(tmp_path)
    entries = files.scan_images(tmp_path / "unlabeled")[0]
    names = {DecodeCache(tmp_path, "unlabeled", s, entries, quiet).path.name for s in (32, 64)}
    changed = [(p, size + 1, *times) for p, size, *times in entries]
    names.add(DecodeCache(tmp_path, "unlabeled", 32, changed, quiet).path.name)
    touched = [(p, size, mtime, ctime + 1) for p, size, mtime, ctime in entries]  # `touch -r` after an edit
    names.add(DecodeCache(tmp_path, "unlabeled", 32, touched, quiet).path.name)
    assert len(names) == 4


def test_cache_dir_falls_back_when_the_folder_is_read_only(tmp_path, monkeypatch):
    monkeypatch.delenv("MTLC_CACHE_DIR", raising=False)
    assert cache_dir(tmp_path) == tmp_path.resolve() / "mtlc-cache"
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert cache_dir(tmp_path).parent == Path.home() / ".cache" / "mtlc"
    monkeypatch.setenv("MTLC_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert cache_dir(tmp_path).parent == tmp_path / "elsewhere"
    assert cache_dir(tmp_path / "a") != cache_dir(tmp_path / "b")  # one folder's cache never evicts another's


# Bad files and folders ----------------------------------------------------------------------------

def spoil(folder, names):
    for name in names:
        (folder / name).write_bytes(b"this is no image")


@pytest.mark.parametrize("prepare, message", [
    (lambda d: spoil(d / "unlabeled", ["u0001.png"]), "1 image file cannot be read: "),
    (lambda d: spoil(d / "unlabeled", [f"u{i:04d}.png" for i in range(0, 24, 3)] + ["a/u0001.png"]),
     "9 image files cannot be read"),
    (lambda d: (d / "unlabeled" / "u0002.png").write_bytes(b""), "u0002.png (an empty file (0 bytes))"),
    (lambda d: [p.unlink() for p in (d / "labeled" / "dog").iterdir()], "labeled/dog holds no images"),
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
    result = invoke(train_mt, ["--dataset", "folder", "--data-dir", data, *SMALL, "--out", tmp_path / "run"])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 3
    assert not (tmp_path / "run").exists()
    assert (data / "mtlc-cache").exists() == ("cannot be read" in result.output)


def test_many_bad_files_are_named_then_counted(tmp_path):
    write_own_folder(tmp_path / "d")
    spoil(tmp_path / "d" / "unlabeled", [f"u{i:04d}.png" for i in range(0, 30, 3)])
    result = invoke(train_mt, ["--dataset", "folder", "--data-dir", tmp_path / "d", *SMALL, "--out", tmp_path / "r"])
    assert result.exit_code == 2
    assert "10 image files cannot be read" in result.output and "and 5 more" in result.output
    assert "u0000.png" in result.output and "--skip-bad-images" in result.output


def test_a_rerun_skipping_bad_files_decodes_nothing(tmp_path, monkeypatch):
    write_own_folder(tmp_path / "d")
    spoil(tmp_path / "d" / "unlabeled", ["u0001.png"])
    assert invoke(train_mt, ["--dataset", "folder", "--data-dir", tmp_path / "d", *SMALL, "--out", tmp_path / "r"]).exit_code == 2
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
    res = run("train_mt.py", "--dataset", "folder", "--data-dir", data, "--skip-bad-images", *SMALL, "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr
    assert "skipped (--skip-bad-images) 3 image files cannot be read" in res.stdout
    assert "17 labeled / 28 unlabeled" in res.stdout
    state = torch.load(tmp_path / "r" / "mt.pt", weights_only=True)
    assert "unlabeled/u0000.png" not in state["config"]["files"]["train"]
    res = run("evaluate.py", "--ckpt", tmp_path / "r" / "mt.pt")
    assert res.returncode == 0, res.stderr  # later stages load the same files (data.restore_data)


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
    result = invoke(train_mt, ["--dataset", "folder", "--data-dir", tmp_path / "d", "--labels", "9", "--out", tmp_path / "r"])
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
    assert run("train_mt.py", "--dataset", "folder", "--data-dir", data, *SMALL, "--out", out).returncode == 0
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
    assert run("train_mt.py", "--dataset", "folder", "--data-dir", tmp_path / "d", *SMALL, "--out", out).returncode == 0
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


def add_mac_and_notebook_leftovers(root):
    """What a folder copied from a Mac or used in Jupyter holds beside the images: an AppleDouble
    ._name beside every image (not an image, though its name says so), .DS_Store, a __MACOSX folder,
    .ipynb_checkpoints inside a class folder (copies) and directly under labeled/ (no class). Returns
    how many hidden entries were added where the walk meets them."""
    added = 0
    for path in sorted(Path(root).rglob("*.png")):
        (path.parent / f"._{path.name}").write_bytes(b"\x00\x05\x16\x07AppleDouble junk")
        added += 1
    for folder in ("labeled", "unlabeled", "test", "labeled/cat"):
        (Path(root) / folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
        added += 1
    for folder in ("labeled/cat/.ipynb_checkpoints", "labeled/.ipynb_checkpoints/cat", "unlabeled/__MACOSX/a"):
        (Path(root) / folder).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(Path(root) / folder / "copy.png")
    return added + 3


def test_other_files_are_named_by_kind_safely_and_in_bounded_memory(tmp_path):
    """A FIFO named like an image, an extension with a terminal escape, a long one, and a stranger's
    folder of thousands of extensions: counted, shown escaped and cut short, at most MOST_KINDS kinds."""
    os.mkfifo(tmp_path / "pipe.png")
    for name in ("a.HEIC", "b.mo\x1b[31mv", "c." + "x" * 40, "notes"):
        (tmp_path / name).write_bytes(b"not an image")
    line = files.describe_others(files.scan_images(tmp_path)[1], tmp_path)
    assert line.endswith("5 files in %s that are not images of the formats read (JPEG, PNG, BMP, GIF, TIFF, WebP, "
                         "PPM/PGM/PBM): 1 without extension, 1 .heic, 1 .mo\\x1b[31mv, 1 .xxxxxxxx..., "
                         "1 pipes, sockets or devices; HEIC/HEIF photos (iPhones, Macs) are not read: export them as JPEG to use "
                         "them" % tmp_path), line
    counts = collections.Counter()
    for k in range(5000):
        files.count_other(counts, files.other_kind(f"f.x{k}"))
    assert len(counts) <= files.MOST_KINDS + 2 and counts["others"] == 5000
    line = files.describe_others(counts, tmp_path)
    assert line.endswith(", 4,995 of other kinds") and line.count(" 1 .x") == 5, line
    assert "1 file in %s that is not an image of" % tmp_path in files.describe_others({"others": 1, ("other", ".mov"): 1}, tmp_path)


def test_the_largest_kinds_are_named_first_and_a_telling_kind_always(tmp_path):
    """500 HEIC photos after 120 kinds of junk are named first, with the HEIC hint; an image whose name
    ends in a space or a dot after its extension is named, quoted, with a hint to rename it."""
    counts = collections.Counter()
    for k in range(120):
        files.count_other(counts, files.other_kind(f"junk.j{k}"))
    for k in range(500):
        files.count_other(counts, files.other_kind(f"IMG_{k}.HEIC"))
    for k in range(300):
        files.count_other(counts, files.other_kind(f"clip_{k}.mov"))
    for name in ("IMG_1.JPG ", "IMG_2.jpg."):
        files.count_other(counts, files.other_kind(name))
    line = files.describe_others(counts, tmp_path)
    assert ": 500 .heic, 300 .mov, " in line and "1 '.jpg ', 1 '.jpg.'" in line, line
    assert "HEIC/HEIF photos (iPhones, Macs) are not read" in line and "rename it" in line
    named = sum(int(part.split()[0].replace(",", "")) for part in line.split(": ", 1)[1].split("; ")[0].split(", "))
    assert named == counts["others"] == 922  # the rest is counted "of other kinds"


@pytest.mark.slow
def test_hidden_files_and_folders_are_left_out_and_counted(tmp_path):
    data = tmp_path / "d"
    write_own_folder(data)
    hidden = add_mac_and_notebook_leftovers(data)
    for name in ("unlabeled/IMG_0001.HEIC", "unlabeled/a/IMG_0002.heic", "unlabeled/clip.MOV", "labeled/notes"):
        (data / name).write_bytes(b"a phone's or a person's file")
    out = tmp_path / "run"
    res = run("train_mt.py", "--dataset", "folder", "--data-dir", data, *SMALL, "--out", out)
    assert res.returncode == 0, res.stderr
    assert f"left out {hidden} hidden files and folders in {data}" in res.stdout
    assert (f"left out 4 files in {data} that are not images of the formats read (JPEG, PNG, BMP, GIF, TIFF, WebP, "
            f"PPM/PGM/PBM): 2 .heic, 1 without extension, 1 .mov; HEIC/HEIF photos") in res.stdout
    assert "18 labeled / 30 unlabeled / 0 validation / 9 test" in res.stdout
    state = torch.load(out / "mt.pt", weights_only=True)
    assert state["config"]["classes"] == ["cat", "dog", "owl"]  # .ipynb_checkpoints is no class
    assert not any("/." in name or "__MACOSX" in name for name in state["config"]["files"]["train"])
    pred = run("evaluate.py", "--ckpt", out / "mt_final.pt", "--predict", data / "unlabeled")
    assert pred.returncode == 0, pred.stderr
    assert len(rows(pred.stdout)) == 30 and "left out 32 hidden files and folders" in pred.stderr  # 30 ._ + .DS_Store + __MACOSX
    assert f"left out 3 files in {data / 'unlabeled'} that are not images" in pred.stderr


def test_a_hidden_folder_alone_is_no_class(tmp_path):
    data = tmp_path / "d"
    write_own_folder(data, classes=("cat",))
    (data / "labeled" / ".ipynb_checkpoints").mkdir()
    Image.new("RGB", (8, 8)).save(data / "labeled" / ".ipynb_checkpoints" / "x.png")
    res = run("train_mt.py", "--dataset", "folder", "--data-dir", data, *SMALL, "--out", tmp_path / "run")
    assert res.returncode == 2 and "holds one class folder (cat)" in res.stderr
