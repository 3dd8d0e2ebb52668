"""The pseudo-label objective end to end, as a user runs it: train_mt.py --consistency fixmatch on a
folder, stage 2 with LC and its control on top, and every tool after training on those checkpoints
(evaluation, calibrated --predict with --max-error, --suggest, --review, --audit, ONNX, TensorBoard);
and its options refused where they do not belong."""
import csv
import io
import json

import pytest

import train_mt
from conftest import invoke, read_rows, run
from fakedata import write_own_folder


@pytest.fixture(scope="module")
def fixmatch_runs(tmp_path_factory):
    """A tiny own-images folder, a FixMatch stage 1 (adaptive threshold, the student's pseudo-labels),
    and stage 2 with LC and its control from it."""
    root = tmp_path_factory.mktemp("fixmatch")
    write_own_folder(root / "d", n_labeled=8, n_unlabeled=24, n_test=8)
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", root / "d", "--width", "0.125", "--labeled-batch",
              "12", "--unlabeled-batch", "12", "--lr", "0.02", "--epochs", "4", "--decay-epochs", "2", "--device", "cpu",
              "--consistency", "fixmatch", "--threshold", "adaptive", "--pseudo-labels", "student",
              "--tensorboard", root / "tb" / "mt", "--out", root / "run")
    assert res.returncode == 0, res.stderr
    assert "unlabeled objective FixMatch (threshold adaptive, the student's pseudo-labels), lambda1 1" in res.stdout
    note = "on top of FixMatch LC has not helped in this project's measurements"
    for lam, out in ((["--lam", "0"], "control"), ([], "lc")):  # LC's run takes the preset's lambda2
        res = run("finetune_lc.py", "--ckpt", root / "run" / "mt.pt", *lam, "--epochs", "1", "--decay-epochs",
                  "1", "--device", "cpu", "--out", root / out)
        assert res.returncode == 0, res.stderr
        assert (note in res.stdout) == (out == "lc")  # the default lambda2 on FixMatch points to --lam 0
    return root


@pytest.mark.slow
def test_stage_two_continues_the_pseudo_label_objective(fixmatch_runs):
    """Stage 2 keeps stage 1's objective (its lines show the share above the threshold), and
    evaluate.py names the runs after it, LC's control included, and pairs LC with its control."""
    root = fixmatch_runs
    records = [json.loads(line) for line in (root / "lc" / "lc_metrics.jsonl").read_text().splitlines()]
    assert all(0 <= r["above_threshold"] <= 1 for r in records) and records[-1]["lc"] > 0
    res = run("evaluate.py", "--ckpt", root / "run" / "mt_final.pt", root / "control" / "lc.pt", root / "lc" / "lc.pt",
              "--json")
    assert res.returncode == 0, res.stderr
    methods = [json.loads(line)["method"] for line in res.stdout.splitlines() if line.startswith("{")]
    base = "FixMatch (threshold adaptive, the student's pseudo-labels)"
    assert methods[:3] == [base, f"{base}, continued (lambda2 0)", f"{base}+LC (relative eps, same-prediction pairs)"]
    table = run("evaluate.py", "--ckpt", root / "control" / "lc.pt", root / "lc" / "lc.pt", "--table", root / "t.md")
    assert table.returncode == 0, table.stderr
    assert f"| {base}+LC (relative eps, same-prediction pairs) minus {base}, continued (lambda2 0) |" in \
        (root / "t.md").read_text()


