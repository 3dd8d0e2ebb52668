"""Chance level: the error of always answering the most frequent class, and whether a model's error
cannot be told from it (a network that learned nothing usable, or too few images to tell)."""
import math

import numpy as np


def chance_error(labels):
    """The error (%) of always answering the most frequent class among `labels` (class indices)."""
    counts = np.bincount(np.asarray(labels))
    return 100 * (1 - counts.max() / counts.sum())


def at_chance(error, labels):
    """Whether a nonzero error (%) measured on images with these labels is within two standard errors
    (of a proportion over as many images) of chance_error, or above it. Never where the labels are of
    one class (chance is then no error) or the error is zero: nothing learned cannot be right on all."""
    chance, n = chance_error(labels), len(labels)
    p = 1 - chance / 100
    return chance > 0 and error > 0 and error >= chance - 200 * math.sqrt(p * (1 - p) / n)
