"""The data: datasets decoded once into uint8 tensors (N, 3, 32, 32), the labeled / unlabeled /
validation splits, the batch stream, augmentation and normalization, and the check of a dataset
against a checkpoint's split.
"""
import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from presets import DATASETS
from runs import UserError, checkpoint_split


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
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _ensure_files(data_dir, files, download, what, or_else=""):
    """Download a dataset into data_dir when its files are missing; exit 2 naming them (and what
    else would do, `or_else`) if that fails."""
    missing = [f for f in files if not (data_dir / f).is_file()]
    if not missing:
        return
    try:
        download()
    except Exception as exc:  # offline, a proxy, a full disk: all end the same way for the user
        raise UserError(f"{what} files missing in {data_dir} and the download failed "
                        f"({type(exc).__name__}); place {', '.join(missing)} there{or_else}") from None
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
    """CIFAR-10 from its pickled python batches (cifar-10-batches-py/data_batch_1..5, test_batch) or,
    without them, the same images in data_dir/train/<class>/*, data_dir/test/<class>/* (any format
    PIL reads, e.g. the JPEG copy of ../shared/data), with CIFAR-10's class folders."""
    import torchvision

    batches = all((data_dir / f).is_file() for f in CIFAR10_FILES)
    if not batches and (data_dir / "train").is_dir() and (data_dir / "test").is_dir():
        data = load_folder(data_dir)
        if data.classes != CIFAR10_CLASSES:
            raise UserError(f"{data_dir}/train and /test hold the class folders {', '.join(data.classes)}, not "
                            f"CIFAR-10's {', '.join(CIFAR10_CLASSES)} (for other images use --dataset folder)")
        return data

    def download():
        torchvision.datasets.CIFAR10(str(data_dir), train=True, download=True)

    _ensure_files(data_dir, CIFAR10_FILES, download, "CIFAR-10",
                  or_else=", or the images as train/<class>/*.png|jpg and test/<class>/*")

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
    return ImageData(train_x, train_y, test_x, test_y, CIFAR10_CLASSES)


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


def read_image(path):
    """An image file as a uint8 (3, 32, 32) tensor: RGB, resized to 32 x 32."""
    from PIL import Image
    try:
        with Image.open(path) as img:
            img = img.convert("RGB").resize((32, 32), Image.BILINEAR)
    except Exception as exc:
        raise UserError(f"cannot read image {path}: {type(exc).__name__}") from None
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)


def load_folder(data_dir):
    """Images in ImageFolder layout: data_dir/train/<class>/*, data_dir/test/<class>/*, as RGB 32x32,
    decoded on all cores (PIL releases the GIL while it decodes)."""
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
        with ThreadPoolExecutor(os.cpu_count()) as pool:
            xs = list(pool.map(read_image, [path for path, _ in samples], chunksize=256))
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


def seed_step(seed, step, rank=0):
    """Seed the global generators for one step: dropout and augmentation depend on (seed, step, rank) alone."""
    torch.manual_seed(seed * 1_000_003 + step + (rank << 40))


class Batches:
    """One process's share of every step's batch, on the training device: the student's and the
    teacher's independently augmented views (labeled images first) and the labels of the labeled
    images. With `world` processes each takes its 1/world share of the configured (global) labeled
    and unlabeled batches."""

    def __init__(self, data, split, config, device, rank=0, world=1):
        for key in ("labeled_batch", "unlabeled_batch"):
            if config[key] % world:
                raise UserError(f"--{key.replace('_', '-')} {config[key]} does not split evenly over "
                                f"{world} processes")
        self.device, self.seed, self.rank = device, config["seed"], rank
        self.n_lab, self.n_unl = config["labeled_batch"] // world, config["unlabeled_batch"] // world
        self.lab_idx, self.unl_idx, self.val_idx = (split[k].to(device) for k in ("labeled_idx", "unlabeled_idx", "val_idx"))
        self.stream = BatchStream(len(self.lab_idx), len(self.unl_idx), config["labeled_batch"],
                                  config["unlabeled_batch"], config["seed"])
        self.train_x, self.train_y = data.train_x.to(device), data.train_y.to(device)
        self.mean, self.std = (torch.tensor(config[k], device=device) for k in ("mean", "std"))
        self.flip = config["dataset"] == "cifar10"

    def views(self, step):
        """(student view, teacher view, labels of the labeled images) of this process's share of the step."""
        seed_step(self.seed, step, self.rank)
        lab_pos, unl_pos = self.stream.batch(step)
        r = self.rank
        lab_pos, unl_pos = lab_pos[r * self.n_lab:(r + 1) * self.n_lab], unl_pos[r * self.n_unl:(r + 1) * self.n_unl]
        idx = torch.cat([self.lab_idx[lab_pos.to(self.device)], self.unl_idx[unl_pos.to(self.device)]])
        images = self.train_x[idx]
        student_view, teacher_view = (augment(images, self.mean, self.std, self.flip)
                                      .contiguous(memory_format=torch.channels_last) for _ in range(2))
        return student_view, teacher_view, self.train_y[idx[:self.n_lab]]

    def training_images(self, n, batch_size=500):
        """A fixed sample of up to n training images (labeled and unlabeled, never the validation
        hold-out), normalized and not augmented, in batches: what the BN statistics are computed on."""
        pool = torch.cat([self.lab_idx, self.unl_idx])
        pick = pool[torch.randperm(len(pool), generator=torch.Generator().manual_seed(self.seed))[:n].to(self.device)]
        for i in range(0, len(pick), batch_size):
            yield normalize(self.train_x[pick[i:i + batch_size]], self.mean, self.std)


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
