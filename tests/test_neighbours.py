"""Sound on any data: eval statistics that follow the weights, eps from the features,
a relative eps that follows the feature scale, the normalized LC form that cannot gain by shrinking
the space, and the warnings when LC or training goes wrong."""
import math

import pytest
import torch

from mtlc.data.datasets import load_digits
from mtlc.data.splits import balanced_split
from fakedata import run_settings, tiny_trainer
from kernels import lc_loss
from mtlc.train.model import Dropout, WeightNormMeanOnlyBN
from mtlc.train.lc import PairDistances, batch_pair_d2, lc_term, mean_pair_d2, normalized_lc_loss, relative_lc_loss
from mtlc.train.epochs import fit
from mtlc.train.settings import MAX_GRAD_NORM, LCSettings, Stage


def digits_config(**changes):
    return dict(dict(seed=3, labeled_batch=16, unlabeled_batch=256, dataset="digits", num_classes=10, width=0.0625,
                     bn_momentum=0.001, mean=[0.2] * 3, std=[0.3] * 3, precision="fp32"), **changes)


def mt_stage(epochs):
    return Stage(name="mt", epochs=epochs, decay_epochs=0, lr=0.05, ema=0.99, cons_weight=10.0, cons_rampup=1,
                 eval_every=epochs, first_step=0)


@torch.no_grad()
def population_means(model, images):
    """Every BN layer's mean over all images in one training-mode batch with dropout off: the
    statistics of the weights as they are, computed from scratch with forward hooks."""
    layers = [m for m in model.modules() if isinstance(m, WeightNormMeanOnlyBN)]
    means = {}

    def hook(layer, inputs, _):
        t = layer._project(inputs[0], layer._weight())
        means[layer] = t.mean((0, 2, 3) if layer.is_conv else (0,))
    handles = [m.register_forward_hook(hook) for m in layers]
    model.train()
    for m in model.modules():
        if isinstance(m, Dropout):
            m.eval()
    model(images)
    for h in handles:
        h.remove()
    return [means[m] for m in layers]


@pytest.mark.slow
def test_eval_statistics_follow_the_weights(tmp_path):
    """After a short run at the paper's BN momentum (0.001), the running means saved in the
    checkpoint are those of its weights, not of the weights 0.001 lagged behind."""
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    trainer = tiny_trainer(data, labeled, unlabeled, digits_config(), mt_stage(epochs=3))
    fit(trainer, tmp_path, {3: ["mt.pt"]}, echo=lambda line: None)
    saved = torch.load(tmp_path / "mt.pt", weights_only=True)
    b = trainer.batches
    images = torch.cat(list(b.training_images(len(data.train_y))))  # what BN_IMAGES covers on digits
    for name in ("student", "teacher"):
        model = getattr(trainer, name)
        model.load_state_dict(saved[name])
        expected = population_means(model, images)
        running = [v for k, v in saved[name].items() if k.endswith("running_mean")]
        assert len(running) == len(expected) == 10
        for got, want in zip(running, expected):
            # chunks of 500 images: each layer sees chunk means, not the population's (1e-3 of the
            # features' scale measured); the lagging means were off by ~0.5 of it
            torch.testing.assert_close(got, want, atol=2e-2 * want.abs().max().item(), rtol=0)
    # the recorded error is the error with these statistics
    assert torch.load(tmp_path / "mt.pt", weights_only=True)["metrics"][-1]["teacher_error"] == \
        trainer.errors()["teacher_error"]


def test_momentum_alone_would_lag(tmp_path):
    """The control of the test above: without the recomputation the running means are far off."""
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    trainer = tiny_trainer(data, labeled, unlabeled, digits_config(), mt_stage(epochs=3))
    trainer.recompute_bn_means = lambda: None
    fit(trainer, tmp_path, {}, echo=lambda line: None)
    images = torch.cat(list(trainer.batches.training_images(len(data.train_y))))
    running = [m.running_mean.clone() for m in trainer.teacher.modules() if isinstance(m, WeightNormMeanOnlyBN)]
    expected = population_means(trainer.teacher, images)
    worst = max(((got - want).abs().max() / want.abs().max()).item() for got, want in zip(running, expected))
    assert worst > 0.1


def clusters(n_per_class, n_classes, dim, spread, gap, seed):
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_classes, dim, generator=gen) * gap
    labels = torch.arange(n_classes).repeat(n_per_class)
    return centres[labels] + spread * torch.randn(len(labels), dim, generator=gen), labels


