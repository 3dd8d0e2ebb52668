"""A pretrained trunk's features of a run's images, computed once and kept as the decode cache keeps
the images: in the dataset's cache folder (data/cache.py's cache_dir), as a work folder (disk/work.py)
whose manifest is sealed by this machine's secret over what the features are of (the backbone and its
weights, the image size, the views, the images' content) and the HMAC of their bytes, so that only
features this machine computed from these very images are ever used, and an embedding cut short
goes on where it stopped. The features are float16 rows, memory-mapped: each training image in two
views (as is, and flipped left to right: the augmentation a frozen trunk's features can still take),
each test image as is.
"""
import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..data.batches import image_batches
from ..data.cache import cache_dir
from ..data.views import normalize
from ..disk.work import Work
from .devices import sync
from .pretrained import BACKBONES, TrunkEngine
from .progress import epoch_progress

VIEWS = ("as is", "flipped")  # of each training image; test images are kept as is
EMBED_BATCH = 64


@dataclass
class Features:
    """A trunk's features of a dataset: train (N, len(VIEWS), D) and test (M, 1, D), float16."""
    train: torch.Tensor
    test: torch.Tensor


def content_key(data, image_size):
    """What tells these images from any others: a folder's content fingerprint (the hash of every
    file's bytes, data/datasets.py), else the hash of the decoded pixels themselves."""
    if data.contents:
        return dict(data.contents, image_size=image_size, files=hashlib.sha256(
            "\0".join(data.files["train"] + ["\1"] + data.files["test"]).encode("utf-8", "surrogateescape")).hexdigest())
    digests = {}
    for part, x in (("train", data.train_x), ("test", data.test_x)):
        h = hashlib.sha256(str(tuple(x.shape)).encode())
        for batch in image_batches(x):
            h.update(batch.numpy().tobytes())
        digests[part] = h.hexdigest()
    return dict(digests, image_size=image_size)


def trunk_input(images, image_size, backbone):
    """uint8 images as the trunk takes them: resized to image_size where they are not (SVHN's and
    CIFAR-10's 32 px, upscaled), normalized as the backbone's original was."""
    x = images.float()
    if x.shape[-1] != image_size:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", antialias=True,
                          align_corners=False).clamp_(0, 255)
    mean, std = (torch.full((3,), v, device=x.device) for v in (backbone.mean, backbone.std))
    return normalize(x.round().to(torch.uint8), mean, std)


def embed(data, data_dir, backbone_name, image_size, device, echo):
    """The Features of `data` under the backbone (computed, or taken up where this machine kept them)."""
    backbone = BACKBONES[backbone_name]
    key = dict(step="embed", backbone=backbone.name, weights=backbone.sha256, views=list(VIEWS),
               images=content_key(data, image_size))
    folder = cache_dir(data_dir) / f"embed-{backbone.name}-{image_size}px"
    # Another run computing or reading them: waited for (reading the kept features takes seconds).
    work = Work(folder, key, echo, wait=lambda: echo(f"waiting for another run that computes or reads the features "
                                                     f"in {folder}"))
    dim = backbone.features
    parts = dict(train=(data.train_x, len(VIEWS)), test=(data.test_x, 1))
    try:
        with work.kept_if_interrupted("the features computed so far"):
            todo = {part: len(x) - work.state.get(part, 0) for part, (x, _) in parts.items()}
            if any(todo.values()):
                compute(work, parts, backbone, image_size, device, echo)
            return Features(*(torch.from_numpy(work.rows(f"{part}.f16", np.float16, views * dim, mode="c"))
                              .view(-1, views, dim) for part, (_, views) in parts.items()))
    finally:
        work.close()


@torch.no_grad()
def compute(work, parts, backbone, image_size, device, echo):
    """Embed what the work has not done yet, a batch at a time, each batch committed."""
    model = TrunkEngine(backbone.name, device)
    total = sum(len(x) * views for x, views in parts.values())
    done_before = sum(work.state.get(part, 0) * views for part, (x, views) in parts.items())
    echo(f"embedding {total - done_before:,} image views with {backbone.name} at {image_size} px"
         + (f" (going on after {done_before:,} kept)" if done_before else ""))
    for part, (x, views) in parts.items():
        start = work.state.get(part, 0)
        out = work.appended(f"{part}.f16")
        batches = list(range(start, len(x), EMBED_BATCH))
        for first in epoch_progress(batches, f"embedding {part}", True, echo):
            images = x[first:first + EMBED_BATCH].to(device)
            inputs = trunk_input(images, image_size, backbone)
            rows = [model(inputs)]
            if views == 2:
                rows.append(model(inputs.flip(3)))
            sync(device)
            out.write(torch.stack(rows, 1).flatten(1).to(torch.float16).cpu().numpy().tobytes())
            work.state[part] = first + len(images)
            work.commit()
    work.commit(force=True)
