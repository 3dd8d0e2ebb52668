"""Using a trained model: predictions for image files, per-class errors, the confusion matrix, and
the README's snippet that loads a checkpoint in your own code."""
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import evaluate
from mtlc.data import images
from mtlc.train import inference
from mtlc.use import classifier
from mtlc.disk import seal
from mtlc.use.calibration import fit_temperature, fitted_or_one, supported_confidence
from mtlc.data.images import decode
from mtlc.train.checkpoints import load_checkpoint, restore_models
from conftest import ROOT, invoke, read_rows, run
from fakedata import write_own_folder



CLASSES = ["cat", "dog", "owl"]


def classes_of(path):
    return CLASSES.index(Path(path).parent.name)


@pytest.mark.slow
def test_predictions_agree_with_the_test_error(trained, tmp_path):
    data, ckpt = trained
    for model in ("teacher", "student"):
        res = run("evaluate.py", "--ckpt", ckpt, "--predict", data / "test", "--csv", tmp_path / "p.csv", "--model", model)
        assert res.returncode == 0, res.stderr
        rows = read_rows((tmp_path / "p.csv").read_text())
        assert len(rows) == 24
        wrong = sum(row["prediction"] != Path(row["path"]).parent.name for row in rows)
        result = json.loads(invoke(evaluate, ["--ckpt", ckpt, "--json"]).output.strip().splitlines()[-1])
        assert 100 * wrong / 24 == pytest.approx(result[f"{model}_error"])


def test_per_class_errors_add_up_to_the_error(trained):
    _, ckpt = trained
    result = json.loads(invoke(evaluate, ["--ckpt", ckpt, "--json"]).output.strip().splitlines()[-1])
    per_class = result["per_class"]
    assert set(per_class) == {"cat", "dog", "owl"} and all(r["count"] == 8 for r in per_class.values())
    for model in ("student", "teacher"):
        total = sum(r["count"] * r[f"{model}_error"] for r in per_class.values()) / result["n_test"]
        assert total == pytest.approx(result[f"{model}_error"])
    text = invoke(evaluate, ["--ckpt", ckpt]).output
    assert "teacher's error per class (test images): cat" in text


def test_teacher_and_student_predict_with_their_own_weights(trained, tmp_path):
    data, ckpt = trained
    state = load_checkpoint(ckpt)
    student, teacher = restore_models(state, torch.device("cpu"))
    mean, std = torch.tensor(state["config"].mean), torch.tensor(state["config"].std)
    paths = sorted((data / "test").rglob("*.png"))
    x = torch.stack([decode(p, 32) for p in paths])
    confidences = {}
    test_logits = {name: inference.outputs(model, x, mean, std)[1] for name, model in
                   (("teacher", teacher), ("student", student))}  # the held-out images are the test images here
    for name, model in (("teacher", teacher), ("student", student)):
        temperature = fitted_or_one(test_logits[name].numpy(), [classes_of(p) for p in paths])  # 1: all right
        probs = torch.softmax(inference.model_outputs(model, x, mean, std)[1] / temperature, 1)
        result = invoke(evaluate, ["--ckpt", ckpt, "--predict", data / "test", "--model", name])
        assert result.exit_code == 0, result.output
        rows = read_rows(result.stdout)
        assert [Path(r["path"]) for r in rows] == paths
        classes = state["config"].classes
        assert [r["prediction"] for r in rows] == [classes[i] for i in probs.argmax(1)]
        assert [r["runner_up"] for r in rows] == [classes[i] for i in probs.topk(2).indices[:, 1]]
        # capped at what the held-out test images can vouch for (calibration.supported_confidence)
        expected = probs.max(1).values.clamp(max=supported_confidence(len(paths)))
        assert [float(r["confidence"]) for r in rows] == pytest.approx(expected.tolist(), abs=1e-4)
        confidences[name] = probs.max(1).values
    assert not torch.allclose(confidences["teacher"], confidences["student"])


