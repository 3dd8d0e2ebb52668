"""The fitted linear heads of a frozen trunk (--consistency probe, self-training): the head a run
writes is scikit-learn's logistic regression on the labeled images' kept features (its predictions,
to the last digit); stage 2 fits it again and says why; --predict's heads that never saw an image are
fitted alike; the options of a schedule of steps are refused with them. And the maths: the weights
folded from the standardized fit, the class prior of the unlabeled images recovered by EM."""
import numpy as np
import pytest
import torch

import evaluate
import finetune_lc
import train_mt
from conftest import BACKBONE_RUN, invoke, needs_backbone, read_rows
from fakedata import write_own_folder
from mtlc.train import linear_heads
from mtlc.train.checkpoints import load_checkpoint, restore_data
from mtlc.train.networks import build_models
from mtlc.train.model import ModelConfig

BACKBONE = "efficientnet-lite0"
# conftest's run of a head on a pretrained trunk, without the schedule a fitted head refuses
FITTED_RUN = [a for i, a in enumerate(BACKBONE_RUN)
              if a not in ("--epochs", "--decay-epochs") and BACKBONE_RUN[i - 1] not in ("--epochs", "--decay-epochs")]


@pytest.mark.parametrize("classes", [2, 5])
def test_folded_weights_give_scikit_learns_probabilities(classes):
    rng = np.random.default_rng(classes)
    x, y = rng.normal(size=(40, 12)) * rng.uniform(0.1, 5, 12) + 3, np.arange(40) % classes
    u = rng.normal(size=(100, 12)) * 2 + 3
    head = linear_heads.linear_probe(x, y, u, classes)
    w, b = head.weights()
    logits = u @ w.T + b
    probs = np.exp(logits - logits.max(1, keepdims=True))
    assert np.allclose(probs / probs.sum(1, keepdims=True), head.model.predict_proba(u), atol=1e-9)


def test_the_unlabeled_images_class_prior_is_recovered():
    """Saerens et al.'s EM on the calibrated probe fitted on balanced labels finds a skewed prior of the
    unlabeled images (three Gaussian classes, 70/20/10%), where the probe's raw posteriors (too flat)
    do not; and the probe weighed to it is right more often (over 8 draws: not on every one, where
    the classes barely overlap)."""
    errors = []
    for seed in range(8):
        rng = np.random.default_rng(seed)
        centres = rng.normal(0, 1.2, (3, 8))

        def draw(counts):
            y = np.repeat(np.arange(3), counts)
            return centres[y] + rng.normal(size=(len(y), 8)), y
        x, y = draw([30, 30, 30])
        u, truth = draw([2100, 600, 300])
        head = linear_heads.linear_probe(x, y, u, 3)
        prior = linear_heads.unlabeled_prior(x, y, u, 3)
        raw = linear_heads.class_prior(head, u, linear_heads.labeled_prior(y, 3))
        assert np.abs(prior - [0.7, 0.2, 0.1]).max() < 0.04 < np.abs(raw - [0.7, 0.2, 0.1]).max()
        corrected = linear_heads.prior_probe(x, y, u, 3)
        errors.append(((head.predict(u) != truth).mean(), (corrected.predict(u) != truth).mean()))
    plain, weighed = np.mean(errors, 0)
    assert weighed < 0.9 * plain


def test_self_training_ranks_confidence_without_a_quota_per_class():
    """Each round takes the most confident unlabeled images whatever their class: on a set where one
    class is 90% of the images, the pseudo-labeled images follow it (no equal share per class)."""
    rng = np.random.default_rng(1)
    centres = np.array([[0.0] * 6, [3.0] * 6])
    x = np.concatenate([centres[0] + rng.normal(size=(10, 6)), centres[1] + rng.normal(size=(10, 6))])
    y = np.repeat([0, 1], 10)
    u = np.concatenate([centres[0] + rng.normal(size=(900, 6)), centres[1] + rng.normal(size=(100, 6))])
    taken = []
    real = linear_heads.fit_linear
    linear_heads.fit_linear = lambda xs, ys, k, **kw: taken.append(np.bincount(ys[20:], minlength=2)) or real(xs, ys, k, **kw)
    try:
        linear_heads.self_trained(x, y, u, 2)
    finally:
        linear_heads.fit_linear = real
    last = taken[-1]
    assert last[0] > 5 * last[1]  # the common class dominates what self-training took


