"""Units of the modules: ramps, EMA, split, augmentation, the WN + mean-only BN layer, conv-large, presets."""
import math

import pytest
import torch

from mtlc.train.presets import PRESETS, preset
from mtlc.train.model import ConvLarge, Dropout, WeightNormMeanOnlyBN
from mtlc.data.batches import BatchStream, epoch_steps
from mtlc.data.views import augment
from mtlc.data.splits import balanced_split
from mtlc.errors import UserError
from mtlc.train.settings import Stage, learning_rate, sigmoid_rampup
from mtlc.train.objectives.mean_teacher import consistency_loss
from mtlc.train.trainer import ema_update


def test_sigmoid_rampup():
    assert sigmoid_rampup(0, 5) == pytest.approx(math.exp(-5))
    assert sigmoid_rampup(2.5, 5) == pytest.approx(math.exp(-1.25))
    assert sigmoid_rampup(5, 5) == 1.0
    assert sigmoid_rampup(50, 5) == 1.0
    assert sigmoid_rampup(-1, 5) == pytest.approx(math.exp(-5))
    assert sigmoid_rampup(0, 0) == 1.0


def test_learning_rate_schedule():
    assert learning_rate(0, 0.05, 300, 200) == 0.05
    assert learning_rate(299.9, 0.05, 300, 200) == 0.05
    assert learning_rate(400, 0.05, 300, 200) == pytest.approx(0.025)
    assert learning_rate(500, 0.05, 300, 200) == 0.0
    assert learning_rate(600, 0.05, 300, 200) == 0.0
    assert learning_rate(300, 0.05, 300, 0) == 0.0


def test_ema_update():
    torch.manual_seed(0)
    student, teacher = ConvLarge(10, 0.125), ConvLarge(10, 0.125)
    before = [p.clone() for p in teacher.parameters()]
    buffers = [b.clone() for b in teacher.buffers()]
    ema_update(teacher, student, 0.99)
    for new, old, s in zip(teacher.parameters(), before, student.parameters()):
        torch.testing.assert_close(new, 0.99 * old + 0.01 * s)
    for new, old in zip(teacher.buffers(), buffers):
        assert torch.equal(new, old)  # running means follow the teacher's own activations


def test_balanced_split():
    labels = torch.arange(10).repeat_interleave(30)[torch.randperm(300)]
    lab, unl = balanced_split(labels, 50, 10, seed=3)
    assert torch.bincount(labels[lab], minlength=10).tolist() == [5] * 10
    assert len(set(lab.tolist()) & set(unl.tolist())) == 0
    assert sorted(lab.tolist() + unl.tolist()) == list(range(300))
    lab2, unl2 = balanced_split(labels, 50, 10, seed=3)
    assert torch.equal(lab, lab2) and torch.equal(unl, unl2)
    assert not torch.equal(lab, balanced_split(labels, 50, 10, seed=4)[0])


@pytest.mark.parametrize("n, match", [(55, "multiple"), (5, "multiple"), (310, "needs 31 images")])
def test_balanced_split_rejects(n, match):
    labels = torch.arange(10).repeat_interleave(30)
    with pytest.raises(UserError, match=match):
        balanced_split(labels, n, 10, seed=0)
    with pytest.raises(UserError, match="needs 31 images of class airplane, the training set has 30"):
        balanced_split(labels, 310, 10, seed=0, class_names=["airplane", *"bcdefghij"])


def test_batch_stream_is_a_function_of_the_step():
    stream = BatchStream(20, 300, 8, 64, seed=1)
    assert stream.steps_per_epoch == 4
    again = BatchStream(20, 300, 8, 64, seed=1)
    for step in (0, 3, 4, 17):
        assert all(torch.equal(a, b) for a, b in zip(stream.batch(step), again.batch(step)))
    # one epoch visits distinct unlabeled images; the labeled stream cycles through the whole set
    unl = torch.cat([stream.batch(s)[1] for s in range(4)])
    assert len(unl.unique()) == len(unl) == 256
    lab = torch.cat([stream.batch(s)[0] for s in range(5)])  # 40 positions = 2 full cycles
    assert sorted(lab[:20].tolist()) == list(range(20)) and sorted(lab[20:].tolist()) == list(range(20))


