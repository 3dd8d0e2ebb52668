"""Whether a folder's images are colour photos or grey ones (scans, glyphs, digits), from a sample:
what `--backbone auto`, a folder's default, chooses by (train/pretrained.py). An ImageNet trunk's
features won on colour photos and lost on grey glyphs and digits (docs/pretrained.md).

A pixel has a colour where its channels differ by more than CHROMA of 255 (a grey image saved as a
JPEG in RGB keeps its channels within a few levels of each other); an image is in colour where
more than COLOUR_PIXELS of its pixels have one.
"""
import numpy as np

from .images import BadImage, decode
from .sample import SAMPLE, sampled_paths, training_folders

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
    colour = seen = 0
    for path in sampled_paths(folders, sample):
        try:
            image = decode(path, SIDE)
        except BadImage:
            continue
        colour += is_colour(image)
        seen += 1
    return (colour / seen if seen else None), seen


def folder_colour_share(data_dir, sample=SAMPLE):
    """colour_share of a folder's training images (sample.training_folders)."""
    folders = training_folders(data_dir, sample)
    return (None, 0) if folders is None else colour_share(folders, sample)
