"""The same image twice: exact copies (the same bytes) and near copies (a resized export, a re-saved
JPEG, a burst), within and across a folder's labeled/, unlabeled/ and test/.

Two images are compared at the cache's size, each standardized (mean 0, standard deviation 1: a
brightness or contrast change cancels), by the mean squared difference d of their values (0 for
equal pixels, about 2 for unrelated ones). A pair is a copy when d is at most NEAR_DISTANCE and at
most NEAR_RATIO times the median distance of the two images to their other candidates. The ratio
matters more than the bound: in a folder of simple images (digits) two different images of a class
are often as close as a photo and its re-saved copy (measured, docs/audit.md: one bound of 0.08 paired
1,616 different digits; the ratio, none). Candidates are each image's CANDIDATES nearest neighbours by
an 8 x 8 standardized thumbnail (192 values, 768 bytes an image).
"""
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.neighbors import NearestNeighbors

from .batches import image_batches
from .images import BadImage, file_digest, read_file

NEAR_DISTANCE = 0.25   # the largest standardized mean squared difference of a near copy
NEAR_RATIO = 0.1       # and at most this share of the images' median distance to their other candidates
CANDIDATES = 8         # nearest thumbnails compared with each image at the cache's size
THUMBNAIL = 8
VERIFY_BATCH = 1024    # candidate pairs compared at a time
# Training images whose thumbnails the check of test/ at the start of training holds at most; above,
# training says the check was not made (evaluate.py --audit makes it).
LEAK_CHECK_MAX = 200_000


def standardized(x):
    """Each image (n, 3, S, S) as float32 values of mean 0 and standard deviation 1, flattened."""
    v = x.reshape(len(x), -1).float()
    return (v - v.mean(1, keepdim=True)) / v.std(1, keepdim=True).clamp_min(1e-3)


def thumbnails(images):
    """The standardized 8 x 8 thumbnails of uint8 images, read a batch at a time: (n, 192) float32."""
    if not len(images):
        return torch.zeros(0, 3 * THUMBNAIL ** 2)
    return torch.cat([standardized(F.adaptive_avg_pool2d(batch.float(), THUMBNAIL)) for batch in image_batches(images)])


def distances(images_a, images_b, pairs):
    """The standardized mean squared difference of each pair (i into images_a, j into images_b)."""
    found = []
    for start in range(0, len(pairs), VERIFY_BATCH):
        chunk = np.array(pairs[start:start + VERIFY_BATCH])
        found += (standardized(images_a[chunk[:, 0]]) - standardized(images_b[chunk[:, 1]])).square().mean(1).tolist()
    return found


def is_copy(d, others):
    """Whether a pair d apart is a copy, given the distances of its images to their other candidates."""
    return d <= NEAR_DISTANCE and d <= NEAR_RATIO * (float(np.median(others)) if others else np.inf)


def near_pairs(images):
    """[(i, j, distance)] with i < j of the uint8 images (n, 3, S, S) that are copies or near copies
    of each other, equal pixels included."""
    if len(images) < 3:
        return []
    thumbs = thumbnails(images).numpy()
    _, index = NearestNeighbors(n_neighbors=min(CANDIDATES + 1, len(images))).fit(thumbs).kneighbors(thumbs)
    pairs = sorted({(min(i, int(j)), max(i, int(j))) for i, row in enumerate(index) for j in row if i != j})
    d = dict(zip(pairs, distances(images, images, pairs)))
    around = {}
    for (i, j), dij in d.items():
        around.setdefault(i, []).append((j, dij))
        around.setdefault(j, []).append((i, dij))
    return [(i, j, dij) for (i, j), dij in d.items()
            if is_copy(dij, [x for k, x in around[i] if k != j] + [x for k, x in around[j] if k != i])]


def copies_in(queries, images):
    """[(i, j, distance)]: query i is a copy or near copy of images[j] (among its CANDIDATES nearest
    thumbnails; the ratio against the query's other candidates)."""
    if not len(queries) or len(images) < 2:
        return []
    _, index = (NearestNeighbors(n_neighbors=min(CANDIDATES, len(images))).fit(thumbnails(images).numpy())
                .kneighbors(thumbnails(queries).numpy()))
    pairs = [(i, int(j)) for i, row in enumerate(index) for j in row]
    d = distances(queries, images, pairs)
    per_query = {}
    for (i, j), dij in zip(pairs, d):
        per_query.setdefault(i, []).append((j, dij))
    return [(i, j, dij) for i, found in per_query.items() for j, dij in found
            if is_copy(dij, [x for k, x in found if k != j])]


def exact_groups(paths):
    """Groups (lists of indices into paths, two or more) of files with the same bytes. A file that
    cannot be read is in none."""
    by_digest = {}
    for i, path in enumerate(paths):
        try:
            by_digest.setdefault(file_digest(read_file(path)), []).append(i)
        except BadImage:
            continue
    return [group for group in by_digest.values() if len(group) > 1]


def leaked_test(data):
    """The names of the test images of an image folder that are a copy or a near copy of one of its
    training images, sorted; None where the training images are too many to check (LEAK_CHECK_MAX)."""
    if len(data.train_x) > LEAK_CHECK_MAX:
        return None
    leaked = {i for i, _, _ in copies_in(data.test_x, data.train_x)}
    return sorted(data.files["test"][i] for i in leaked)
