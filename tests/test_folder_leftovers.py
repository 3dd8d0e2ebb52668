"""Other files beside the images: hidden ones (Mac, Jupyter) left out and counted, other kinds named."""
import collections
import os
from pathlib import Path

import pytest
import torch
from PIL import Image

from mtlc.data import files
from conftest import run
from fakedata import SMALL, rows, write_own_folder


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
    Image.new("RGB", (8, 8)).save(data / "cover.jpg")  # beside the parts: read by nothing, said
    out = tmp_path / "run"
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", data, *SMALL, "--out", out)
    assert res.returncode == 0, res.stderr
    assert f"left out {hidden} hidden files and folders in {data}" in res.stdout
    assert (f"left out 4 files in {data} that are not images of the formats read (JPEG, PNG, BMP, GIF, TIFF, WebP, "
            f"PPM/PGM/PBM): 2 .heic, 1 without extension, 1 .mov; HEIC/HEIF photos") in res.stdout
    assert f"left out 1 image lying in {data} itself (cover.jpg): only labeled/, unlabeled/ and test/ are read" in res.stdout
    assert "18 labeled / 30 unlabeled / 0 validation / 9 test" in res.stdout
    state = torch.load(out / "mt.pt", weights_only=True)
    assert state["config"]["classes"] == ["cat", "dog", "owl"]  # .ipynb_checkpoints is no class
    assert not any("/." in name or "__MACOSX" in name for name in state["config"]["files"]["train"])
    pred = run("evaluate.py", "--ckpt", out / "mt_final.pt", "--predict", data / "unlabeled")
    assert pred.returncode == 0, pred.stderr
    assert len(rows(pred.stdout)) == 30 and "left out 32 hidden files and folders" in pred.stderr  # 30 ._ + .DS_Store + __MACOSX
    assert f"left out 3 files in {data / 'unlabeled'} that are not images" in pred.stderr
    # what training said of the folder it read is not said again by a tool that reads it back
    assert "cover.jpg" not in pred.stderr and pred.stderr.count("hidden files and folders") == 1


def test_a_hidden_folder_alone_is_no_class(tmp_path):
    data = tmp_path / "d"
    write_own_folder(data, classes=("cat",))
    (data / "labeled" / ".ipynb_checkpoints").mkdir()
    Image.new("RGB", (8, 8)).save(data / "labeled" / ".ipynb_checkpoints" / "x.png")
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", data, *SMALL, "--out", tmp_path / "run")
    assert res.returncode == 2 and "holds one class folder (cat)" in res.stderr


def test_links_that_lead_out_of_the_folder_are_followed_and_said(tmp_path):
    """A link in unlabeled/ to a folder elsewhere, one to a file elsewhere, and one inside: the
    images are read, and the two that lead out are said (label.py moves nothing through them)."""
    from mtlc.data.datasets import load_folder
    data = tmp_path / "d"
    write_own_folder(data, n_unlabeled=6)
    (tmp_path / "elsewhere").mkdir()
    for name in ("e1.png", "e2.png"):
        Image.new("RGB", (8, 8), (200, 0, 0)).save(tmp_path / "elsewhere" / name)
    (data / "unlabeled" / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (data / "unlabeled" / "one.png").symlink_to(tmp_path / "elsewhere" / "e1.png")
    (data / "unlabeled" / "alias.png").symlink_to(data / "unlabeled" / "u0000.png")  # inside: not said
    said = []
    loaded = load_folder(data, echo=said.append)
    assert sum(name.startswith("unlabeled/") for name in loaded.files["train"]) == 6 + 2 + 2  # linked/ 2, one, alias
    assert f"followed 2 links in {data} that lead out of it: the images there are read, but label.py" in "\n".join(said)
