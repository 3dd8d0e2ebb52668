"""The pseudo-label objective (--consistency fixmatch): its strong views against torchvision's
functional ops written out here as RandAugment documents them, the draws' statistics, Cutout, the
loss and FreeMatch's adaptive threshold against their formulas, and its state in checkpoints."""
import math

import pytest
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

from mtlc.train.presets import CONSISTENCY
from mtlc.train.objectives.fixmatch import ADAPTIVE_MOMENTUM, FixMatch, is_threshold
from mtlc.data.views import CUTOUT_FILL, StrongAugment
from fakedata import run_settings

# RandAugment's ops at torchvision's magnitude 9 of 31 bins (0 .. 30), written out independently:
# the op, its magnitude at bin 9, and the functional call it stands for.
BIN = 9 / 30
REFERENCE = {
    "Identity": (0.0, lambda x, m: x),
    "ShearX": (0.3 * BIN, lambda x, m: TF.affine(x, angle=0.0, translate=[0, 0], scale=1.0,
                                                 shear=[math.degrees(math.atan(m)), 0.0], center=[0, 0])),
    "ShearY": (0.3 * BIN, lambda x, m: TF.affine(x, angle=0.0, translate=[0, 0], scale=1.0,
                                                 shear=[0.0, math.degrees(math.atan(m))], center=[0, 0])),
    "TranslateX": (150 / 331 * 32 * BIN, lambda x, m: TF.affine(x, angle=0.0, translate=[int(m), 0], scale=1.0,
                                                               shear=[0.0, 0.0])),
    "TranslateY": (150 / 331 * 32 * BIN, lambda x, m: TF.affine(x, angle=0.0, translate=[0, int(m)], scale=1.0,
                                                               shear=[0.0, 0.0])),
    "Rotate": (30 * BIN, lambda x, m: TF.rotate(x, angle=m)),
    "Brightness": (0.9 * BIN, lambda x, m: TF.adjust_brightness(x, 1 + m)),
    "Color": (0.9 * BIN, lambda x, m: TF.adjust_saturation(x, 1 + m)),
    "Contrast": (0.9 * BIN, lambda x, m: TF.adjust_contrast(x, 1 + m)),
    "Sharpness": (0.9 * BIN, lambda x, m: TF.adjust_sharpness(x, 1 + m)),
    "Posterize": (7, lambda x, m: TF.posterize(x, bits=int(m))),
    "Solarize": (1 - BIN, lambda x, m: TF.solarize(x, threshold=255 * m)),
    "AutoContrast": (0.0, lambda x, m: TF.autocontrast(x)),
    "Equalize": (0.0, lambda x, m: TF.equalize(x)),
}
SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness"}


def images(n=24, size=32, seed=0):
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_every_op_is_randaugments_at_its_magnitude_image_by_image():
    """Each of the 14 ops, with both signs where RandAugment draws one, applied to a batch equals the
    functional op on each image alone at RandAugment's magnitude."""
    strong = StrongAugment(32)
    assert {name for name, _ in strong.variants} == set(REFERENCE)
    assert len(strong.variants) == len(REFERENCE) + len(SIGNED)
    x = images()
    for v, (name, magnitude) in enumerate(strong.variants):
        expected_magnitude, op = REFERENCE[name]
        assert abs(abs(magnitude) - expected_magnitude) < 1e-5, name
        batch = strong.apply(v, x)
        for i in range(len(x)):
            assert torch.equal(batch[i], op(x[i], magnitude)), (name, magnitude, i)


def test_draws_pick_each_op_and_sign_uniformly_per_image():
    """Over 70,000 images: every op about 1/14 of the draws, each sign of a signed op half of its own
    (bounds of 5 standard deviations), and images of one batch draw apart."""
    strong = StrongAugment(32)
    torch.manual_seed(0)
    n = 70_000
    variants = strong.draw(n, torch.device("cpu"))
    counts = torch.bincount(variants, minlength=len(strong.variants)).double()
    p = 1 / len(REFERENCE)
    for name in REFERENCE:
        rows = [v for v, (op, _) in enumerate(strong.variants) if op == name]
        share = counts[rows].sum() / n
        assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / n), name
        if name in SIGNED:
            positive, negative = counts[rows]
            half = (positive + negative) / 2
            assert abs(positive - half) < 5 * math.sqrt(half / 2), name
    assert len(set(strong.draw(32, torch.device("cpu")).tolist())) > 5


def test_sync_free_and_eager_views_are_the_same_images():
    """The graphed step's path (every op on every image, each keeping its own) and the eager one (each
    op on the images that drew it) give the same views from the same draws."""
    strong = StrongAugment(32)
    x = images(64)
    torch.manual_seed(5)
    eager = strong(x)
    torch.manual_seed(5)
    assert torch.equal(strong(x, sync_free=True), eager)
    assert not torch.equal(eager, x) and eager.dtype == torch.uint8


@pytest.mark.parametrize("size", [32, 17, 96])
def test_cutout_is_one_square_per_image_cut_by_the_border(size):
    strong = StrongAugment(size)
    side = strong.cutout_side
    x = torch.zeros(200, 3, size, size, dtype=torch.uint8)
    torch.manual_seed(1)
    out = strong.cutout(x)
    cut = out[:, 0] == CUTOUT_FILL
    assert torch.equal(cut, (out == CUTOUT_FILL).all(1))  # every channel alike
    for mask in cut:
        rows, cols = mask.any(1).nonzero()[:, 0], mask.any(0).nonzero()[:, 0]
        assert mask.sum() == len(rows) * len(cols)  # a rectangle
        assert 0 < len(rows) <= side and 0 < len(cols) <= side
        inside = 0 < rows.min() and rows.max() < size - 1  # not cut by the top or bottom border
        assert len(rows) == side or not inside
    assert (cut.flatten(1).sum(1) == side * side).float().mean() > 0.2  # whole squares are common


