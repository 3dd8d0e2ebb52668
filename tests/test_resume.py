"""Kill anywhere, resume, same files: an interrupt at any write of a milestone epoch, then --resume,
ends with every file an uninterrupted run writes, bitwise equal models; and atomic writes."""
import os
import signal
from pathlib import Path

import pytest
import torch

import finetune_lc
from mtlc.disk import runs
import train_mt
from mtlc.errors import WriteFailed
from mtlc.disk.runs import Interrupted, atomic_write, read_metrics
from conftest import TINY_RUN, invoke, overriding

TINY = [*TINY_RUN, "--unlabeled-batch", "512", "--seed", "2", "--precision", "fp32"]
MT_ARGS = [*TINY, "--epochs", "2", "--decay-epochs", "1"]  # milestones: mt.pt after epoch 2, mt_final.pt after 3
LC_ARGS = ["--epochs", "1", "--decay-epochs", "1", "--lc-rampup", "1", "--device", "cpu"]  # lc.pt after epoch 2
MT_FILES = ("mt.pt", "mt_final.pt", "mt_last.pt", "mt_metrics.jsonl")
LC_FILES = ("lc.pt", "lc_last.pt", "lc_metrics.jsonl")


def interrupt_write(monkeypatch, name, nth):
    """Make the nth write of the file `name` stop half way with the SIGTERM handler's exception."""
    real = runs.atomic_write
    count = [0]

    def writer(path, write):
        if Path(path).name == name:
            count[0] += 1
            if count[0] == nth:
                def half(f):
                    f.write(b"half a file")
                    raise Interrupted(signal.SIGTERM)
                return real(path, half)
        return real(path, write)
    monkeypatch.setattr(runs, "atomic_write", writer)


def assert_same_run(straight, resumed, files):
    for name in files:
        assert (resumed / name).exists(), name
    for name in (f for f in files if f.endswith(".pt")):
        a, b = (torch.load(d / name, weights_only=True) for d in (straight, resumed))
        assert (a["epoch"], a["step"]) == (b["epoch"], b["step"]), name
        for part in ("student", "teacher"):
            assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), (name, part)
        for key, buffers in a["optimizer"]["state"].items():
            assert all(torch.equal(v, b["optimizer"]["state"][key][k]) for k, v in buffers.items()), (name, key)
    metrics = next(f for f in files if f.endswith(".jsonl"))
    strip = [[{k: v for k, v in r.items() if k != "time_s"} for r in read_metrics(d / metrics)]
             for d in (straight, resumed)]
    assert strip[0] == strip[1]  # each epoch once, with the same numbers
    assert not list(resumed.glob(".*.tmp"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    assert invoke(train_mt, [*MT_ARGS, "--out", out]).exit_code == 0
    assert invoke(finetune_lc, ["--ckpt", out / "mt.pt", *LC_ARGS, "--out", out / "lc"]).exit_code == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name, nth", [("mt.pt", 1), ("mt_last.pt", 2), ("mt_metrics.jsonl", 2),
                                       ("mt_final.pt", 1), ("mt_last.pt", 3), ("mt_metrics.jsonl", 3)])
def test_mt_killed_at_any_write_resumes_to_the_same_files(straight, tmp_path, monkeypatch, name, nth):
    interrupt_write(monkeypatch, name, nth)
    result = invoke(train_mt, [*MT_ARGS, "--out", tmp_path])
    assert result.exit_code == 128 + signal.SIGTERM and "interrupted by SIGTERM" in result.output, result.output
    assert not list(tmp_path.glob(".*.tmp"))
    monkeypatch.undo()
    result = invoke(train_mt, [*overriding(MT_ARGS, "--epochs", "5"), "--resume", "--out", tmp_path])  # the line again
    assert result.exit_code == 0, result.output
    # the options equal to the run's go unsaid; the run's 2 + 1 epochs, not 5
    assert "--resume continues with the run's own settings; ignored: --epochs 5 (the run's: 2)\n" in result.output
    assert_same_run(straight, tmp_path, MT_FILES)


