"""The data: datasets decoded once into uint8 tensors (N, 3, S, S), the labeled / unlabeled /
validation splits, the batch stream, augmentation and normalization, and the check of a dataset
against a checkpoint's split.
"""
import csv
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import click
import numpy as np
import torch
import torch.nn.functional as F

from images import cache_dir, describe_bad, describe_hidden, find_images, is_hidden, is_image_name, load_images
from presets import DATASETS
from runs import UserError, checkpoint_split


@dataclass
class ImageData:
    train_x: torch.Tensor  # uint8 (N, 3, S, S)
    train_y: torch.Tensor  # int64 (N,); -1 for an image without a label (a folder's unlabeled/)
    test_x: torch.Tensor   # may hold no images (a folder without test/)
    test_y: torch.Tensor
    classes: list
    files: dict = None     # image folders: {"train": [...], "test": [...]} paths relative to the folder
    skipped: list = field(default_factory=list)  # [(relative path, reason)] left out by --skip-bad-images

    @property
    def has_unlabeled_part(self):
        """Whether some training images come without labels (a folder's unlabeled/)."""
        return bool((self.train_y < 0).any())

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


def load_cifar10(data_dir, echo=click.echo):
    """CIFAR-10 from its pickled python batches (cifar-10-batches-py/data_batch_1..5, test_batch) or,
    without them, the same images in data_dir/train/<class>/*, data_dir/test/<class>/* (any format
    PIL reads, e.g. the JPEG copy of ../shared/data), with CIFAR-10's class folders."""
    import torchvision

    batches = all((data_dir / f).is_file() for f in CIFAR10_FILES)
    if not batches and (data_dir / "train").is_dir() and (data_dir / "test").is_dir():
        data = load_folder(data_dir, echo=echo)
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


