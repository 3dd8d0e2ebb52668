"""The model a Label Studio backend answers with, one version at a time: on a frozen trunk, the heads
that never saw an image of evaluate.py --predict first (use/unseen.py: the same heads, kept in the
folder's cache), then each round's heads trained again on the labels given (live_training.py), one
a fold; the paper's network answers alone and never changes. An image is known by the hash of its
bytes: the heads take the kept features of the checkpoint's images (none decoded again), and compute
those of any other image; the paper's network decodes each.

Each image is answered by the head of its fold, which never saw it: an unlabeled image of the
checkpoint by the head that left it out, any other by the head its hash picks. Each version's
confidences are calibrated on the checkpoint's held-out images predicted alike (a temperature fitted
on them and capped by what they can show; use/calibration.py), so that a score means for an
unlabeled image what it means for a held-out one: the promise of --max-error holds for every version,
and the least confident are the images a finished folder needs a person for (use/orders.py). A label
given to a held-out image is kept in the labels file but never trained on: the held-out images stay
the ones the calibration is measured on.
"""
import hashlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ..data.files import file_digest
from ..data.images import BadImage, decode_bytes
from ..train.checkpoints import load_checkpoint
from ..train.inference import model_outputs
from ..train.model import ModelConfig
from ..use.calibration import confidences
from ..use.classifier import Classifier, checkpoint_identity
from ..use.unseen import models_of_row


class Version(NamedTuple):
    """One version of the model: its name (Label Studio's model_version), the networks that answer
    (on a frozen trunk one head a fold, use/unseen.py; else the whole network on images), their
    held-out calibration (None: uncalibrated)."""
    name: str
    heads: list
    calibration: object


class Answer(NamedTuple):
    label: str
    score: float
    version: str


class LiveModel:
    """The checkpoint at `checkpoint`, its images in the folder `root` (module docstring)."""

    def __init__(self, checkpoint, root, device, echo):
        self.classifier = Classifier(load_checkpoint(checkpoint), device=device)
        self.state, self.config, self.device = self.classifier.state, self.classifier.config, self.classifier.device
        self.classes = list(self.config.classes)
        digest = hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest()[:8]
        self.base_name = f"{Path(checkpoint).name}@{digest}"
        self.why_not_live = None if ModelConfig.of_run(self.config).keeps_features else (
            "the paper's network trains from its images, not on kept features: a retrain takes as long as "
            "train_mt.py (label.py --apply the labels file, then train again)")
        if self.why_not_live is None:
            why = self.classifier.calibrate_unseen(checkpoint_identity(checkpoint), root, echo=echo)
            if why:
                self.why_not_live = f"no heads that never saw an image: {why}"
        self.unseen = self.classifier.unseen if self.why_not_live is None else None
        if self.unseen is not None:
            self.state, self.data = self.unseen.state, self.unseen.data
            self.held_rows = set(self.state["val_idx"].tolist())
            self.current = Version(self.base_name, self.unseen.heads, self.classifier.calibration)
        else:
            self.current = Version(self.base_name, [self.classifier.model], self.classifier.calibrate(root, echo=echo))

    @property
    def keeps_features(self):
        """Whether its heads answer on kept features and learn live."""
        return self.unseen is not None

    def trained(self, labels, rows):
        """Make the heads of these flat rows (one a fold, FoldHeads.train's), trained on `labels`
        ({row: class}), the current version."""
        heads = [models_of_row(self.state, row, self.device)[1] for row in rows]
        given = hashlib.sha256(repr(sorted(labels.items())).encode()).hexdigest()[:6]
        self.current = Version(f"{self.base_name}+{len(labels)} labels {given}", heads, self.unseen.calibration(heads))
        return self.current

    def training_labels(self, rows):
        """{training row: class} of the kept labels ({path: (label, digest)}) whose images the checkpoint
        may train on (held-out images and images it never had left out)."""
        if not self.keeps_features:
            return {}
        labels = {}
        for label, digest in rows.values():
            place, row = self.place(digest)
            if place == "train" and label in self.classes:
                labels[row] = self.classes.index(label)
        return labels

    def place(self, digest):
        """Where the checkpoint has the image of this digest: ("train", row) among the images it may
        train on, ("held-out", None) for one it is calibrated on, (None, None) for an image it never had
        (or any image of the paper's network, which keeps no features to know them by)."""
        if not self.keeps_features:
            return None, None
        row = int(self.unseen.known.rows([digest])[0])
        if row < 0:
            return None, None
        if row >= self.unseen.known.n_train or row in self.held_rows:
            return "held-out", None
        return "train", row

    def answers(self, images):
        """An Answer for each image's bytes, or the BadImage line where it cannot be decoded; one
        version answers them all."""
        version = self.current
        logits, failed = self.logits(version, images)
        calibration = version.calibration
        predicted, confidence = confidences(logits, calibration.temperature if calibration else 1.0,
                                            calibration.ceiling if calibration else 1.0)
        return [failed[i] if i in failed else Answer(self.classes[predicted[i]], float(confidence[i]), version.name)
                for i in range(len(images))]

    def logits(self, version, images):
        """(logits (n, classes), {position: why} of those that cannot be decoded, whose rows are 0):
        on a frozen trunk each image's head on the kept features where its bytes are known
        (KeptFeatures), the others decoded; the paper's network on each image decoded."""
        n, failed = len(images), {}
        digests = [file_digest(b) for b in images]
        folds, rows = self.unseen.folds_of(digests) if self.keeps_features else (None, np.full(n, -1))
        decoded = torch.zeros(n, 3, self.config.image_size, self.config.image_size, dtype=torch.uint8)
        for i in np.flatnonzero(rows < 0).tolist():
            try:
                decoded[i] = decode_bytes(images[i], self.config.image_size, self.config.framed)
            except BadImage as exc:
                failed[i] = str(exc)
        with torch.no_grad():
            if not self.keeps_features:
                mean, std = self.classifier.mean, self.classifier.std
                return model_outputs(version.heads[0], decoded.to(self.device), mean, std)[1].cpu(), failed
            features = self.unseen.known.features(decoded, rows)
            return self.unseen.logits(features, folds, version.heads)[1], failed
