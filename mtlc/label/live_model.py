"""The model a Label Studio backend answers with, one version at a time: the checkpoint's head first,
then each head trained again on the labels given (live_training.py). An image is known by the
hash of its bytes: a head on a frozen trunk takes the kept features of the checkpoint's images
(none decoded again), and computes those of any other image; the paper's network decodes each.

Each version's confidences are calibrated on the checkpoint's held-out images (its test/ images,
else its --val hold-out; use/held_out.py), a temperature fitted on them and capped by what they
can show (use/calibration.py). A label given to a held-out image is kept in the labels file but
never trained on: the held-out images stay the ones the calibration is measured on. A head trained
again has trained on the folder's unlabeled images (as the checkpoint's did), so on those it is
surer than on held-out ones: its score ranks the images (least sure first), while the promise of
evaluate.py --max-error rests on its heads that never saw an image.
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
from ..train.moved_images import restored_as_now
from ..train.networks import build_models
from ..use.calibration import Calibration, confidences
from ..use.classifier import Classifier
from ..use.held_out import held_out
from ..use.kept_features import KeptFeatures
from ..use.unseen import unflat


class Version(NamedTuple):
    """One version of the model: its name (Label Studio's model_version), the network that answers
    (a head on features, or the whole network on images), its held-out calibration."""
    name: str
    model: torch.nn.Module
    calibration: Calibration


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
        self.keeps_features = ModelConfig.of_run(self.config).keeps_features
        self.why_not_live = None if self.keeps_features else (
            "the paper's network trains from its images, not on kept features: a retrain takes as long as "
            "train_mt.py (label.py --apply the labels file, then train again)")
        if self.keeps_features:
            self.state, self.data = restored_as_now(self.state, root, echo=echo, device=self.device)
            self.known = KeptFeatures(self.data, self.classifier.model, self.config, self.device)
            self.held = held_out(self.state, self.data)
            self.held_part = "test" if self.held.source == "test" else "train"
            self.held_rows = set(self.state["val_idx"].tolist())
            self.current = self.version(self.base_name, self.classifier.model)
        else:
            self.current = Version(self.base_name, self.classifier.model, self.classifier.calibrate(root, echo=echo))

    def version(self, name, head):
        """A Version of a head on the trunk's features, calibrated on the held-out images' kept features."""
        features = getattr(self.data.features, self.held_part)[self.held.rows, 0].float().to(self.device)
        with torch.no_grad():
            logits = model_outputs(head, features, None, None)[1].cpu().numpy()
        calibration = Calibration.fit(logits, self.held.y.numpy(), self.held.source, doubted=self.held.relabeled.numpy())
        return Version(name, head, calibration)

    def trained(self, labels, weights):
        """Make the head of these weights, trained on `labels` ({row: class}), the current version."""
        _, head = build_models(ModelConfig(**self.state["model_args"]), self.device)
        unflat(head, weights)
        head.eval()
        given = hashlib.sha256(repr(sorted(labels.items())).encode()).hexdigest()[:6]
        self.current = self.version(f"{self.base_name}+{len(labels)} labels {given}", head)
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
        row = int(self.known.rows([digest])[0])
        if row < 0:
            return None, None
        if row >= self.known.n_train or row in self.held_rows:
            return "held-out", None
        return "train", row

    def answers(self, images):
        """An Answer for each image's bytes, or the BadImage line where it cannot be decoded; one
        version answers them all."""
        version = self.current
        logits, failed = self.logits(version.model, images)
        calibration = version.calibration
        predicted, confidence = confidences(logits, calibration.temperature if calibration else 1.0,
                                            calibration.ceiling if calibration else 1.0)
        return [failed[i] if i in failed else Answer(self.classes[predicted[i]], float(confidence[i]), version.name)
                for i in range(len(images))]

    def logits(self, model, images):
        """(logits (n, classes), {position: why} of those that cannot be decoded, whose rows are 0):
        a frozen trunk's head on the kept features where an image's bytes are known (KeptFeatures),
        the others decoded; the paper's network on each image decoded."""
        n, failed = len(images), {}
        rows = self.known.rows([file_digest(b) for b in images]) if self.keeps_features else np.full(n, -1)
        decoded = torch.zeros(n, 3, self.config.image_size, self.config.image_size, dtype=torch.uint8)
        for i in np.flatnonzero(rows < 0).tolist():
            try:
                decoded[i] = decode_bytes(images[i], self.config.image_size, self.config.framed)
            except BadImage as exc:
                failed[i] = str(exc)
        with torch.no_grad():
            if not self.keeps_features:
                mean, std = self.classifier.mean, self.classifier.std
                return model_outputs(model, decoded.to(self.device), mean, std)[1].cpu(), failed
            features = self.known.features(decoded, rows).to(self.device)
            return model_outputs(model, features, None, None)[1].cpu(), failed
