"""What makes a kept decode cache valid or refused: the files, times, folder and machine it was written for."""
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mtlc.data import cache
from mtlc.data import files
from mtlc.data import images
from mtlc.data.cache import DecodeCache, cache_dir
from mtlc.data.datasets import load_dataset
from mtlc.disk import seal
from conftest import run
from fakedata import counting, no_decoding, quiet, write_own_folder


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


def write_archive_like_classes(folder):
    """labeled/cat and labeled/dog each holding 000.bmp ... 004.bmp of one size and one modification
    time (BMP is a fixed-size format; per-class numbering; times kept from an archive), cats dark and
    dogs bright, and a few unlabeled images."""
    rng = np.random.default_rng(0)
    for name, value in (("cat", 30), ("dog", 220)):
        (folder / "labeled" / name).mkdir(parents=True)
        for i in range(5):
            path = folder / "labeled" / name / f"{i:03d}.bmp"
            Image.fromarray(np.full((8, 8, 3), value + i, np.uint8)).save(path)
            os.utime(path, ns=(10 ** 18, 10 ** 18))
    (folder / "unlabeled").mkdir()
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(folder / "unlabeled" / f"u{i}.png")


def test_files_of_one_name_size_and_time_never_share_a_row(tmp_path, monkeypatch):
    """The cache of a folder whose classes hold files of the same names, sizes and times is rebuilt
    after a file is added: every image keeps its own pixels (a cache that matched rows by base name
    gave the cats the dogs' pixels), and nothing but the new file is decoded."""
    write_archive_like_classes(tmp_path)
    before = load_dataset("folder", tmp_path, echo=quiet)
    Image.new("RGB", (8, 8)).save(tmp_path / "unlabeled" / "added.png")
    decoded = counting(monkeypatch, "decode_bytes")
    after = load_dataset("folder", tmp_path, echo=quiet)
    assert len(decoded) == 1
    for k, name in enumerate(after.files["train"][:10]):
        value = (30 if "/cat/" in name else 220) + int(name[-5])
        assert (after.train_x[k] == value).all(), name
    assert torch.equal(after.train_x[:10], before.train_x[:10])


def test_an_edit_that_keeps_size_and_modification_time_is_seen(tmp_path):
    """An image rewritten in place with the same size, its modification time put back (`touch -r`):
    its change time moved, so the cache decodes it again, and the folder's content fingerprint (what
    stage 2 and evaluate compare with the checkpoint's) changes with it."""
    write_archive_like_classes(tmp_path)
    before = load_dataset("folder", tmp_path, echo=quiet)
    path = tmp_path / "labeled" / "cat" / "002.bmp"
    stamp = path.stat()
    Image.fromarray(np.full((8, 8, 3), 99, np.uint8)).save(path)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert path.stat().st_size == stamp.st_size and path.stat().st_mtime_ns == stamp.st_mtime_ns
    after = load_dataset("folder", tmp_path, echo=quiet)
    assert (after.train_x[2] == 99).all() and after.files == before.files
    assert after.contents["train"] != before.contents["train"] and after.contents["test"] == before.contents["test"]


def as_machine(monkeypatch, config_dir):
    """Run what follows as another machine would: its own secret (seal.py)."""
    monkeypatch.setenv("MTLC_CONFIG_DIR", str(config_dir))
    seal.secret.cache_clear()


def paint_first_row(folder):
    """Paint the first image of the training cache white, its size and listing kept."""
    (u8,) = (folder / "mtlc-cache").glob("train-*.u8")
    with open(u8, "r+b") as f:
        f.seek(cache.HEADER_BYTES)
        f.write(b"\xff" * 3 * 32 * 32)


