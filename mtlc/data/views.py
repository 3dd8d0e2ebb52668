"""The views of uint8 images (B, 3, H, W) a network sees, made on the device where the step runs:
normalized by the run's channel statistics; the weak view, the paper's augmentation (a random shift,
for CIFAR-10 a random flip); and the strong view of the pseudo-label objective (FixMatch's):
torchvision's RandAugment, then Cutout, drawn per image.

torchvision's RandAugment (v2: two ops an image, each op and its sign uniform, magnitude 9 of 31
bins) draws one op for a whole batch, and draws it on the host: per image it needs a Python loop,
and in a CUDA graph its first draw would be replayed forever. Here the draws are device tensors, one
per image, and each op is torchvision's own at torchvision's magnitude: in eager mode applied to the
images that drew it; sync-free (the graphed step) applied to every image, each keeping its own draw,
which gives the same images with no host read.
"""
import functools

import torch
import torch.nn.functional as F


def max_shift(image_size):
    """The augmentation's translation in pixels: the paper's 2 at 32 x 32, in proportion at other sizes."""
    return max(1, round(2 * image_size / 32))


def augment(x, mean, std, flip, max_shift=2):
    """Normalized, randomly translated (pad max_shift with black, random H x W crop) and, for
    CIFAR-10, randomly flipped copies of uint8 images (B, 3, H, W). Every call draws new randomness."""
    return normalize(shift_and_flip(x, flip, max_shift), mean, std)


