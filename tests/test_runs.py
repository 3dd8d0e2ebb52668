"""Runs that survive: resume after a real SIGTERM ends bitwise equal, guards stop bad runs cleanly."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY_RUN, run

TINY = [*TINY_RUN, "--unlabeled-batch", "256", "--seed", "5"]


def epochs_in(path):
    return [json.loads(line)["epoch"] for line in Path(path).read_text().splitlines()]


def kill_after_first_epoch(args, checkpoint):
    """Start a run, send it SIGTERM as soon as its first resume checkpoint is on disk (while it
    writes the milestone checkpoint and the metrics, or trains on), and return what it said. A process
    of its own: a signal goes to a process, and its exit status is the handler's."""
    proc = subprocess.Popen([sys.executable, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not checkpoint.exists() and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, err


def assert_same_weights(a, b):
    a, b = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    for model in ("student", "teacher"):
        assert all(torch.equal(a[model][k], b[model][k]) for k in a[model]), model
    assert a["step"] == b["step"] and a["epoch"] == b["epoch"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted MT run (4 epochs) to compare resumed ones against (stage 2's resume at every
    write: test_resume.py)."""
    out = tmp_path_factory.mktemp("straight")
    res = run("train_mt.py", *TINY, "--epochs", "3", "--decay-epochs", "1", "--out", out)
    assert res.returncode == 0, res.stderr
    return out


@pytest.mark.slow
def test_mt_resume_after_sigterm_is_bitwise(straight, tmp_path):
    args = ["train_mt.py", *TINY, "--epochs", "3", "--decay-epochs", "1", "--out", tmp_path]
    code, err = kill_after_first_epoch(args, tmp_path / "mt_last.pt")
    assert code == 128 + signal.SIGTERM and "interrupted by SIGTERM" in err and "Traceback" not in err, (code, err)
    assert torch.load(tmp_path / "mt_last.pt", weights_only=True)["epoch"] >= 1  # a whole checkpoint
    res = run("train_mt.py", "--resume", "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    assert epochs_in(tmp_path / "mt_metrics.jsonl") == [1, 2, 3, 4]
    for name in ("mt.pt", "mt_final.pt"):
        assert_same_weights(straight / name, tmp_path / name)


@pytest.mark.slow
def test_resume_needs_a_run_to_resume(tmp_path):
    res = run("train_mt.py", "--resume", "--out", tmp_path)
    assert res.returncode == 2 and "nothing to resume" in res.stderr
    res = run("train_mt.py", "--resume", "--overwrite", "--out", tmp_path)  # --overwrite: a stage 2 beside it
    assert res.returncode == 2 and "nothing to resume" in res.stderr
    res = run("train_mt.py", "--resume", "--benchmark", "3", "--out", tmp_path)
    assert res.returncode == 2 and "exclude each other" in res.stderr


@pytest.mark.slow
def test_stage_two_starts_from_an_unfinished_stage_one_only_when_asked_and_a_resume_replaces_it(tmp_path):
    """finetune_lc.py --ckpt mt_last.pt of a stage 1 killed before LC's start is refused without
    --unfinished; the stage 2 it made is stale once the stage 1 goes on, and a resumed stage 1 treats
    it as a new stage 1 would: refused without --overwrite, removed with it once the run ends."""
    code, err = kill_after_first_epoch(["train_mt.py", *TINY, "--epochs", "3", "--decay-epochs", "1", "--out", tmp_path],
                                       tmp_path / "mt_last.pt")
    assert code == 128 + signal.SIGTERM, err
    epoch = torch.load(tmp_path / "mt_last.pt", weights_only=True)["epoch"]
    assert 1 <= epoch < 3
    stage_two = ["finetune_lc.py", "--ckpt", tmp_path / "mt_last.pt", "--epochs", "1", "--decay-epochs", "0"]
    res = run(*stage_two)
    assert res.returncode == 2 and f"is stage 1 at epoch {epoch} of the 3 before LC's start" in res.stderr, res.stderr
    assert not (tmp_path / "lc.pt").exists()
    res = run(*stage_two, "--unfinished")
    assert res.returncode == 0 and (tmp_path / "lc.pt").exists(), res.stderr
    res = run("train_mt.py", "--resume", "--out", tmp_path)
    assert res.returncode == 2 and "lc.pt, lc_metrics.jsonl, lc_last.pt of a stage 2" in res.stderr, res.stderr
    res = run("train_mt.py", "--resume", "--overwrite", "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    assert "removed the stage 2 that continued the unfinished run" in res.stdout and "ignored" not in res.stdout
    assert (tmp_path / "mt.pt").exists() and not any((tmp_path / n).exists() for n in ("lc.pt", "lc_last.pt",
                                                                                      "lc_metrics.jsonl"))


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_checkpoints(straight, tmp_path):
    before = (straight / "mt.pt").read_bytes()
    res = run("finetune_lc.py", "--ckpt", straight / "mt.pt", "--lr", "1e6", "--out", tmp_path)
    assert res.returncode == 3 and "non-finite loss at step" in res.stderr and "Traceback" not in res.stderr
    assert "ce=" in res.stderr and "lc=" in res.stderr and "eps=" in res.stderr and "lambda2=" in res.stderr
    assert (straight / "mt.pt").read_bytes() == before
    assert not (tmp_path / "lc.pt").exists()


def test_distribution_collapse_stops():
    """Features whose spread fell under 1% of its value when LC started stop the run (exit 3),
    naming eps and lambda2."""
    from mtlc.data.datasets import load_digits
    from mtlc.data.splits import balanced_split
    from fakedata import tiny_trainer
    from mtlc.errors import TrainingFailed
    from mtlc.train.settings import Stage
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    config = dict(seed=3, labeled_batch=16, unlabeled_batch=256, dataset="digits", num_classes=10, width=0.0625,
                  bn_momentum=0.02, mean=[0.2] * 3, std=[0.3] * 3)
    stage = Stage(name="lc", epochs=1, decay_epochs=0, lr=0.05, ema=0.9, cons_weight=1.0, cons_rampup=1,
                  eval_every=1, first_step=0, lc_eps=1e6, lc_weight=20.0)
    trainer = tiny_trainer(data, labeled, unlabeled, config, stage)
    finite = torch.tensor(1.0)
    trainer.check(0, finite, torch.tensor(2.0), {})  # LC's first step sets the reference spread
    trainer.check(1, finite, torch.tensor(0.021), {})  # just above 1% of it
    with pytest.raises(TrainingFailed, match="collapse") as failed:
        trainer.check(2, finite, torch.tensor(0.019), {})
    assert failed.value.exit_code == 3
    assert "eps=1e+06" in failed.value.message and "lambda2=20" in failed.value.message


@pytest.mark.slow
def test_sigint_stops_with_a_message(tmp_path):
    proc = subprocess.Popen([sys.executable, "train_mt.py", *TINY, "--epochs", "6", "--out", str(tmp_path)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (tmp_path / "mt_last.pt").exists() and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT and "interrupted by SIGINT" in err, (proc.returncode, err)
    assert torch.load(tmp_path / "mt_last.pt", weights_only=True)["epoch"] >= 1


@pytest.mark.slow
def test_a_resume_reads_the_folder_where_it_now_is(tmp_path):
    """A run whose folder moved while it was stopped resumes with --data-dir naming the new place (its
    images checked as they are now) and says nothing of it."""
    from fakedata import write_own_folder
    write_own_folder(tmp_path / "d", n_labeled=4, n_unlabeled=12, n_test=2)
    args = ["train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--consistency", "mt", "--data-dir", tmp_path / "d", "--width",
            "0.0625", "--image-size", "16", "--labeled-batch", "4", "--unlabeled-batch", "4", "--epochs", "3",
            "--decay-epochs", "1", "--device", "cpu", "--out", tmp_path / "run"]
    code, err = kill_after_first_epoch(args, tmp_path / "run" / "mt_last.pt")
    assert code == 128 + signal.SIGTERM, err
    (tmp_path / "d").rename(tmp_path / "moved")
    res = run("train_mt.py", "--resume", "--out", tmp_path / "run")
    assert res.returncode == 2 and str(tmp_path / "d") in res.stderr, res.stderr
    res = run(ROOT / "train_mt.py", "--resume", "--data-dir", "moved", "--out", tmp_path / "run", cwd=tmp_path)
    assert res.returncode == 0 and "ignored" not in res.stdout, res.stdout + res.stderr
    config = torch.load(tmp_path / "run" / "mt_final.pt", weights_only=True)["config"]
    assert config["data_dir"] == str((tmp_path / "moved").resolve())


def test_options_equal_to_the_runs_own_go_unsaid(tmp_path, monkeypatch):
    """A relative path to the run's own place, and options stored under another name (--compile,
    --lc-pairs, --lc-scope) equal to the run's, are not named as ignored; one that differs is."""
    import click
    from click.testing import CliRunner
    from mtlc.train.options import note_ignored_by_resume
    said = []

    @click.command()
    @click.option("--data-dir")
    @click.option("--compile", "compile_", is_flag=True)
    @click.option("--lc-pairs")
    @click.option("--lc-scope")
    @click.option("--epochs", type=int)
    def command(**options):
        note_ignored_by_resume(dict(data_dir=str(tmp_path.resolve()), compile=True, pairs="all", scope="local", epochs=3),
                               (), said.append)
    monkeypatch.chdir(tmp_path)
    args = ["--data-dir", ".", "--compile", "--lc-pairs", "all", "--lc-scope", "local"]
    assert CliRunner().invoke(command, args).exit_code == 0 and said == []
    assert CliRunner().invoke(command, [*args, "--epochs", "5"]).exit_code == 0
    assert said == ["--resume continues with the run's own settings; ignored: --epochs 5 (the run's: 3)"]


@pytest.mark.parametrize("stage, left, stopped", [
    ("mt", ("mt_metrics.jsonl", "mt_last.pt"), True), ("mt", ("mt.pt", "mt_metrics.jsonl", "mt_last.pt"), True),
    ("mt", ("mt.pt", "mt_final.pt", "mt_metrics.jsonl", "mt_last.pt"), False),
    ("lc", ("lc_metrics.jsonl", "lc_last.pt"), True), ("lc", ("lc.pt", "lc_metrics.jsonl", "lc_last.pt"), False)])
def test_an_earlier_run_that_stopped_is_said_to_be_resumable(tmp_path, stage, left, stopped):
    """Outputs of a run stopped before its end (the state after an epoch, not the stage's last
    checkpoint): the refusal names --resume first, --overwrite for a finished one."""
    from mtlc.disk.outputs import STAGE_OUTPUTS
    from mtlc.disk.runs import existing_outputs
    from mtlc.errors import UserError
    for name in left:
        (tmp_path / name).write_bytes(b"x")
    with pytest.raises(UserError) as refused:
        existing_outputs(tmp_path, STAGE_OUTPUTS[stage], overwrite=False)
    assert ("pass --resume to continue it, --overwrite to start again" in refused.value.message) == stopped
    assert "--overwrite" in refused.value.message
    assert existing_outputs(tmp_path, STAGE_OUTPUTS[stage], overwrite=True) == [n for n in STAGE_OUTPUTS[stage] if n in left]
