"""A sample of a folder's training images, spread over its class folders and unlabeled/: what the
choices made from a look at the images (data/colour.py: photos or grey scans; data/sides.py: how
large they are) are made on, before anything is decoded into the cache.
"""
import itertools
import os
from pathlib import Path

from .files import is_hidden, walk_images
from .layout import is_own_layout

SAMPLE = 240  # images looked at, shared out among the folders given


def sampled_paths(folders, sample=SAMPLE):
    """The first images of each folder (in the order sorted paths have), `sample` in all, shared out
    evenly."""
    folders = list(folders)
    for folder in folders:
        for rel, *_ in itertools.islice(walk_images(folder), max(1, sample // max(1, len(folders)))):
            yield os.path.join(folder, rel)


def training_folders(data_dir, sample=SAMPLE):
    """The folders of a folder's training images: each class folder of labeled/ and unlabeled/ (of
    train/ in the benchmark layout), so that every class is looked at; with more folders than
    `sample`, the last `sample` of them (unlabeled/ among them). None where there is no such folder."""
    root = Path(data_dir)
    parts = [root / "labeled", root / "unlabeled"] if is_own_layout(root) else [root / "train"]
    if not parts[0].is_dir():  # not a folder load_dataset takes: it says why
        return None
    folders = [part / name for part in parts if part.name != "unlabeled" and part.is_dir()
               for name in sorted(os.listdir(part)) if not is_hidden(name) and (part / name).is_dir()]
    folders += [part for part in parts if part.name == "unlabeled" and part.is_dir()]
    return folders[-sample:] if len(folders) > sample else folders
