"""A pretrained backbone trained whole (train_mt.py --trunk trained): the trunk starts from the
package's weights, trains with the head on images that it resizes to its side, is kept whole in the
checkpoint (whose trunk keys are checked), and every tool after training takes the run through the
trained trunk, never the package's frozen one or its kept features."""
import importlib.util
import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn

import evaluate
import finetune_lc
import mtlc
import train_mt
from conftest import invoke, needs_backbone, read_rows, train_backbone_run
from fakedata import write_own_folder
from mtlc.train import pretrained
from mtlc.train.checkpoints import STATE_CHECKS, load_checkpoint, restore_data, restore_models
from mtlc.train.model import ModelConfig, recompute_bn_means

BACKBONE = "efficientnet-lite0"
pytestmark = needs_backbone(BACKBONE)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A trained-trunk run on a small own-images folder (images 40 x 30, trained at 32 px)."""
    root = tmp_path_factory.mktemp("trained")
    output = train_backbone_run(root, "--trunk", "trained", "--unlabeled-batch", "6", n_labeled=6, n_unlabeled=12,
                                n_test=4)
    assert f"{BACKBONE} (trained)" in output
    return root


def test_the_trunk_starts_from_the_package_weights_trains_and_is_kept_whole(run):
    state = load_checkpoint(run / "run" / "mt_final.pt")
    assert state["model_args"] == dict(num_classes=state["config"].num_classes, width=0.25, bn_momentum=0.001,
                                       backbone=BACKBONE, trunk="trained", image_size=32)
    start = pretrained.trunk_weights(BACKBONE)
    student = {k.removeprefix("trunk."): v for k, v in state["student"].items() if k.startswith("trunk.")}
    assert set(student) == set(start)  # the whole trunk is in the checkpoint
    changed = [k for k, v in start.items() if v.is_floating_point() and not torch.equal(student[k], v)]
    assert any("conv" in k for k in changed)  # and trained: its convolutions moved from ImageNet's weights
    assert restore_data(state, echo=lambda line: None).features is None  # no kept features: images


def test_a_trained_trunk_resizes_images_to_its_side_and_takes_gradients():
    net = pretrained.PretrainedNet(BACKBONE, 3, width=0.25, trained_size=32)
    images = torch.randn(2, 3, 24, 24)
    resized = nn.functional.interpolate(images, size=(32, 32), mode="bilinear", align_corners=False)
    net.eval()
    assert torch.allclose(net.features(images), net.features(resized), atol=1e-6)
    net.train()
    z, logits = net(images)
    logits.sum().backward()
    assert all(p.grad is not None for p in net.trunk.parameters() if p.requires_grad)


@pytest.mark.slow
def test_finetune_predict_audit_onnx_and_load_take_the_trained_trunk(run, tmp_path, monkeypatch):
    ckpt = run / "run" / "mt.pt"
    result = invoke(finetune_lc, ["--ckpt", ckpt, "--epochs", "1", "--decay-epochs", "1"])
    assert result.exit_code == 0, result.output
    lc = run / "run" / "lc.pt"
    monkeypatch.setattr(pretrained, "TrunkEngine", lambda *a: pytest.fail("the package's frozen trunk ran"))
    state = load_checkpoint(lc)
    data = restore_data(state, echo=lambda line: None)
    _, teacher = restore_models(state, torch.device("cpu"))
    teacher.eval()
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (state["config"].mean, state["config"].std))
    with torch.no_grad():
        expected = teacher((data.test_x.float() / 255 - mean) / std)[1].argmax(1)
    predictions = mtlc.load(lc, device="cpu").predict(run / "d" / "test")
    assert ({p.path.relative_to(run / "d").as_posix(): p.label for p in predictions}
            == {name: state["config"].classes[i] for name, i in zip(data.files["test"], expected.tolist())})
    result = invoke(evaluate, ["--ckpt", lc, "--predict", run / "d" / "unlabeled", "--max-error", "5", "--csv",
                               tmp_path / "p.csv"])
    assert result.exit_code == 0, result.output
    assert len(read_rows((tmp_path / "p.csv").read_text(), more=("accepted",))) == 12
    result = invoke(evaluate, ["--ckpt", lc, "--audit", tmp_path / "audit.csv", "--audit-steps", "20",
                               "--audit-folds", "2"])
    assert result.exit_code == 0, result.output
    result = invoke(evaluate, ["--ckpt", lc, "--onnx", tmp_path / "m.onnx"])
    assert result.exit_code == 0, result.output
    import onnxruntime
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert list(np.argmax(session.run(None, {"images": data.test_x.numpy()})[0], 1)) == expected.tolist()


def test_a_trained_trunk_run_resumes_to_the_same_weights(run, tmp_path):
    """Killed after its second epoch, the run resumes from mt_last.pt, its trunk restored from the
    checkpoint, and ends where the run that was not killed ended."""
    shutil.copytree(run / "run", tmp_path / "run", ignore=shutil.ignore_patterns("lc*", "*.lock"))
    state = torch.load(tmp_path / "run" / "mt_last.pt", weights_only=True)
    assert state["epoch"] == 3  # the whole run's
    for name in ("mt_final.pt", "mt_last.pt"):
        (tmp_path / "run" / name).unlink()
    args = ["--dataset", "folder", "--data-dir", run / "d", "--out", tmp_path / "run", "--device", "cpu"]
    kept = torch.load(run / "run" / "mt.pt", weights_only=True)  # mt.pt: after epoch 2
    torch.save(dict(kept, epoch=2, metrics=kept["metrics"][:2]), tmp_path / "run" / "mt_last.pt")
    result = invoke(train_mt, [*args, "--resume"])
    assert result.exit_code == 0 and "after epoch 2" in result.output and "mt epoch 1/" not in result.output
    resumed = torch.load(tmp_path / "run" / "mt_final.pt", weights_only=True)["teacher"]
    whole = torch.load(run / "run" / "mt_final.pt", weights_only=True)["teacher"]
    assert resumed.keys() == whole.keys() and any(k.startswith("trunk.") for k in whole)
    assert all(torch.allclose(resumed[k].float(), whole[k].float(), atol=1e-5) for k in whole)


def test_trunk_trained_needs_a_pretrained_backbone(tmp_path):
    write_own_folder(tmp_path / "d", n_labeled=4, n_unlabeled=4, n_test=2, size=(20, 20))
    result = invoke(train_mt, ["--dataset", "folder", "--data-dir", tmp_path / "d", "--backbone", "convlarge",
                               "--trunk", "trained", "--device", "cpu", "--out", tmp_path / "run"])
    assert result.exit_code == 2 and "--trunk trained trains a pretrained backbone" in result.output
    assert not (tmp_path / "run" / "mt.pt").exists()


@pytest.mark.parametrize("extra, ok", [
    ({}, True), (dict(backbone=BACKBONE), True), (dict(backbone=BACKBONE, trunk="trained", image_size=128), True),
    (dict(trunk="trained", image_size=128), False),                      # ConvLarge has no trunk to train
    (dict(backbone=BACKBONE, trunk="trained"), False),                   # its side is needed
    (dict(backbone=BACKBONE, trunk="frozen", image_size=128), False),    # a frozen trunk keeps no keys
    (dict(backbone=BACKBONE, trunk="trained", image_size=8), False),
    (dict(backbone=BACKBONE, trunk="trained", image_size="128"), False)])
def test_a_checkpoints_trunk_keys_are_checked(extra, ok):
    assert STATE_CHECKS["model_args"](dict(num_classes=10, width=1.0, bn_momentum=0.001, **extra)) is ok


def test_model_config_keeps_trunk_keys_only_for_a_trained_trunk():
    frozen = ModelConfig(backbone=BACKBONE)
    assert frozen.keeps_features and "trunk" not in frozen.as_dict()
    trained = ModelConfig(backbone=BACKBONE, trunk="trained", image_size=64)
    assert not trained.keeps_features and ModelConfig(**trained.as_dict()) == trained
    assert not ModelConfig().keeps_features


def test_batch_norms_running_statistics_are_recomputed_over_the_images():
    """torch's batch norms (a trained trunk's) get the average of the batch means and variances, as
    the head's mean-only ones do, whatever their momentum."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm2d(3, momentum=0.01))
    batches = [torch.randn(8, 3, 4, 4) * 2 + 5 for _ in range(3)]
    recompute_bn_means(model, batches)
    bn = model[0]
    means = torch.stack([b.mean((0, 2, 3)) for b in batches]).mean(0)
    variances = torch.stack([b.var((0, 2, 3), unbiased=True) for b in batches]).mean(0)
    assert torch.allclose(bn.running_mean, means, atol=1e-5) and torch.allclose(bn.running_var, variances, atol=1e-4)
    assert bn.momentum == 0.01 and model.training  # its momentum and mode as they were


