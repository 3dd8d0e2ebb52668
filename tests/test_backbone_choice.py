"""--backbone auto, a folder's default: colour photos get the ImageNet-pretrained trunk, grey images
(scans, glyphs, digits) the paper's network from scratch; a missing package falls back in one line;
the checkpoint keeps the network chosen, never "auto"."""
import importlib.util

import numpy as np
import pytest
import torch
from PIL import Image

import train_mt
from conftest import invoke, needs_backbone
from mtlc.data.colour import colour_share, folder_colour_share, is_colour
from mtlc.train import pretrained
from mtlc.train.checkpoints import load_checkpoint


def write_images(folder, n, grey, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        pixels = rng.integers(0, 256, (24, 24, 1 if grey else 3), dtype=np.uint8)
        image = Image.fromarray(pixels.squeeze(-1), "L").convert("RGB") if grey else Image.fromarray(pixels)
        image.save(folder / f"{i}.jpg", quality=75)  # a JPEG's chroma noise on grey stays under CHROMA


def write_layout(root, grey_share):
    """labeled/<class>/ and unlabeled/ whose images are grey in the given share (the rest in colour)."""
    for k, name in enumerate(("a", "b")):
        write_images(root / "labeled" / name, 4, grey=True, seed=k)
    n = 40
    write_images(root / "unlabeled" / "g", round(n * grey_share), grey=True, seed=7)
    write_images(root / "unlabeled" / "c", n - round(n * grey_share), grey=False, seed=8)


def test_a_pixel_spread_tells_colour_from_grey():
    grey = torch.full((3, 8, 8), 100, dtype=torch.uint8)
    grey[1] += 3  # a few levels of chroma noise: still grey
    assert not is_colour(grey)
    colour = grey.clone()
    colour[0, :2] = 250  # a quarter of the pixels red
    assert is_colour(colour)


def test_the_share_counts_readable_images_only(tmp_path):
    write_images(tmp_path / "g", 3, grey=True)
    write_images(tmp_path / "c", 1, grey=False)
    (tmp_path / "c" / "broken.png").write_bytes(b"not a png")
    assert colour_share([tmp_path / "g", tmp_path / "c"]) == (0.25, 4)
    assert colour_share([tmp_path / "nothing"]) == (None, 0)


def test_every_class_folder_is_looked_at(tmp_path):
    """The sample is shared out among the class folders and unlabeled/, not the first folder's images."""
    for name, grey in (("a", True), ("b", False), ("c", False)):
        write_images(tmp_path / "train" / name, 30, grey=grey)
    share, seen = folder_colour_share(tmp_path, sample=30)
    assert seen == 30 and share == pytest.approx(2 / 3)


def test_many_class_folders_cost_one_image_each_up_to_the_sample(tmp_path):
    for k in range(12):
        write_images(tmp_path / "labeled" / f"c{k:02d}", 3, grey=k < 6, seed=k)
    write_images(tmp_path / "unlabeled", 3, grey=False)
    share, seen = folder_colour_share(tmp_path, sample=8)
    assert seen == 8 and share == pytest.approx(7 / 8)  # c05 (grey) to c11 and unlabeled/, one image each


@pytest.mark.parametrize("grey_share, chosen", [(1.0, "convlarge"), (0.7, "convlarge"), (0.2, pretrained.PHOTO_BACKBONE)])
def test_auto_chooses_by_the_share_in_colour(tmp_path, monkeypatch, grey_share, chosen):
    monkeypatch.setattr(pretrained, "missing_packages", lambda backbone, device: [])
    write_layout(tmp_path, grey_share)
    said = []
    assert pretrained.auto_backbone(tmp_path, "cpu", said.append) == chosen
    assert said[0].startswith("train_mt: --backbone auto: ") and chosen in said[0]


def test_auto_without_the_packages_falls_back_to_the_papers_network(tmp_path, monkeypatch):
    """On a CPU the trunk runs in onnxruntime (exported by onnx): without either, the paper's network."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    write_layout(tmp_path, 0.0)
    said = []
    assert pretrained.auto_backbone(tmp_path, "cpu", said.append) == "convlarge"
    assert "pip install" in said[0] and "onnxruntime" in said[0]
    assert "onnxruntime" not in pretrained.missing_packages(pretrained.BACKBONES[pretrained.PHOTO_BACKBONE], "cuda")
    said = []  # a trunk trained with its head runs in torch: no CPU engine asked for
    if not pretrained.missing_packages(pretrained.BACKBONES[pretrained.PHOTO_BACKBONE]):
        assert pretrained.auto_backbone(tmp_path, "cpu", said.append, "trained") == pretrained.PHOTO_BACKBONE
        assert "ImageNet-pretrained, trained;" in said[0]


@pytest.mark.parametrize("layout", ["missing", "empty", "unlabeled only"])
def test_auto_says_nothing_where_the_folder_is_no_folder_of_images(tmp_path, layout):
    """Loading the folder says what is wrong with it; the choice adds no line before that."""
    if layout == "empty":
        (tmp_path / "d" / "labeled" / "a").mkdir(parents=True)
    elif layout == "unlabeled only":
        write_images(tmp_path / "d" / "unlabeled", 3, grey=False)
    said = []
    assert pretrained.auto_backbone(tmp_path / "d", "cpu", said.append) == "convlarge" and said == []


def test_a_grey_folder_trains_the_papers_network_by_default(tmp_path):
    write_layout(tmp_path / "d", 1.0)
    result = invoke(train_mt, ["--dataset", "folder", "--data-dir", tmp_path / "d", "--width", "0.0625", "--image-size",
                               "16", "--epochs", "1", "--decay-epochs", "0", "--device", "cpu", "--out", tmp_path / "r"])
    assert result.exit_code == 0, result.output
    assert "--backbone auto: 100% of" in result.output and "are grey: convlarge" in result.output
    assert load_checkpoint(tmp_path / "r" / "mt.pt")["config"].backbone == "convlarge"


@needs_backbone(pretrained.PHOTO_BACKBONE)
def test_a_colour_folder_trains_on_the_pretrained_trunk_by_default(tmp_path):
    write_layout(tmp_path / "d", 0.0)
    result = invoke(train_mt, ["--dataset", "folder", "--data-dir", tmp_path / "d", "--width", "0.0625", "--image-size",
                               "32", "--epochs", "1", "--decay-epochs", "0", "--device", "cpu", "--out", tmp_path / "r"])
    assert result.exit_code == 0, result.output
    assert f"are in colour: {pretrained.PHOTO_BACKBONE}" in result.output
    assert load_checkpoint(tmp_path / "r" / "mt.pt")["config"].backbone == pretrained.PHOTO_BACKBONE


def test_auto_is_for_folders_only(tmp_path):
    result = invoke(train_mt, ["--dataset", "digits", "--backbone", "auto", "--out", tmp_path / "r"])
    assert result.exit_code == 2 and "--backbone auto chooses for a folder's images" in result.output
    assert not (tmp_path / "r" / "mt_last.pt").exists()