def fixmatch(threshold, classes):
    return FixMatch(run_settings(threshold=threshold, num_classes=classes), torch.device("cpu"))


def test_fixed_threshold_loss_is_fixmatchs():
    """The mean over every unlabeled image of the cross-entropy to the weak view's class, counting
    only those whose confidence clears the threshold."""
    torch.manual_seed(0)
    student, source = torch.randn(50, 4) * 3, torch.randn(50, 4) * 3
    loss, targets, (above,) = fixmatch(0.7, 4).unlabeled_loss(student, source, 0)
    probs = torch.softmax(source, 1)
    keep = probs.max(1).values >= 0.7
    expected = sum(F.cross_entropy(student[i:i + 1], probs[i:i + 1].argmax(1)) for i in range(50) if keep[i]) / 50
    assert torch.allclose(loss, expected) and above.item() == pytest.approx(keep.float().mean().item())
    assert torch.equal(targets, probs.argmax(1)) and 0 < keep.sum() < 50


def test_adaptive_threshold_follows_freematch():
    """tau and p~ start at 1/C and move as EMAs (momentum 0.999) of the batch's mean confidence and
    mean prediction; class c's threshold is tau p~(c) / max p~; the state survives a checkpoint."""
    torch.manual_seed(0)
    pseudo = fixmatch("adaptive", 3)
    tau, means = torch.tensor(1 / 3), torch.full((3,), 1 / 3)
    for _ in range(5):
        source = torch.randn(40, 3) * 4 + torch.tensor([2.0, 0.0, 0.0])
        probs = torch.softmax(source, 1)
        tau = ADAPTIVE_MOMENTUM * tau + (1 - ADAPTIVE_MOMENTUM) * probs.max(1).values.mean()
        means = ADAPTIVE_MOMENTUM * means + (1 - ADAPTIVE_MOMENTUM) * probs.mean(0)
        _, targets, (above,) = pseudo.unlabeled_loss(torch.randn(40, 3), source, 0)
        thresholds = tau * means / means.max()
        assert above.item() == pytest.approx((probs.max(1).values >= thresholds[targets]).float().mean().item())
    assert torch.allclose(pseudo.confidence, tau) and torch.allclose(pseudo.class_means, means)
    again = fixmatch("adaptive", 3)
    again.load_state_dict(pseudo.state_dict())
    assert torch.equal(again.class_means, pseudo.class_means) and torch.equal(again.confidence, pseudo.confidence)
    assert fixmatch(0.95, 3).state_dict() is None


def test_the_global_adaptive_threshold_is_freematchs_tau_for_every_class():
    """adaptive-global: the same tau as adaptive, for every class alike (no lower threshold for a class
    predicted less often: no push towards equal classes)."""
    torch.manual_seed(0)
    per_class, alike = fixmatch("adaptive", 3), fixmatch("adaptive-global", 3)
    for _ in range(5):
        source = torch.randn(40, 3) * 4 + torch.tensor([3.0, 0.0, 0.0])  # class 0 predicted most
        probs = torch.softmax(source, 1)
        per_class.unlabeled_loss(torch.randn(40, 3), source, 0)
        _, targets, (above,) = alike.unlabeled_loss(torch.randn(40, 3), source, 0)
        assert above.item() == pytest.approx((probs.max(1).values >= alike.confidence).float().mean().item())
    assert torch.equal(alike.confidence, per_class.confidence)
    assert (per_class.confidence * per_class.class_means / per_class.class_means.max())[1] < alike.confidence


def test_threshold_values():
    assert is_threshold(0.95) and is_threshold(1) and is_threshold("adaptive") and is_threshold("adaptive-global")
    assert not any(is_threshold(v) for v in (0, -0.1, 1.01, float("nan"), True, "0.9", None))


def test_fixmatch_defaults_are_the_measured_choices_and_mt_stays_the_presets_objective():
    from mtlc.train.network_choice import objective_settings
    unset = dict(threshold=None, pseudo_labels=None, cons_weight=None, unlabeled_batch=None)
    fixmatch = objective_settings("fixmatch", **unset)
    assert (fixmatch["threshold"], fixmatch["pseudo_labels"], fixmatch["cons_weight"]) == ("adaptive", "teacher", 1.0)
    assert objective_settings("fixmatch", **dict(unset, threshold=0.95))["threshold"] == 0.95
    assert objective_settings("fixmatch", True, **unset)["threshold"] == 0.95  # a frozen trunk's head
    assert objective_settings("fixmatch", True, **dict(unset, threshold="adaptive"))["threshold"] == "adaptive"
    assert all(CONSISTENCY[d] == "mt" for d in ("svhn", "cifar10", "digits")) and objective_settings("mt", **unset)["cons_weight"] == 100.0


def test_a_folder_trains_fixmatch_unless_told_otherwise(trained):
    """The practitioner's path: a folder run given no --consistency trains FixMatch with its chosen settings
    (docs/better-labels.md: ahead of MT on two datasets, level on the third)."""
    import json
    _, checkpoint = trained
    config = torch.load(checkpoint, weights_only=True)["config"]
    assert (config["consistency"], config["threshold"], config["pseudo_labels"]) == ("fixmatch", "adaptive", "teacher")
    metrics = [json.loads(line) for line in (checkpoint.parent / "mt_metrics.jsonl").read_text().splitlines()]
    assert all(0 <= m["above_threshold"] <= 1 for m in metrics if "above_threshold" in m) and metrics