def test_eps_auto_lands_between_same_and_different_class_distances():
    batches = []
    for seed in range(4):
        z, labels = clusters(4, 8, 16, spread=0.3, gap=3.0, seed=seed)
        z_unlabeled, _ = clusters(12, 8, 16, spread=0.3, gap=3.0, seed=seed + 100)
        batches.append((z, z_unlabeled, labels))
    distances = PairDistances.of_batches(batches)
    assert distances.same.max() < distances.different.min()  # separable, by construction
    eps = distances.choose_eps()
    assert distances.same.max() < eps < distances.different.min()
    summary = distances.summary(eps)
    assert summary["d2_ratio"] == pytest.approx(summary["d2_same_median"] / summary["d2_different_median"])
    assert summary["d2_ratio"] < 0.1


def test_eps_auto_needs_both_kinds_of_pairs():
    z, labels = clusters(1, 6, 4, spread=0.3, gap=3.0, seed=0)  # one image per class: no same-class pair
    assert PairDistances.of_batches([(z, z, labels)]).choose_eps() is None


def test_mean_pair_d2_is_the_mean_over_the_lc_pairs():
    gen = torch.Generator().manual_seed(1)
    zl, zu = torch.randn(7, 5, generator=gen, dtype=torch.float64) + 3, torch.randn(11, 5, generator=gen,
                                                                                    dtype=torch.float64)
    brute = torch.cat([(a - zu).square().mean(1) for a in torch.cat([zl, zu])]).mean()
    torch.testing.assert_close(mean_pair_d2(zl, zu), brute)
    # batch_pair_d2 leaves out the U x U diagonal (d2 = 0): its sum over all pairs is the same
    torch.testing.assert_close(batch_pair_d2(zl, zu).sum() / (18 * 11), brute)
    assert len(batch_pair_d2(zl, zu)) == 18 * 11 - 11


def test_relative_eps_follows_the_feature_scale():
    gen = torch.Generator().manual_seed(2)
    zl, zu = torch.randn(32, 16, generator=gen), torch.randn(128, 16, generator=gen)
    loss, fraction = relative_lc_loss(zl, zu, 0.6)
    assert 0.03 < fraction < 0.5
    small_loss, small_fraction = relative_lc_loss(0.1 * zl, 0.1 * zu, 0.6)
    assert small_fraction == fraction  # the same pairs are neighbours at a tenth of the scale
    torch.testing.assert_close(small_loss, 0.01 * loss, rtol=1e-5, atol=0)
    # ... while a fixed eps takes in more pairs as the space shrinks
    eps = 0.6 * mean_pair_d2(zl, zu).item()
    assert lc_loss(0.1 * zl, 0.1 * zu, eps, return_fraction=True)[1] > 2 * fraction


