"""The memory-mapped decode cache at scale's rules, on small folders: the first decode holds one
batch, not every image; a decode killed mid-write leaves no cache that looks valid; processes of a
torchrun launch decode once and share the one mapped file (and none waits forever for a main
process that failed); training from the mapped images is bitwise training from the same images held
in memory; and after label.py's moves only new files are decoded."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image

from mtlc.data import images

from mtlc.data import batches
from mtlc.data.batches import channel_stats
from mtlc.data.datasets import load_dataset
from mtlc.train.devices import Processes
from conftest import ROOT, run
from fakedata import counting, quiet, tiny_trainer, write_own_folder
from mtlc.errors import UserError
from mtlc.train.settings import Stage


def write_tiny_pngs(folder, n, seed=0):
    """n small PNGs (8 x 8, random colours) in folder/unlabeled, and a labeled/ with two classes."""
    rng = np.random.default_rng(seed)
    for part, count in (("unlabeled", n), ("labeled/a", 4), ("labeled/b", 4)):
        (folder / part).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(folder / part / f"{i:05d}.png")


# Decodes n empty files (decode_bytes is replaced by one that returns a constant image of size x
# size) in batches of 64 and prints the growth of the peak RSS in bytes.
BOUNDED_DECODE = """
import resource, sys, torch
from pathlib import Path
from mtlc.data import cache
from mtlc.data import files
from mtlc.data import images
root, n, size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
entries = files.scan_images(root)[0]
cache.DECODE_BATCH = 64
images.decode_bytes = lambda data, s, framing=None: torch.full((3, s, s), 7, dtype=torch.uint8)
list(images.decode_batches([root / entry[0] for entry in entries[:128]], size, 64))  # warm the pool and the allocator
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
x, bad, _, _, written = cache.load_images(root, entries, "train", size, lambda line: None)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
assert x.shape == (n, 3, size, size) and not bad and written > x.numel()
print(after - before, x.numel())
"""


@pytest.mark.slow
def test_the_first_decode_holds_one_batch_not_every_image(tmp_path):
    """5,000 images of 3 x 200 x 200 are 600 MB decoded; decoding them in batches of 64 (7.7 MB) into
    the cache must not raise the peak RSS by anything near that (measured: 36-132 MB, the allocator's
    arenas and the pool's two batches in flight)."""
    for i in range(5000):
        (tmp_path / f"{i:05d}.png").touch()
    res = run("-c", BOUNDED_DECODE, tmp_path, 5000, 200)
    assert res.returncode == 0, res.stderr
    growth, total = map(int, res.stdout.split())
    assert total == 5000 * 3 * 200 * 200
    assert growth < total / 3, f"peak RSS grew by {growth / 2**20:.0f} MB decoding {total / 2**20:.0f} MB"


# Decodes a folder slowly (each image waits 50 ms: 10 s in all, two manifests of kept work) until killed.
SLOW_DECODE = """
import sys, time
from mtlc.data import cache
from mtlc.data import files
from mtlc.data import images
from mtlc.data.datasets import load_dataset
cache.DECODE_BATCH = 8
original = images.decode_bytes
images.decode_bytes = lambda data, size, *framing: time.sleep(0.05) or original(data, size, *framing)
load_dataset("folder", sys.argv[1], echo=lambda line: None)
"""


def committed_images(folder):
    """Whether a decode's work in `folder` has committed rows of images (its first manifest names none)."""
    for manifest in folder.glob(".train-*.mtlc-work/manifest.json"):
        try:
            if json.loads(manifest.read_text())["files"].get("images.u8", [0])[0] > 128:
                return True
        except (OSError, ValueError, KeyError):  # written by its rename at this moment, or not yet
            pass
    return False


def test_a_decode_killed_mid_write_leaves_no_cache_that_looks_valid_and_the_next_goes_on(tmp_path, monkeypatch):
    """kill -9 in the middle of the first decode: the rows decoded so far are kept under a hidden name,
    nothing that a later run could take for a cache; the next run decodes only the files after those
    kept, and its images are those of a decode never interrupted."""
    write_tiny_pngs(tmp_path, 400)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_DECODE, str(tmp_path)], cwd=ROOT)
    folder = tmp_path / "mtlc-cache"
    deadline = time.time() + 60
    while time.time() < deadline and not committed_images(folder):  # a manifest that names decoded rows
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (kept,) = folder.glob(".train-*.mtlc-work")  # the rows decoded so far, under a hidden name
    assert 128 + 8 * 3072 <= (kept / "images.u8").stat().st_size < 128 + 408 * 3072
    assert not list(folder.glob("train-*"))  # no .u8, no .json: nothing that a later run could take for a cache
    said, decoded = [], counting(monkeypatch, "decode_bytes")
    data = load_dataset("folder", tmp_path, echo=said.append)
    assert any("going on with the decode kept" in line for line in said) and 0 < len(decoded) < 400
    monkeypatch.setenv("MTLC_CACHE_DIR", str(tmp_path / "fresh"))
    whole = load_dataset("folder", tmp_path, echo=said.append)
    assert torch.equal(data.train_x, whole.train_x) and data.contents == whole.contents
    assert not list(folder.glob(".train-*"))


