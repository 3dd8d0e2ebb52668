"""A pretrained trunk's features of a run's images, computed once per image and kept as the decode
cache keeps the images: in the dataset's cache folder (data/cache.py's cache_dir), as a work folder
(disk/work.py) whose manifest is sealed by this machine's secret over what the features are of (the
backbone and its weights, the image size, the views, how the images were decoded) and the HMAC of
their bytes, so that only features this machine computed are ever used. Each row is keyed by what
tells its image: the digest of its file's bytes (a folder: the decode cache's), else of its decoded
pixels. A run computes only the rows of images not kept yet: label.py's moves (the same files
under other names) cost nothing, new images only theirs, and an embedding cut short goes on where it
stopped. The rows are float16, memory-mapped: each training image in two views (as is, and flipped
left to right: the augmentation a frozen trunk's features can still take); the test images, which
are only ever seen as they are, in that view alone and a work of their own.
"""
import functools
import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..data.batches import image_batches
from ..data.cache import CACHE_VERSION, cache_dir
from ..data.cache_rows import SortedRows
from ..data.framing import SQUASH
from ..data.mapped import mapped_work_rows, release_pages
from ..data.views import StrongAugment, max_shift, normalize, shift_and_flip
from ..disk.work import Work
from ..errors import UserError
from .devices import sync
from .pretrained import BACKBONES, TrunkEngine
from .progress import epoch_progress

VIEWS = ("as is", "flipped")  # of each training image
TEST_VIEWS = VIEWS[:1]  # of each test image
EMBED_BATCH = 64
# The strong views' recipe (data/views.py's StrongAugment on a shift_and_flip), part of their work's key
STRONG_VERSION = 2
KEYS, ROWS = "keys.s32", "views.f16"  # the work's files: each row's key (hex digest), its views' features
# Bytes of features a run gathers into memory where its images do not lie in the kept order (after
# label.py's moves); more are written in its order to the work once (5 GB at a million images).
GATHER_IN_MEMORY = 2 ** 30


@dataclass
class Features:
    """A trunk's features of a dataset: train (N, len(VIEWS), D) and test (M, 1, D), float16; strong
    (N, K, D): K of FixMatch's strong views of each training image (RunSettings.strong_views), or None."""
    train: torch.Tensor
    test: torch.Tensor
    strong: torch.Tensor = None


def image_keys(data, part):
    """What tells each image of a part ("train" or "test") from any other (hex digests, S32): its
    file's digest where the dataset is a folder, else that of its decoded pixels."""
    if data.digests:
        return np.asarray(data.digests[part](), "S32")
    x = data.train_x if part == "train" else data.test_x
    return np.array([hashlib.blake2b(image.numpy().tobytes(), digest_size=16).hexdigest()
                     for batch in image_batches(x) for image in batch], "S32").reshape(-1)


def trunk_input(images, image_size, backbone):
    """uint8 images as the trunk takes them: resized to image_size where they are not (SVHN's and
    CIFAR-10's 32 px, upscaled), normalized as the backbone's original was."""
    x = images.float()
    if x.shape[-1] != image_size:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", antialias=True,
                          align_corners=False).clamp_(0, 255)
    mean, std = (torch.full((3,), v, device=x.device) for v in (backbone.mean, backbone.std))
    return normalize(x.round().to(torch.uint8), mean, std)


def embed(data, data_dir, backbone_name, image_size, device, echo, strong_views=0, framing=SQUASH):
    """The Features of `data` (its images framed by `framing`) under the backbone: the rows kept of its
    images, the others computed first; with strong_views, as many of FixMatch's strong views of each
    training image as well."""
    backbone = BACKBONES[backbone_name]
    parts = {part: (x, image_keys(data, part)) for part, x in (("train", data.train_x), ("test", data.test_x))}
    (train,) = kept_views(data, data_dir, backbone, image_size, VIEWS, {"train": parts["train"]}, device, echo,
                          framing)
    (test,) = kept_views(data, data_dir, backbone, image_size, TEST_VIEWS, {"test": parts["test"]}, device, echo,
                         framing)
    strong = None
    if strong_views:
        names = tuple(f"strong {i + 1}" for i in range(strong_views))
        (strong,) = kept_views(data, data_dir, backbone, image_size, names, {"train": parts["train"]}, device, echo,
                               framing)
    return Features(train, test, strong)


def kept_views(data, data_dir, backbone, image_size, views, parts, device, echo, framing=SQUASH):
    """The kept features (n, len(views), D) of the images of each part ({part: (images, keys)}) in
    these views (VIEWS, TEST_VIEWS or strong ones: a work folder each), the missing ones computed first."""
    strong = views[0].startswith("strong")
    key = dict(step="embed", backbone=backbone.name, weights=backbone.sha256, features=backbone.features,
               views=list(views), image_size=image_size, decoded=CACHE_VERSION,
               keyed_by="file bytes" if data.digests else "pixels")
    if strong:
        key["strong"] = STRONG_VERSION
    if framing != SQUASH:  # (squash's key is that of before framings: its features stay valid)
        key["framing"] = framing.as_dict()
    views_tag = {VIEWS: "", TEST_VIEWS: "-as-is"}.get(views, f"-strong{len(views)}")
    folder = cache_dir(data_dir) / f"embed-{backbone.name}-{image_size}px{framing.tag}{views_tag}"
    # Another run computing or reading them: waited for (reading the kept features takes seconds).
    work = Work(folder, key, echo, wait=lambda: echo(f"waiting for another run that computes or reads the features "
                                                     f"in {folder}"))
    try:
        with work.kept_if_interrupted("the features computed so far"):
            todo = missing(kept_keys(work), parts)
            if todo:
                compute(work, todo, backbone, image_size, device, echo)
            keys = kept_keys(work)
            known = functools.cache(lambda: SortedRows(np.asarray(keys)))  # sorted once, where a part needs it
            starts = np.cumsum([0] + [len(k) for _, k in parts.values()])
            return [gathered(work, part, rows_of(keys, part_keys, start, known))
                    for (part, (_, part_keys)), start in zip(parts.items(), starts)]
    finally:
        work.close()