def test_relative_lc_loss_is_lc_loss_at_the_batch_eps():
    """Loss and gradients equal those of the fixed-eps loss at eps = ratio x the batch's mean d2."""
    gen = torch.Generator().manual_seed(3)
    zl = (torch.randn(16, 8, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    zu = torch.randn(64, 8, generator=gen, dtype=torch.float64).requires_grad_()
    loss, _ = relative_lc_loss(zl, zu, 0.3)
    grads = torch.autograd.grad(loss, (zl, zu))
    eps = 0.3 * mean_pair_d2(zl.detach(), zu.detach()).item()
    expected = lc_loss(zl, zu, eps)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=0)
    for got, want in zip(grads, torch.autograd.grad(expected, (zl, zu))):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def radial_share(z, grad):
    """The share of the gradient's squared norm along the (centred) features themselves."""
    centred = z - z.mean(0)
    return ((grad * centred).sum().square() / (grad.square().sum() * centred.square().sum())).item()


def lc_grads(form, zl, zu, ratio):
    zl, zu = zl.detach().requires_grad_(), zu.detach().requires_grad_()
    loss, fraction = lc_term(zl, zu, None, form, ratio)
    return loss, fraction, torch.cat(torch.autograd.grad(loss, (zl, zu)))


@pytest.mark.parametrize("scale", [0.05, 0.7, 3.0])
def test_normalized_lc_gains_nothing_from_scaling_all_features(scale):
    """A common factor on every feature leaves the normalized loss and its neighbours as they are, and
    its gradient has no component along the features (shrinking the space buys nothing), while the
    relative form's value falls with the scale and a share of its gradient only shrinks the space."""
    gen = torch.Generator().manual_seed(4)
    zl = torch.randn(32, 16, generator=gen, dtype=torch.float64) + 0.5
    zu = torch.randn(128, 16, generator=gen, dtype=torch.float64)
    loss, fraction, grad = lc_grads("normalized", zl, zu, 0.6)
    scaled_loss, scaled_fraction, scaled_grad = lc_grads("normalized", scale * zl, scale * zu, 0.6)
    assert 0.03 < fraction < 0.5 and scaled_fraction == fraction
    torch.testing.assert_close(scaled_loss, loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(scaled_grad, grad / scale, rtol=1e-9, atol=1e-12)
    z = torch.cat([zl, zu])
    assert radial_share(z, grad) < 1e-20
    relative_loss, _, relative_grad = lc_grads("relative", zl, zu, 0.6)
    torch.testing.assert_close(lc_grads("relative", scale * zl, scale * zu, 0.6)[0], scale ** 2 * relative_loss)
    assert radial_share(z, relative_grad) > 0.01


def test_relative_lc_is_unit_free_in_units_of_the_start_scale():
    """Divided by the mean d2 at LC's start, the relative loss takes the same value on features c times
    larger that started c^2 times larger: lambda2 weighs LC alike whatever the data's feature scale."""
    gen = torch.Generator().manual_seed(7)
    zl, zu = torch.randn(32, 16, generator=gen, dtype=torch.float64), torch.randn(128, 16, generator=gen, dtype=torch.float64)
    start = mean_pair_d2(zl, zu).item()
    loss, fraction = lc_term(zl, zu, None, "relative", 0.5, unit=start)
    torch.testing.assert_close(loss, relative_lc_loss(zl, zu, 0.5)[0] / start)
    for c in (0.1, 30.0):
        scaled, scaled_fraction = lc_term(c * zl, c * zu, None, "relative", 0.5, unit=c ** 2 * start)
        torch.testing.assert_close(scaled, loss, rtol=1e-10, atol=0)
        assert scaled_fraction == fraction


def test_trainer_divides_the_relative_loss_by_its_unit():
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)

    def first_step_lc(unit):
        stage = Stage(name="lc", epochs=1, decay_epochs=0, lr=0.05, ema=0.99, cons_weight=10.0, cons_rampup=1,
                      eval_every=1, first_step=0, lc_eps=1.0, lc_weight=2.0, lc_rampup=0, lc_eps_scale="relative",
                      lc_eps_ratio=0.4, lc_loss_unit=unit)
        trainer = tiny_trainer(data, labeled, unlabeled, digits_config(), stage)
        return trainer.train_step(0, *trainer.batches.views(0))[3].item()  # (loss, ce, cons, lc, ...)
    assert first_step_lc(4.0) == pytest.approx(first_step_lc(1.0) / 4, rel=1e-6)


@pytest.mark.parametrize("stage_name", ["mt", "lc"])
def test_a_clipping_stage_clips_the_gradient_norm_and_only_where_it_is_large(monkeypatch, stage_name):
    """An absurd weight (lambda2 in stage 2, the consistency weight in stage 1): the step's gradient is
    clipped to norm 10 (stage 2 diverged to NaN within a few steps without, a folder's stage 1 of a
    few dozen images too); with weight 0 it is far below 10 and left exactly as it was; a stage that
    does not clip (the paper's stage 1) takes the whole gradient."""
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    seen = []
    real_step = torch.optim.SGD.step
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, *a, **k: seen.append(torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for g in self.param_groups for p in g["params"]])).item()) or real_step(self, *a, **k))

    def first_step_norm(weight, clip=MAX_GRAD_NORM):
        lc = dict(lc_eps=1e6, lc_weight=weight, lc_rampup=0) if stage_name == "lc" else {}
        stage = Stage(name=stage_name, epochs=1, decay_epochs=0, lr=0.05, ema=0.99,
                      cons_weight=10.0 if stage_name == "lc" else weight, cons_rampup=1 if stage_name == "lc" else 0,
                      eval_every=1, first_step=0, max_grad_norm=clip, **lc)
        trainer = tiny_trainer(data, labeled, unlabeled, digits_config(), stage)
        seen.clear()
        trainer.train_step(0, *trainer.batches.views(0))
        return seen[0]
    huge, none = first_step_norm(1e6), first_step_norm(0.0)
    assert huge == pytest.approx(MAX_GRAD_NORM, rel=1e-4)
    assert none < MAX_GRAD_NORM / 2
    assert first_step_norm(0.0, clip=None) == none  # unclipped: the same step gives the same norm
    assert first_step_norm(1e6, clip=None) > 100 * huge


def test_stage_2_and_a_folders_stage_1_clip_the_paper_datasets_stage_1_does_not():
    for dataset, stage_1 in (("folder", MAX_GRAD_NORM), ("digits", None), ("cifar10", None), ("svhn", None)):
        config = run_settings(**digits_config(dataset=dataset))
        assert config.stage("mt").max_grad_norm == stage_1
        lc = LCSettings(eps=50.0, eps_auto=False, eps_scale="fixed", eps_ratio=None, start={}, loss_unit=1.0, pairs="all",
                        truth=None, lam=20.0, lc_rampup=1, epochs=1, decay_epochs=0, lr=0.05, eval_every=1,
                        scope="local", mt_checkpoint="mt.pt", mt_epoch=None, mt_step=10)
        assert config.replace(lc=lc).stage("lc").max_grad_norm == MAX_GRAD_NORM


