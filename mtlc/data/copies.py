"""The same image twice: exact copies (the same bytes) and near copies (a resized export, a re-saved
JPEG, a burst), within and across a folder's labeled/, unlabeled/ and test/.

Two images are compared at the cache's size (at most COMPARE_SIDE: a larger one area-averaged down
to it), each standardized (mean 0, standard deviation 1: a
brightness or contrast change cancels), by the mean squared difference d of their values (0 for
equal pixels, about 2 for unrelated ones). A pair is a copy when d is at most NEAR_DISTANCE and at
most NEAR_RATIO times the median distance of the two images to their other candidates. A flat
image (a blank page, a one-pixel file scaled up) has nothing to standardize: where both images of a
pair are flat, d is their plain mean squared difference in units of FLAT_SCALE grey levels, so that a
white page copies a white page and never a black one. The ratio
matters more than the bound: in a folder of simple images (digits) two different images of a class
are often as close as a photo and its re-saved copy (measured, docs/audit.md: one bound of 0.08 paired
1,616 different digits; the ratio, none). Candidates are each image's CANDIDATES nearest neighbours by
an 8 x 8 standardized thumbnail (192 values), found with faiss (nearest.py: exact up to a few
thousand images against a million, an inverted-file index beyond); thumbnails and images are read a
batch at a time from the memory-mapped cache, never all at once.
"""
import numpy as np
import torch
import torch.nn.functional as F

from .batches import ImageRows
from .nearest import Vectors, nearest

NEAR_DISTANCE = 0.25   # the largest standardized mean squared difference of a near copy
NEAR_RATIO = 0.1       # and at most this share of the images' median distance to their other candidates
CANDIDATES = 8         # nearest thumbnails compared with each image at the cache's size
THUMBNAIL = 8
VERIFY_BATCH = 1024    # candidate pairs compared at a time
POOL_BATCH = 4096      # images made into thumbnails at a time
FLAT_STD = 2.0         # an image whose values vary less than this (grey levels, standard deviation) is flat
FLAT_SCALE = 32.0      # a flat pair's difference in these units: 8 levels apart is d 0.0625, black and white 64
# The side pairs are compared at, at most: a pretrained trunk's cache at 260 px made the checks of
# train_mt.py 199 s and 6 GB on 10,015 photos (HAM10000, 2 cores); a copy at 64 px is still a copy.
COMPARE_SIDE = 64


def standardized(x):
    """Each image (n, 3, S, S) as float32 values of mean 0 and standard deviation 1, flattened."""
    v = x.reshape(len(x), -1).float()
    return (v - v.mean(1, keepdim=True)) / v.std(1, keepdim=True).clamp_min(1e-3)


def thumbnail_batch(images):
    """The standardized 8 x 8 thumbnails of a batch of uint8 images: (n, 192) float32, pooled
    POOL_BATCH images at a time (a float copy of 65,536 images of 32 px would be 800 MB)."""
    if len(images) <= POOL_BATCH:
        return standardized(F.adaptive_avg_pool2d(images.float(), THUMBNAIL))
    return torch.cat([thumbnail_batch(images[start:start + POOL_BATCH]) for start in range(0, len(images), POOL_BATCH)])


def as_rows(images):
    """An ImageRows of uint8 images (n, 3, S, S) or of one already."""
    return images if isinstance(images, ImageRows) else ImageRows(images)


def thumbnails(images):
    """The standardized 8 x 8 thumbnails of uint8 images, read a batch at a time: (n, 192) float32."""
    rows = as_rows(images)
    if not len(rows):
        return torch.zeros(0, 3 * THUMBNAIL ** 2)
    return torch.cat([thumbnail_batch(batch) for batch in rows.batches()])


