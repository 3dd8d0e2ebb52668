"""Shared pieces of the three stages: model, data, augmentation, ramps, EMA, checkpoints.

Equation numbers refer to the paper (../shared/paper/local_clustering_mean_teacher.tex).
"""
import contextlib
import json
import math
import os
import pickle
import random
import signal
import tempfile
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
import torch
import torch.nn as nn
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.flop_counter import FlopCounterMode

from kernels import lc_loss

# ----------------------------------------------------------------------------------------------
# Presets: the paper's protocol (Section 5.1) per dataset; digits is the small offline quickstart.
# Schedules are in epochs; an epoch is one pass over the unlabeled set.

PRESETS = {
    "svhn": dict(labels=1000, epochs=300, decay_epochs=200, ema=0.995, cons_rampup=5,
                 lc_epochs=100, lc_decay_epochs=200, lc_rampup=50, eps=50.0, lam=20.0, eval_every=10, bn_momentum=0.001),
    "cifar10": dict(labels=4000, epochs=800, decay_epochs=200, ema=0.99, cons_rampup=5,
                    lc_epochs=200, lc_decay_epochs=200, lc_rampup=100, eps=50.0, lam=10.0, eval_every=10, bn_momentum=0.001),
    # digits: ~1440 training images, ~10 steps per epoch. MT needs a consistency ramp of several
    # hundred steps on data this small (a ramp of tens of steps makes it worse than supervised-only)
    # and a schedule of ~1500 steps to pull ahead; the BN running means must follow within that.
    # Its 16-d features (width 0.125) sit closer than SVHN's: same-class pairs at d2 ~ 2.5, other
    # classes beyond ~4 after MT, so eps = 3; eps = 3 with lambda2 = 20 collapsed every pair into
    # one neighbourhood within 10 epochs.
    "digits": dict(labels=100, epochs=100, decay_epochs=50, ema=0.99, cons_rampup=30,
                   lc_epochs=20, lc_decay_epochs=30, lc_rampup=10, eps=3.0, lam=2.0, eval_every=10,
                   bn_momentum=0.02),
    "folder": dict(labels=None, epochs=300, decay_epochs=200, ema=0.99, cons_rampup=5,
                   lc_epochs=100, lc_decay_epochs=200, lc_rampup=50, eps=50.0, lam=20.0, eval_every=10, bn_momentum=0.001),
}
# CIFAR-10 with 2,000 labels: MT for 600 epochs, LC until epoch 800 (Section 5.1), eps 40.
CIFAR10_2000 = dict(epochs=600, eps=40.0)
DATASETS = tuple(PRESETS)


def preset(dataset, labels):
    """The protocol's defaults for a dataset, and for CIFAR-10 with 2,000 labels its own."""
    values = dict(PRESETS[dataset])
    if dataset == "cifar10" and labels == 2000:
        values.update(CIFAR10_2000)
    return values


def preset_help(key):
    """'[default: svhn 300, cifar10 800, ...]' for an option's --help, from PRESETS."""
    values = ", ".join(f"{name} {p[key]}" for name, p in PRESETS.items() if p[key] is not None)
    extra = f"; cifar10 with 2000 labels {CIFAR10_2000[key]}" if key in CIFAR10_2000 else ""
    return f"[default: {values}{extra}]"


class UserError(click.ClickException):
    """A problem with the user's input or files: a one-line message and exit code 2, no traceback."""
    exit_code = 2


# ----------------------------------------------------------------------------------------------
# Model: the 13-layer ConvNet ("conv-large") with weight normalization and mean-only batch norm.