def shared_worker(rank, world, init_file, folder, out_dir):
    """One process of two: load the folder (rank 0 first), read every image, report memory."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        decoded = []
        original = images.decode_bytes
        images.decode_bytes = lambda data, size, *framing: decoded.append(size) or original(data, size, *framing)
        batches.PASS_BYTES = 2 ** 22  # read in batches of 4 MiB

        def status():
            fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
            return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}

        before = status()
        data = Processes(rank, world).main_first(lambda: load_dataset("folder", folder, image_size=224, echo=quiet))
        stats = batches.channel_stats(data.train_x)  # every image read, through the map
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(dict(
            decoded=len(decoded), nbytes=data.train_x.numel(), stats=[t.tolist() for t in stats],
            peak_growth=status()["VmHWM"] - before["VmRSS"])))
    finally:
        dist.destroy_process_group()


def test_two_processes_decode_once_and_share_one_mapped_copy(tmp_path):
    """600 images at 224 px (90 MB): rank 0 decodes them into the cache; rank 1 decodes none, maps the
    same file and reads every image (the same exact statistics) with its peak RSS growing by far
    less than the images' size: it holds neither a copy nor, once read, their pages."""
    folder = tmp_path / "d"
    write_tiny_pngs(folder, 592)
    mp.spawn(shared_worker, args=(2, tmp_path / "init", folder, tmp_path), nprocs=2)
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert first["nbytes"] == second["nbytes"] == 600 * 3 * 224 * 224
    assert first["decoded"] == 600 and second["decoded"] == 0
    assert first["stats"] == second["stats"]
    assert second["peak_growth"] < second["nbytes"] / 3, second


def failing_worker(rank, world, init_file, out_dir):
    """Rank 0's load fails on bad input (exit 2); what does each rank end with?"""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    calls = []

    def work():
        calls.append(rank)
        raise UserError("no images here")
    try:
        Processes(rank, world).main_first(work)
        outcome = "returned"
    except UserError:
        outcome = "UserError"
    except SystemExit as exc:
        outcome = f"SystemExit {exc.code}"
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(dict(outcome=outcome, calls=calls)))


def test_when_the_main_process_fails_the_others_exit_with_its_code(tmp_path):
    """No process waits forever for a cache that will not come: rank 1 never runs the work and exits
    with rank 0's exit code (rank 0 prints the message)."""
    mp.spawn(failing_worker, args=(2, tmp_path / "init", tmp_path), nprocs=2)
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert first == dict(outcome="UserError", calls=[0])
    assert second == dict(outcome="SystemExit 2", calls=[])