def thumbnail_vectors(images):
    """The thumbnails of images (ImageRows, or a tensor) as nearest.Vectors: made a batch at a time
    as a search needs them, never held all at once."""
    rows = as_rows(images)

    def batches():
        for batch in rows.batches():  # 64 MiB of images at a time (batches.PASS_BYTES)
            yield thumbnail_batch(batch).numpy()

    def at(idx):  # POOL_BATCH images in memory at a time: a faiss training sample is a quarter of a million
        made = [thumbnail_batch(rows.gather(idx[s:s + POOL_BATCH])).numpy() for s in range(0, len(idx), POOL_BATCH)]
        return np.concatenate(made) if made else np.zeros((0, 3 * THUMBNAIL ** 2), np.float32)
    return Vectors(len(rows), 3 * THUMBNAIL ** 2, batches, at)


def distances(images_a, images_b, pairs):
    """The standardized mean squared difference of each pair (i into images_a, j into images_b),
    pairs an (n, 2) array; float32 (n,)."""
    a, b = as_rows(images_a), as_rows(images_b)
    found = np.zeros(len(pairs), np.float32)
    for start in range(0, len(pairs), VERIFY_BATCH):
        chunk = pairs[start:start + VERIFY_BATCH]
        found[start:start + len(chunk)] = pair_distances(a.gather(chunk[:, 0]), b.gather(chunk[:, 1])).numpy()
    return found


def compared(x):
    """uint8 images (n, 3, S, S) as float32 at the side they are compared at (COMPARE_SIDE at most)."""
    x = x.float()
    return F.interpolate(x, size=COMPARE_SIDE, mode="area") if x.shape[-1] > COMPARE_SIDE else x


def pair_distances(x, y):
    """d of each pair (x[i], y[i]) of uint8 images: standardized, or plain where both are flat (a flat
    image against one that is not stays about 1 apart, standardized: never a copy)."""
    x, y = compared(x), compared(y)
    plain_x, plain_y = x.reshape(len(x), -1), y.reshape(len(y), -1)
    flat = (plain_x.std(1) < FLAT_STD) & (plain_y.std(1) < FLAT_STD)
    plain = ((plain_x - plain_y) / FLAT_SCALE).square().mean(1)
    return torch.where(flat, plain, (standardized(x) - standardized(y)).square().mean(1))


def is_copy(d, others):
    """Whether a pair d apart is a copy, given the distances of its images to their other candidates."""
    return d <= NEAR_DISTANCE and d <= NEAR_RATIO * (float(np.median(others)) if len(others) else np.inf)


