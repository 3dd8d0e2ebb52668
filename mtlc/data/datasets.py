"""The datasets (SVHN, CIFAR-10, digits, image folders) as uint8 tensors (N, 3, S, S), memory-mapped
from the decode cache for a folder; the labeled / unlabeled / validation splits; the true classes
for measurements; and the check of a dataset against a checkpoint's split. The batch stream that
reads them is batches.py.
"""
import collections
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import click
import numpy as np
import torch
import torch.nn.functional as F

from ..errors import UserError
from .layout import check_part_names, describe_loose, is_own_layout
from .cache import cache_dir, content_fingerprint, load_images
from .framing import SQUASH
from .files import (
    OUTSIDE,
    count_other,
    describe_bad,
    describe_hidden,
    describe_links_out,
    describe_others,
    is_hidden,
    is_image_name,
    other_kind,
    scan_images,
)


@dataclass
class ImageData:
    train_x: torch.Tensor  # uint8 (N, 3, S, S)
    train_y: torch.Tensor  # int64 (N,); -1 for an image without a label (a folder's unlabeled/)
    test_x: torch.Tensor   # may hold no images (a folder without test/)
    test_y: torch.Tensor
    classes: list
    files: dict = None     # image folders: {"train": [...], "test": [...]} paths relative to the folder
    contents: dict = None  # image folders: {"train": ..., "test": ...} which names hold which bytes (a hash)
    digests: dict = None   # image folders: {"train": f, "test": f}, f() the digest of each image's file (hex, S32)
    skipped: list = field(default_factory=list)  # [(relative path, reason)] left out by --skip-bad-images
    # A pretrained trunk's features of the images (train.embeddings.Features), where a run trains on them
    features: object = None

    def inputs(self, part):
        """What a network of the run takes for the training or test images: the images (uint8), or
        the trunk's features of them (float16 (N, views, D)) where it trains on those."""
        if self.features is not None:
            return getattr(self.features, part)
        return self.train_x if part == "train" else self.test_x

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
    """Download a dataset into data_dir when its files are missing (download None: never, say so);
    exit 2 naming them (and what else would do, `or_else`) if that fails."""
    missing = [f for f in files if not (data_dir / f).is_file()]
    if not missing:
        return
    if download is None:
        raise UserError(f"{what} files missing in {data_dir} ({', '.join(missing)}): only train_mt.py downloads a "
                        f"dataset (--dataset with --data-dir); give this command --data-dir where the files are")
    made = [p for p in (data_dir, *data_dir.parents) if not p.exists()]  # the folders a download would make
    try:
        download()
    except Exception as exc:  # offline, a proxy, a full disk: all end the same way for the user
        for folder in made:  # a failed download leaves no empty --data-dir behind (innermost first)
            try:
                folder.rmdir()
            except OSError:  # not empty (a partial archive, another run's files): left as it is
                break
        raise UserError(f"{what} files missing in {data_dir} and the download failed "
                        f"({type(exc).__name__}); place {', '.join(missing)} there{or_else}") from None
    still = [f for f in files if not (data_dir / f).is_file()]
    if still:
        raise UserError(f"{what} download did not produce {', '.join(still)} in {data_dir}")


def load_svhn(data_dir, download=True):
    """SVHN from torchvision's files (train_32x32.mat, test_32x32.mat), digit '0' stored as 10 -> 0;
    downloaded into data_dir where they are missing, if `download`."""
    import scipy.io

    def fetch():
        import torchvision  # only to download: its import alone takes seconds
        for split in ("train", "test"):
            torchvision.datasets.SVHN(str(data_dir), split=split, download=True)

    _ensure_files(data_dir, SVHN_FILES, fetch if download else None, "SVHN")

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


