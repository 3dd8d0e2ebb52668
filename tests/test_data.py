"""Dataset loading: tiny files in SVHN's and CIFAR-10's real formats, an ImageFolder tree, digits."""
import numpy as np
import pytest
import torch
import torchvision

from mtlc.data.batches import channel_stats
from mtlc.data.datasets import CIFAR10_CLASSES, load_dataset, load_digits
from mtlc.errors import UserError
from fakedata import write_cifar10, write_folder, write_svhn


def test_svhn_mat_files(tmp_path):
    written = write_svhn(tmp_path)
    data = load_dataset("svhn", tmp_path)
    x, digits = written["train"]
    assert data.train_x.shape == (200, 3, 32, 32) and data.train_x.dtype == torch.uint8
    assert data.test_x.shape == (50, 3, 32, 32)
    assert torch.equal(data.train_x[7], torch.from_numpy(x[:, :, :, 7]).permute(2, 0, 1))
    assert data.train_y.tolist() == digits.tolist()  # label 10 became 0
    assert data.num_classes == 10


def test_cifar10_pickled_batches(tmp_path):
    written = write_cifar10(tmp_path)
    data = load_dataset("cifar10", tmp_path)
    assert data.train_x.shape == (200, 3, 32, 32) and data.test_x.shape == (50, 3, 32, 32)
    raw, labels = written["data_batch_2"]
    assert torch.equal(data.train_x[40 + 3], torch.from_numpy(raw[3].reshape(3, 32, 32)))
    assert data.train_y[40:80].tolist() == labels
    assert data.classes[0] == "airplane"


def test_image_folder(tmp_path):
    write_folder(tmp_path)
    data = load_dataset("folder", tmp_path)
    assert data.classes == ["cat", "dog", "owl"]
    assert data.train_x.shape == (24, 3, 32, 32) and data.test_x.shape == (9, 3, 32, 32)
    assert torch.bincount(data.train_y).tolist() == [8, 8, 8]


def test_digits_split_is_fixed_and_stratified():
    a, b = load_digits(), load_digits()
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert a.train_x.shape[1:] == (3, 32, 32) and len(a.train_y) + len(a.test_y) == 1797
    counts = torch.bincount(a.test_y, minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38


def fail_download(*args, **kwargs):
    raise OSError("no network")


@pytest.mark.parametrize("name, missing", [("svhn", "train_32x32.mat"), ("cifar10", "data_batch_1")])
def test_missing_files_name_what_to_place(tmp_path, monkeypatch, name, missing):
    monkeypatch.setattr(torchvision.datasets, "SVHN", fail_download)
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", fail_download)
    with pytest.raises(UserError, match=missing) as err:
        load_dataset(name, tmp_path)
    assert err.value.exit_code == 2


def test_folder_errors(tmp_path):
    with pytest.raises(UserError, match="holds neither labeled/"):
        load_dataset("folder", tmp_path)
    (tmp_path / "train").mkdir()
    with pytest.raises(UserError, match="no class folders"):
        load_dataset("folder", tmp_path)
    write_folder(tmp_path)
    (tmp_path / "test" / "owl").rename(tmp_path / "test" / "emu")
    with pytest.raises(UserError, match="class folders differ"):
        load_dataset("folder", tmp_path)


def test_corrupt_file_is_a_user_error(tmp_path):
    write_svhn(tmp_path)
    (tmp_path / "test_32x32.mat").write_bytes(b"not a mat file")
    with pytest.raises(UserError, match="cannot read"):
        load_dataset("svhn", tmp_path)


def test_channel_stats():
    x = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    x[1] = 255
    mean, std = channel_stats(x)
    torch.testing.assert_close(mean, torch.full((3,), 0.5))
    assert np.allclose(std.numpy(), 0.5, atol=0.02)


def test_cifar10_as_image_files(tmp_path):
    """The same images in train/<class>/*, test/<class>/* (the JPEG copy's layout) with CIFAR-10's preset."""
    write_folder(tmp_path, classes=CIFAR10_CLASSES, n_train=2, n_test=1)
    data = load_dataset("cifar10", tmp_path)
    assert data.classes == CIFAR10_CLASSES and data.train_x.shape == (20, 3, 32, 32) and len(data.test_y) == 10
    assert torch.bincount(data.train_y).tolist() == [2] * 10


def test_cifar10_image_files_must_be_cifar10s_classes(tmp_path):
    write_folder(tmp_path)  # cat, dog, owl
    with pytest.raises(UserError, match="not CIFAR-10's"):
        load_dataset("cifar10", tmp_path)


def test_cifar10_missing_names_both_forms(tmp_path, monkeypatch):
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", fail_download)
    with pytest.raises(UserError, match=r"data_batch_1.*or the images as train/<class>/"):
        load_dataset("cifar10", tmp_path)