@pytest.mark.slow
def test_every_tool_after_training_takes_a_fixmatch_checkpoint(fixmatch_runs):
    root = fixmatch_runs
    ckpt, folder = root / "lc" / "lc.pt", root / "d"
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", folder / "unlabeled", "--max-error", "50", "--csv",
              root / "labels.csv", "--review", root / "review.html")
    assert res.returncode == 0, res.stderr
    rows = read_rows((root / "labels.csv").read_text(), more=("accepted",))
    assert len(rows) == 24 and {r["accepted"] for r in rows} <= {"0", "1"} and (root / "review.html").stat().st_size
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", folder / "unlabeled", "--suggest", "3", "--csv", root / "n.csv")
    assert res.returncode == 0, res.stderr
    assert len(list(csv.DictReader(io.StringIO((root / "n.csv").read_text())))) == 3
    res = run("evaluate.py", "--ckpt", ckpt, "--audit", root / "audit.csv", "--audit-folds", "2", "--audit-steps", "6")
    assert res.returncode == 0, res.stderr
    assert (root / "audit.csv").read_text().startswith("kind,path,score,suggestion")
    res = run("evaluate.py", "--ckpt", ckpt, "--onnx", root / "m.onnx")
    assert res.returncode == 0 and (root / "m.onnx").stat().st_size, res.stderr
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    curves = EventAccumulator(str(root / "tb" / "mt")).Reload()
    shares = [e.value for e in curves.Scalars("pseudo_labels/above_threshold")]
    assert len(shares) == 6 and all(0 <= v <= 1 for v in shares)


@pytest.mark.parametrize("args, message", [
    (["--threshold", "0.9"], "--threshold goes with --consistency fixmatch, not mt"),
    (["--pseudo-labels", "student"], "--pseudo-labels goes with --consistency fixmatch, not mt"),
    (["--consistency", "fixmatch", "--threshold", "1.5"], "1.5 is not in the range 0<x<=1"),
    (["--consistency", "fixmatch", "--threshold", "high"], "'high' is neither a number nor 'adaptive'"),
    (["--consistency", "fixmatch", "--threshold", "nan"], "'nan' is not a finite number"),
])
def test_pseudo_label_options_out_of_place_are_refused(tmp_path, args, message):
    res = invoke(train_mt, [*args, "--width", "0.0625", "--out", tmp_path / "r"])
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_the_objectives_benchmark_in_miniature(tmp_path):
    """tools/bench_objectives.py on digits, one seed, both objectives 100 times shorter: every run made,
    each checkpoint measured (test error, the unlabeled images' error, what --max-error accepts of them
    and its actual error), the paired differences written; a second call trains nothing again."""
    args = ["tools/bench_objectives.py", "--dataset", "digits", "--seeds", "1", "--width", "0.0625", "--max-error", "99",
            "--objective", "mt=--compress 100 --image-size 16",
            "--objective", "fixmatch=--consistency fixmatch --compress 100 --image-size 16",
            "--out", tmp_path / "runs", "--record", tmp_path / "r.json"]
    res = run(*args)
    assert res.returncode == 0, res.stderr
    record = json.loads((tmp_path / "r.json").read_text())
    for name in ("mt-1", "fixmatch-1"):
        for stage in ("mt", "control", "lc"):
            m = record["results"][name][stage]
            assert 0 <= m["test_error"] <= 100 and m["unlabeled"] == 1337 and 0 <= m["accepted_share"] <= 100
            assert (m["accepted_error"] is None) == (m["accepted"] == 0)
    measured = [m for runs in record["results"].values() for m in runs.values() if m["accepted"]]
    assert all(0 <= m["accepted_error"] <= 100 for m in measured)
    assert set(record["differences"]) == {"fixmatch minus mt (stage 1)", "mt: LC minus its control",
                                          "fixmatch: LC minus its control"}
    assert "fixmatch minus mt (stage 1)" in res.stdout
    again = run(*args)
    assert again.returncode == 0 and "start " not in again.stderr


def test_the_benchmark_measures_what_a_threshold_accepts():
    """scored: the share accepted at the threshold found, their actual error, and none measured without one."""
    import numpy as np
    import torch
    from mtlc.use.calibration import Threshold
    from tools.bench_objectives import scored
    predicted, y = np.array([0, 1, 2, 0]), np.array([0, 1, 0, 1])
    confidence = np.array([0.9, 0.8, 0.7, 0.6])
    test_logits, test_y = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0])
    m = scored(predicted, confidence, y, test_logits, test_y, Threshold(0.7, 10, 0.0, 5.0))
    assert (m["accepted"], m["accepted_share"], m["unlabeled_error"], m["test_error"]) == (3, 75.0, 50.0, 50.0)
    assert m["accepted_error"] == pytest.approx(100 / 3)
    none = scored(predicted, confidence, y, test_logits, test_y, None)
    assert (none["accepted"], none["accepted_share"], none["accepted_error"]) == (0, 0.0, None)
