"""The classifier as ONNX: uint8 images in, calibrated probabilities out, any batch size, the class
names in its metadata; checked with onnxruntime against the checkpoint's own predictions on real
image files."""
import json

import numpy as np
import pytest
import torch

import evaluate
import mtlc
from conftest import invoke
from mtlc.use.calibration import DECIMALS
from mtlc.data.images import decode
from mtlc.use.onnx_export import INPUT, export_onnx

pytestmark = pytest.mark.slow  # each export traces the network (torch.export): about 10 s

# Probabilities agree to this (float32 graph, float64 softmax in the package; the same network).
ATOL = 1e-5


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    folder, checkpoint = trained
    classifier = mtlc.load(checkpoint, device="cpu")
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    meta = export_onnx(classifier, path, checkpoint)
    return classifier, path, meta, folder


def session(path):
    import onnxruntime
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_onnx_gives_the_checkpoints_calibrated_predictions_on_real_images(exported):
    classifier, path, meta, folder = exported
    paths = sorted((folder / "unlabeled").rglob("*.png")) + sorted((folder / "test").rglob("*.png"))
    expected = {p.path: p for p in classifier.predict_files([str(p) for p in paths])}
    images = torch.stack([decode(p, classifier.image_size) for p in paths])
    run = session(path)
    assert classifier.calibration is not None and classifier.temperature != 1.0  # a temperature to carry
    for batch in (1, 7, len(paths)):  # any batch size
        probabilities = run.run(None, {INPUT: images[:batch].numpy()})[0]
        assert probabilities.dtype == np.float32 and probabilities.shape == (batch, len(classifier.classes))
        np.testing.assert_allclose(probabilities.sum(1), 1.0, atol=1e-5)
        for p, row in zip(paths[:batch], probabilities):
            prediction = expected[str(p)]
            assert classifier.classes[int(row.argmax())] == prediction.label
            assert row.max() == pytest.approx(prediction.confidence, abs=0.5 * 10 ** -DECIMALS + ATOL)  # as the CSV rounds
    _, reference = classifier.classify(images)
    np.testing.assert_allclose(run.run(None, {INPUT: images.numpy()})[0], reference.numpy(), atol=ATOL)


def test_onnx_metadata_names_the_classes_and_the_calibration(exported):
    classifier, path, meta, _ = exported
    found = session(path).get_modelmeta().custom_metadata_map
    assert json.loads(found["classes"]) == classifier.classes
    assert float(found["temperature"]) == classifier.temperature
    assert float(found["confidence_ceiling"]) == classifier.ceiling < 1 and found["answers"] == classifier.answers
    assert found["model"] == "teacher" and found["image_size"] == str(classifier.image_size)
    assert found == meta
    inputs = session(path).get_inputs()
    assert [(i.name, i.type) for i in inputs] == [(INPUT, "tensor(uint8)")] and isinstance(inputs[0].shape[0], str)


def test_onnx_of_the_student_and_of_an_uncalibrated_checkpoint(trained, tmp_path):
    _, checkpoint = trained
    classifier = mtlc.load(checkpoint, model="student", device="cpu", calibrate=False)
    meta = export_onnx(classifier, tmp_path / "student.onnx", checkpoint)
    assert meta["model"] == "student" and meta["temperature"] == "1.0" and meta["calibration"].startswith("none")
    images = torch.randint(0, 256, (3, 3, classifier.image_size, classifier.image_size), dtype=torch.uint8)
    np.testing.assert_allclose(session(tmp_path / "student.onnx").run(None, {INPUT: images.numpy()})[0],
                               classifier.classify(images)[1].numpy(), atol=ATOL)


