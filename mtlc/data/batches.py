"""The batch stream: which images every step trains on, gathered a batch at a time from the
(memory-mapped, for an image folder) uint8 images, augmented and normalized on the training
device; and the passes over many images (channel statistics, predictions) that read them in
bounded batches, never a float copy of the folder.
"""
import contextlib

import numpy as np
import torch

from ..errors import UserError
from .mapped import in_order, release_pages
from .views import StrongAugment, feature_views, max_shift, normalization, normalize, shift_and_flip

# Bytes of uint8 images a whole-dataset pass reads at a time (the channel statistics): 64 MiB.
PASS_BYTES = 2 ** 26


def image_batches(x, idx=None, batch_size=None):
    """Consecutive batches of the uint8 images x (all of them, or the rows idx in that order), each
    a tensor in memory: over a memory-mapped x only the rows of one batch are read at a time.
    batch_size: images per batch [default: as many as PASS_BYTES hold]."""
    n = len(x) if idx is None else len(idx)
    batch_size = batch_size or max(1, PASS_BYTES // max(1, x[0].numel() if len(x) else 1))
    with in_order(x) if idx is None else contextlib.nullcontext():
        for i in range(0, n, batch_size):
            yield x[i:i + batch_size] if idx is None else x[idx[i:i + batch_size]]
            release_pages(x)


GATHER_ROWS = 256  # scattered images read between two releases of the mapped pages (1,024 mapped up to 660 MB)


class ImageRows:
    """The uint8 images of several arrays (a folder's training then test images, each memory-mapped),
    or any rows of one dtype (a trunk's features of them), as one sequence, never copied into one:
    consecutive batches, and the rows at given positions (`at` some positions: the same, read when
    asked for)."""

    def __init__(self, *parts, at=None):
        self.parts = [p for p in parts if len(p)] or list(parts[:1])
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])
        self.at = None if at is None else np.asarray(at, dtype=np.int64)

    def subset(self, at):
        """The images at positions `at` of these, as an ImageRows (nothing read)."""
        return ImageRows(*self.parts, at=at if self.at is None else self.at[np.asarray(at, dtype=np.int64)])

    def __len__(self):
        return int(self.starts[-1]) if self.at is None else len(self.at)

    @property
    def image_size(self):
        return self.parts[0].shape[-1]

    def batches(self, batch_size=None):
        """Consecutive batches in memory (image_batches of each part in turn)."""
        if self.at is not None:
            batch_size = batch_size or max(1, PASS_BYTES // max(1, self.parts[0][0].numel()))
            for start in range(0, len(self), batch_size):
                yield self.gather(np.arange(start, min(start + batch_size, len(self))))
            return
        for part in self.parts:
            yield from image_batches(part, None, batch_size)

    def gather(self, idx):
        """The images at positions idx (any order), in memory; the mapped pages read let go every
        GATHER_ROWS images (each scattered image can map a whole folio of the cache, up to 2 MB:
        262,144 of a million images gathered at once mapped all 3 GB of it)."""
        idx = np.asarray(idx, dtype=np.int64)
        idx = torch.as_tensor(idx if self.at is None else self.at[idx], dtype=torch.long)
        out = torch.empty(len(idx), *self.parts[0].shape[1:], dtype=self.parts[0].dtype)
        for k, part in enumerate(self.parts):
            mine = torch.nonzero((idx >= int(self.starts[k])) & (idx < int(self.starts[k + 1])))[:, 0]
            for start in range(0, len(mine), GATHER_ROWS):
                chunk = mine[start:start + GATHER_ROWS]
                out[chunk] = part[idx[chunk] - int(self.starts[k])]
                release_pages(part)
        return out


def channel_stats(x):
    """Per-channel mean and std (n - 1) of uint8 images, in [0, 1] units: exact, from integer sums
    over batches, so the result is the same whatever the batch size, the order or the folder's size."""
    sums, squares, count = np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64), 0
    for batch in image_batches(x):
        b = batch.numpy()
        # Summed into int64 in numpy's small buffers; squares fit uint16 (255^2 < 2^16): no 8x copy.
        sums += b.sum((0, 2, 3), dtype=np.int64)
        squares += np.square(b, dtype=np.uint16).sum((0, 2, 3), dtype=np.int64)
        count += b.shape[0] * b.shape[2] * b.shape[3]
    sums, squares = (v.tolist() for v in (sums, squares))
    mean = [s / (255 * count) for s in sums]
    # Python's integers keep q n - s^2 exact; one rounding to float at the end.
    std = [((q * count - s * s) / (count * (count - 1))) ** 0.5 / 255 for s, q in zip(sums, squares)]
    return torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)


