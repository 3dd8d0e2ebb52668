"""How large a folder's images are, from a sample (data/sample.py) read by their headers alone: what
a pretrained trunk's framing is chosen by (train/pretrained.py framing_of). A photo is cropped as the
trunk saw ImageNet, its border left out; an image far smaller than the trunk's side (CIFAR-10's 32 px
against Lite2's 260) is all content, upscaled many times, and cropping it lost 3 to 5 points of the
labels' error there (docs/pretrained.md).
"""
import io
import statistics

from PIL import Image

from ..disk.opening import read_regular
from .files import FORMATS
from .sample import SAMPLE, sampled_paths, training_folders


def shorter_side(path):
    """The shorter side of an image file, from its header; None where it cannot be read."""
    try:
        with Image.open(io.BytesIO(read_regular(path)), formats=FORMATS) as img:
            return min(img.size)
    except Exception:  # an unreadable file is loading's to report
        return None


def folder_side(data_dir, sample=SAMPLE):
    """The median shorter side of a sample of a folder's training images, None where none is read."""
    folders = training_folders(data_dir, sample)
    sides = [s for s in map(shorter_side, sampled_paths(folders or [], sample)) if s]
    return statistics.median(sides) if sides else None