def load_cifar10(data_dir, echo=click.echo, download=True, check_listing=None):
    """CIFAR-10 from its pickled python batches (cifar-10-batches-py/data_batch_1..5, test_batch) or,
    without them, the same images in data_dir/train/<class>/*, data_dir/test/<class>/* (any format
    PIL reads, e.g. the JPEG copy of ../shared/data), with CIFAR-10's class folders; the batches
    downloaded into data_dir where neither is there, if `download`."""
    batches = all((data_dir / f).is_file() for f in CIFAR10_FILES)
    if not batches and (data_dir / "train").is_dir() and (data_dir / "test").is_dir():
        data = load_folder(data_dir, echo=echo, check_listing=check_listing)
        if data.classes != CIFAR10_CLASSES:
            raise UserError(f"{data_dir}/train and /test hold the class folders {', '.join(data.classes)}, not "
                            f"CIFAR-10's {', '.join(CIFAR10_CLASSES)} (for other images use --dataset folder)")
        return data

    def fetch():
        import torchvision  # only to download: its import alone takes seconds
        torchvision.datasets.CIFAR10(str(data_dir), train=True, download=True)

    _ensure_files(data_dir, CIFAR10_FILES, fetch if download else None, "CIFAR-10",
                  or_else=", or the images as train/<class>/*.png|jpg and test/<class>/*")

    def read(names):
        xs, ys = [], []
        for name in names:
            x, y = read_cifar10_batch(data_dir / name)
            xs.append(x)
            ys.append(y)
        return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))

    train_x, train_y = read(CIFAR10_FILES[:5])
    test_x, test_y = read(CIFAR10_FILES[5:])
    return ImageData(train_x, train_y, test_x, test_y, CIFAR10_CLASSES)


class CifarUnpickler(pickle.Unpickler):
    """Unpickles what CIFAR-10's python batches hold (dicts, lists, bytes, str, int and numpy
    arrays) and nothing else: a pickle names the functions it calls, and a crafted batch file could
    name any (a pickle.load of it runs code)."""
    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"it asks to call {module}.{name}, which a CIFAR-10 batch never holds "
                                         f"(refused: unpickling it could run code)")
        return super().find_class(module, name)


def read_cifar10_batch(path):
    """(uint8 images (n, 3, 32, 32), int64 labels (n,)) of one of CIFAR-10's python batch files,
    read with CifarUnpickler and checked; exit 2 naming the file for anything else."""
    try:
        with open(path, "rb") as f:
            batch = CifarUnpickler(f, encoding="bytes").load()
        data, labels = batch[b"data"], batch[b"labels"]
        if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == 3072):
            raise ValueError("its data is not a uint8 array of 3,072 values per image")
        labels = np.asarray(labels)
        if labels.dtype.kind not in "iu" or labels.shape != (len(data),) or not ((labels >= 0) & (labels < 10)).all():
            raise ValueError("its labels are not one class 0-9 per image")
    except Exception as exc:
        raise UserError(f"cannot read {path} as a CIFAR-10 batch: {type(exc).__name__}: {str(exc)[:200]}") from None
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


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
    """({class name: [(path relative to root's parent, size, modification time)]} of root/<class>/**
    (images.scan_images: sorted, any nesting inside a class folder), the counts of what was left out:
    hidden files and folders, other files). A hidden folder is never a class. Exit 2 naming
    the folder for a missing root (when required), no class folders, a class folder without images,
    or images lying outside the class folders."""
    if not root.is_dir():
        if required:
            raise UserError(f"{root} is missing (expected {root}/<class>/<image>)")
        return {}, collections.Counter()
    entries = list(root.iterdir())
    left_out = collections.Counter(hidden=sum(is_hidden(p.name) for p in entries))
    entries = [p for p in entries if not is_hidden(p.name)]
    classes = sorted(p.name for p in entries if p.is_dir())
    loose = [p.name for p in entries if p.is_file() and is_image_name(p.name)]
    if loose:
        raise UserError(f"{root} holds images outside class folders ({', '.join(sorted(loose)[:3])}"
                        f"{', ...' if len(loose) > 3 else ''}): put each in {root}/<class>/")
    if not classes:
        raise UserError(f"no class folders in {root} (expected {root}/<class>/<image>)")
    for p in entries:
        if p.is_file() and not is_image_name(p.name):
            count_other(left_out, other_kind(p.name))
    groups, in_empty = {}, collections.Counter()
    for c in classes:
        groups[c], counts = in_part(root.name + "/" + c, scan_images(root / c))
        left_out.update(counts)
        in_empty.update(counts if not groups[c] else {})
    empty = [c for c, paths in groups.items() if not paths]
    if empty:
        others = describe_others(in_empty, root / empty[0] if len(empty) == 1 else root)
        raise UserError(f"{root / empty[0]} holds no images" + (f" (nor do {len(empty) - 1} other class folders)"
                                                                 if len(empty) > 1 else "") + f": {others}" * bool(others)
                        + "; put images of the class in it, or remove the folder (a class folder is a class)")
    return groups, left_out