@needs_backbone(BACKBONE)
@pytest.mark.parametrize("objective", ["probe", "self-training"])
def test_a_fitted_run_writes_scikit_learns_head(tmp_path, objective):
    write_own_folder(tmp_path / "d", n_labeled=4, n_unlabeled=12, n_test=3, size=(40, 30))
    result = invoke(train_mt, [*FITTED_RUN, "--consistency", objective, "--data-dir", tmp_path / "d", "--out",
                               tmp_path / "run"])
    assert result.exit_code == 0, result.output
    state = load_checkpoint(tmp_path / "run" / "mt.pt")
    assert state["model_args"]["head"] == "linear" and state["epoch"] == 1 and state["step"] == 1
    data = restore_data(state, echo=lambda line: None)
    lab, unl = state["labeled_idx"], state["unlabeled_idx"]
    features = data.features.train[:, 0].float().numpy()
    fit = linear_heads.linear_probe if objective == "probe" else (
        lambda x, y, u, k: linear_heads.self_trained(x, y, u, k, correct_prior=True))
    head = fit(features[lab], data.train_y[lab].numpy(), features[unl], 3)
    _, teacher = build_models(ModelConfig(**state["model_args"]), "cpu")
    teacher.load_state_dict(state["teacher"])
    with torch.no_grad():
        ours = torch.softmax(teacher(torch.from_numpy(features[unl]))[1].double(), 1).numpy()
    assert np.allclose(ours, head.predict_proba(features[unl]), atol=1e-5)
    assert "fitted once" in result.output and "test error" in result.output
    # stage 2 fits the same head again, and says so
    result = invoke(finetune_lc, ["--ckpt", tmp_path / "run" / "mt.pt"])
    assert result.exit_code == 0, result.output
    assert "nothing trains: stage 2 fits it again" in result.output
    lc = load_checkpoint(tmp_path / "run" / "lc.pt")
    assert all(torch.equal(lc["teacher"][k], state["teacher"][k]) for k in state["teacher"])
    # --predict: four heads that never saw an image, fitted alike
    out = tmp_path / "p.csv"
    result = invoke(evaluate, ["--ckpt", tmp_path / "run" / "lc.pt", "--predict", tmp_path / "d" / "unlabeled",
                               "--csv", out])
    assert result.exit_code == 0, result.output
    assert result.output.count(" of 4 trained") == 4
    assert len(read_rows(out.read_text(), more=("like_no_class",))) == 12


@needs_backbone(BACKBONE)
@pytest.mark.parametrize("options, said", [
    (["--backbone", "convlarge"], "fits a linear head on a frozen pretrained trunk"),
    (["--trunk", "trained"], "fits a linear head on a frozen pretrained trunk"),
    (["--epochs", "3"], "--epochs: --consistency probe fits its head once"),
    (["--unlabeled-batch", "8"], "--unlabeled-batch: --consistency probe fits its head once"),
])
def test_a_fitted_objective_refuses_what_it_cannot_do(tmp_path, options, said):
    write_own_folder(tmp_path / "d", n_labeled=4, n_unlabeled=8, n_test=0, size=(40, 30))
    backbone = [] if "--backbone" in options else ["--backbone", BACKBONE]
    result = invoke(train_mt, ["--dataset", "folder", *backbone, "--image-size", "32", "--device", "cpu",
                               "--consistency", "probe", *options, "--data-dir", tmp_path / "d", "--out", tmp_path / "r"])
    assert result.exit_code == 2 and said in result.output, result.output
    assert not (tmp_path / "r").exists()