def kept_keys(work):
    return work.rows(KEYS, "S32", 1).reshape(-1)


def missing(kept, parts):
    """[(a part's images, their keys, a position)]: each image whose key the work does not hold, copies
    of one file included (a few more embedded, so that a first embedding's rows are its images' in
    their order: rows_of finds them in place, and none is gathered)."""
    known = SortedRows(np.asarray(kept))
    return [(x, keys, position) for x, keys in parts.values() for position in np.flatnonzero(known.rows(keys) < 0).tolist()]


def rows_of(kept, keys, start, known):
    """The kept row of each key: start, start + 1, ... where the kept keys from start are these in
    order (a first embedding's), else each key's first row (known(): the kept keys' SortedRows)."""
    if np.array_equal(kept[start:start + len(keys)], keys):
        return np.arange(start, start + len(keys))
    return known().rows(keys)


def gathered(work, part, idx):
    """The features (n, views, D) of the kept rows idx: a memory-mapped view where they lie in order
    (a first embedding's); else gathered into memory where they fit GATHER_IN_MEMORY, or written in
    this order to the work (once for an order) and mapped: memory stays bounded at a million images."""
    views = len(work.key["views"])
    width = views * work.key["features"]
    rows = mapped_work_rows(work, ROWS, np.float16, width)
    if len(idx) and (idx.min() < 0 or idx.max() >= len(rows)):  # never a wrong image's row, silently
        raise UserError(f"the features kept in {work.folder} lack some of the images: delete that folder and run again")
    idx = torch.as_tensor(idx, dtype=torch.long)
    if not len(idx):
        out = torch.zeros(0, width, dtype=torch.float16)
    elif torch.equal(idx, torch.arange(int(idx[0]), int(idx[0]) + len(idx))):
        out = rows[int(idx[0]):int(idx[0]) + len(idx)]
    elif len(idx) * width * rows.element_size() <= GATHER_IN_MEMORY:
        out = torch.cat(list(image_batches(rows, idx, EMBED_BATCH * 64)))
    else:
        name, order = f"order-{part}.f16", hashlib.sha256(idx.numpy().tobytes()).hexdigest()
        if work.state.get(name) != order:
            written = work.restarted(name)
            for batch in image_batches(rows, idx, EMBED_BATCH * 64):
                written.write(batch.numpy().tobytes())
            work.state[name] = order
            work.commit(force=True)
        out = mapped_work_rows(work, name, np.float16, width)
    return out.view(len(idx), views, width // views)



@torch.no_grad()
def compute(work, todo, backbone, image_size, device, echo):
    """Embed the images of todo (missing's) in the work's views, a batch at a time, each batch
    committed with its keys."""
    model = TrunkEngine(backbone.name, device)
    views = work.key["views"]
    strong = "strong" in work.key
    echo(f"embedding {len(todo) * len(views):,} image views with {backbone.name} at {image_size} px"
         + (f" (FixMatch's strong views, {len(views)} an image)" if strong else "")
         + (f" (going on after {len(kept_keys(work)):,} images kept)" if len(kept_keys(work)) else ""))
    features, keys = work.appended(ROWS), work.appended(KEYS)
    sources = list({id(x): x for x, _, _ in todo}.values())  # the mapped decode caches the images come from
    for first in epoch_progress(range(0, len(todo), EMBED_BATCH), "embedding", True, echo):
        batch = todo[first:first + EMBED_BATCH]
        images = torch.stack([x[position] for x, _, position in batch]).to(device)
        for x in sources:
            release_pages(x)  # memory holds a batch, not every image read so far
        batch_keys = np.array([k[position] for _, k, position in batch], "S32")
        inputs = (strong_inputs(images, len(views), batch_keys, image_size, backbone) if strong
                  else weak_inputs(images, image_size, backbone)[:len(views)])
        rows = torch.stack([model(x) for x in inputs], 1)
        sync(device)
        features.write(rows.flatten(1).to(torch.float16).cpu().numpy().tobytes())
        keys.write(batch_keys.tobytes())
        work.commit()
    work.commit(force=True)


def weak_inputs(images, image_size, backbone):
    """The trunk's inputs of VIEWS: the images as they are, and flipped left to right (TEST_VIEWS: the first)."""
    inputs = trunk_input(images, image_size, backbone)
    return [inputs, inputs.flip(3)]


def strong_inputs(images, n, keys, image_size, backbone):
    """The trunk's inputs of n strong views of uint8 images, as FixMatch's (data/views.py: a random
    shift and flip, then RandAugment and Cutout at the side they were decoded at), made on the CPU
    from a generator seeded by each image's key: an image gets the same views on any run and device,
    whichever images share its batch."""
    size = images.shape[-1]
    augment = StrongAugment(size)
    views = [[] for _ in range(n)]
    with torch.random.fork_rng(devices=[]):
        for image, key in zip(images.cpu(), keys):
            torch.manual_seed(int(bytes(key)[:15], 16))
            for view in views:
                view.append(augment(shift_and_flip(image[None], True, max_shift(size))))
    return [trunk_input(torch.cat(view).to(images.device), image_size, backbone) for view in views]