@pytest.mark.slow
def test_a_corrupt_file_is_one_empty_row(trained, tmp_path):
    data, ckpt = trained
    shutil.copytree(data / "test", tmp_path / "t")
    clean = run("evaluate.py", "--ckpt", ckpt, "--predict", tmp_path / "t", "--csv", tmp_path / "clean.csv")
    assert clean.returncode == 0, clean.stderr
    (tmp_path / "t" / "dog" / "3.png").write_bytes(b"\x89PNG broken")
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", tmp_path / "t", "--csv", tmp_path / "p.csv")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"cannot read {tmp_path / 't' / 'dog' / '3.png'}" in res.stderr and "1 could not be read" in res.stderr
    rows, before = read_rows((tmp_path / "p.csv").read_text()), read_rows((tmp_path / "clean.csv").read_text())
    assert len(rows) == len(before) == 24
    for row, old in zip(rows, before):
        if row["path"].endswith("dog/3.png"):
            assert row["prediction"] == row["confidence"] == row["runner_up"] == ""
        else:
            assert row == old


def test_folders_are_searched_recursively(trained, tmp_path):
    data, ckpt = trained
    (tmp_path / "notes.txt").write_text("not an image")
    shutil.copy(data / "test" / "cat" / "0.png", tmp_path / "single.png")
    result = invoke(evaluate, ["--ckpt", ckpt, "--predict", data / "unlabeled", tmp_path / "single.png", tmp_path])
    assert result.exit_code == 0, result.output
    rows = read_rows(result.stdout)
    assert len(rows) == 24 + 1  # unlabeled/ (nested), the file once (tmp_path, given too, holds it)
    assert any("/a/b/" in r["path"] for r in rows) and rows[24]["path"] == str(tmp_path / "single.png")
    assert "1 file that is not an image ignored" in result.output and ": 1 .txt" in result.output


def test_predicting_holds_two_batches_of_decoded_images(trained, monkeypatch):
    """Decoded minus classified images never exceeds two batches (the one classified, the next one
    decoding meanwhile): all images decoded up front (or a prefetch of more) would fail this."""
    data, ckpt = trained
    counts = dict(decoded=0, classified=0, most=0)
    real_decode, real_classify = images.decode_or_reason, inference.model_outputs

    def counting_decode(path, size, **framing):
        counts["decoded"] += 1
        counts["most"] = max(counts["most"], counts["decoded"] - counts["classified"])
        return real_decode(path, size, **framing)

    def counting_classify(model, x, mean, std):
        if counts["decoded"]:  # the files' stream (the held-out images before it come from the cache)
            counts["classified"] += len(x)
        return real_classify(model, x, mean, std)
    monkeypatch.setattr(images, "decode_or_reason", counting_decode)
    monkeypatch.setattr(classifier, "model_outputs", counting_classify)
    result = invoke(evaluate, ["--ckpt", ckpt, "--predict", data / "unlabeled", "--batch-size", "5"])
    assert result.exit_code == 0, result.output
    assert counts["decoded"] == counts["classified"] == 24
    assert 5 <= counts["most"] <= 10  # 10 when the next batch is decoded before this one is classified


def interrupted(trained, tmp_path, monkeypatch):
    """A run of --predict --csv (batches of 5) killed while it classifies its second batch (it raises):
    (its arguments, its result, the sizes of the batches classified, the CSV it was to replace)."""
    data, ckpt = trained
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("path,prediction,confidence,runner_up\nthe previous run's labels\n")
    real_classify, calls = inference.model_outputs, []

    def dies_on_the_second_batch(model, x, mean, std):
        calls.append(len(x))
        if calls == [5, 5]:  # the files' batches (the held-out images pass through mtlc.train.inference)
            raise RuntimeError("killed")
        return real_classify(model, x, mean, std)
    monkeypatch.setattr(classifier, "model_outputs", dies_on_the_second_batch)
    args = ["--ckpt", ckpt, "--predict", data / "unlabeled", "--batch-size", "5", "--csv", csv_path]
    result = invoke(evaluate, args)
    assert isinstance(result.exception, RuntimeError) and calls == [5, 5]
    assert "the same command goes on from there" in result.output
    calls.append("the kill")
    return args, csv_path, calls