@pytest.mark.parametrize("pairs", ["all", "same-prediction", "true-class"])
def test_trainer_hands_the_loss_the_classes_of_its_pairs(pairs, monkeypatch):
    """all: no class ids; same-prediction: the labels, then the teacher's predicted classes; true-class:
    the true classes of the step's images in batch order."""
    from mtlc.train import lc as neighbours
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    stage = Stage(name="lc", epochs=1, decay_epochs=0, lr=0.05, ema=0.99, cons_weight=10.0, cons_rampup=1,
                  eval_every=1, first_step=0, lc_eps=1.0, lc_weight=2.0, lc_rampup=0, lc_eps_scale="relative",
                  lc_eps_ratio=0.4, lc_pairs=pairs)
    trainer = tiny_trainer(data, labeled, unlabeled, digits_config(), stage)
    if pairs == "true-class":
        trainer.true_classes = data.train_y.clone()
    seen = []

    def recording(z_labeled, z_unlabeled, eps, **kwargs):
        seen.append(kwargs.get("classes"))
        return lc_loss(z_labeled, z_unlabeled, eps, **kwargs)
    monkeypatch.setattr(neighbours, "lc_loss", recording)
    teacher, teacher_outputs = trainer.targets_forward, []
    trainer.targets_forward = lambda x: teacher_outputs.append(teacher(x)) or teacher_outputs[-1]
    student_view, teacher_view, labels = trainer.batches.views(5)
    trainer.train_step(5, student_view, teacher_view, labels)
    (classes,) = seen
    if pairs == "all":
        assert classes is None
    elif pairs == "same-prediction":
        assert torch.equal(classes, torch.cat([labels, teacher_outputs[0][1][16:].argmax(1)]))
    else:
        assert torch.equal(classes, data.train_y[trainer.batches.indices(5)])


def test_normalized_lc_loss_is_the_loss_of_the_rescaled_features():
    """Its value is L_lc of z / sqrt(s) at eps = ratio, and its gradient, scale included in the graph,
    matches finite differences."""
    gen = torch.Generator().manual_seed(5)
    zl = (torch.randn(6, 4, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    zu = torch.randn(20, 4, generator=gen, dtype=torch.float64).requires_grad_()
    root = mean_pair_d2(zl, zu).sqrt()
    torch.testing.assert_close(normalized_lc_loss(zl, zu, 0.8)[0], lc_loss(zl / root, zu / root, 0.8),
                               rtol=1e-12, atol=0)
    assert torch.autograd.gradcheck(lambda a, b: normalized_lc_loss(a, b, 0.8)[0], (zl, zu))


def test_fixed_form_is_the_papers_loss():
    """The fixed form (svhn and cifar10 presets) is Eq. 4-5 as the authors' code computes it: d2 the
    mean over features of the squared difference, w = exp(-d2 / eps) on pairs with d2 <= eps, each
    term the mean of w d2 over its neighbour pairs; written out here independently, to 1e-6."""
    gen = torch.Generator().manual_seed(6)
    zl = torch.randn(32, 24, generator=gen) * 4
    zu = torch.randn(128, 24, generator=gen) * 4
    eps = 20.0

    def term(a, b):
        d2 = ((a[:, None, :] - b[None, :, :]) ** 2).mean(-1)
        neighbour = (d2 <= eps).float()
        return (neighbour * torch.exp(-d2 / eps) * d2).sum() / neighbour.sum()
    expected = term(zl.double(), zu.double()) + term(zu.double(), zu.double())
    loss, fraction = lc_term(zl, zu, eps, "fixed")
    assert 0.05 < fraction < 0.9
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=0)


def test_chance_level_warnings():
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    trainer = tiny_trainer(data, labeled, unlabeled, digits_config(), mt_stage(epochs=1))
    good = dict(student_labeled_error=3.0, teacher_labeled_error=2.0)
    assert trainer.chance_warnings(good) == []
    bad = dict(student_labeled_error=3.0, teacher_labeled_error=90.0)
    (warning,) = trainer.chance_warnings(bad)
    assert ("teacher's error on its labeled images ends at 90.0% wrong, no better than always answering the most "
            "frequent class (90.0%): it learned nothing usable") in warning
    # within two standard errors of chance (6 of 100 images here): cannot be told, counted in images
    limit = 90 - 2 * math.sqrt(100 * 0.1 * 0.9)
    (unclear,) = trainer.chance_warnings(dict(good, student_labeled_error=limit))
    assert "cannot be told from always answering" in unclear and "too few images to tell" in unclear
    assert not trainer.chance_warnings(dict(good, student_labeled_error=limit - 1))