def test_training_from_the_mapped_images_is_bitwise_training_from_memory(tmp_path):
    """The same steps (MT, then LC) from the memory-mapped cache and from a copy of its images in
    memory: the same weights, bit for bit."""
    write_own_folder(tmp_path, n_unlabeled=60)
    mapped = load_dataset("folder", tmp_path, echo=quiet)
    in_memory = load_dataset("folder", tmp_path, echo=quiet)
    in_memory.train_x, in_memory.test_x = in_memory.train_x.clone(), in_memory.test_x.clone()
    labeled, unlabeled = (mapped.train_y >= 0).nonzero().flatten(), (mapped.train_y < 0).nonzero().flatten()
    mean, std = channel_stats(mapped.train_x)
    config = dict(seed=1, labeled_batch=6, unlabeled_batch=12, dataset="folder", num_classes=3, width=0.0625,
                  bn_momentum=0.02, mean=mean.tolist(), std=std.tolist(), precision="fp32")
    weights = []
    for data in (mapped, in_memory):
        for name in ("mt", "lc"):
            stage = Stage(name=name, epochs=1, decay_epochs=0, lr=0.05, ema=0.9, cons_weight=10.0, cons_rampup=1,
                          eval_every=1, first_step=0, lc_eps=2.0, lc_weight=5.0, lc_rampup=0, lc_pairs="all")
            trainer = tiny_trainer(data, labeled, unlabeled, config, stage)
            for step in range(4):
                trainer.train_step(step, *trainer.batches.views(step))
            errors = trainer.errors()
            weights.append((trainer.student.state_dict(), errors))
    for (a, errors_a), (b, errors_b) in zip(weights[:2], weights[2:]):
        assert errors_a == errors_b
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_after_label_moves_files_only_new_files_are_decoded(tmp_path, monkeypatch):
    """label.py moves images from unlabeled/ to labeled/<class>/ (a rename: a new path): the next
    cache reads them, finds their bytes among the previous cache's rows and copies those; files at
    the same path, size and times are not even read; only a new file is decoded; and the images are
    bitwise those of a fresh decode."""
    write_own_folder(tmp_path / "d")
    load_dataset("folder", tmp_path / "d", echo=quiet)
    for name in ("u0000.png", "u0003.png"):
        os.rename(tmp_path / "d" / "unlabeled" / name, tmp_path / "d" / "labeled" / "cat" / name)
    Image.new("RGB", (9, 7), (10, 200, 30)).save(tmp_path / "d" / "unlabeled" / "new.png")
    read, decoded = counting(monkeypatch, "read_file"), counting(monkeypatch, "decode_bytes")
    again = load_dataset("folder", tmp_path / "d", echo=quiet)
    assert sorted(Path(p).name for p in read) == ["new.png", "u0000.png", "u0003.png"] and len(decoded) == 1
    assert sorted(p.name.split("-")[0] + "".join(p.suffixes[-2:]) for p in (tmp_path / "d" / "mtlc-cache").glob("train-*")) \
        == ["train.files.json", "train.json", "train.u8"]  # the previous cache is gone
    monkeypatch.setenv("MTLC_CACHE_DIR", str(tmp_path / "fresh"))
    fresh = load_dataset("folder", tmp_path / "d", echo=quiet)
    assert len(decoded) == 1 + len(fresh.train_x) + len(fresh.test_x)
    assert again.files == fresh.files and again.contents == fresh.contents and torch.equal(again.train_x, fresh.train_x)


def test_a_large_gather_lets_the_mapped_pages_go_every_gather_rows(monkeypatch):
    """Scattered images are gathered GATHER_ROWS at a time, the mapped pages let go after each chunk
    (each image can map a whole folio of the cache: a quarter of a million gathered at once mapped all
    3 GB of a million-image cache), with the same images in the same order as plain indexing."""
    released = []
    monkeypatch.setattr(batches, "release_pages", lambda part: released.append(len(part)))
    monkeypatch.setattr(batches, "GATHER_ROWS", 100)
    train = torch.randint(0, 256, (700, 3, 4, 4), dtype=torch.uint8)
    test = torch.randint(0, 256, (300, 3, 4, 4), dtype=torch.uint8)
    idx = np.random.default_rng(0).permutation(1000)[:650]
    assert torch.equal(batches.ImageRows(train, test).gather(idx), torch.cat([train, test])[idx])
    in_train = int((idx < 700).sum())
    assert released == [700] * -(-in_train // 100) + [300] * -(-(650 - in_train) // 100)


def test_a_decode_cache_larger_than_the_free_space_is_refused_before_it_is_written(tmp_path, monkeypatch):
    """--image-size 10000 wrote 10.8 GB before anything said so: the cache's size is weighed against its
    disk's free space first (refused in one line, nothing written), and a large one is said."""
    from collections import namedtuple
    from mtlc.disk import room
    write_own_folder(tmp_path / "d")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(room.shutil, "disk_usage", lambda path: usage(10 ** 12, 0, 10 ** 5))
    with pytest.raises(UserError, match=r"decoding \d+ images at 96 px takes .* GB free: free some space"):
        load_dataset("folder", tmp_path / "d", image_size=96, echo=quiet)
    assert not list((tmp_path / "d" / "mtlc-cache").glob("*"))
    said = []
    monkeypatch.setattr(room, "LARGE", 1)
    monkeypatch.setattr(room.shutil, "disk_usage", lambda path: usage(10 ** 12, 0, 10 ** 11))
    load_dataset("folder", tmp_path / "d", image_size=96, echo=said.append)
    assert any(line.startswith("decoding") and "GB free)" in line for line in said), said
