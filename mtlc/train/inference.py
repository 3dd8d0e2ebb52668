"""A model's outputs for many images: one batch at a time in eval mode (the BN running means, no
dropout), on the model's device, gathered on the CPU in float32. Every pass over images that is not
a training step goes through here: test errors, predictions, features for t-SNE and selection. And
chance level: the error of always answering the most frequent class, and whether a model's error
cannot be told from it (a network that learned nothing usable, or too few images to tell).
"""
import math

import numpy as np
import torch

from ..data.batches import image_batches
from ..data.views import normalize

BATCH = 500  # images per forward pass


@torch.no_grad()
def model_outputs(model, x, mean, std):
    """(pooled features, logits) of the model in eval mode for one batch of uint8 images x, float32,
    where x is; the model's mode is left as it was."""
    was_training = model.training
    model.eval()
    features, logits = model(normalize(x, mean, std))
    model.train(was_training)
    return features.float(), logits.float()


def outputs(model, x, mean, std, idx=None, batch_size=BATCH):
    """(features (n, D), logits (n, classes)) on the CPU for the uint8 images x (or its rows idx), a
    batch at a time, each moved to the model's device."""
    device = next(model.parameters()).device
    parts = [model_outputs(model, batch.to(device), mean, std) for batch in image_batches(x, idx, batch_size)]
    if not parts:
        return torch.zeros(0, getattr(model, "feature_dim", 0)), torch.zeros(0, 0)
    return tuple(torch.cat([p[k].cpu() for p in parts]) for k in (0, 1))


def predict_classes(model, x, mean, std, idx=None):
    """The class the model gives each of the uint8 images x (or its rows idx), on the CPU."""
    logits = outputs(model, x, mean, std, idx)[1]
    return logits.argmax(1) if len(logits) else torch.zeros(0, dtype=torch.long)


def test_error(model, x, y, mean, std, idx=None):
    """Error (%) of the model on uint8 images x (or its rows idx) with labels y."""
    return 100.0 * (predict_classes(model, x, mean, std, idx) != y.cpu()).sum().item() / len(y)


def chance_error(labels):
    """The error (%) of always answering the most frequent class among `labels` (class indices)."""
    counts = np.bincount(np.asarray(labels))
    return 100 * (1 - counts.max() / counts.sum())


def chance_verdict(error, labels):
    """How an error (%) measured on images with these labels stands to chance_error, in counts of
    wrong images (a float comparison at exactly chance lost by an ulp): "no better" where as many or
    more are wrong as always answering the most frequent class gets wrong, "unclear" where fewer but
    within two standard errors (of a proportion over as many images), else None. Never where the
    labels are of one class (chance is then no error) or none is wrong: nothing learned cannot be
    right on all."""
    counts = np.bincount(np.asarray(labels))
    n = int(counts.sum())
    wrong, chance_wrong = round(error * n / 100), n - int(counts.max())
    if chance_wrong == 0 or wrong == 0:
        return None
    if wrong >= chance_wrong:
        return "no better"
    p = counts.max() / n
    return "unclear" if wrong >= chance_wrong - 2 * math.sqrt(n * p * (1 - p)) else None


def at_chance(error, labels):
    """Whether the error cannot be told from chance level (chance_verdict: no better, or unclear)."""
    return chance_verdict(error, labels) is not None


def chance_words(verdict, error, labels):
    """The one wording of a verdict of chance_verdict: what the error is against chance level."""
    chance = chance_error(labels)
    if verdict == "no better":
        return f"{error:.1f}% wrong, no better than always answering the most frequent class ({chance:.1f}%)"
    return (f"{error:.1f}% wrong, which cannot be told from always answering the most frequent class ({chance:.1f}%) "
            f"on {len(labels):,} images (within two standard errors)")