def test_an_epoch_of_few_unlabeled_images_is_as_many_passes_as_make_its_least_steps():
    assert [epoch_steps(n, 128, 10) for n in (64, 128, 300, 1279, 1280, 5000)] == [10, 10, 10, 18, 10, 39]
    assert epoch_steps(300, 64, 1) == 4 and epoch_steps(300, 64, 10) == 12
    # the same batches at every step: only where epochs end moves
    one, passes = BatchStream(20, 300, 8, 64, seed=1), BatchStream(20, 300, 8, 64, seed=1, min_epoch_steps=10)
    assert (one.steps_per_epoch, passes.steps_per_epoch) == (4, 12)
    for step in range(30):
        assert all(torch.equal(a, b) for a, b in zip(one.batch(step), passes.batch(step)))


def dot_image():
    x = torch.zeros(1, 3, 32, 32, dtype=torch.uint8)
    x[0, :, 10, 20] = 255
    return x


def test_augment_shifts_at_most_two_pixels_and_covers_all_shifts():
    x = dot_image().expand(2000, -1, -1, -1)
    out = augment(x, torch.zeros(3), torch.ones(3), flip=False)  # out = pixel / 255
    assert out.shape == (2000, 3, 32, 32)
    bright = (out[:, 0] == 1.0).nonzero()[:, 1:]
    assert len(bright) == 2000  # the dot stays inside the image, once per image
    shifts = {(r - 10, c - 20) for r, c in bright.tolist()}
    assert shifts == {(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)}


@pytest.mark.parametrize("flip", [False, True])
def test_augment_flips_only_when_asked(flip):
    x = dot_image().expand(500, -1, -1, -1)
    out = augment(x, torch.zeros(3), torch.ones(3), flip=flip)
    cols = (out[:, 0] == 1.0).nonzero()[:, 2]
    mirrored = (cols <= 31 - 20 + 2).sum().item()  # the dot at column 11 +- 2 instead of 20 +- 2
    assert (mirrored > 150) if flip else (mirrored == 0)


def test_student_and_teacher_views_are_independent():
    torch.manual_seed(0)
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    a = augment(x, torch.zeros(3), torch.ones(3), flip=True)
    b = augment(x, torch.zeros(3), torch.ones(3), flip=True)
    same = [torch.equal(a[i], b[i]) for i in range(64)]
    assert sum(same) < 10  # 50 shift x flip combinations: few images get the same view twice


def test_augment_normalizes():
    x = torch.full((4, 3, 32, 32), 51, dtype=torch.uint8)
    mean, std = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 0.5, 0.5])
    out = augment(x, mean, std, flip=False)
    centre = out[:, :, 2:30, 2:30]  # away from the black padding
    torch.testing.assert_close(centre[:, 0], torch.full_like(centre[:, 0], (0.2 - 0.1) / 0.5))
    torch.testing.assert_close(centre[:, 2], torch.full_like(centre[:, 2], (0.2 - 0.3) / 0.5))


@pytest.mark.parametrize("conv", [True, False])
def test_weight_norm_mean_only_bn_layer(conv):
    torch.manual_seed(0)
    layer = WeightNormMeanOnlyBN(8, 16, 3 if conv else None, padding=1, init_scale=0.5)
    x = torch.randn(64, 8, 6, 6) * 3 + 1 if conv else torch.randn(64, 8) * 3 + 1
    dims = (0, 2, 3) if conv else (0,)
    shape = (1, -1, 1, 1) if conv else (1, -1)
    layer.pending_init = True
    layer.train()
    y = layer(x) - layer.bias.view(shape)  # the normalized output, before the bias
    torch.testing.assert_close(y.mean(dims), torch.zeros(16), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.std(dims), torch.full((16,), 0.5), atol=1e-4, rtol=1e-4)
    # the bias starts at minus the initial mean (the authors' init); eval mode uses the running mean
    t = layer._project(x, layer._weight())
    torch.testing.assert_close(layer.bias, -t.mean(dims), atol=1e-5, rtol=1e-5)
    layer.running_mean.fill_(0.25)
    layer.eval()
    torch.testing.assert_close(layer(x), t - 0.25 + layer.bias.view(shape))
    # training mode subtracts the batch mean and moves the running mean by the momentum (0.001)
    layer.train()
    layer(x)
    torch.testing.assert_close(layer.running_mean, 0.25 + 0.001 * (t.mean(dims) - 0.25))


