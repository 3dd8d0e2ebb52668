"""Chance level: the error of always answering the most frequent class, and whether a model's error
is no better than that (a network that learned nothing usable)."""
import math

import numpy as np


def chance_error(labels):
    """The error (%) of always answering the most frequent class among `labels` (class indices)."""
    counts = np.bincount(np.asarray(labels))
    return 100 * (1 - counts.max() / counts.sum())


def at_chance(error, labels):
    """Whether an error (%) measured on images with these labels is within two standard errors (of
    a proportion over as many images) of chance_error, or above it."""
    p, n = 1 - chance_error(labels) / 100, len(labels)
    return error >= chance_error(labels) - 200 * math.sqrt(p * (1 - p) / n)