def test_a_run_killed_half_way_leaves_the_previous_csv_and_goes_on_where_it_stopped(trained, tmp_path, monkeypatch):
    """The CSV is replaced only once every row exists: a run killed after its first batch leaves the
    previous CSV as it was and its predictions kept beside it; the same command again classifies only
    the images after them, writes what an uninterrupted run writes, and leaves nothing else behind."""
    args, csv_path, calls = interrupted(trained, tmp_path, monkeypatch)
    assert csv_path.read_text() == "path,prediction,confidence,runner_up\nthe previous run's labels\n"
    again = invoke(evaluate, args)
    assert again.exit_code == 0 and "5 of 24 images were predicted before" in again.output, again.output
    assert calls[3:] == [5, 5, 5, 4]
    whole = invoke(evaluate, args[:-1] + [tmp_path / "whole.csv"])
    assert whole.exit_code == 0 and calls[7:] == [5, 5, 5, 5, 4]
    assert csv_path.read_text() == (tmp_path / "whole.csv").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["labels.csv", "whole.csv"]


@pytest.mark.parametrize("meddle", ["paint a kept row", "another machine's secret"])
def test_kept_predictions_this_machine_cannot_vouch_for_are_made_again(trained, tmp_path, monkeypatch, meddle):
    """Kept predictions are taken up only where this machine's seal holds over their bytes: a row
    painted since, or work sealed under another secret (a folder from elsewhere), is predicted again."""
    args, csv_path, calls = interrupted(trained, tmp_path, monkeypatch)
    if meddle == "paint a kept row":
        rows = next(tmp_path.glob(".labels.csv.mtlc-work")) / "rows.jsonl"
        rows.write_text(re.sub(r'"(cat|dog|owl)"', '"owl"', rows.read_text(), count=1))
    else:
        monkeypatch.setenv("MTLC_CONFIG_DIR", str(tmp_path / "elsewhere"))
        seal.secret.cache_clear()
    again = invoke(evaluate, args)
    seal.secret.cache_clear()
    assert again.exit_code == 0 and "predicted before" not in again.output and calls[3:] == [5, 5, 5, 5, 4]


@pytest.mark.parametrize("args, message", [
    (["--predict", "/nonexistent/x"], "does not exist"),
    (["--csv", "p.csv"], "--csv goes with --predict"),
    (["--predict", ".", "--json"], "--json goes with the checkpoints' errors, or with --predict and --csv"),
    (["--predict", ".", "--table", "t.md"], "--predict takes exactly one --ckpt"),
    (["--max-error", "5"], "--max-error goes with --predict"),
    (["--suggest", "5"], "--suggest goes with --predict"),
    (["--review-per-class", "5"], "--review-per-class goes with --predict"),
    (["--review-max", "5"], "--review-max goes with --review"),
    (["--audit-steps", "5"], "--audit-steps goes with --audit"),
    (["--tsne-points", "50"], "--tsne-points goes with --tsne"),
    (["--batch-size", "5"], "--batch-size goes with --predict"),
    (["--label-studio-root", "."], "--label-studio-root goes with --label-studio"),
    (["--predict", ".", "--max-error", "100"], "--max-error"),
    (["--predict", ".", "--suggest", "0"], "--suggest"),
])
def test_predict_bad_input(trained, tmp_path, args, message):
    _, ckpt = trained
    result = invoke(evaluate, ["--ckpt", ckpt, *args])
    assert result.exit_code == 2 and message in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke(evaluate, ["--ckpt", ckpt, "--predict", empty, "--csv", tmp_path / "p.csv"])
    assert result.exit_code == 2 and "no image files" in result.output and not (tmp_path / "p.csv").exists()