def test_conv_large_shapes_and_parameters():
    full = ConvLarge(num_classes=10, width=1.0)
    assert sum(p.numel() for p in full.parameters() if p.requires_grad) == 3_121_812
    small = ConvLarge(num_classes=7, width=0.25)
    small.data_init(torch.randn(16, 3, 32, 32))
    small.eval()
    z, logits = small(torch.randn(5, 3, 32, 32))
    assert z.shape == (5, 32) and logits.shape == (5, 7)
    z, logits = full.eval()(torch.randn(2, 3, 32, 32))
    assert z.shape == (2, 128) and logits.shape == (2, 10)


def test_data_init_sets_every_layer():
    torch.manual_seed(0)
    model = ConvLarge(10, 0.125)
    model.data_init(torch.randn(32, 3, 32, 32))
    layers = [m for m in model.modules() if isinstance(m, WeightNormMeanOnlyBN)]
    assert len(layers) == 10 and not any(m.pending_init for m in layers)
    assert all(not torch.equal(m.g, torch.ones_like(m.g)) for m in layers)


def test_presets_follow_the_paper():
    assert preset("svhn", 1000)["epochs"] == 300 and preset("svhn", 500)["lam"] == 20.0
    assert preset("cifar10", 4000)["epochs"] == 800 and preset("cifar10", 4000)["eps"] == 50.0
    assert preset("cifar10", 2000)["epochs"] == 600 and preset("cifar10", 2000)["eps"] == 40.0
    assert PRESETS["cifar10"]["epochs"] == 800  # the 2000-label variant leaves the table alone


def schedule_trainer(stage):
    """A Trainer on digits with 5 steps per epoch (1,337 unlabeled images, batches of 256)."""
    from mtlc.data.datasets import load_digits
    from fakedata import tiny_trainer
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    config = dict(seed=0, labeled_batch=16, unlabeled_batch=256, dataset="digits", num_classes=10, width=0.0625,
                  bn_momentum=0.02, mean=[0.2] * 3, std=[0.3] * 3)
    trainer = tiny_trainer(data, labeled, unlabeled, config, stage)
    assert trainer.steps_per_epoch == 5
    return trainer


def ramp(t):
    return math.exp(-5 * (1 - t) ** 2)


def test_schedule_of_mean_teacher():
    """lr and the consistency ramp count from the start of MT (Section 5.1)."""
    trainer = schedule_trainer(Stage(name="mt", epochs=20, decay_epochs=10, lr=0.05, ema=0.99, cons_weight=100.0,
                                     cons_rampup=10, eval_every=10, first_step=0))
    lr, cons, lc = trainer.schedule(0)
    assert (lr, lc) == (0.05, 0.0) and cons == pytest.approx(100 * ramp(0))
    assert trainer.schedule(25)[1] == pytest.approx(100 * ramp(0.5))  # epoch 5 of a 10-epoch ramp
    assert trainer.schedule(50)[1] == 100.0 and trainer.schedule(99)[0] == 0.05
    assert trainer.schedule(125)[0] == pytest.approx(0.025)  # half way through the decay
    assert trainer.schedule(150)[0] == 0.0


def test_schedule_of_local_clustering():
    """In stage 2 the lr and the LC ramp count from the start of LC, the consistency ramp still
    from the start of MT."""
    stage = Stage(name="lc", epochs=10, decay_epochs=10, lr=0.05, ema=0.99, cons_weight=100.0, cons_rampup=40,
                  eval_every=10, first_step=150, lc_eps=2.0, lc_weight=20.0, lc_rampup=4)  # LC from MT epoch 30
    trainer = schedule_trainer(stage)
    lr, cons, lc = trainer.schedule(150)
    assert lr == 0.05 and cons == pytest.approx(100 * ramp(30 / 40)) and lc == pytest.approx(20 * ramp(0))
    assert trainer.schedule(160)[2] == pytest.approx(20 * ramp(0.5))  # LC epoch 2 of a 4-epoch ramp
    assert trainer.schedule(170)[2] == 20.0 and trainer.schedule(200)[1] == 100.0
    assert trainer.schedule(150 + 5 * 15)[0] == pytest.approx(0.025)
    assert trainer.schedule(150 + 5 * 20)[0] == 0.0


def test_consistency_loss_is_eq_1_with_the_teacher_detached():
    torch.manual_seed(0)
    student, teacher = torch.randn(6, 10, requires_grad=True), torch.randn(6, 10, requires_grad=True)
    loss = consistency_loss(student, teacher)
    expected = (student.softmax(1) - teacher.softmax(1)).square().mean()
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert teacher.grad is None and student.grad.abs().sum() > 0