def in_part(part, scanned):
    """scan_images of data_dir/part with the paths made relative to data_dir."""
    entries, counts = scanned
    return [(f"{part}/{rel}", *stamp) for rel, *stamp in entries], counts


class Files(NamedTuple):
    """The image files of one or more parts of a folder, in order."""
    entries: list        # [(path relative to the folder (labeled/cat/1.jpg), size, modification and change time)]
    labels: torch.Tensor  # their classes' indices; -1 in unlabeled/


def listed(groups, classes):
    """Files of the groups [{class: entries}] (unlabeled/: {None: entries}), in order."""
    pairs = [(e, -1 if c is None else classes.index(c)) for group in groups for c, es in group.items() for e in es]
    return Files([e for e, _ in pairs], torch.tensor([c for _, c in pairs], dtype=torch.long))


def read_files(data_dir, files, group, size, echo, framing=SQUASH):
    """(uint8 images (memory-mapped), labels, names relative to data_dir, content fingerprint, the
    digests of their files (a function)) of the readable files, through the decode cache, [(name,
    reason)] of the others, bytes written to the cache; framed by `framing`."""
    x, bad, content, digests, written = load_images(data_dir, files.entries, group, size, echo, framing)
    names = [entry[0] for entry in files.entries]
    if not bad:
        return (x, files.labels, names, content, digests), bad, written
    unreadable = {name for name, _ in bad}
    good = [i for i, name in enumerate(names) if name not in unreadable]
    return (x, files.labels[good], [names[i] for i in good], content, digests), bad, written


def checked_classes(data_dir, train_groups, test_groups, own):
    """(the classes, the folder that names them) of a folder's class folders; exit 2 where fewer than
    two, or where test/ names a class the training part lacks (own layout) or differs (benchmark layout)."""
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
    return classes, where