def test_confusion_matrix(trained, tmp_path):
    _, ckpt = trained
    result = invoke(evaluate, ["--ckpt", ckpt, "--confusion", tmp_path / "c.png", "--model", "student"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_the_readme_snippet_runs(trained, capsys):
    """The README's "In your own code" block, run as written on a trained checkpoint and its
    folder, prints what `evaluate.py --predict` writes: the same classes and calibrated confidences."""
    data, ckpt = trained
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("In your own code:"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "runs/mine/lc.pt" in code and "mydata/unlabeled" in code and len(code.strip().splitlines()) <= 4
    exec(compile(code.replace("runs/mine/lc.pt", str(ckpt)).replace("mydata", str(data)), "README.md", "exec"), {})
    printed = [line.split(" ") for line in capsys.readouterr().out.strip().splitlines()]
    rows = read_rows(run("evaluate.py", "--ckpt", ckpt, "--predict", data / "unlabeled").stdout)
    assert [(p, label, float(c)) for p, label, c in printed] == [
        (r["path"], r["prediction"], float(r["confidence"])) for r in rows]


@pytest.mark.slow
def test_confidences_are_calibrated_on_the_held_out_images(trained, tmp_path):
    data, ckpt = trained
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", data / "unlabeled", "--csv", tmp_path / "p.csv", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    state = load_checkpoint(ckpt)
    _, teacher = restore_models(state, torch.device("cpu"))
    mean, std = torch.tensor(state["config"].mean), torch.tensor(state["config"].std)
    paths = sorted((data / "test").rglob("*.png"))
    logits = inference.outputs(teacher, torch.stack([decode(p, 32) for p in paths]), mean, std)[1]
    assert summary["temperature"] == pytest.approx(fit_temperature(logits.numpy(), [classes_of(p) for p in paths]))
    assert summary["held_out"] == "test" and summary["n_held_out"] == 24
    assert set(summary) >= {"ece_before", "ece_after"} and list(summary["error_at_coverage"]) == [
        str(c) for c in range(10, 101, 10)]
    assert res.stderr.count("calibrated on 24 held-out test images") == 1
    result = json.loads(invoke(evaluate, ["--ckpt", ckpt, "--json"]).stdout.strip().splitlines()[-1])
    assert result["calibration"]["temperature"] == pytest.approx(summary["temperature"])


@pytest.mark.slow
def test_accepted_is_exactly_the_rows_at_or_above_the_threshold(trained, tmp_path):
    data, ckpt = trained
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", data / "unlabeled", "--csv", tmp_path / "p.csv",
              "--max-error", "60", "--coverage", tmp_path / "coverage.png")
    assert res.returncode == 0, res.stderr
    found = re.search(r"(\d+) of 24 accepted at an expected error of at most 60% \(threshold ([0-9.]+), from 24 "
                      r"held-out images\)", res.stderr)
    assert found, res.stderr
    rows = read_rows((tmp_path / "p.csv").read_text(), ["accepted"])
    threshold = float(found.group(2))
    assert [r["accepted"] for r in rows] == [str(int(float(r["confidence"]) >= threshold)) for r in rows]
    assert sum(r["accepted"] == "1" for r in rows) == int(found.group(1)) > 0
    assert (tmp_path / "coverage.png").read_bytes()[:4] == b"\x89PNG"
    plain = read_rows(run("evaluate.py", "--ckpt", ckpt, "--predict", data / "unlabeled").stdout)
    assert [{k: r[k] for k in plain[0]} for r in rows] == plain  # the first four columns as they were

    strict = run("evaluate.py", "--ckpt", ckpt, "--predict", data / "unlabeled", "--csv", tmp_path / "s.csv",
                 "--max-error", "1")  # 24 held-out images cannot vouch for 1%: 0 wrong of 24 is up to 11.7%
    assert strict.returncode == 0 and "0 of 24 accepted: no confidence threshold" in strict.stderr
    assert {r["accepted"] for r in read_rows((tmp_path / "s.csv").read_text(), ["accepted"])} == {"0"}


@pytest.mark.slow
def test_suggest_lists_n_distinct_unlabeled_images(trained, tmp_path):
    """--suggest 5: by default the 5 least confident of the images --predict gives a row (readable, none
    like no class), the same twice; --order typiclust: 5 images of 5 clusters."""
    data, ckpt = trained
    outputs = []
    for name in ("a.csv", "b.csv"):
        res = run("evaluate.py", "--ckpt", ckpt, "--predict", data / "unlabeled", "--suggest", "5", "--csv",
                  tmp_path / name, "--max-error", "60")
        assert res.returncode == 0, res.stderr
        assert "predicted 24 of 24 images" in res.stderr and "the 5 to label next, best first" in res.stderr
        outputs.append((tmp_path / name).read_text())
    rows = read_rows(outputs[0], ["accepted", "cluster"])
    assert len({r["path"] for r in rows}) == 5 and outputs[0] == outputs[1]
    assert all(Path(r["path"]).is_relative_to(data / "unlabeled") for r in rows)
    every = run("evaluate.py", "--ckpt", ckpt, "--predict", data / "unlabeled", "--csv", tmp_path / "all.csv")
    assert every.returncode == 0, every.stderr
    ranked = sorted(read_rows((tmp_path / "all.csv").read_text()), key=lambda r: float(r["confidence"]))
    assert [r["path"] for r in rows] == [r["path"] for r in ranked[:5]]
    assert [float(r["confidence"]) for r in rows] == sorted(float(r["confidence"]) for r in rows)
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", data / "unlabeled", "--suggest", "5", "--order", "typiclust",
              "--csv", tmp_path / "t.csv")
    assert res.returncode == 0, res.stderr
    assert len({r["cluster"] for r in read_rows((tmp_path / "t.csv").read_text(), ["cluster"])}) == 5


@pytest.fixture(scope="module")
def no_held_out(tmp_path_factory):
    """A checkpoint whose folder has no test/ and no --val hold-out."""
    root = tmp_path_factory.mktemp("nohold")
    write_own_folder(root / "d", n_labeled=6, n_unlabeled=12, n_test=0)
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", root / "d", "--width", "0.125", "--labeled-batch",
              "6", "--unlabeled-batch", "6", "--epochs", "1", "--decay-epochs", "1", "--device", "cpu",
              "--out", root / "run")
    assert res.returncode == 0, res.stderr
    return root / "d", root / "run" / "mt_final.pt"