@pytest.mark.slow
@pytest.mark.parametrize("name, nth", [("lc.pt", 1), ("lc_last.pt", 2), ("lc_metrics.jsonl", 2)])
def test_lc_killed_at_any_write_resumes_to_the_same_files(straight, tmp_path, monkeypatch, name, nth):
    interrupt_write(monkeypatch, name, nth)
    result = invoke(finetune_lc, ["--ckpt", straight / "mt.pt", *LC_ARGS, "--out", tmp_path])
    assert result.exit_code == 128 + signal.SIGTERM, result.output
    monkeypatch.undo()
    # the line again with another stage 1 and lambda2: both said, neither used (--out given: --ckpt is not read)
    result = invoke(finetune_lc, ["--ckpt", straight / "mt_final.pt", *LC_ARGS, "--lam", "3", "--resume",
                                  "--out", tmp_path])
    assert result.exit_code == 0, result.output
    assert (f"ignored: --ckpt {straight / 'mt_final.pt'} (the run's: {(straight / 'mt.pt').resolve()}), --lam 3.0 "
            f"(the run's: ") in result.output, result.output
    assert_same_run(straight / "lc", tmp_path, LC_FILES)


@pytest.mark.parametrize("failure, raised", [(OSError(28, "No space left on device"), WriteFailed),
                                             (Interrupted(signal.SIGTERM), Interrupted)])
def test_a_failed_write_leaves_the_previous_file(tmp_path, failure, raised):
    path = tmp_path / "state.pt"
    atomic_write(path, lambda f: f.write(b"the previous run"))

    def fail_half_way(f):
        f.write(b"the new run, cut")
        raise failure
    with pytest.raises(raised) as caught:
        atomic_write(path, fail_half_way)
    if raised is WriteFailed:  # one line naming the file and the OS's reason, exit code 1
        assert caught.value.exit_code == 1 and f"cannot write {path}: No space left on device" in caught.value.message
    assert path.read_bytes() == b"the previous run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


def test_a_good_write_gets_the_permissions_of_a_plain_open(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "a", lambda f: f.write(b"x"))
        with open(tmp_path / "b", "wb") as f:
            f.write(b"x")
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode == (tmp_path / "b").stat().st_mode
    assert (tmp_path / "a").read_bytes() == b"x"


@pytest.mark.slow
def test_the_pseudo_label_objective_resumes_to_the_same_files(tmp_path, monkeypatch):
    """--consistency fixmatch with the adaptive threshold, whose state (tau, p~) moves every step: killed
    after its second epoch and resumed, the files of an uninterrupted run, that state included; stage 2
    continues it from mt.pt."""
    args = [*MT_ARGS, "--consistency", "fixmatch", "--threshold", "adaptive"]
    assert invoke(train_mt, [*args, "--out", tmp_path / "straight"]).exit_code == 0
    interrupt_write(monkeypatch, "mt_last.pt", 2)
    assert invoke(train_mt, [*args, "--out", tmp_path / "resumed"]).exit_code != 0
    monkeypatch.undo()
    result = invoke(train_mt, ["--resume", "--out", tmp_path / "resumed"])
    assert result.exit_code == 0, result.output
    assert_same_run(tmp_path / "straight", tmp_path / "resumed", MT_FILES)
    a, b = (torch.load(d / "mt_final.pt", weights_only=True) for d in (tmp_path / "straight", tmp_path / "resumed"))
    assert a["config"]["consistency"] == "fixmatch" and a["config"]["threshold"] == "adaptive"
    assert all(torch.equal(a["adaptive_threshold"][k], b["adaptive_threshold"][k]) for k in ("confidence", "class_means"))
    assert a["adaptive_threshold"]["confidence"] > 0.1 and "above_threshold" in a["metrics"][-1]
    result = invoke(finetune_lc, ["--ckpt", tmp_path / "straight" / "mt.pt", *LC_ARGS, "--lam", "0", "--out", tmp_path / "lc"])
    assert result.exit_code == 0, result.output
    lc = torch.load(tmp_path / "lc" / "lc.pt", weights_only=True)
    assert lc["config"]["consistency"] == "fixmatch" and lc["adaptive_threshold"] is not None