def load_folder(data_dir, image_size=32, skip_bad=False, echo=click.echo, check_listing=None, restored=False,
                framing=SQUASH):
    """A user's images, in one of two layouts:

    - your own images: data_dir/labeled/<class>/** (every image labeled), data_dir/unlabeled/**
      (any nesting; nothing but the pixels is read: their labels are -1) and, optionally,
      data_dir/test/<class>/**;
    - the benchmark layout: data_dir/train/<class>/**, data_dir/test/<class>/** (--labels draws the
      labeled images from train, the rest are treated as unlabeled).

    Images are RGB, framed (framing.py) to image_size, decoded on all cores once into the decode cache
    (images.DecodeCache) and memory-mapped from it: the training images are one array, the test images another.
    Unreadable files end the run with one message listing them (exit 2) unless skip_bad. check_listing:
    called with {"train": names, "test": names} (relative to the folder) before anything is decoded."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise UserError(f"--data-dir {data_dir} is not a folder")
    check_part_names(data_dir)
    own = is_own_layout(data_dir)
    if not own and not (data_dir / "train").is_dir():
        raise UserError(f"{data_dir} holds neither labeled/ (your own images: labeled/<class>/*, unlabeled/*, "
                        f"optionally test/<class>/*) nor train/<class>/* with test/<class>/*")
    if own:
        train_groups, left_out = class_images(data_dir / "labeled")
        unlabeled, counts = (in_part("unlabeled", scan_images(data_dir / "unlabeled"))
                             if (data_dir / "unlabeled").is_dir() else ([], collections.Counter()))
        left_out.update(counts)
        if not unlabeled:
            others = describe_others(counts, data_dir / "unlabeled")
            raise UserError(f"{data_dir / 'unlabeled'} holds no images (put the images without labels there, "
                            f"any nesting){f': {others}' * bool(others)}" if (data_dir / "unlabeled").is_dir() else
                            f"{data_dir / 'unlabeled'} is missing (put the images without labels there, any nesting)")
        test_groups, counts = class_images(data_dir / "test", required=False)
    else:
        (train_groups, left_out), unlabeled = class_images(data_dir / "train"), []
        test_groups, counts = class_images(data_dir / "test")
    left_out.update(counts)
    for line in (describe_hidden(left_out["hidden"], data_dir), describe_others(left_out, data_dir),
                 describe_loose(data_dir, own), describe_links_out(left_out[OUTSIDE], data_dir)):
        if line and not restored:
            echo(line)
    classes, where = checked_classes(data_dir, train_groups, test_groups, own)

    # One cache for the training images (labeled, then unlabeled), one for the test images: each a
    # single memory-mapped array, so training indexes one array and holds only its batches.
    groups = [train_groups] + [{None: unlabeled}] * own
    train_files, test_files = listed(groups, classes), listed([test_groups], classes) if test_groups else None
    if check_listing is not None:
        check_listing(dict(train=[e[0] for e in train_files.entries],
                           test=[e[0] for e in test_files.entries] if test_files else []))
    (train_x, train_y, train_names, train_content, train_digests), bad, written = read_files(
        data_dir, train_files, "train", image_size, echo, framing)
    if test_groups:
        (test_x, test_y, test_names, test_content, test_digests), bad_test, written_test = read_files(
            data_dir, test_files, "test", image_size, echo, framing)
    else:
        test_x, test_y, test_names, test_content, test_digests, bad_test, written_test = (
            torch.zeros(0, 3, image_size, image_size, dtype=torch.uint8), torch.zeros(0, dtype=torch.long), [],
            content_fingerprint([]), lambda: np.zeros(0, "S32"), [], 0)
    if written + written_test:
        echo(f"cached the decoded images in {cache_dir(data_dir)} ({(written + written_test) / 2**20:.0f} MB; delete it "
             f"at will: it is rebuilt when needed)")
    bad += bad_test
    if bad and not skip_bad:
        raise UserError(describe_bad(bad, data_dir) + "; replace or remove them, or pass --skip-bad-images to "
                        "train without them (the decoded images are cached: a rerun with --skip-bad-images decodes nothing)")
    if bad and not restored:
        echo(f"skipped (--skip-bad-images) {describe_bad(bad, data_dir, shown=3)}")
    missing = [c for i, c in enumerate(classes) if not (train_y == i).any()]
    if missing:
        raise UserError(f"{where / missing[0]} holds no readable images")
    return ImageData(train_x, train_y, test_x, test_y, classes, files=dict(train=train_names, test=test_names),
                     contents=dict(train=train_content, test=test_content), skipped=bad,
                     digests=dict(train=train_digests, test=test_digests))


# The datasets load_dataset knows; the paper's protocol for each is train.presets'.
DATASETS = ("svhn", "cifar10", "digits", "folder")


def load_dataset(name, data_dir, image_size=32, skip_bad=False, echo=click.echo, download=True, check_listing=None,
                 restored=False, framing=SQUASH):
    """A dataset by name; image_size and skip_bad (leave unreadable files out) apply to image folders,
    image_size to digits too (SVHN and CIFAR-10 are 32 x 32). download: fetch SVHN or CIFAR-10 where
    their files are missing (train_mt.py only); check_listing: load_folder's; restored: a checkpoint's
    folder, whose files left out and skipped the run that trained it said (not said again); framing:
    how a folder's images become squares (framing.py)."""
    data_dir = Path(data_dir)
    if name in ("svhn", "cifar10") and image_size != 32:
        raise UserError(f"--image-size {image_size}: {name} is the paper's 32 x 32 (--image-size is for folder and digits)")
    if name == "svhn":
        return load_svhn(data_dir, download)
    if name == "cifar10":
        return load_cifar10(data_dir, echo, download, check_listing)
    if name == "digits":
        return load_digits(image_size)
    if name == "folder":
        return load_folder(data_dir, image_size, skip_bad, echo, check_listing, restored, framing)
    raise UserError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