@pytest.mark.slow
def test_without_held_out_images_confidences_are_uncalibrated_and_said_once(no_held_out, tmp_path):
    data, ckpt = no_held_out
    res = run("evaluate.py", "--ckpt", ckpt, "--predict", data / "unlabeled", "--csv", tmp_path / "p.csv", "--json")
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("uncalibrated") == 1 and json.loads(res.stdout)["temperature"] is None
    state = load_checkpoint(ckpt)
    _, teacher = restore_models(state, torch.device("cpu"))
    mean, std = torch.tensor(state["config"].mean), torch.tensor(state["config"].std)
    rows = read_rows((tmp_path / "p.csv").read_text())
    x = torch.stack([decode(r["path"], 32) for r in rows])
    raw = torch.softmax(inference.model_outputs(teacher, x, mean, std)[1], 1).max(1).values
    assert [float(r["confidence"]) for r in rows] == pytest.approx(raw.tolist(), abs=1e-4)
    refused = run("evaluate.py", "--ckpt", ckpt, "--predict", data / "unlabeled", "--max-error", "10")
    assert refused.returncode == 2 and "need the checkpoint's held-out labeled images" in refused.stderr
    assert "Traceback" not in refused.stderr
    suggested = run("evaluate.py", "--ckpt", ckpt, "--predict", data / "unlabeled", "--suggest", "3")
    assert suggested.returncode == 0 and len(read_rows(suggested.stdout, ["cluster"])) == 3


@pytest.mark.slow
def test_json_output_is_json_only_even_while_decoding(trained, tmp_path):
    _, ckpt = trained
    env = dict(MTLC_CACHE_DIR=str(tmp_path / "fresh-cache"))  # no cache: the folder is decoded
    res = run("evaluate.py", "--ckpt", ckpt, ckpt, "--json", env=env)
    assert res.returncode == 0 and "cached the decoded images" in res.stderr  # said, on stderr
    lines = [json.loads(line) for line in res.stdout.splitlines()]  # every line of stdout is JSON
    assert len(lines) == 1 and "teacher_error" in lines[0] and "again: counted once" in res.stderr  # one file once