class WeightNormMeanOnlyBN(nn.Module):
    """Conv or linear layer, weight-normalized, followed by mean-only batch normalization
    (Salimans & Kingma 2016): y = W x - mean(W x) + b with W = g v / |v| per output unit.

    `data_init` (on the first batch) sets g so that W x has standard deviation `init_scale` on that
    batch, and, as the authors' code does, b = -mean(W x): the units start shifted by their initial
    mean, mostly on the 0.1 slope of the LeakyReLU that follows. With b = 0 instead, SGD at the
    paper's lr 0.05 with momentum 0.9 diverged within 10 steps here. Training subtracts the batch
    mean and updates a running mean (momentum 0.001), which starts at the first batch's mean;
    eval mode subtracts the running mean.
    """

    def __init__(self, in_features, out_features, kernel_size=None, padding=0, init_scale=1.0,
                 v_std=0.05, momentum=0.001):
        super().__init__()
        shape = (out_features, in_features) + ((kernel_size, kernel_size) if kernel_size else ())
        self.v = nn.Parameter(torch.randn(shape) * v_std)
        self.g = nn.Parameter(torch.ones(out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.register_buffer("running_mean", torch.zeros(out_features))
        self.is_conv, self.padding = kernel_size is not None, padding
        self.init_scale, self.momentum = init_scale, momentum
        self.pending_init = False

    def _project(self, x, weight):
        if self.is_conv:
            return F.conv2d(x, weight, padding=self.padding)
        return F.linear(x, weight)

    def _weight(self):
        norm = self.v.flatten(1).norm(dim=1).view(-1, *[1] * (self.v.dim() - 1))
        return self.g.view_as(norm) * self.v / norm

    def forward(self, x):
        if self.pending_init:
            self._data_init(x)
        t = self._project(x, self._weight())
        dims = (0, 2, 3) if self.is_conv else (0,)
        shape = (1, -1, 1, 1) if self.is_conv else (1, -1)
        if self.training:
            mean = t.mean(dims)
            with torch.no_grad():
                self.running_mean.lerp_(mean.detach().float(), self.momentum)
        else:
            mean = self.running_mean.to(t.dtype)
        return t + (self.bias - mean).to(t.dtype).view(shape)  # one pass over t; t's dtype under autocast

    @torch.no_grad()
    def _data_init(self, x):
        self.pending_init = False
        t = self._project(x, self._weight() / self.g.view(-1, *[1] * (self.v.dim() - 1)))
        dims = (0, 2, 3) if self.is_conv else (0,)
        self.g.copy_(self.init_scale / (t.std(dims) + 1e-8))
        self.running_mean.copy_(t.mean(dims) * self.g)
        self.bias.copy_(-self.running_mean)


class Dropout(nn.Module):
    """Dropout (zero with probability p, scale the rest by 1 / (1 - p)). On a CPU the mask comes
    from rand_like: nn.Dropout's bernoulli_ took 16% of a training step at width 0.125, this 4x less.
    On a GPU nn.functional.dropout is one fused kernel already."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training:
            return x
        if x.is_cuda:
            return F.dropout(x, self.p, training=True)
        mask = torch.rand_like(x, dtype=torch.float32).ge_(self.p).mul_(1.0 / (1.0 - self.p))
        return x * mask.to(x.dtype)


class ConvLarge(nn.Module):
    """The 13-layer ConvNet of Pi-model, Mean Teacher and the paper (3,121,812 parameters at width 1).

    forward(x) returns (z, logits): z is the globally average-pooled feature (128-d at width 1)
    on which the LC loss acts, logits the 10 (num_classes) class scores.
    """

    def __init__(self, num_classes=10, width=1.0, bn_momentum=0.001):
        super().__init__()
        def channels(c):  # width-1 channel count -> this network's (the RGB input stays 3)
            return c if c == 3 else max(1, round(c * width))

        def layer(cin, cout, k=None, pad=0, init_scale=1.0):
            # v ~ N(0, 0.05^2) at width 1, the authors' init. SGD's step on a weight direction
            # scales as 1 / |v|^2, so a narrower layer keeps the full-width row norm |v| instead:
            # otherwise its effective lr grows as 1 / width and training diverges.
            v_std = 0.05 * math.sqrt(cin / channels(cin))
            return WeightNormMeanOnlyBN(channels(cin), channels(cout), k, pad, init_scale, v_std, bn_momentum)

        specs = [(3, 128, 3, 1), (128, 128, 3, 1), (128, 128, 3, 1), "pool",
                 (128, 256, 3, 1), (256, 256, 3, 1), (256, 256, 3, 1), "pool",
                 (256, 512, 3, 0), (512, 256, 1, 0), (256, 128, 1, 0)]
        layers = []
        for spec in specs:
            if spec == "pool":
                layers += [nn.MaxPool2d(2), Dropout(0.5)]
            else:
                layers += [layer(*spec), nn.LeakyReLU(0.1, inplace=True)]
        self.features = nn.Sequential(*layers)
        self.feature_dim = channels(128)
        self.classifier = WeightNormMeanOnlyBN(self.feature_dim, num_classes, init_scale=0.1,
                                               v_std=0.05 * math.sqrt(128 / self.feature_dim), momentum=bn_momentum)

    def forward(self, x):
        z = self.features(x).mean((2, 3))
        return z, self.classifier(z)

    @torch.no_grad()
    def data_init(self, x):
        """Data-dependent initialization of every layer from one batch (train mode, as in training)."""
        for m in self.modules():
            if isinstance(m, WeightNormMeanOnlyBN):
                m.pending_init = True
        was_training = self.training
        self.train()
        self(x)
        self.train(was_training)


# ----------------------------------------------------------------------------------------------
# Data: whole datasets decoded once into uint8 tensors (N, 3, 32, 32).

@dataclass
class ImageData:
    train_x: torch.Tensor  # uint8 (N, 3, 32, 32)
    train_y: torch.Tensor  # int64 (N,)
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: list

    @property
    def num_classes(self):
        return len(self.classes)


SVHN_FILES = ("train_32x32.mat", "test_32x32.mat")
CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_FILES = tuple(f"{CIFAR10_DIR}/data_batch_{i}" for i in range(1, 6)) + (f"{CIFAR10_DIR}/test_batch",)


def _ensure_files(data_dir, files, download, what):
    """Download a dataset into data_dir when its files are missing; exit 2 naming them if that fails."""
    missing = [f for f in files if not (data_dir / f).is_file()]
    if not missing:
        return
    try:
        download()
    except Exception as exc:  # offline, a proxy, a full disk: all end the same way for the user
        raise UserError(f"{what} files missing in {data_dir} and the download failed "
                        f"({type(exc).__name__}); place {', '.join(missing)} there") from None
    still = [f for f in files if not (data_dir / f).is_file()]
    if still:
        raise UserError(f"{what} download did not produce {', '.join(still)} in {data_dir}")


def load_svhn(data_dir):
    """SVHN from torchvision's files (train_32x32.mat, test_32x32.mat), digit '0' stored as 10 -> 0."""
    import scipy.io
    import torchvision

    def download():
        for split in ("train", "test"):
            torchvision.datasets.SVHN(str(data_dir), split=split, download=True)

    _ensure_files(data_dir, SVHN_FILES, download, "SVHN")

    def read(name):
        try:
            mat = scipy.io.loadmat(str(data_dir / name))
            x = torch.from_numpy(np.ascontiguousarray(mat["X"].transpose(3, 2, 0, 1)))
            y = torch.from_numpy(mat["y"].astype(np.int64).reshape(-1)) % 10
        except Exception as exc:
            raise UserError(f"cannot read {data_dir / name}: {type(exc).__name__}: {exc}") from None
        return x, y

    (train_x, train_y), (test_x, test_y) = read(SVHN_FILES[0]), read(SVHN_FILES[1])
    return ImageData(train_x, train_y, test_x, test_y, [str(i) for i in range(10)])


def load_cifar10(data_dir):
    """CIFAR-10 from its pickled python batches (cifar-10-batches-py/data_batch_1..5, test_batch)."""
    import torchvision

    def download():
        torchvision.datasets.CIFAR10(str(data_dir), train=True, download=True)

    _ensure_files(data_dir, CIFAR10_FILES, download, "CIFAR-10")

    def read(names):
        xs, ys = [], []
        for name in names:
            try:
                with open(data_dir / name, "rb") as f:
                    batch = pickle.load(f, encoding="bytes")
                xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
                ys.append(np.asarray(batch[b"labels"], dtype=np.int64))
            except Exception as exc:
                raise UserError(f"cannot read {data_dir / name}: {type(exc).__name__}: {exc}") from None
        return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))

    train_x, train_y = read(CIFAR10_FILES[:5])
    test_x, test_y = read(CIFAR10_FILES[5:])
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    return ImageData(train_x, train_y, test_x, test_y, classes)


