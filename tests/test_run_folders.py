"""Real machines: one writer per run folder (a live run's folder is refused, a killed run's is not),
and a write the OS refuses (a full disk, a file-size limit) is one line naming the file and the
reason, exit code 1, no partial file, the earlier files whole, and the rerun completes. The limits are
real: `ulimit -f` in the child's shell, so Python gets EFBIG ('File too large') as on a full disk it
gets ENOSPC."""
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY_RUN, run
from fakedata import write_own_folder
from mtlc.disk.outputs import LOCK_NAME

TINY = [*TINY_RUN, "--unlabeled-batch", "256", "--seed", "5"]


def start(*args):
    return subprocess.Popen([sys.executable, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_lock(folder, proc, seconds=120):
    """Until the run in proc says in its lock file that it holds folder."""
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        lock = Path(folder) / LOCK_NAME
        if lock.exists() and f"pid {proc.pid}" in lock.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"the run did not take {folder}: {proc.communicate()}")


def no_temp_files(folder):
    return not [p for p in Path(folder).rglob("*.tmp")]


@pytest.mark.slow
def test_second_run_on_a_live_folder_exits_at_once_naming_the_first(tmp_path):
    first = start("train_mt.py", "--dataset", "digits", *TINY, "--epochs", "30", "--decay-epochs", "0",
                  "--out", tmp_path)
    try:
        wait_for_lock(tmp_path, first)
        t0 = time.time()
        second = run("train_mt.py", "--dataset", "digits", *TINY, "--epochs", "1", "--decay-epochs", "0",
                     "--overwrite", "--out", tmp_path)
        assert second.returncode == 2 and time.time() - t0 < 30
        assert f"{tmp_path} is being written by another run (train_mt.py, pid {first.pid} on" in second.stderr
        assert "Traceback" not in second.stderr
        lc = run("finetune_lc.py", "--ckpt", tmp_path / "mt.pt", "--device", "cpu")  # its default --out: the same folder
        assert lc.returncode == 2 and "being written by another run (train_mt.py" in lc.stderr
    finally:
        first.kill()
        first.communicate()


@pytest.mark.slow
def test_a_killed_runs_lock_does_not_block_the_next(tmp_path):
    """SIGKILL leaves the lock file, and its pid, behind; the lock itself went with the process."""
    first = start("train_mt.py", "--dataset", "digits", *TINY, "--epochs", "30", "--decay-epochs", "0",
                  "--out", tmp_path)
    wait_for_lock(tmp_path, first)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    assert f"pid {first.pid}" in (tmp_path / LOCK_NAME).read_text()
    again = run("train_mt.py", "--dataset", "digits", *TINY, "--epochs", "1", "--decay-epochs", "0", "--overwrite",
                "--out", tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "mt_final.pt").exists() and no_temp_files(tmp_path)


@pytest.mark.slow
def test_a_run_that_fails_on_its_input_leaves_no_folder(tmp_path):
    res = run("finetune_lc.py", "--ckpt", tmp_path / "new" / "mt.pt", "--device", "cpu")
    assert res.returncode == 2 and not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()  # a folder that was there: left as it was, no lock file in it
    res = run("train_mt.py", "--dataset", "digits", "--resume", "--out", tmp_path / "mine")
    assert res.returncode == 2 and list((tmp_path / "mine").iterdir()) == []


@pytest.mark.slow
def test_checkpoint_write_refused_then_the_rerun_completes(tmp_path):
    """digits writes no decode cache, so the first file is a checkpoint: larger than 64 KiB at this width."""
    args = ["train_mt.py", "--dataset", "digits", *TINY, "--epochs", "1", "--decay-epochs", "1", "--out", tmp_path]
    res = run(*args, limit_kb=64)
    assert res.returncode == 1, res.stderr
    assert f"cannot write {tmp_path}/mt.pt: File too large" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "mt.pt").exists() and no_temp_files(tmp_path)
    res = run(*args)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "mt_final.pt").exists()


def test_metrics_write_refused_leaves_the_previous_file(tmp_path):
    """The metrics file is rewritten whole after every epoch; a refused rewrite leaves the last good one."""
    code = ("import sys; from mtlc.disk.runs import write_metrics; "
            "write_metrics(sys.argv[1], [{'epoch': i, 'pad': 'x' * 100} for i in range(2000)])")
    path = tmp_path / "mt_metrics.jsonl"
    path.write_text('{"epoch": 1}\n')
    res = run("-c", f"{code}", path, limit_kb=16)
    assert res.returncode == 1 and f"cannot write {path}: File too large" in res.stderr, res.stderr
    assert path.read_text() == '{"epoch": 1}\n' and no_temp_files(tmp_path)