def test_a_cache_that_came_with_the_folder_is_never_trusted(tmp_path, monkeypatch):
    """A stranger decodes the folder (their secret), paints a row of its cache, and ships folder and
    cache in a tar: after extracting, the images are decoded again, not one painted pixel served, and
    the victim's own cache keeps none of them."""
    import tarfile
    write_own_folder(tmp_path / "d")
    as_machine(monkeypatch, tmp_path / "stranger")
    load_dataset("folder", tmp_path / "d", echo=quiet)
    paint_first_row(tmp_path / "d")
    with tarfile.open(tmp_path / "d.tar", "w") as tar:
        tar.add(tmp_path / "d", arcname="d")
    with tarfile.open(tmp_path / "d.tar") as tar:
        tar.extractall(tmp_path / "victim", filter="tar")
    as_machine(monkeypatch, tmp_path / "me")
    said = []
    data = load_dataset("folder", tmp_path / "victim" / "d", echo=said.append)
    fresh = images.decode(tmp_path / "victim" / "d" / data.files["train"][0], 32)
    assert torch.equal(data.train_x[0], fresh) and not (data.train_x[0] == 255).all()
    again = load_dataset("folder", tmp_path / "victim" / "d", echo=quiet)  # from the victim's own cache now
    assert torch.equal(again.train_x[0], fresh)


def test_a_cache_changed_after_it_was_written_is_decoded_again(tmp_path, monkeypatch):
    """Same machine, same secret: a row painted in place (its size kept) is noticed, as the .u8 is
    no longer the file this machine sealed; so is a cache whose seal was made with another secret."""
    write_own_folder(tmp_path / "d")
    as_machine(monkeypatch, tmp_path / "me")
    first = load_dataset("folder", tmp_path / "d", echo=quiet)
    paint_first_row(tmp_path / "d")
    said = []
    again = load_dataset("folder", tmp_path / "d", echo=said.append)
    fresh = images.decode(tmp_path / "d" / first.files["train"][0], 32)
    assert torch.equal(again.train_x[0], fresh) and any("not the file this machine wrote" in s for s in said)
    as_machine(monkeypatch, tmp_path / "other")
    said.clear()
    load_dataset("folder", tmp_path / "d", echo=said.append)
    assert any("not made by this machine" in s for s in said), said


def test_a_cache_folder_that_is_a_link_is_refused(tmp_path):
    """mtlc-cache a link to a folder elsewhere: the cache would write and delete files there; the run
    is refused in one line, and nothing is written there."""
    write_own_folder(tmp_path / "d")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "train-32px-keep.json").write_text("someone's file")
    (tmp_path / "d" / "mtlc-cache").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", tmp_path / "d", "--epochs", "1", "--out", tmp_path / "r",
              env=dict(MTLC_CONFIG_DIR=str(tmp_path / "me")))
    assert res.returncode == 2 and "is a symbolic link, not the decode cache folder" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and [p.name for p in (tmp_path / "elsewhere").iterdir()] == ["train-32px-keep.json"]


def test_a_pipe_in_the_cache_never_hangs(tmp_path, monkeypatch):
    write_own_folder(tmp_path / "d")
    as_machine(monkeypatch, tmp_path / "me")
    load_dataset("folder", tmp_path / "d", echo=quiet)
    (meta,) = [p for p in (tmp_path / "d" / "mtlc-cache").glob("train-*.json") if not p.name.endswith(".files.json")]
    meta.unlink()
    os.mkfifo(meta)
    res = run("-c", "import sys; from mtlc.data.datasets import load_dataset; load_dataset('folder', sys.argv[1])", tmp_path / "d",
              env=dict(MTLC_CONFIG_DIR=str(tmp_path / "me")), timeout=120)
    assert res.returncode == 0 and "a link or a pipe" in res.stdout, res.stdout + res.stderr


def test_a_folder_at_a_cache_file_name_leaves_the_images_decoded_and_says_so(tmp_path, monkeypatch):
    """A folder where the cache's record of a group goes cannot be replaced: the run goes on with the
    images decoded, and says the cache could not be written."""
    write_own_folder(tmp_path / "d")
    as_machine(monkeypatch, tmp_path / "me")
    load_dataset("folder", tmp_path / "d", echo=quiet)
    (meta,) = [p for p in (tmp_path / "d" / "mtlc-cache").glob("train-*.json") if not p.name.endswith(".files.json")]
    meta.unlink()
    meta.mkdir()
    res = run("-c", "import sys; from mtlc.data.datasets import load_dataset; d = load_dataset('folder', sys.argv[1]); "
              "print(len(d.train_y))", tmp_path / "d", env=dict(MTLC_CONFIG_DIR=str(tmp_path / "me")), timeout=120)
    assert res.returncode == 0 and "cannot write the decode cache" in res.stdout + res.stderr, res.stdout + res.stderr
    assert meta.is_dir()
