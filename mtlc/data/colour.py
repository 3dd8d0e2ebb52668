"""Whether a folder's images are colour photos or grey ones (scans, glyphs, digits), from a sample:
what `--backbone auto`, a folder's default, chooses by (train/pretrained.py). An ImageNet trunk's
features won on colour photos and lost on grey glyphs and digits (docs/pretrained.md).

A pixel has a colour where its channels differ by more than CHROMA of 255 (a grey image saved as a
JPEG in RGB keeps its channels within a few levels of each other); an image is in colour where
more than COLOUR_PIXELS of its pixels have one.
"""
import itertools
import os
from pathlib import Path

import numpy as np

from .layout import is_own_layout
from .files import is_hidden, walk_images
from .images import BadImage, decode

SAMPLE = 240          # images looked at, shared out among the folders given
SIDE = 32             # the side they are decoded at
CHROMA = 24           # of 255: the spread of R, G and B above which a pixel has a colour
COLOUR_PIXELS = 0.05  # the share of an image's pixels with a colour that makes it a colour image


def is_colour(image):
    """Whether a uint8 (3, H, W) image is in colour (CHROMA, COLOUR_PIXELS)."""
    channels = image.numpy().astype(np.int16)
    spread = channels.max(axis=0) - channels.min(axis=0)
    return (spread > CHROMA).mean() > COLOUR_PIXELS


def colour_share(folders, sample=SAMPLE):
    """(the share of the images looked at that are in colour, how many were looked at): the first
    images of each folder in `folders` (in the order sorted paths have), `sample` in all, shared out
    evenly; a file that cannot be read is passed over. (None, 0) where none could be read."""
    folders = list(folders)
    colour = seen = 0
    for folder in folders:
        for rel, *_ in itertools.islice(walk_images(folder), max(1, sample // max(1, len(folders)))):
            try:
                image = decode(os.path.join(folder, rel), SIDE)
            except BadImage:
                continue
            colour += is_colour(image)
            seen += 1
    return (colour / seen if seen else None), seen


def folder_colour_share(data_dir, sample=SAMPLE):
    """colour_share of a folder's training images: each class folder of labeled/ and unlabeled/ (of
    train/ in the benchmark layout), so that every class is looked at; with more folders than
    `sample`, the last `sample` of them (unlabeled/ among them), an image each."""
    root = Path(data_dir)
    parts = [root / "labeled", root / "unlabeled"] if is_own_layout(root) else [root / "train"]
    if not parts[0].is_dir():  # not a folder load_dataset takes: it says why
        return None, 0
    folders = [part / name for part in parts if part.name != "unlabeled" and part.is_dir()
               for name in sorted(os.listdir(part)) if not is_hidden(name) and (part / name).is_dir()]
    folders += [part for part in parts if part.name == "unlabeled" and part.is_dir()]
    return colour_share(folders[-sample:] if len(folders) > sample else folders, sample)