def load_digits():
    """scikit-learn's bundled 8x8 digits (1,797 images), upscaled to 3 x 32 x 32, with a fixed
    stratified 80/20 train/test split (seed 0)."""
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    bunch = sk_digits()
    images = torch.from_numpy(bunch.images).float().div(16.0)[:, None]  # values 0..16
    images = F.interpolate(images, size=32, mode="bilinear", align_corners=False)
    images = (images.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    train_idx, test_idx = train_test_split(np.arange(len(labels)), test_size=0.2, random_state=0,
                                           stratify=bunch.target)
    train_idx, test_idx = torch.from_numpy(train_idx), torch.from_numpy(test_idx)
    return ImageData(images[train_idx], labels[train_idx], images[test_idx], labels[test_idx],
                     [str(i) for i in range(10)])


def load_folder(data_dir):
    """Images in ImageFolder layout: data_dir/train/<class>/*, data_dir/test/<class>/*, as RGB 32x32."""
    from PIL import Image
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    def read(split):
        root = data_dir / split
        classes = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        if not classes:
            raise UserError(f"no class folders in {root} (expected {root}/<class>/<image>)")
        try:
            samples = make_dataset(str(root), {c: i for i, c in enumerate(classes)}, IMG_EXTENSIONS)
        except FileNotFoundError as exc:
            raise UserError(f"{root}: {str(exc).splitlines()[0]}") from None
        xs = []
        for path, _ in samples:
            try:
                with Image.open(path) as img:
                    img = img.convert("RGB").resize((32, 32), Image.BILINEAR)
            except Exception as exc:
                raise UserError(f"cannot read image {path}: {type(exc).__name__}") from None
            xs.append(torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1))
        return torch.stack(xs), torch.tensor([label for _, label in samples]), classes

    train_x, train_y, classes = read("train")
    test_x, test_y, test_classes = read("test")
    if test_classes != classes:
        raise UserError(f"train and test class folders differ in {data_dir}: "
                        f"{sorted(set(classes) ^ set(test_classes))}")
    return ImageData(train_x, train_y, test_x, test_y, classes)


def load_dataset(name, data_dir):
    data_dir = Path(data_dir)
    if name == "svhn":
        return load_svhn(data_dir)
    if name == "cifar10":
        return load_cifar10(data_dir)
    if name == "digits":
        return load_digits()
    if name == "folder":
        return load_folder(data_dir)
    raise UserError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def balanced_split(labels, n_labeled, num_classes, seed):
    """Indices of n_labeled training images, n_labeled / num_classes per class, and of the rest.

    Drawn with its own generator, so the split depends on `seed` alone.
    """
    if n_labeled < num_classes or n_labeled % num_classes:
        raise UserError(f"--labels {n_labeled} must be a positive multiple of the {num_classes} classes")
    per_class = n_labeled // num_classes
    gen = torch.Generator().manual_seed(seed)
    chosen = []
    for c in range(num_classes):
        members = (labels == c).nonzero().flatten()
        if len(members) < per_class:
            raise UserError(f"--labels {n_labeled} needs {per_class} images of class {c}, "
                            f"the training set has {len(members)}")
        chosen.append(members[torch.randperm(len(members), generator=gen)[:per_class]])
    labeled = torch.cat(chosen).sort().values
    is_labeled = torch.zeros(len(labels), dtype=torch.bool)
    is_labeled[labeled] = True
    unlabeled = (~is_labeled).nonzero().flatten()
    if len(unlabeled) == 0:
        raise UserError(f"--labels {n_labeled} leaves no unlabeled training image")
    return labeled, unlabeled


def hold_out(unlabeled, n_val, seed):
    """Move n_val random images of the unlabeled set into a validation set that is never trained on."""
    if n_val < 0 or n_val >= len(unlabeled):
        raise UserError(f"--val {n_val} must be >= 0 and leave unlabeled images ({len(unlabeled)} available)")
    order = torch.randperm(len(unlabeled), generator=torch.Generator().manual_seed(seed + 1))
    return unlabeled[order[n_val:]].sort().values, unlabeled[order[:n_val]].sort().values


def channel_stats(x):
    """Per-channel mean and std of uint8 images, in [0, 1] units."""
    x = x.float().div(255)
    return x.mean((0, 2, 3)), x.std((0, 2, 3))


