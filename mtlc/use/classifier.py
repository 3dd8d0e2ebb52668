"""A trained checkpoint as a classifier of image files, in your own code; what `evaluate.py
--predict` runs:

    import mtlc
    classifier = mtlc.load("runs/digits/lc.pt")
    predictions = classifier.predict(["photo.jpg", "more_photos/"])  # [Prediction(path, label, confidence, ...)]

Images are read as training read them (the checkpoint's image size and normalization), a batch at a
time; confidences are calibrated on the checkpoint's held-out images where it has them and they can
be read (`classifier.calibration`; else `classifier.uncalibrated` says why and they are the raw
softmax).
"""
from typing import Optional

import torch

from ..data.batches import normalization
from .calibration import Calibration
from ..train.checkpoints import load_checkpoint, restore_models
from .held_out import restore_held_out
from ..train.devices import pick_device
from ..errors import UserError
from ..train.inference import outputs
from .predictions import Prediction, held_out_calibration, image_paths, predict_files


class Classifier:
    """One model of a checkpoint (the teacher, or the student), ready to classify images."""

    def __init__(self, state, *, model="teacher", device="cpu"):
        self.state, self.config = state, state["config"]
        self.device = pick_device(device) if isinstance(device, str) else device
        student, teacher = restore_models(state, self.device)
        self.model_name, self.model = model, (teacher if model == "teacher" else student)
        self.classes, self.image_size = self.config["classes"], self.config["image_size"]
        self.mean, self.std = normalization(self.config, self.device)
        self.calibration: Optional[Calibration] = None
        self.uncalibrated: Optional[str] = "not calibrated yet"

    @property
    def temperature(self):
        return self.calibration.temperature if self.calibration else 1.0

    def calibrate(self, data_dir=None, echo=lambda line: None):
        """Fit the temperature on the checkpoint's held-out images (data.restore_held_out, from its
        own data_dir unless one is given); returns the Calibration, or None where there are none or
        they cannot be read as they were trained (self.uncalibrated says why)."""
        try:
            held = restore_held_out(self.state, data_dir, echo=echo)
        except UserError as e:
            self.calibration, self.uncalibrated = None, f"the checkpoint's held-out images cannot be read: {e.message}"
            return None
        if not len(held.y):
            self.calibration, self.uncalibrated = None, ("the checkpoint has no held-out images (a test/ folder, or "
                                                         "train_mt.py --val N)")
            return None
        self.calibration = held_out_calibration(self.state, held, self.model, self.device)
        self.uncalibrated = self.calibration.uncalibrated
        return self.calibration

    def predict_files(self, paths, batch_size=256):
        """A Prediction for each file of paths, in order, a batch at a time (a generator)."""
        return predict_files(self.model, paths, self.classes, self.image_size, self.mean, self.std,
                             batch_size=batch_size, temperature=self.temperature)

    def predict(self, targets, batch_size=256):
        """[Prediction] for the image files among targets (files, or folders searched recursively)."""
        paths, _, _ = image_paths(targets)
        return list(self.predict_files(paths, batch_size))

    def classify(self, images):
        """(class indices, calibrated probabilities (n, classes)) of uint8 images (n, 3, S, S) at the
        checkpoint's image size."""
        logits = outputs(self.model, images, self.mean, self.std)[1]
        probabilities = torch.softmax(logits.double() / self.temperature, 1)
        return probabilities.argmax(1), probabilities


def load(path, *, model="teacher", device="auto", calibrate=True, data_dir=None):
    """The Classifier of a checkpoint (a .pt of train_mt.py or finetune_lc.py), calibrated on its
    held-out images where it can be (calibrate=True)."""
    classifier = Classifier(load_checkpoint(path), model=model, device=device)
    if calibrate:
        classifier.calibrate(data_dir)
    return classifier


__all__ = ["Classifier", "Prediction", "load"]