def test_split_forward_is_two_passes():
    """SplitForward: the labeled and the unlabeled images each through the model with their own
    batch means, as two separate calls give them; a joint pass differs."""
    from mtlc.train.model import SplitForward
    torch.manual_seed(0)
    model = ConvLarge(10, 0.0625)
    model.data_init(torch.randn(16, 3, 32, 32))
    for m in model.modules():
        if isinstance(m, Dropout):
            m.p = 0.0
    x = torch.randn(24, 3, 32, 32)
    z, logits = SplitForward(model, 8)(x)
    (z_l, y_l), (z_u, y_u) = model(x[:8]), model(x[8:])
    torch.testing.assert_close(z, torch.cat([z_l, z_u]))
    torch.testing.assert_close(logits, torch.cat([y_l, y_u]))
    assert not torch.allclose(model(x)[0], z, atol=1e-4)


def test_compressed_schedule_is_the_papers_shape_shorter():
    """--compress 10 on CIFAR-10 (359 steps an epoch): every length a tenth, whole epochs; the
    consistency ramp held at 300 steps; stage 2 from MT's epoch 60 for 40 + 20 epochs as the paper's
    600 -> 1,000 + 200."""
    from mtlc.train.presets import MIN_RAMP_STEPS, preset
    paper, short = preset("cifar10", 4000, 359), preset("cifar10", 4000, 359, compress=10)
    assert {k: short[k] for k in ("epochs", "decay_epochs", "lc_start_epoch", "lc_epochs", "lc_decay_epochs",
                                  "eval_every")} == dict(epochs=80, decay_epochs=20, lc_start_epoch=60, lc_epochs=40,
                                                         lc_decay_epochs=20, eval_every=1)
    assert short["cons_rampup"] == pytest.approx(MIN_RAMP_STEPS / 359) and short["lc_rampup"] == 10
    assert {k: v for k, v in short.items() if "epoch" not in k and "rampup" not in k and k != "eval_every"} == \
        {k: v for k, v in paper.items() if "epoch" not in k and "rampup" not in k and k != "eval_every"}
    tiny = preset("cifar10", 4000, 359, compress=1000)  # never under one epoch, a decay may vanish
    assert (tiny["epochs"], tiny["decay_epochs"], tiny["lc_epochs"]) == (1, 0, 1)
    assert tiny["cons_rampup"] == tiny["lc_rampup"] == pytest.approx(MIN_RAMP_STEPS / 359)
    few_steps = preset("cifar10", 4000, 100, compress=1000)  # 300 steps would be 3 epochs of a 1-epoch stage
    assert few_steps["cons_rampup"] == few_steps["lc_rampup"] == 1
    nearly = preset("digits", 100, 10, compress=1.05)  # equal time for a dearer step: the ramps as they were
    assert (nearly["cons_rampup"], nearly["lc_rampup"]) == (30, 10) == (preset("digits", 100, 10)["cons_rampup"], 10)
    digits, longer = preset("digits", 100, 10), preset("digits", 100, 10, compress=0.25)  # under 1: four times as long
    assert {k: longer[k] for k in ("epochs", "decay_epochs", "lc_epochs", "lc_decay_epochs", "cons_rampup", "lc_rampup")} \
        == {k: 4 * digits[k] for k in ("epochs", "decay_epochs", "lc_epochs", "lc_decay_epochs", "cons_rampup", "lc_rampup")}


def test_a_failed_download_leaves_no_folder_it_made(tmp_path):
    """Offline, a download makes --data-dir and fails: the folders it made go again (none of them was
    there before); a folder that was there, or one holding a partial file, stays."""
    from mtlc.data.datasets import _ensure_files

    def failing(folder, partial=False):
        def download():
            folder.mkdir(parents=True, exist_ok=True)
            if partial:
                (folder / "cifar-10-python.tar.gz").write_bytes(b"half")
            raise OSError("network unreachable")
        return download

    data_dir = tmp_path / "data" / "cifar10"
    with pytest.raises(UserError, match="the download failed"):
        _ensure_files(data_dir, ["data_batch_1"], failing(data_dir), "CIFAR-10")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()
    with pytest.raises(UserError):
        _ensure_files(tmp_path / "mine", ["data_batch_1"], failing(tmp_path / "mine"), "CIFAR-10")
    assert (tmp_path / "mine").is_dir()
    with pytest.raises(UserError):
        _ensure_files(data_dir, ["data_batch_1"], failing(data_dir, partial=True), "CIFAR-10")
    assert (data_dir / "cifar-10-python.tar.gz").exists()
