"""How an image of any shape becomes the square a network takes (a run's `framing`, kept in its
checkpoint): squashed to the square (the paper's network, and every run from before framing was
kept), its centre cropped at the aspect it has (a pretrained trunk's own view: the shorter side
resized to side / crop, then the centre side x side, as timm's evaluation transform does), or
padded to a square with grey. Training, the decode cache, predictions, the audit, the review page's
model and the ONNX example all frame through one Framing.
"""
import math
from dataclasses import dataclass

from PIL import Image, ImageOps

MODES = ("squash", "crop", "pad")
INTERPOLATIONS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
PAD_GREY = (127, 127, 127)  # what a padded image's border is: the middle of the range, near 0 once normalized
# A crop whose whole resize would hold more than this many times its square resizes only the square (a strip).
STRIP = 16


@dataclass(frozen=True)
class Framing:
    """mode: squash, crop or pad; crop: the share of the shorter side a centre crop keeps (timm's
    crop_pct; 1, the centre square); interpolation: bilinear or bicubic (PIL's, antialiased)."""
    mode: str = "squash"
    crop: float = 1.0
    interpolation: str = "bilinear"

    def __post_init__(self):
        if (self.mode not in MODES or self.interpolation not in INTERPOLATIONS
                or isinstance(self.crop, bool) or not (isinstance(self.crop, (int, float)) and 0.5 <= self.crop <= 1)):
            raise ValueError(f"not a framing: {self.mode!r}, crop {self.crop!r}, {self.interpolation!r}")

    def decoded_side(self, side):
        """The side an image must keep, at least, before it is framed at `side` (what the decoder's
        reduced-scale draft may go down to): a crop resizes the shorter side to more than side."""
        return math.floor(side / self.crop) if self.mode == "crop" else side

    def __call__(self, img, side):
        """A PIL image framed as a side x side image."""
        method = INTERPOLATIONS[self.interpolation]
        if self.mode == "squash":
            return img.resize((side, side), method)
        if self.mode == "pad":
            return ImageOps.pad(img, (side, side), method, color=PAD_GREY)
        # timm's Resize(floor(side / crop_pct)), CenterCrop(side), with torchvision's arithmetic (tested equal)
        short = self.decoded_side(side)
        w, h = img.size
        size = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
        left, top = int(round((size[0] - side) / 2.0)), int(round((size[1] - side) / 2.0))
        if size[0] * size[1] > STRIP * side * side:
            # a strip (10,000 x 20, 1 x 100,000): its whole resize would take gigabytes for the square
            # it keeps, so only that square's part of the image is resized
            sx, sy = w / size[0], h / size[1]
            return img.resize((side, side), method, box=(left * sx, top * sy, (left + side) * sx, (top + side) * sy))
        return img.resize(size, method).crop((left, top, left + side, top + side))

    @property
    def tag(self):
        """A short name for file names and keys: '' for squash bilinear (the names of before), else
        e.g. 'crop89bicubic', 'padbilinear'."""
        if self == SQUASH:
            return ""
        return f"{self.mode}{round(self.crop * 100) if self.mode == 'crop' else ''}{self.interpolation}"

    def describe(self):
        if self.mode == "squash":
            return f"squashed to a square ({self.interpolation})"
        if self.mode == "pad":
            return f"padded to a square with grey ({self.interpolation})"
        kept = "the centre square" if self.crop == 1 else f"the centre {self.crop:.0%} of the shorter side"
        return f"{kept}, aspect kept ({self.interpolation})"

    def as_dict(self):
        return dict(mode=self.mode, crop=self.crop, interpolation=self.interpolation)

    @classmethod
    def of(cls, value):
        """From a checkpoint's dict (ValueError for anything else); None: squash, runs from before."""
        if value is None:
            return SQUASH
        if not (isinstance(value, dict) and set(value) == {"mode", "crop", "interpolation"}):
            raise ValueError(f"not a framing: {value!r}")
        return cls(**value)


SQUASH = Framing()