class BatchStream:
    """The indices of every step's batches, a pure function of (seed, step): an epoch is one pass
    over the unlabeled set in a fresh random order; the labeled set cycles in its own orders."""

    def __init__(self, n_labeled, n_unlabeled, labeled_batch, unlabeled_batch, seed):
        self.n_labeled, self.n_unlabeled = n_labeled, n_unlabeled
        self.labeled_batch, self.unlabeled_batch, self.seed = labeled_batch, unlabeled_batch, seed
        self.steps_per_epoch = max(1, n_unlabeled // unlabeled_batch)
        self._perms = {}

    def _perm(self, kind, k, n):
        key = (kind, k)
        if key not in self._perms:
            if len(self._perms) > 8:
                self._perms.clear()
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 2 * k + kind)
            self._perms[key] = torch.randperm(n, generator=gen)
        return self._perms[key]

    def batch(self, step):
        """(positions in the labeled set, positions in the unlabeled set) for this step."""
        epoch, i = divmod(step, self.steps_per_epoch)
        u = self._perm(1, epoch, self.n_unlabeled)
        u = u[torch.arange(i * self.unlabeled_batch, (i + 1) * self.unlabeled_batch) % self.n_unlabeled]
        pos = torch.arange(step * self.labeled_batch, (step + 1) * self.labeled_batch)
        cycles, offsets = pos // self.n_labeled, pos % self.n_labeled
        lab = torch.empty_like(pos)
        for cycle in cycles.unique().tolist():
            sel = cycles == cycle
            lab[sel] = self._perm(0, cycle, self.n_labeled)[offsets[sel]]
        return lab, u


# ----------------------------------------------------------------------------------------------
# Augmentation, batch-wise on the training device: no per-image Python.