def test_decode_cache_write_refused_ends_the_run(tmp_path):
    """The caches of a folder's images are written before any checkpoint, a batch at a time: here the
    training images (49 of 64 x 64 pixels, 602 KB) pass the 256 KiB limit while being written."""
    data = tmp_path / "d"
    write_own_folder(data)
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", data, "--image-size", "64", "--width", "0.0625",
              "--epochs", "1", "--decay-epochs", "0", "--device", "cpu", "--out", tmp_path / "run", limit_kb=256)
    assert res.returncode == 1, res.stderr
    # the rows are written into the cache's work folder first (.train-64px-<key>.mtlc-work/): that write is refused
    assert f"cannot write {data}/mtlc-cache/.train-64px-" in res.stderr and "File too large" in res.stderr
    assert no_temp_files(data) and not list((data / "mtlc-cache").glob("train-*"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("own")
    write_own_folder(folder / "d")
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", folder / "d", "--width", "0.0625", "--labeled-batch",
              "6", "--unlabeled-batch", "12", "--epochs", "1", "--decay-epochs", "0", "--device", "cpu",
              "--out", folder / "run")
    assert res.returncode == 0, res.stderr
    return folder


@pytest.mark.parametrize("output, args", [
    ("labels.csv", ["--predict", "{d}/unlabeled", "--csv"]),
    ("confusion.png", ["--confusion"]),
])
@pytest.mark.slow
def test_evaluate_outputs_refused_leave_the_previous_file(trained, output, args):
    """A predictions CSV (here 30 rows) and a figure larger than the 1 KiB limit; the earlier file stays.
    (The CSV's rows are kept in its work folder first, .labels.csv.mtlc-work/: that write is the one refused.)"""
    target = trained / output
    previous = b"path,prediction,confidence,runner_up\r\nthe previous file" if output.endswith(".csv") else b"the previous file"
    target.write_bytes(previous)
    args = [a.format(d=trained / "d") for a in args]
    res = run("evaluate.py", "--ckpt", trained / "run" / "mt_final.pt", *args, target, limit_kb=1)
    assert res.returncode == 1, res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("Error: cannot write ")]
    assert len(said) == 1 and target.name in said[0] and ": File too large" in said[0], res.stderr
    assert "Traceback" not in res.stderr
    assert target.read_bytes() == previous and no_temp_files(trained)


@pytest.mark.slow
def test_readers_of_a_live_folder_see_only_complete_files(tmp_path):
    """While a run rewrites its checkpoints and metrics every epoch, every file another process finds
    there loads whole, and stage 2 may start from its mt.pt into another folder."""
    import json

    import torch
    first = start("train_mt.py", "--dataset", "digits", *TINY, "--epochs", "40", "--decay-epochs", "0",
                  "--lc-start-epoch", "1", "--out", tmp_path / "mt")
    try:
        loads, deadline = 0, time.time() + 120
        while first.poll() is None and time.time() < deadline and loads < 60:
            for path in sorted((tmp_path / "mt").glob("*")):
                if path.suffix == ".pt":
                    torch.load(path, weights_only=True)
                    loads += 1
                elif path.suffix == ".jsonl":
                    [json.loads(line) for line in path.read_text().splitlines()]
        assert loads >= 20, (loads, first.poll())
        lc = run("finetune_lc.py", "--ckpt", tmp_path / "mt" / "mt.pt", "--epochs", "1", "--decay-epochs", "0",
                 "--device", "cpu", "--out", tmp_path / "lc")
        assert lc.returncode == 0, lc.stderr
    finally:
        first.kill()
        first.communicate()


@pytest.mark.slow
def test_overwrite_replaces_the_earlier_outputs_only_once_the_new_ones_exist(tmp_path):
    """A run with --overwrite killed after its first epoch leaves the earlier run's outputs byte for
    byte; --resume continues it where it wrote (a hidden folder in --out) and only its end replaces
    them."""
    first = run("train_mt.py", "--dataset", "digits", *TINY, "--epochs", "2", "--decay-epochs", "0", "--out", tmp_path)
    assert first.returncode == 0, first.stderr
    outputs = ("mt.pt", "mt_final.pt", "mt_metrics.jsonl", "mt_last.pt")
    before = {name: (tmp_path / name).read_bytes() for name in outputs}
    second = start("train_mt.py", "--dataset", "digits", *TINY, "--lr", "0.03", "--epochs", "8", "--decay-epochs", "0",
                   "--overwrite", "--out", tmp_path)
    staged = tmp_path / ".mtlc-next-mt" / "mt_last.pt"
    deadline = time.time() + 120
    while not staged.exists() and second.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    second.send_signal(signal.SIGTERM)
    second.communicate()
    assert second.returncode == 128 + signal.SIGTERM
    assert {name: (tmp_path / name).read_bytes() for name in outputs} == before
    resumed = run("train_mt.py", "--resume", "--out", tmp_path)
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, resumed.stderr
    assert not (tmp_path / ".mtlc-next-mt").exists()
    assert all((tmp_path / name).read_bytes() != before[name] for name in outputs)
    assert len((tmp_path / "mt_metrics.jsonl").read_text().splitlines()) == 8