def test_a_trunk_trained_on_32_px_datasets_augments_at_their_own_side():
    """CIFAR-10's 32-px images, which a trained trunk sees upscaled to --image-size, are shifted and
    cut out at 32 px (a cutout sized for 160 px would cover the whole image)."""
    from fakedata import run_settings
    from mtlc.data.batches import Batches
    from mtlc.data.datasets import ImageData
    data = ImageData(torch.zeros(8, 3, 32, 32, dtype=torch.uint8), torch.arange(8) % 2,
                     torch.zeros(0, 3, 32, 32, dtype=torch.uint8), torch.zeros(0, dtype=torch.long), ["a", "b"])
    split = dict(labeled_idx=torch.arange(4), unlabeled_idx=torch.arange(4, 8), val_idx=torch.zeros(0, dtype=torch.long))
    config = run_settings(dataset="cifar10", num_classes=2, image_size=160, backbone=BACKBONE, trunk="trained",
                          labeled_batch=2, unlabeled_batch=2)
    batches = Batches(data, split, config, torch.device("cpu"), strong_view=True)
    assert batches.max_shift == 2 and batches.strong.cutout_side < 32


def test_a_checkpoint_whose_network_is_not_its_runs_is_refused_in_one_line(run, tmp_path):
    state = torch.load(run / "run" / "mt_final.pt", weights_only=True)
    for name, edited in [("frozen-run", dict(state, config=dict(state["config"], trunk="frozen"))),
                         ("other-side", dict(state, model_args=dict(state["model_args"], image_size=64)))]:
        torch.save(edited, tmp_path / f"{name}.pt")
        result = invoke(evaluate, ["--ckpt", tmp_path / f"{name}.pt"])
        assert result.exit_code == 2 and "its network's backbone, trunk, image size or head" in result.output, result.output


def test_a_trained_trunk_checkpoint_needs_timm_but_not_the_weights_package(run, monkeypatch):
    real = importlib.util.find_spec
    package = pretrained.BACKBONES[BACKBONE].package
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    assert len(mtlc.load(run / "run" / "mt_final.pt", device="cpu").predict(run / "d" / "test")) == 12