def epoch_steps(n_unlabeled, unlabeled_batch, min_steps=1):
    """The steps of an epoch: whole passes over the unlabeled set, as few as make min_steps steps."""
    per_pass = max(1, n_unlabeled // unlabeled_batch)
    return per_pass * -(-min_steps // per_pass)


class BatchStream:
    """The indices of every step's batches, a pure function of (seed, step): each pass over the
    unlabeled set in a fresh random order (an epoch is one pass, or as many as make min_epoch_steps);
    the labeled set cycles in its own orders."""

    def __init__(self, n_labeled, n_unlabeled, labeled_batch, unlabeled_batch, seed, min_epoch_steps=1):
        self.n_labeled, self.n_unlabeled = n_labeled, n_unlabeled
        self.labeled_batch, self.unlabeled_batch, self.seed = labeled_batch, unlabeled_batch, seed
        self.steps_per_pass = max(1, n_unlabeled // unlabeled_batch)
        self.steps_per_epoch = epoch_steps(n_unlabeled, unlabeled_batch, min_epoch_steps)
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
        done, i = divmod(step, self.steps_per_pass)
        u = self._perm(1, done, self.n_unlabeled)
        u = u[torch.arange(i * self.unlabeled_batch, (i + 1) * self.unlabeled_batch) % self.n_unlabeled]
        pos = torch.arange(step * self.labeled_batch, (step + 1) * self.labeled_batch)
        cycles, offsets = pos // self.n_labeled, pos % self.n_labeled
        lab = torch.empty_like(pos)
        for cycle in cycles.unique().tolist():
            sel = cycles == cycle
            lab[sel] = self._perm(0, cycle, self.n_labeled)[offsets[sel]]
        return lab, u


def seed_step(seed, step, rank=0):
    """Seed the global generators for one step: dropout and augmentation depend on (seed, step, rank) alone.
    As torch.manual_seed, but the CUDA generators only once CUDA is in use: torch.manual_seed queues their
    seeding with a formatted stack each time, 0.7 ms of a 9 ms step of a head on a trunk's features."""
    value = seed * 1_000_003 + step + (rank << 40)
    torch.random.default_generator.manual_seed(value)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(value)


class Batches:
    """One process's share of every step's batch, on the training device: the student's and the
    teacher's independently augmented views (labeled images first) and the labels of the labeled
    images. With `world` processes each takes its 1/world share of the configured (global) labeled
    and unlabeled batches. The images stay where they are (memory-mapped for a folder, in the host's
    memory otherwise): each step gathers its own on the host and moves those to the device."""

    def __init__(self, data, split, config, device, rank=0, world=1, strong_view=False):
        for key in ("labeled_batch", "unlabeled_batch"):
            if getattr(config, key) % world:
                raise UserError(f"--{key.replace('_', '-')} {getattr(config, key)} does not split evenly over "
                                f"{world} processes")
        self.device, self.seed, self.rank = device, config.seed, rank
        self.n_lab, self.n_unl = config.labeled_batch // world, config.unlabeled_batch // world
        self.lab_idx, self.unl_idx, self.val_idx = (split[k].cpu() for k in ("labeled_idx", "unlabeled_idx", "val_idx"))
        self.stream = BatchStream(len(self.lab_idx), len(self.unl_idx), config.labeled_batch,
                                  config.unlabeled_batch, config.seed, config.min_epoch_steps)
        # The images, or a pretrained trunk's features of them (embedded ahead: views drawn, not made)
        self.train_x, self.train_y = data.inputs("train"), data.train_y
        self.embedded = self.train_x.dtype != torch.uint8
        self.strong_feature_view = strong_view
        # FixMatch's strong views embedded ahead (RunSettings.strong_views), where the run keeps them
        self.strong_x = data.features.strong if self.embedded and strong_view else None
        self.mean, self.std = normalization(config, device)
        self.flip = config.dataset == "cifar10"
        self.max_shift = max_shift(config.decode_size)
        # strong_view: the objective trains the student on strong views of the unlabeled images (FixMatch's).
        self.strong = StrongAugment(config.decode_size) if strong_view and not self.embedded else None

    @property
    def resident_bytes(self):
        """What the graphed step keeps on its device: the training images, or their features (strong views too)."""
        return self.train_x.nbytes + (0 if self.strong_x is None else self.strong_x.nbytes)

    def indices(self, step):
        """The training-set indices of this process's share of the step's images, labeled ones first."""
        lab_pos, unl_pos = self.stream.batch(step)
        r = self.rank
        lab_pos, unl_pos = lab_pos[r * self.n_lab:(r + 1) * self.n_lab], unl_pos[r * self.n_unl:(r + 1) * self.n_unl]
        return torch.cat([self.lab_idx[lab_pos], self.unl_idx[unl_pos]])

    def views(self, step):
        """(student view, teacher view, labels of the labeled images) of this process's share of the step."""
        seed_step(self.seed, step, self.rank)
        idx = self.indices(step)
        images = self.train_x[idx].to(self.device, non_blocking=True)
        release_pages(self.train_x)  # a fraction of a millisecond: memory stays at one batch
        strong = None
        if self.strong_x is not None:
            strong = self.strong_x[idx[self.n_lab:]].to(self.device, non_blocking=True)
            release_pages(self.strong_x)
        return *self.augmented(images, strong=strong), self.train_y[idx[:self.n_lab]].to(self.device)

    def augmented(self, images, sync_free=False, strong=None):
        """(student view, teacher view) of a step's uint8 images on the device (labeled first), drawn
        independently: both weak (shift, flip), or with strong_view the student's unlabeled images
        strong (data/views.py); sync_free: no host read (the graphed step). Features embedded ahead:
        views.feature_views (strong: the unlabeled images' strong views embedded ahead, if kept)."""
        if self.embedded:
            return feature_views(images, self.n_lab, self.strong_feature_view, strong)
        student = (self.strong_view(images, sync_free) if self.strong
                   else shift_and_flip(images, self.flip, self.max_shift))
        teacher = shift_and_flip(images, self.flip, self.max_shift)
        return tuple(normalize(v, self.mean, self.std).contiguous(memory_format=torch.channels_last)
                     for v in (student, teacher))

    def strong_view(self, images, sync_free):
        """The labeled images weak, the unlabeled ones strong (built on their own weak view, as FixMatch's)."""
        weak = shift_and_flip(images, self.flip, self.max_shift)
        return torch.cat([weak[:self.n_lab], self.strong(weak[self.n_lab:], sync_free)])

    def training_images(self, n, batch_size=500):
        """A fixed sample of up to n training images (labeled and unlabeled, never the validation
        hold-out), normalized and not augmented, in batches: what the BN statistics are computed on."""
        pool = torch.cat([self.lab_idx, self.unl_idx])
        pick = pool[torch.randperm(len(pool), generator=torch.Generator().manual_seed(self.seed))[:n]]
        for batch in image_batches(self.train_x, pick, batch_size):
            yield normalize(batch.to(self.device), self.mean, self.std)