def load_digits(image_size=32):
    """scikit-learn's bundled 8x8 digits (1,797 images), upscaled to 3 x S x S, with a fixed
    stratified 80/20 train/test split (seed 0)."""
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    bunch = sk_digits()
    images = torch.from_numpy(bunch.images).float().div(16.0)[:, None]  # values 0..16
    images = F.interpolate(images, size=image_size, mode="bilinear", align_corners=False)
    images = (images.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    train_idx, test_idx = train_test_split(np.arange(len(labels)), test_size=0.2, random_state=0,
                                           stratify=bunch.target)
    train_idx, test_idx = torch.from_numpy(train_idx), torch.from_numpy(test_idx)
    return ImageData(images[train_idx], labels[train_idx], images[test_idx], labels[test_idx],
                     [str(i) for i in range(10)])


def class_images(root, required=True):
    """({class name: [image paths]} of root/<class>/** (sorted; any nesting inside a class folder),
    the number of hidden files and folders left out). A hidden folder is never a class. Exit 2 naming
    the folder for a missing root (when required), no class folders, a class folder without images,
    or images lying outside the class folders."""
    if not root.is_dir():
        if required:
            raise UserError(f"{root} is missing (expected {root}/<class>/<image>)")
        return {}, 0
    entries = list(root.iterdir())
    hidden = sum(is_hidden(p.name) for p in entries)
    entries = [p for p in entries if not is_hidden(p.name)]
    classes = sorted(p.name for p in entries if p.is_dir())
    loose = [p.name for p in entries if p.is_file() and is_image_name(p)]
    if loose:
        raise UserError(f"{root} holds images outside class folders ({', '.join(sorted(loose)[:3])}"
                        f"{', ...' if len(loose) > 3 else ''}): put each in {root}/<class>/")
    if not classes:
        raise UserError(f"no class folders in {root} (expected {root}/<class>/<image>)")
    groups = {}
    for c in classes:
        groups[c], _, hidden_inside = find_images(root / c)
        hidden += hidden_inside
    empty = [c for c, paths in groups.items() if not paths]
    if empty:
        raise UserError(f"{root / empty[0]} holds no images" + (f" (nor do {len(empty) - 1} other class folders)"
                                                                 if len(empty) > 1 else ""))
    return groups, hidden


class Part(NamedTuple):
    """One part of an image folder (train, labeled, unlabeled or test), decoded."""
    x: torch.Tensor    # uint8 images of the readable files
    y: torch.Tensor    # their labels; -1 in unlabeled/
    names: list        # their paths relative to the folder
    bad: list          # [(relative path, reason)] of the files that cannot be read
    commit: Callable   # writes the decode cache (after a miss), once the folder has passed its checks

    @classmethod
    def empty(cls, size):
        return cls(torch.zeros(0, 3, size, size, dtype=torch.uint8), torch.zeros(0, dtype=torch.long), [], [],
                   lambda: 0)


def read_part(data_dir, part, groups, classes, size, echo):
    """Decode one part (train, labeled, test: groups {class: paths}; unlabeled: groups {None: paths})
    through the cache."""
    root = data_dir / part
    paths = [p for ps in groups.values() for p in ps]
    labels = torch.tensor([-1 if c is None else classes.index(c) for c, ps in groups.items() for _ in ps],
                          dtype=torch.long)
    x, bad, commit = load_images(root, paths, part, size, echo, data_dir)
    names = [f"{part}/{p.relative_to(root).as_posix()}" for p in paths]
    bad = [(f"{part}/{p}", reason) for p, reason in bad]
    good = torch.tensor([n not in {b for b, _ in bad} for n in names], dtype=torch.bool) if bad else None
    if good is not None:
        labels, names = labels[good], [n for n, g in zip(names, good.tolist()) if g]
    return Part(x, labels, names, bad, commit)


def is_own_layout(data_dir):
    """Whether a folder holds your own images (labeled/, unlabeled/) rather than train/ and test/."""
    return (Path(data_dir) / "labeled").exists() or (Path(data_dir) / "unlabeled").exists()


def load_folder(data_dir, image_size=32, skip_bad=False, echo=click.echo):
    """A user's images, in one of two layouts:

    - your own images: data_dir/labeled/<class>/** (every image labeled), data_dir/unlabeled/**
      (any nesting; nothing but the pixels is read: their labels are -1) and, optionally,
      data_dir/test/<class>/**;
    - the benchmark layout: data_dir/train/<class>/**, data_dir/test/<class>/** (--labels draws the
      labeled images from train, the rest are treated as unlabeled).

    Images are RGB, resized to image_size, decoded on all cores once and cached (images.DecodeCache).
    Unreadable files end the run with one message listing them (exit 2) unless skip_bad."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise UserError(f"--data-dir {data_dir} is not a folder")
    own = is_own_layout(data_dir)
    if not own and not (data_dir / "train").is_dir():
        raise UserError(f"{data_dir} holds neither labeled/ (your own images: labeled/<class>/*, unlabeled/*, "
                        f"optionally test/<class>/*) nor train/<class>/* with test/<class>/*")
    if own:
        train_groups, hidden = class_images(data_dir / "labeled")
        unlabeled, _, hidden_unlabeled = (find_images(data_dir / "unlabeled") if (data_dir / "unlabeled").is_dir()
                                          else ([], 0, 0))
        hidden += hidden_unlabeled
        if not unlabeled:
            raise UserError(f"{data_dir / 'unlabeled'} holds no images (put the images without labels there, "
                            f"any nesting)" if (data_dir / "unlabeled").is_dir() else
                            f"{data_dir / 'unlabeled'} is missing (put the images without labels there, any nesting)")
        test_groups, hidden_test = class_images(data_dir / "test", required=False)
    else:
        (train_groups, hidden), unlabeled = class_images(data_dir / "train"), []
        test_groups, hidden_test = class_images(data_dir / "test")
    if hidden + hidden_test:
        echo(describe_hidden(hidden + hidden_test, data_dir))
    classes = sorted(train_groups)
    where = data_dir / ("labeled" if own else "train")
    if len(classes) < 2:
        raise UserError(f"{where} holds one class folder ({classes[0]}): a classifier needs two or more")
    foreign = sorted(set(test_groups) - set(classes))
    if foreign and own:
        raise UserError(f"{data_dir / 'test'} has class folders that {where} lacks: {', '.join(foreign)}")
    if not own and sorted(test_groups) != classes:
        raise UserError(f"train and test class folders differ in {data_dir}: "
                        f"{sorted(set(classes) ^ set(test_groups))}")

    parts = [("labeled" if own else "train", train_groups)] + [("unlabeled", {None: unlabeled})] * own
    train = [read_part(data_dir, part, groups, classes, image_size, echo) for part, groups in parts]
    test = read_part(data_dir, "test", test_groups, classes, image_size, echo) if test_groups else Part.empty(image_size)
    bad = [b for part in train + [test] for b in part.bad]
    if bad and not skip_bad:
        raise UserError(describe_bad(bad, data_dir) + "; replace or remove them, or pass --skip-bad-images to "
                        "train without them")
    if bad:
        echo(f"skipped {describe_bad(bad, data_dir, shown=3)}")
    train_x, train_y = torch.cat([p.x for p in train]), torch.cat([p.y for p in train])
    missing = [c for i, c in enumerate(classes) if not (train_y == i).any()]
    if missing:
        raise UserError(f"{where / missing[0]} holds no readable images")
    written = sum(part.commit() for part in train + [test])
    if written:
        echo(f"cached the decoded images in {cache_dir(data_dir)} ({written / 2**20:.0f} MB; delete it at will: it is "
             f"rebuilt when needed)")
    files = dict(train=[n for p in train for n in p.names], test=test.names)
    return ImageData(train_x, train_y, test.x, test.y, classes, files=files, skipped=bad)


def load_dataset(name, data_dir, image_size=32, skip_bad=False, echo=click.echo):
    """A dataset by name; image_size and skip_bad (leave unreadable files out) apply to image folders,
    image_size to digits too (SVHN and CIFAR-10 are 32 x 32)."""
    data_dir = Path(data_dir)
    if name in ("svhn", "cifar10") and image_size != 32:
        raise UserError(f"--image-size {image_size}: {name} is the paper's 32 x 32 (--image-size is for folder and digits)")
    if name == "svhn":
        return load_svhn(data_dir)
    if name == "cifar10":
        return load_cifar10(data_dir, echo)
    if name == "digits":
        return load_digits(image_size)
    if name == "folder":
        return load_folder(data_dir, image_size, skip_bad, echo)
    raise UserError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def own_split(labels, n_val, seed):
    """A folder of your own images: every labeled image is labeled, every unlabeled one unlabeled;
    n_val labeled images (stratified by class) are held out as a validation set, never trained on."""
    from sklearn.model_selection import train_test_split
    pool, unlabeled = (labels >= 0).nonzero().flatten(), (labels < 0).nonzero().flatten()
    if n_val == 0:
        return pool, unlabeled, torch.zeros(0, dtype=torch.long)
    counts = torch.bincount(labels[pool])
    if n_val < len(counts) or len(pool) - n_val < len(counts) or counts.min() < 2:
        raise UserError(f"--val {n_val}: a hold-out stratified by class needs at least one image per class in it and "
                        f"one left to train on ({len(pool)} labeled images, {counts.min().item()} in the smallest class)")
    train, val = train_test_split(pool.numpy(), test_size=n_val, random_state=seed, stratify=labels[pool].numpy())
    return torch.from_numpy(np.sort(train)), unlabeled, torch.from_numpy(np.sort(val))


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


def max_shift(image_size):
    """The augmentation's translation in pixels: the paper's 2 at 32 x 32, in proportion at other sizes."""
    return max(1, round(2 * image_size / 32))


def augment(x, mean, std, flip, max_shift=2):
    """Normalized, randomly translated (pad max_shift with black, random H x W crop) and, for
    CIFAR-10, randomly flipped copies of uint8 images (B, 3, H, W). Every call draws new randomness."""
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
        self.max_shift = max_shift(config.get("image_size", 32))

    def indices(self, step):
        """The training-set indices of this process's share of the step's images, labeled ones first."""
        lab_pos, unl_pos = self.stream.batch(step)
        r = self.rank
        lab_pos, unl_pos = lab_pos[r * self.n_lab:(r + 1) * self.n_lab], unl_pos[r * self.n_unl:(r + 1) * self.n_unl]
        return torch.cat([self.lab_idx[lab_pos.to(self.device)], self.unl_idx[unl_pos.to(self.device)]])

    def views(self, step):
        """(student view, teacher view, labels of the labeled images) of this process's share of the step."""
        seed_step(self.seed, step, self.rank)
        idx = self.indices(step)
        images = self.train_x[idx]
        student_view, teacher_view = (augment(images, self.mean, self.std, self.flip, self.max_shift)
                                      .contiguous(memory_format=torch.channels_last) for _ in range(2))
        return student_view, teacher_view, self.train_y[idx[:self.n_lab]]

    def training_images(self, n, batch_size=500):
        """A fixed sample of up to n training images (labeled and unlabeled, never the validation
        hold-out), normalized and not augmented, in batches: what the BN statistics are computed on."""
        pool = torch.cat([self.lab_idx, self.unl_idx])
        pick = pool[torch.randperm(len(pool), generator=torch.Generator().manual_seed(self.seed))[:n].to(self.device)]
        for i in range(0, len(pick), batch_size):
            yield normalize(self.train_x[pick[i:i + batch_size]], self.mean, self.std)


def true_classes(data, truth_csv=None, option="--truth"):
    """Every training image's true class: the dataset's labels and, for a folder's unlabeled images
    (label -1), those of a CSV with columns path,class (paths as the folder names them, e.g.
    unlabeled/u00001.jpg; examples/own_images.py writes one beside the folders it builds). For
    measurements only: training never reads them. Exit 2 where a class is missing or unknown."""
    y = data.train_y.clone()
    unknown = (y < 0).nonzero().flatten().tolist()
    if not unknown:
        return y
    if truth_csv is None:
        raise UserError(f"the {len(unknown)} unlabeled images of this folder have no known classes: give {option}, "
                        f"a CSV of path,class for them")
    try:
        with open(truth_csv, newline="") as f:
            rows = {r.get("path"): r.get("class") for r in csv.DictReader(f)}
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"cannot read {option} {truth_csv}: {exc}") from None
    names = [data.files["train"][i] for i in unknown]
    missing = [n for n in names if rows.get(n) not in data.classes]
    if missing:
        raise UserError(f"{option} {truth_csv} has no known class for {len(missing)} unlabeled images "
                        f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    y[unknown] = torch.tensor([data.classes.index(rows[n]) for n in names])
    return y


def restore_data(state, data_dir=None, echo=click.echo):
    """The checkpoint's dataset (from its own data_dir unless one is given), checked against it: an
    image folder must hold the very files it was trained on."""
    config = state["config"]
    where = data_dir or config["data_dir"]
    data = load_dataset(config["dataset"], where, config.get("image_size", 32), config.get("skip_bad_images", False), echo)
    if config.get("files") is not None:
        check_same_files(config["files"], data.files, where)
    n_train = len(data.train_y)
    split = torch.cat(list(checkpoint_split(state).values()))
    if data.num_classes != config["num_classes"] or len(split) != n_train or split.max() >= n_train:
        raise UserError(f"the {config['dataset']} data in {data_dir or config['data_dir']} does not match the "
                        f"checkpoint ({data.num_classes} classes and {n_train} training images here, "
                        f"{config['num_classes']} and {len(split)} in the checkpoint)")
    return data


def held_out(state, data):
    """The labeled images a checkpoint never trained on: (uint8 images, classes, which): its test
    images ("test"), else its --val hold-out ("validation"); none where it has neither."""
    if len(data.test_y):
        return data.test_x, data.test_y, "test"
    val_idx = state.get("val_idx", torch.zeros(0, dtype=torch.long))
    return data.train_x[val_idx], data.train_y[val_idx], "validation"


def check_same_files(then, now, where):
    """Exit 2 if the image files of a folder differ from those a checkpoint was trained on."""
    for part in ("train", "test"):
        if then[part] == now[part]:
            continue
        gone, new = sorted(set(then[part]) - set(now[part])), sorted(set(now[part]) - set(then[part]))
        listing = "; ".join(f"{len(names)} {what} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                            for what, names in (("missing", gone), ("new", new)) if names)
        raise UserError(f"the images in {where} changed since the checkpoint was trained: {listing or 'another order'}; "
                        f"restore them, or train again from stage 1")