def candidate_pairs(index):
    """The distinct pairs (i, j), i < j, of each image i and its candidates index[i] (-1: none),
    sorted: an (n, 2) int64 array."""
    n, k = index.shape
    i, j = np.repeat(np.arange(n), k), index.ravel()
    keep = (j >= 0) & (j != i)
    low, high = np.minimum(i[keep], j[keep]), np.maximum(i[keep], j[keep])
    key = np.unique(low * n + high)
    return np.stack([key // n, key % n], 1)


def near_pairs(images, progress=lambda n: None):
    """[(i, j, distance)] with i < j of the uint8 images (ImageRows or (n, 3, S, S)) that are copies
    or near copies of each other, equal pixels included."""
    rows = as_rows(images)
    if len(rows) < 3:
        return []
    vectors = thumbnail_vectors(rows)
    index = nearest(vectors, vectors, min(CANDIDATES + 1, len(rows)), progress=progress)[1]
    pairs = candidate_pairs(index).astype(np.int32 if len(rows) < 2 ** 31 else np.int64)  # 9 million at a million
    del index
    d = distances(rows, rows, pairs)
    close = np.flatnonzero(d <= NEAR_DISTANCE)
    if not len(close):
        return []
    # Each image's distances to all its candidates, both ways: grouped by image.
    ends, others, both = np.concatenate(pairs.T), np.concatenate(pairs[:, ::-1].T), np.concatenate([d, d])
    order = np.argsort(ends, kind="stable")
    ends, others, both = ends[order], others[order], both[order]

    def around(i, but):
        lo, hi = np.searchsorted(ends, [i, i + 1])
        return both[lo:hi][others[lo:hi] != but]
    return [(int(i), int(j), float(d[p])) for p, (i, j) in zip(close, pairs[close])
            if is_copy(d[p], np.concatenate([around(i, j), around(j, i)]))]


def copies_in(queries, images):
    """[(i, j, distance)]: query i is a copy or near copy of images[j] (among its CANDIDATES nearest
    thumbnails; the ratio against the query's other candidates). Both ImageRows or tensors."""
    queries, images = as_rows(queries), as_rows(images)
    if not len(queries) or len(images) < 2:
        return []
    _, index = nearest(thumbnail_vectors(images), thumbnail_vectors(queries), min(CANDIDATES, len(images)))
    found = index >= 0
    pairs = np.stack([np.nonzero(found)[0], index[found]], 1)
    d = np.full(index.shape, np.inf, np.float32)
    d[found] = distances(queries, images, pairs)
    result = []
    for i, k in zip(*np.nonzero(d <= NEAR_DISTANCE)):
        others = np.delete(d[i], k)
        if is_copy(d[i, k], others[np.isfinite(others)]):
            result.append((int(i), int(index[i, k]), float(d[i, k])))
    return result


def exact_groups(digests):
    """Groups (arrays of indices, two or more, in order) of the images whose files have the same
    bytes, from the digest of each (None or "" where unknown: in none)."""
    digests = np.asarray([d or "" for d in digests])
    if not len(digests):
        return []
    order = np.argsort(digests, kind="stable")
    ordered = digests[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(ordered)]
    return [np.sort(order[s:e]) for s, e in zip(starts, ends) if e - s > 1 and ordered[s]]


def leaked_test(data):
    """The names of the test images of an image folder that are a copy or a near copy of one of its
    training images, sorted (at any size: nearest.py's search)."""
    leaked = {i for i, _, _ in copies_in(data.test_x, data.train_x)}
    return sorted(data.files["test"][i] for i in leaked)


def copied_images(train_x, held):
    """The training images among `held` (indices: a --val hold-out) that are a copy or a near copy of
    another training image (copies_in), as a sorted array of indices."""
    held = np.asarray(held, dtype=np.int64)
    rest = np.setdiff1d(np.arange(len(train_x)), held)
    if not len(held) or not len(rest):
        return np.zeros(0, dtype=np.int64)
    found = copies_in(train_x[torch.from_numpy(held)], ImageRows(train_x).subset(rest))
    return np.unique(held[[i for i, _, _ in found]]).astype(np.int64)


def copy_pairs(digests, images, progress=lambda n: None):
    """{(i, j): (score, detail)} with i < j: the images (ImageRows or a tensor) that are copies of each
    other, exact (the same bytes, by the digest of each: score 1) before near (near_pairs: 1 - their
    difference)."""
    found = {}
    for group in exact_groups(digests):
        for i in group[1:]:
            found[(int(group[0]), int(i))] = (1.0, "exact: the same bytes")
    for i, j, distance in near_pairs(images, progress):
        found.setdefault((i, j), (1.0 - distance, f"near: standardized difference {distance:.3f}"))
    return found


def label_conflicts(data, trained_without=()):
    """[(name, class, name of its copy, its class, detail)]: the copies among a folder's labeled
    training images and test images that disagree on their class (the same image under two labels is
    a label conflict, never a plain duplicate); [] for a dataset without file names. trained_without:
    the training images (indices) a run takes without their labels (label.py --accepted's), left out."""
    if not data.files:
        return []
    names = data.files["train"] + data.files["test"]
    labels = np.concatenate([data.train_y.numpy(), data.test_y.numpy()])
    labels[np.asarray(trained_without, dtype=np.int64)] = -1
    digests = np.concatenate([data.digests["train"](), data.digests["test"]()])
    labeled = np.flatnonzero(labels >= 0)  # the copies among the images with a label only
    rows = ImageRows(data.train_x, data.test_x).subset(labeled)  # read a batch at a time: never all gathered
    pairs = [(labeled[i], labeled[j], detail) for (i, j), (_, detail) in sorted(copy_pairs(digests[labeled], rows).items())]
    return [(names[j], data.classes[labels[j]], names[i], data.classes[labels[i]], detail)
            for i, j, detail in pairs if labels[i] != labels[j]]