def test_evaluate_onnx_as_a_user_runs_it(trained, tmp_path):
    from conftest import run
    folder, checkpoint = trained
    res = run("evaluate.py", "--ckpt", checkpoint, "--onnx", tmp_path / "m.onnx", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert "as ONNX, uint8 images (N, 3, 32, 32) in, probabilities of its 3 classes out" in res.stderr
    assert json.loads(session(tmp_path / "m.onnx").get_modelmeta().custom_metadata_map["classes"]) == ["cat", "dog", "owl"]
    for args, said in ((["--predict", folder / "unlabeled"], "--onnx takes exactly one --ckpt"),
                       (["--json"], "--json goes with the checkpoints' errors"),
                       (["--confusion", tmp_path / "c.png"], "--onnx takes exactly one --ckpt")):
        res = invoke(evaluate, ["--ckpt", checkpoint, "--onnx", tmp_path / "n.onnx", *args])
        assert res.exit_code == 2 and said in res.output, res.output
    res = invoke(evaluate, ["--ckpt", checkpoint, "--onnx", checkpoint])
    assert res.exit_code == 2 and not (tmp_path / "n.onnx").exists()  # never over its own checkpoint


def test_the_onnx_example_needs_no_torch_and_predicts_as_evaluate_does(trained, tmp_path):
    """examples/onnx_predict.py (onnxruntime, numpy and PIL only) on the folder's image files: the
    classes and confidences evaluate.py --predict writes; torch cannot even be imported. A .png holding
    PostScript is a file it cannot read, as for --predict: never handed to Ghostscript (a stand-in gs on
    PATH records any call)."""
    import csv
    import subprocess
    import sys

    from conftest import ROOT, run
    from PIL import Image
    folder, checkpoint = trained
    assert run("evaluate.py", "--ckpt", checkpoint, "--onnx", tmp_path / "m.onnx").returncode == 0
    odd = tmp_path / "odd"
    odd.mkdir()
    ramp = np.linspace(0, 1, 40 * 30).reshape(30, 40)
    Image.fromarray((ramp * 60000).astype(np.uint16)).save(odd / "g16.png")  # 16-bit gray
    Image.fromarray(ramp.astype(np.float32), "F").save(odd / "f.tif")  # float
    Image.fromarray((np.dstack([ramp] * 4) * 255).astype(np.uint8), "RGBA").save(odd / "rgba.png")
    (odd / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    (odd / "ps.png").write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 32 32\nshowpage\n")
    import os
    os.mkfifo(odd / "pipe.png")  # opening it would block: a file it cannot read
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "gs").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'gs-called'}\n")
    (tmp_path / "bin" / "gs").chmod(0o755)
    paths = sorted(str(p) for p in (folder / "unlabeled").rglob("*.png")) + sorted(str(p) for p in odd.iterdir())
    res = run("evaluate.py", "--ckpt", checkpoint, "--predict", *paths, "--csv", tmp_path / "p.csv", "--skip-bad-images")
    assert res.returncode == 0, res.stderr
    (tmp_path / "torch.py").write_text("raise ImportError('no torch here')\n")  # shadows torch for the example
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "onnx_predict.py"), tmp_path / "m.onnx", *paths],
                         capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(tmp_path), "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})
    assert res.returncode == 1 and "cannot read" in res.stderr  # the broken file, reported; the rest predicted
    ours = {r["path"]: r for r in csv.DictReader(res.stdout.splitlines())}
    theirs = {r["path"]: r for r in csv.DictReader(open(tmp_path / "p.csv", encoding="utf-8"))}
    assert set(ours) == set(theirs) == set(paths)
    for path, row in theirs.items():
        assert ours[path]["prediction"] == row["prediction"], path
        if row["prediction"]:
            assert float(ours[path]["confidence"]) == pytest.approx(float(row["confidence"]), abs=1.01e-4), path
    assert ours[str(odd / "broken.png")]["prediction"] == "" and ours[str(odd / "ps.png")]["prediction"] == ""
    assert not (tmp_path / "gs-called").exists()


def test_the_onnx_example_refuses_in_one_line(exported, tmp_path):
    """--help exits 0; no images, or a model it cannot use (missing, not ONNX, an ONNX without our
    metadata) exit 2 with one line; a reader that leaves early (| head) ends it without a traceback."""
    import subprocess
    import sys

    import onnx
    from conftest import ROOT, run
    _, path, _, folder = exported
    assert run("examples/onnx_predict.py", "--help").returncode == 0
    assert run("examples/onnx_predict.py", path).returncode == 2
    (tmp_path / "text.onnx").write_text("not a model")
    model = onnx.load(str(path))
    del model.metadata_props[:]
    onnx.save(model, str(tmp_path / "bare.onnx"))
    for bad in (tmp_path / "missing.onnx", tmp_path / "text.onnx", tmp_path / "bare.onnx"):
        res = run("examples/onnx_predict.py", bad, *sorted((folder / "test").rglob("*.png")))
        assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and "cannot use" in res.stderr, res.stderr
        assert res.stdout == ""
    many = tmp_path / "many"  # rows beyond a pipe's buffer, so that writing outlives the reader
    many.mkdir()
    image = next((folder / "test").rglob("*.png")).read_bytes()
    for k in range(2000):
        (many / f"{k}.png").write_bytes(image)
    res = subprocess.run(["bash", "-c", f"{sys.executable} examples/onnx_predict.py {path} {many}/*.png | head -c 10"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert len(res.stdout) == 10 and "Traceback" not in res.stderr and res.stderr == "", res.stderr


def test_outputs_never_replace_a_pipe_or_a_device(trained, tmp_path):
    """As root a FIFO, /dev/full or any device at an output's path would become a plain file."""
    import os
    from conftest import run
    _, checkpoint = trained
    os.mkfifo(tmp_path / "pipe.onnx")
    res = run("evaluate.py", "--ckpt", checkpoint, "--onnx", tmp_path / "pipe.onnx")
    assert res.returncode == 2 and "is a pipe, not a file" in res.stderr
    assert (tmp_path / "pipe.onnx").is_fifo()