def augment(x, mean, std, flip, max_shift=2):
    """Normalized, randomly translated (pad 2 with black, random 32x32 crop) and, for CIFAR-10,
    randomly flipped copies of uint8 images (B, 3, H, W). Every call draws new randomness."""
    b, _, h, w = x.shape
    padded = F.pad(x, (max_shift,) * 4)
    dy = torch.randint(0, 2 * max_shift + 1, (b, 1), device=x.device)
    dx = torch.randint(0, 2 * max_shift + 1, (b, 1), device=x.device)
    rows = (dy + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (dx + torch.arange(w, device=x.device))[:, None, None, :]
    out = padded[torch.arange(b, device=x.device)[:, None, None, None],
                 torch.arange(x.shape[1], device=x.device)[None, :, None, None], rows, cols]
    if flip:
        flipped = torch.rand(b, device=x.device) < 0.5
        out = torch.where(flipped[:, None, None, None], out.flip(3), out)
    return normalize(out, mean, std)


def normalize(x, mean, std):
    return (x.float().div(255) - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


# ----------------------------------------------------------------------------------------------
# Schedules, EMA, losses.

def sigmoid_rampup(progress, length):
    """exp(-5 (1 - t)^2), t = progress / length clipped to [0, 1] (Mean Teacher's ramp-up); 1 if length is 0."""
    if length <= 0:
        return 1.0
    t = min(max(progress / length, 0.0), 1.0)
    return math.exp(-5.0 * (1.0 - t) ** 2)


def learning_rate(progress, lr, constant_epochs, decay_epochs):
    """lr for `constant_epochs`, then linearly down to 0 over `decay_epochs` (progress in epochs)."""
    if progress < constant_epochs:
        return lr
    if decay_epochs <= 0:
        return 0.0
    return lr * max(0.0, 1.0 - (progress - constant_epochs) / decay_epochs)


@torch.no_grad()
def ema_update(teacher, student, alpha):
    """theta'' <- alpha theta'' + (1 - alpha) theta' (Eq. 3), one fused foreach operation."""
    t_params, s_params = list(teacher.parameters()), list(student.parameters())
    torch._foreach_mul_(t_params, alpha)
    torch._foreach_add_(t_params, s_params, alpha=1.0 - alpha)


def consistency_loss(student_logits, teacher_logits):
    """MSE between the class probabilities (Eq. 1), mean over classes and images; teacher detached."""
    return F.mse_loss(F.softmax(student_logits.float(), 1), F.softmax(teacher_logits.detach().float(), 1))


@torch.no_grad()
def test_error(model, x, y, mean, std, batch_size=500):
    """Error (%) of the model in eval mode on uint8 images x with labels y."""
    was_training = model.training
    model.eval()
    wrong = 0
    for i in range(0, len(x), batch_size):
        _, logits = model(normalize(x[i:i + batch_size], mean, std))
        wrong += (logits.argmax(1) != y[i:i + batch_size]).sum().item()
    model.train(was_training)
    return 100.0 * wrong / len(x)


# ----------------------------------------------------------------------------------------------
# Devices, seeds, checkpoints, metrics.

def pick_device(name):
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def seed_step(seed, step, rank=0):
    """Seed the global generators for one step: dropout and augmentation depend on (seed, step, rank) alone."""
    torch.manual_seed(seed * 1_000_003 + step + (rank << 40))


PRECISIONS = ("auto", "fp32", "bf16")


def resolve_precision(precision, device):
    """'auto' is bf16 where the device computes it natively (CUDA GPUs with bf16, CPUs with
    AVX512-BF16 or AMX), else fp32."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported()
    else:
        native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return "bf16" if native else "fp32"


@dataclass
class Processes:
    """This process's place among the processes of a torchrun launch (rank 0 of 1 without one)."""
    rank: int = 0
    world: int = 1

    @property
    def main(self):
        return self.rank == 0

    def echo(self, message):
        """Print on the main process only."""
        if self.main:
            click.echo(message)


@contextlib.contextmanager
def processes(device_name):
    """(Processes, this process's device). Under torchrun (WORLD_SIZE > 1) it joins the process group:
    nccl with one GPU per process (LOCAL_RANK) on CUDA, gloo on CPU; and leaves it at the end."""
    device = pick_device(device_name)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        yield Processes(), device
        return
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield Processes(dist.get_rank(), dist.get_world_size()), device
    finally:
        dist.destroy_process_group()


def atomic_write(path, write):
    """Write a file via a temp file in the same folder, flush + fsync, then os.replace: a crash
    never leaves a truncated file behind."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # the permissions a plain open() would give, not mkstemp's 0600
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def existing_outputs(out, names, overwrite):
    """The files among `names` that an earlier run left in `out`; exit 2 unless told to overwrite them."""
    existing = [name for name in names if (Path(out) / name).exists()]
    if existing and not overwrite:
        raise UserError(f"{out} already holds {', '.join(existing)} of an earlier run; "
                        f"pass --overwrite or choose another --out")
    return existing


def save_checkpoint(path, state):
    atomic_write(path, lambda f: torch.save(state, f))


def read_metrics(path):
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def write_metrics(path, records):
    """Rewrite the metrics file atomically, so it is never half-written."""
    atomic_write(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in records).encode()))


def rng_state():
    state = dict(torch=torch.get_rng_state(), python=random.getstate())
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


CHECKPOINT_KEYS = ("student", "teacher", "optimizer", "epoch", "step", "config", "labeled_idx", "unlabeled_idx")


def load_checkpoint(path):
    """A checkpoint as a dict, loaded with weights_only=True (a checkpoint from elsewhere cannot run
    code); any problem ends the run with exit code 2 and a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UserError(f"cannot load checkpoint {path}: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200] if str(exc) else 'unreadable'}") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise UserError(f"{path} is not a checkpoint of this project (missing {', '.join(missing)})")
    return state


def build_models(config, device):
    student = ConvLarge(config["num_classes"], config["width"], config["bn_momentum"]).to(device)
    teacher = ConvLarge(config["num_classes"], config["width"], config["bn_momentum"]).to(device)
    for p in teacher.parameters():
        p.requires_grad_(False)
    return student, teacher


def make_optimizer(student, lr):
    return torch.optim.SGD(student.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-4)


# ----------------------------------------------------------------------------------------------
# The training loop both stages run: the MT objective (Eq. 2), plus lambda2 * r2 * L_lc (Eq. 6) in
# stage 2.

@dataclass
class Stage:
    name: str                 # "mt" or "lc"
    epochs: int               # constant-lr epochs of this stage
    decay_epochs: int         # then linear decay of the lr to 0
    lr: float
    ema: float
    cons_weight: float        # lambda1
    cons_rampup: float        # epochs, counted from the start of stage 1
    eval_every: int
    first_step: int           # global step at which this stage starts
    lc_eps: float = 0.0       # stage 2 only
    lc_weight: float = 0.0    # lambda2
    lc_rampup: float = 0.0    # epochs, counted from the start of stage 2


class TrainingFailed(click.ClickException):
    """Training went wrong (a non-finite loss, collapsed features): exit code 3, checkpoints kept."""
    exit_code = 3


class Interrupted(click.ClickException):
    def __init__(self, signum):
        super().__init__(f"interrupted by {signal.Signals(signum).name}; every file on disk is complete "
                         f"(the last finished epoch is in the *_last.pt checkpoint: continue with --resume)")
        self.exit_code = 128 + signum


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT and SIGTERM end the run at once with a message; atomic writes keep the files whole."""
    def handler(signum, frame):
        raise Interrupted(signum)
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# Collapse: the batch's feature spread (mean over features of the std over images) below this
# fraction of its value when LC started means LC has pulled every image onto one point.
COLLAPSE_FRACTION = 0.01


def feature_spread(z):
    return z.detach().float().std(0).mean()


def checkpoint_state(student, teacher, optimizer, stage, epoch, step, config, split, reference_spread, metrics):
    return dict(student=student.state_dict(), teacher=teacher.state_dict(), optimizer=optimizer.state_dict(),
                stage=stage.name, epoch=epoch, step=step, config=config, **split, rng=rng_state(),
                reference_spread=reference_spread, metrics=metrics)


def checkpoint_split(state):
    """The labeled / unlabeled / validation indices of a checkpoint."""
    return dict(labeled_idx=state["labeled_idx"], unlabeled_idx=state["unlabeled_idx"],
                val_idx=state.get("val_idx", torch.zeros(0, dtype=torch.long)))


def check_resume_flags(resume, **flags):
    """--resume continues a run as it was: it excludes the flags given here that are set."""
    for name, value in flags.items():
        if resume and value:
            raise UserError(f"--resume and --{name} exclude each other")


def resume_checkpoint(out, stage_name, write=True):
    """The `<stage>_last.pt` of an interrupted run in `out`, its RNG states restored, and (by the
    process that writes) the metrics file rewritten to the epochs that checkpoint has seen (it holds
    their records)."""
    path = Path(out) / f"{stage_name}_last.pt"
    if not path.exists():
        raise UserError(f"--resume: {path} does not exist (nothing to resume in {out})")
    state = load_checkpoint(path)
    if state.get("stage") != stage_name:
        raise UserError(f"--resume: {path} holds stage {state.get('stage')!r}, not {stage_name!r}")
    set_rng_state(state["rng"])
    if write:
        write_metrics(Path(out) / f"{stage_name}_metrics.jsonl", state["metrics"])
    return state


class Trainer:
    """What one process needs for the training step of both stages, on its device: the MT objective
    (Eq. 2) and, in stage 2, lambda2 * r2 * L_lc on top (Eq. 6). With several processes each one
    takes its 1/world share of the configured (global) labeled and unlabeled batches."""

    def __init__(self, student, teacher, optimizer, data, split, config, stage, device, procs=None,
                 reference_spread=None):
        procs = procs or Processes()
        for key in ("labeled_batch", "unlabeled_batch"):
            if config[key] % procs.world:
                raise UserError(f"--{key.replace('_', '-')} {config[key]} does not split evenly over "
                                f"{procs.world} processes")
        self.student, self.teacher, self.optimizer = student, teacher, optimizer
        self.split, self.config, self.stage, self.device, self.procs = split, config, stage, device, procs
        self.reference_spread = reference_spread  # feature spread when LC started (collapse guard)
        self.n_lab, self.n_unl = config["labeled_batch"] // procs.world, config["unlabeled_batch"] // procs.world
        self.lab_idx, self.unl_idx, self.val_idx = (split[k].to(device) for k in ("labeled_idx", "unlabeled_idx", "val_idx"))
        self.stream = BatchStream(len(self.lab_idx), len(self.unl_idx), config["labeled_batch"],
                                  config["unlabeled_batch"], config["seed"])
        self.train_x, self.train_y = data.train_x.to(device), data.train_y.to(device)
        self.test_x, self.test_y = data.test_x.to(device), data.test_y.to(device)
        self.mean, self.std = (torch.tensor(config[k], device=device) for k in ("mean", "std"))
        self.flip = config["dataset"] == "cifar10"
        self.precision = config.get("precision", "fp32")
        self.lc_global = config.get("lc", {}).get("scope", "local") == "global" and procs.world > 1
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # shapes never change: pick the fastest conv algorithms once
        student.train()
        teacher.train()  # dropout on and batch means, as in both reference implementations
        student.to(memory_format=torch.channels_last)  # faster convolutions on CPU and GPU alike
        teacher.to(memory_format=torch.channels_last)
        # The BN running means are averaged over the processes after every step (average_buffers),
        # not broadcast from rank 0.
        model = student if procs.world == 1 else DDP(student, forward_sync_buffers=False)
        compile_ = torch.compile if config.get("compile") else (lambda m: m)
        self.student_forward, self.teacher_forward = compile_(model), compile_(teacher)

    def schedule(self, step):
        """(lr, lambda1 * r, lambda2 * r2) at a global step: r counts epochs from the start of MT,
        r2 and the lr schedule from the start of this stage."""
        stage, spe = self.stage, self.stream.steps_per_epoch
        progress = (step - stage.first_step) / spe
        lr = learning_rate(progress, stage.lr, stage.epochs, stage.decay_epochs)
        cons_w = stage.cons_weight * sigmoid_rampup(step / spe, stage.cons_rampup)
        lc_w = stage.lc_weight * sigmoid_rampup(progress, stage.lc_rampup) if stage.name == "lc" else 0.0
        return lr, cons_w, lc_w

    def views(self, step):
        """This process's share of the step's batch: the student's and the teacher's independently
        augmented views (labeled images first) and the labels of the labeled images."""
        seed_step(self.config["seed"], step, self.procs.rank)
        lab_pos, unl_pos = self.stream.batch(step)
        r = self.procs.rank
        lab_pos, unl_pos = lab_pos[r * self.n_lab:(r + 1) * self.n_lab], unl_pos[r * self.n_unl:(r + 1) * self.n_unl]
        idx = torch.cat([self.lab_idx[lab_pos.to(self.device)], self.unl_idx[unl_pos.to(self.device)]])
        images = self.train_x[idx]
        student_view, teacher_view = (augment(images, self.mean, self.std, self.flip)
                                      .contiguous(memory_format=torch.channels_last) for _ in range(2))
        return student_view, teacher_view, self.train_y[idx[:self.n_lab]]

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def train_step(self, step, student_view, teacher_view, labels):
        """One SGD step and the EMA update (Eq. 3). Returns (loss, ce, cons, lc, neighbour fraction)."""
        lr, cons_w, lc_w = self.schedule(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with self.autocast():  # the convolutions; every loss below is computed in fp32
            z, logits = self.student_forward(student_view)
            with torch.no_grad():
                _, teacher_logits = self.teacher_forward(teacher_view)
        ce = F.cross_entropy(logits[:self.n_lab].float(), labels)
        cons = consistency_loss(logits, teacher_logits)
        loss = ce + cons_w * cons
        if self.stage.name == "lc":
            z = z.float()
            z_lab, z_unl = z[:self.n_lab], z[self.n_lab:]
            if self.lc_global:  # neighbours across the whole global batch; gradients flow back to every rank
                z_lab, z_unl = (torch.cat(dist_nn.all_gather(t)) for t in (z_lab, z_unl))
            lc, fraction = lc_loss(z_lab, z_unl, self.stage.lc_eps, return_fraction=True)
            loss = loss + lc_w * lc
            spread = feature_spread(z)
        else:
            lc = fraction = spread = torch.zeros((), device=self.device)
        self.check(step, loss, spread, dict(ce=ce, cons=cons, lc=lc))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        ema_update(self.teacher, self.student, self.stage.ema)
        if self.procs.world > 1:
            average_buffers([self.student, self.teacher], self.procs.world)
        return torch.stack([loss.detach(), ce.detach(), cons.detach(), lc.detach(), fraction.float()])

    def check(self, step, loss, spread, parts):
        """Stop on a non-finite loss or, in LC, on collapsed features: one host sync per step, and
        with several processes one all_reduce, so that every process decides alike."""
        status = torch.stack([(~torch.isfinite(loss)).float(), spread])
        if self.procs.world > 1:
            dist.all_reduce(status)
        nonfinite, spread = status.tolist()
        spread /= self.procs.world
        epoch = (step - self.stage.first_step) // self.stream.steps_per_epoch + 1
        where = f"at step {step} (epoch {epoch} of stage {self.stage.name})"
        if nonfinite:
            values = " ".join(f"{k}={v.item():.4g}" for k, v in parts.items())
            raise TrainingFailed(f"non-finite loss {where}: {values}; the checkpoints of the finished epochs are kept")
        if self.stage.name != "lc":
            return
        if self.reference_spread is None:
            self.reference_spread = spread
        if spread < COLLAPSE_FRACTION * self.reference_spread:
            raise TrainingFailed(f"distribution collapse {where}: the features' spread fell to {spread:.3g}, under "
                                 f"{COLLAPSE_FRACTION:g} of its {self.reference_spread:.3g} when LC started; "
                                 f"eps={self.stage.lc_eps:g} and lambda2={self.stage.lc_weight:g} pull every image "
                                 f"onto one point (the paper saw this for eps > 500 or lambda2 > 50); the "
                                 f"checkpoints of the finished epochs are kept")

    def errors(self):
        """Test errors (%) of student and teacher, and on the validation hold-out if there is one."""
        errors = dict(student_error=test_error(self.student, self.test_x, self.test_y, self.mean, self.std),
                      teacher_error=test_error(self.teacher, self.test_x, self.test_y, self.mean, self.std))
        if len(self.val_idx):
            x, y = self.train_x[self.val_idx], self.train_y[self.val_idx]
            errors.update(student_val_error=test_error(self.student, x, y, self.mean, self.std),
                          teacher_val_error=test_error(self.teacher, x, y, self.mean, self.std))
        return errors


def average_buffers(modules, world):
    """Average the BN running means over the processes. Each process's running mean followed the
    batch means of its own shard; their average is what one process seeing the whole (equally
    sharded) batch would hold, and it keeps every process's teacher identical."""
    buffers = [b for m in modules for b in m.buffers()]
    flat = torch.cat([b.flatten() for b in buffers])
    dist.all_reduce(flat)
    flat /= world
    torch._foreach_copy_(buffers, [v.view_as(b) for v, b in zip(flat.split([b.numel() for b in buffers]), buffers)])


def fit(trainer, out, milestones, start_epoch=0, echo=click.echo):
    """Train the stage's epochs after `start_epoch` (epochs already done). After every epoch the main
    process writes the resume checkpoint <stage>_last.pt (with the metrics so far), copies it to
    each name in milestones[epoch], then adds the epoch's line to
    <stage>_metrics.jsonl. A kill between any two of these leaves files that --resume continues
    from exactly. Returns the last record."""
    stage, spe, procs = trainer.stage, trainer.stream.steps_per_epoch, trainer.procs
    total_epochs = stage.epochs + stage.decay_epochs
    out = Path(out)
    metrics = read_metrics(out / f"{stage.name}_metrics.jsonl")
    record = metrics[-1] if metrics else None
    for epoch in range(start_epoch + 1, total_epochs + 1):
        start = time.perf_counter()
        sums = torch.zeros(5, device=trainer.device)  # loss, ce, cons, lc, neighbour fraction
        for i in range(spe):
            step = stage.first_step + (epoch - 1) * spe + i
            sums += trainer.train_step(step, *trainer.views(step))
        if procs.world > 1:
            dist.all_reduce(sums)
        means = (sums / (spe * procs.world)).tolist()
        lr, cons_w, lc_w = trainer.schedule(step)
        # global_epoch counts from the start of MT, so MT and LC curves share an axis (Fig. 2).
        record = dict(stage=stage.name, epoch=epoch, global_epoch=stage.first_step / spe + epoch,
                      step=stage.first_step + epoch * spe, lr=lr,
                      cons_weight=cons_w, lc_weight=lc_w, loss=means[0], ce=means[1], cons=means[2],
                      time_s=round(time.perf_counter() - start, 3))
        if stage.name == "lc":
            record.update(lc=means[3], neighbour_fraction=means[4])
        if not procs.main:
            continue  # the other processes go on with the next epoch; rank 0 meets them at its first step
        line = (f"{stage.name} epoch {epoch}/{total_epochs} | loss {means[0]:.4f} ce {means[1]:.4f} "
                f"cons {means[2]:.5f}" + (f" lc {means[3]:.4f} nbr {means[4]:.3f}" if stage.name == "lc" else "")
                + f" | lr {lr:.4f} w_cons {cons_w:.2f}" + (f" w_lc {lc_w:.2f}" if stage.name == "lc" else "")
                + f" | {record['time_s']:.1f}s")
        if epoch % stage.eval_every == 0 or epoch == total_epochs:
            record.update(trainer.errors())
            line += f" | test error student {record['student_error']:.2f}% teacher {record['teacher_error']:.2f}%"
            if "student_val_error" in record:
                line += (f" | val error student {record['student_val_error']:.2f}% "
                         f"teacher {record['teacher_val_error']:.2f}%")
        echo(line)
        metrics.append(record)
        state = checkpoint_state(trainer.student, trainer.teacher, trainer.optimizer, stage, epoch, record["step"],
                                 trainer.config, trainer.split, trainer.reference_spread, metrics)
        save_checkpoint(out / f"{stage.name}_last.pt", state)
        for name in milestones.get(epoch, ()):
            save_checkpoint(out / name, state)
        write_metrics(out / f"{stage.name}_metrics.jsonl", metrics)
    return record


def step_flops(trainer, student_view, teacher_view):
    """FLOPs of one training step's model work (student forward + backward, teacher forward),
    counted by torch on the eager modules."""
    with FlopCounterMode(display=False) as counter:
        z, logits = trainer.student(student_view)
        (z.float().sum() + logits.float().sum()).backward()
        with torch.no_grad():
            trainer.teacher(teacher_view)
    trainer.optimizer.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def benchmark(trainer, steps, warmup=3, echo=click.echo):
    """Time `steps` training steps after `warmup` ones (the steps train for real; nothing is saved).
    Returns medians over the timed steps, throughput of all processes together, and the share of
    each step spent on the data path (index, gather, augment both views)."""
    def sync():
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)

    first = trainer.stage.first_step
    step_times, data_times = [], []
    for i in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        views = trainer.views(first + i)
        sync()
        t1 = time.perf_counter()
        trainer.train_step(first + i, *views)
        sync()
        t2 = time.perf_counter()
        if i >= warmup:
            step_times.append(t2 - t0)
            data_times.append(t1 - t0)
        echo(f"benchmark {'warm-up' if i < warmup else 'step'} {i + 1 - warmup * (i >= warmup)}/"
             f"{warmup if i < warmup else steps}: {t2 - t0:.4f} s (data {t1 - t0:.4f} s)")
    sec = statistics.median(step_times)
    flops = step_flops(trainer, *views[:2]) * trainer.procs.world
    batch = trainer.config["labeled_batch"] + trainer.config["unlabeled_batch"]
    return dict(sec_per_step=sec, images_per_sec=batch / sec, gflops_per_sec=flops / 1e9 / sec,
                data_share=statistics.median(data_times) / sec, precision=trainer.precision,
                gflop_per_step=flops / 1e9, steps=steps, warmup=warmup, stage=trainer.stage.name,
                dataset=trainer.config["dataset"], width=trainer.config["width"], batch=batch,
                processes=trainer.procs.world, compile=bool(trainer.config.get("compile")),
                device=device_name(trainer.device), threads=torch.get_num_threads())


def speed_options(stage_name):
    """The --precision, --compile and --benchmark options that both training stages take."""
    options = [
        click.option("--precision", type=click.Choice(PRECISIONS), default="auto",
                     help="bf16 runs the networks under autocast; the losses, the EMA and the weights stay fp32. "
                          "auto: bf16 where the device computes it natively (CUDA GPUs with bf16, CPUs "
                          "with AVX512-BF16 or AMX), else fp32."),
        click.option("--compile", "compile_", is_flag=True,
                     help="torch.compile the networks: faster steps after a slower start (about a minute at width 1 "
                          "on a CPU)."),
        click.option("--benchmark", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Time N training steps after 3 warm-up steps instead of training; the last line printed "
                          "is one JSON object (sec_per_step, images_per_sec, gflops_per_sec, data_share, precision, "
                          f"...). Writes nothing, unless --out is given: then {stage_name}_benchmark.json there."),
    ]

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


def report_benchmark(trainer, steps, out=None):
    """Run the benchmark; the main process prints its result as one JSON line, the last it prints,
    and writes it to `out`/<stage>_benchmark.json when `out` is given."""
    result = benchmark(trainer, steps, echo=trainer.procs.echo)
    if trainer.procs.main:
        line = json.dumps(result)
        if out is not None:
            Path(out).mkdir(parents=True, exist_ok=True)
            atomic_write(Path(out) / f"{trainer.stage.name}_benchmark.json", lambda f: f.write(line.encode() + b"\n"))
        click.echo(line)


def device_name(device):
    """The GPU's or the CPU's model name, for benchmark records."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def restore_models(state, device):
    """Student and teacher of a checkpoint; a checkpoint of another width or class count exits 2."""
    config = state["config"]
    try:
        student, teacher = build_models(config, device)
        student.load_state_dict(state["student"])
        teacher.load_state_dict(state["teacher"])
    except (KeyError, TypeError, RuntimeError) as exc:
        raise UserError(f"checkpoint does not fit this project's model: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200]}") from None
    return student, teacher


def restore_training(state, device):
    """Student, teacher and optimizer of a checkpoint, ready to continue training."""
    student, teacher = restore_models(state, device)
    optimizer = make_optimizer(student, state["config"]["lr"])
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"checkpoint's optimizer state does not fit: {type(exc).__name__}: {exc}") from None
    return student, teacher, optimizer


def restore_data(state, data_dir=None):
    """The checkpoint's dataset (from its own data_dir unless one is given), checked against it."""
    config = state["config"]
    data = load_dataset(config["dataset"], data_dir or config["data_dir"])
    n_train = len(data.train_y)
    split = torch.cat(list(checkpoint_split(state).values()))
    if data.num_classes != config["num_classes"] or len(split) != n_train or split.max() >= n_train:
        raise UserError(f"the {config['dataset']} data in {data_dir or config['data_dir']} does not match the "
                        f"checkpoint ({data.num_classes} classes and {n_train} training images here, "
                        f"{config['num_classes']} and {len(split)} in the checkpoint)")
    return data
