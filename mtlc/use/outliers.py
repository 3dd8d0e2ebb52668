"""Images like no labeled image: each image's mean distance to its nearest labeled images, in units of
the labeled images' own largest such distance. The audit lists the images of a folder above a
margin (audit.py: in a network's features or a pretrained trunk's, and in thumbnails); --predict
marks the new images a head on a pretrained trunk meets above it (LabeledSpread), so that a blank
page or a chart is never accepted as one of the classes.
"""
import numpy as np
import torch

from ..data.batches import ImageRows
from ..data.copies import thumbnail_vectors
from ..data.nearest import BLOCK, Vectors, in_memory, nearest
from .selection import unit_rows

OUTLIER_NEIGHBOURS = 5  # labeled images an image's distance to the classes is measured to
# How much farther than the farthest labeled image an outlier must be, set on the two 5% folders of
# docs/audit.md and checked on the 10% ones: on digits with photos among them, 15 of 18 found and
# none wrongly; on a CIFAR-10 folder with digits among the photos, none found, none wrongly (1.0
# flagged 84 photos there).
OUTLIER_MARGIN = 1.25
# The same for a pretrained trunk's features (ImageNet's: a blank page, noise or a chart lies far from
# every labeled photo there, where a head fitted to the folder's classes maps it near one of them).
# Measured on three CIFAR-10 folders with ten junk images and foreign photos in unlabeled/, and on
# Imagenette's real photos (docs/audit.md, "Junk among photos"): every junk image that is no photo
# above it, no ordinary image (the farthest of Imagenette's at 1.048: a thin margin there).
TRUNK_OUTLIER_MARGIN = 1.05
SPREAD_FLOOR = 1e-6  # labeled images closer than this (unit features) to their nearest others are all copies


def distance_ratios(vectors, labeled):
    """Each image's mean (Euclidean) distance to its OUTLIER_NEIGHBOURS nearest labeled images (a
    labeled image's to the others), over the largest such distance of a labeled image; None where
    fewer than 2 images are labeled. vectors: nearest.Vectors of every image; labeled: a bool mask."""
    positions = np.flatnonzero(labeled)

    def labeled_batches():
        for start in range(0, len(positions), BLOCK):
            yield vectors.rows(positions[start:start + BLOCK])
    spread = LabeledSpread(Vectors(len(positions), vectors.dim, labeled_batches, lambda idx: vectors.rows(positions[idx])))
    if spread.own is None:
        return None
    mean = spread.distances(vectors)
    mean[positions] = spread.own  # a labeled image is its own nearest: its distance to the others
    return mean / max(float(spread.own.max()), 1e-12)


def outlier_scores(features, images, labeled, feature_margin=OUTLIER_MARGIN):
    """Each image's outlier score: distance_ratios in the features (L2-normalized; scaled so that
    feature_margin there counts as OUTLIER_MARGIN) and in the images' 8 x 8 thumbnails
    (copies.thumbnail_vectors), the larger of the two; images None: the features' alone (a pretrained
    trunk's: there thumbnails flagged real photos of plain sky, docs/audit.md). features: (n, D), an
    array, a memory map, or nearest.Vectors. None where fewer than 2 images are labeled."""
    normalized = features if isinstance(features, Vectors) else in_memory(features)
    unit = Vectors(normalized.n, normalized.dim, lambda: (unit_rows(b) for b in normalized.batches()),
                   lambda idx: unit_rows(normalized.rows(idx)))
    ratios = distance_ratios(unit, labeled)
    if ratios is None:
        return None
    ratios = ratios * (OUTLIER_MARGIN / feature_margin)
    return ratios if images is None else np.maximum(ratios, distance_ratios(thumbnail_vectors(images), labeled))


def trunk_vectors(data):
    """The kept features of a pretrained trunk for every image (training, then test; their plain
    view) as nearest.Vectors, read a batch at a time."""
    rows = ImageRows(data.features.train[:, 0], data.features.test[:, 0])

    def array(t):
        return np.ascontiguousarray(t.numpy(), dtype=np.float32)
    return Vectors(len(rows), rows.parts[0].shape[-1], lambda: (array(b) for b in rows.batches()),
                   lambda idx: array(rows.gather(idx)))


class LabeledSpread:
    """Labeled images as nearest.Vectors and how far each lies from its OUTLIER_NEIGHBOURS nearest
    others (own; None where fewer than 2): distances() of other images to them, and ratios() of a
    pretrained trunk's features of new images over the largest own distance, as distance_ratios gives
    them for a folder's own images (--predict's measure)."""

    def __init__(self, labeled):
        self.labeled = labeled
        self.k = min(OUTLIER_NEIGHBOURS, labeled.n - 1)
        self.own = self.largest = None  # largest None: no spread to measure in (each among copies of itself)
        if self.k >= 1:
            squared, _ = nearest(labeled, labeled, self.k + 1)
            self.own = np.sqrt(np.maximum(squared[:, 1:], 0)).mean(1)
            self.largest = float(self.own.max()) if self.own.max() > SPREAD_FLOOR else None

    @classmethod
    def of_checkpoint(cls, state, data):
        """Of the images a checkpoint trained with labels, in the trunk's kept features (L2-normalized);
        None where they have no spread to measure in."""
        labeled = torch.from_numpy(state["labeled_idx"].numpy())
        spread = cls(in_memory(unit_rows(np.asarray(data.features.train[labeled, 0], np.float32))))
        return spread if spread.largest is not None else None

    def distances(self, queries):
        """Each query's (nearest.Vectors) mean distance to its k nearest labeled images."""
        squared, _ = nearest(self.labeled, queries, self.k)
        return np.sqrt(np.maximum(squared, 0)).mean(1)

    def ratios(self, features):
        """Each of the trunk features (n, D) given: its mean distance to its nearest labeled images over
        the labeled images' largest."""
        return self.distances(in_memory(unit_rows(features))) / self.largest