def shift_and_flip(x, flip, max_shift=2):
    """augment's translation and flip (the weak view), still uint8."""
    b, _, h, w = x.shape
    padded = F.pad(x, (max_shift,) * 4)
    dy = torch.randint(0, 2 * max_shift + 1, (b, 1), device=x.device)
    dx = torch.randint(0, 2 * max_shift + 1, (b, 1), device=x.device)
    rows = (dy + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (dx + torch.arange(w, device=x.device))[:, None, None, :]
    out = padded[torch.arange(b, device=x.device)[:, None, None, None],
                 torch.arange(x.shape[1], device=x.device)[None, :, None, None], rows, cols]
    if flip:
        flipped = torch.rand(b, device=x.device) < 0.5
        out = torch.where(flipped[:, None, None, None], out.flip(3), out)
    return out


def normalize(x, mean, std):
    """uint8 images in the run's units; features a trunk computed ahead (floats (N, views, D)): their
    first view (as is), as they are."""
    if x.dtype != torch.uint8:
        return x[:, 0].float() if x.dim() == 3 else x.float()
    return (x.float().div(255) - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


# FixMatch's strong view of features embedded ahead where no strong view of the images was: a share of
# them dropped, on top of the weak view.
STRONG_FEATURE_DROPOUT = 0.5


def feature_views(x, n_labeled, strong, strong_rows=None):
    """(student view, teacher view) of a step's features (B, views, D) embedded ahead (as is, flipped):
    each image's view drawn at random for each, independently. With `strong` the student's unlabeled
    images take one of their strong views drawn at random (strong_rows (B - n_labeled, K, D): those
    embedded ahead, embeddings.strong_inputs), or without them their weak view with half its features
    dropped (FixMatch's strong view, in feature space)."""
    def drawn(rows):
        pick = torch.randint(0, rows.shape[1], (rows.shape[0],), device=rows.device)
        return rows[torch.arange(rows.shape[0], device=rows.device), pick].float()
    student, teacher = drawn(x), drawn(x)
    if strong and strong_rows is not None:
        student = torch.cat([student[:n_labeled], drawn(strong_rows)])
    elif strong:
        keep = torch.rand_like(student[n_labeled:]).ge_(STRONG_FEATURE_DROPOUT).div_(1 - STRONG_FEATURE_DROPOUT)
        student = torch.cat([student[:n_labeled], student[n_labeled:] * keep])
    return student, teacher


def normalization(config, device=None):
    """A run's per-channel (mean, std) of its training images (channel_stats, kept in its config), as
    tensors on device: what normalize takes."""
    return tuple(torch.tensor(getattr(config, k), device=device) for k in ("mean", "std"))


@functools.cache
def rand_augment():
    """torchvision's RandAugment, whose op table (_AUGMENTATION_SPACE) and op implementation
    (_apply_image_or_video_transform) are used as they are, so that every op and magnitude is
    torchvision's (tests compare them image by image). Imported when a strong view is first made:
    torchvision's import alone takes seconds, which every command that trains no FixMatch would pay."""
    from torchvision.transforms import v2
    return v2.RandAugment()

# Cutout after RandAugment, as FixMatch's strong augmentation: a square of half the image's side at a
# uniform centre (cut by the border), filled with mid-grey.
CUTOUT_SHARE = 0.5
CUTOUT_FILL = 127


class StrongAugment:
    """RandAugment + Cutout for uint8 images of one size; each call draws anew from the global
    generator of the images' device."""

    def __init__(self, image_size):
        self.rand_augment = rand_augment()
        self.variants = []  # (op name, signed magnitude)
        choices = []        # per op: the variant of a positive and of a negative draw
        for name, (magnitudes, signed) in self.rand_augment._AUGMENTATION_SPACE.items():
            values = magnitudes(self.rand_augment.num_magnitude_bins, image_size, image_size)
            magnitude = 0.0 if values is None else float(values[self.rand_augment.magnitude])
            choices.append([len(self.variants), len(self.variants) + int(signed)])
            self.variants += [(name, magnitude)] + [(name, -magnitude)] * signed
        self.choices = torch.tensor(choices)
        self.cutout_side = max(1, round(CUTOUT_SHARE * image_size))

    def apply(self, variant, images):
        """One op of the table (its index in self.variants) on a batch, as torchvision's RandAugment does."""
        name, magnitude = self.variants[variant]
        augment = self.rand_augment
        return augment._apply_image_or_video_transform(images, name, magnitude, augment.interpolation, augment._fill)

    def draw(self, n, device):
        """The variant each of n images gets: an op uniformly, negated where torchvision's rand() <= 0.5."""
        op = torch.randint(len(self.choices), (n,), device=device)
        negative = (torch.rand(n, device=device) <= 0.5).long()
        if self.choices.device != op.device:  # moved once, before a CUDA graph's capture (no copies in one)
            self.choices = self.choices.to(op.device)
        return self.choices[op, negative]

    def randaugment(self, images, variants, sync_free):
        """Each image with its own variant applied."""
        if sync_free:
            every = torch.stack([self.apply(v, images) for v in range(len(self.variants))])
            return every[variants, torch.arange(len(images), device=images.device)]
        out = images.clone()
        for v in variants.unique().tolist():  # a host read: eager steps only
            rows = torch.nonzero(variants == v)[:, 0]
            out[rows] = self.apply(v, images[rows])
        return out

    def cutout(self, images):
        """A square of cutout_side pixels at a uniform centre per image set to CUTOUT_FILL."""
        b, _, h, w = images.shape
        device = images.device
        top = torch.randint(0, h, (b, 1, 1), device=device) - self.cutout_side // 2
        left = torch.randint(0, w, (b, 1, 1), device=device) - self.cutout_side // 2
        rows = torch.arange(h, device=device)[None, :, None]
        cols = torch.arange(w, device=device)[None, None, :]
        inside = (rows >= top) & (rows < top + self.cutout_side) & (cols >= left) & (cols < left + self.cutout_side)
        return images.masked_fill(inside[:, None], CUTOUT_FILL)

    def __call__(self, images, sync_free=False):
        """The strong view of uint8 images (B, 3, H, W); sync_free: no host read (a captured step)."""
        for _ in range(self.rand_augment.num_ops):
            images = self.randaugment(images, self.draw(len(images), images.device), sync_free)
        return self.cutout(images)
