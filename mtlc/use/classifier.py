"""A trained checkpoint as a classifier of image files, in your own code; what `evaluate.py
--predict` runs:

    import mtlc
    classifier = mtlc.load("runs/digits/lc.pt")
    predictions = classifier.predict(["photo.jpg", "more_photos/"])  # [Prediction(path, label, confidence, ...)]

Images are read as training read them (the checkpoint's image size, framing and normalization), a batch at a
time; confidences are calibrated on the checkpoint's held-out images where it has them and they can
be read (`classifier.calibration`; else `classifier.uncalibrated` says why and they are the raw
softmax).
"""
import numbers
import os
import re
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
import torch

from ..data.layout import is_own_layout
from ..data.files import ImageFiles, image_paths
from ..data.framing import SQUASH
from ..data.images import decode_batches
from ..data.views import normalization
from ..disk.opening import identity
from ..errors import UserError
from ..train.checkpoints import load_checkpoint, restore_data, restore_models
from ..train.devices import pick_device
from ..train.inference import model_outputs, outputs
from ..train.model import ModelConfig
from ..train.moved_images import restored_as_now
from .calibration import Calibration, confidences
from .held_out import held_out, restore_held_out
from .outliers import TRUNK_OUTLIER_MARGIN


MODELS = ("teacher", "student")


def checked_model(model):
    if model not in MODELS or not isinstance(model, str):
        raise ValueError(f"model must be one of {', '.join(map(repr, MODELS))}, not {model!r}")
    return model


def checked_device(device):
    if isinstance(device, torch.device):
        return device
    if not (isinstance(device, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", device)):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device, not {device!r}")
    return pick_device(device)


def checked_path(path, name):
    """A str or os.PathLike (a pathlib.Path): one path, as the scripts take it, kept as given (a
    Prediction names its file as it was asked for)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (a str or a pathlib.Path), not {type(path).__name__}")
    return path


def checked_paths(targets, name="targets"):
    """One path (a str or a pathlib.Path is one, never its characters), or an iterable of them."""
    if isinstance(targets, (str, os.PathLike)):
        return [checked_path(targets, name)]
    if isinstance(targets, (bytes, bytearray)) or not hasattr(targets, "__iter__"):
        raise TypeError(f"{name} must be a path (a str or a pathlib.Path) or a list of them, not "
                        f"{type(targets).__name__}")
    return [checked_path(target, f"each of {name}") for target in targets]


def checked_batch_size(batch_size):
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
        raise TypeError(f"batch_size must be an int, not {type(batch_size).__name__}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    return int(batch_size)


class Classifier:
    """One model of a checkpoint (the teacher, or the student), ready to classify images."""

    def __init__(self, state, *, model="teacher", device="cpu"):
        model = checked_model(model)
        self.state, self.config = state, state["config"]
        self.device = checked_device(device)
        student, teacher = restore_models(state, self.device)
        self.model_name, self.model = model, (teacher if model == "teacher" else student)
        self.classes, self.image_size, self.framing = self.config.classes, self.config.image_size, self.config.framed
        self.mean, self.std = normalization(self.config, self.device)
        self.calibration: Optional[Calibration] = None
        self.uncalibrated: Optional[str] = "not calibrated yet"
        self.unseen = None  # UnseenHeads: where set, each image is predicted by a head that never saw it
        self.why_not_unseen = None  # why load(unseen=True) could not have them

    @property
    def answers(self):
        """Which network answers, in words: the checkpoint's own head, or the heads that never saw an image."""
        if self.unseen is not None:
            return (f"{len(self.unseen.heads)} heads trained as the checkpoint's was, each image answered by one that "
                    f"never trained on it (evaluate.py --predict's)")
        own = f"the checkpoint's own {self.model_name}"
        if ModelConfig.of_run(self.config).keeps_features and len(self.state["unlabeled_idx"]):
            own += (", which trained on its unlabeled images and is surer of them than of others (for those, "
                    "mtlc.load(..., unseen=True) or evaluate.py --predict"
                    + (f": {self.why_not_unseen}" if self.why_not_unseen else "") + ")")
        return own

    @property
    def strays(self):
        """Whether its predictions say which images are like no class (Prediction.like_no_class)."""
        return self.unseen is not None and self.unseen.spread is not None

    @property
    def temperature(self):
        return self.calibration.temperature if self.calibration else 1.0

    @property
    def ceiling(self):
        """The highest confidence the held-out images support (calibration.supported_confidence)."""
        return self.calibration.ceiling if self.calibration else 1.0

    def calibrate(self, data_dir=None, echo=lambda line: None):
        """Fit the temperature on the checkpoint's held-out images (data.restore_held_out, from its
        own data_dir unless one is given); returns the Calibration, or None where there are none or
        they cannot be read as they were trained (self.uncalibrated says why)."""
        data_dir = None if data_dir is None else checked_path(data_dir, "data_dir")
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

    def calibrate_unseen(self, checkpoint_key, data_dir=None, echo=lambda line: None):
        """Where the checkpoint is a head on a frozen trunk that trained on unlabeled images: predict
        with heads that never saw an image (unseen.py), calibrated alike; returns why not (a line)
        where that cannot be, else None. checkpoint_key: what tells the checkpoint (the heads are
        kept under it)."""
        from .unseen import FOLDS, UnseenHeads
        if not ModelConfig.of_run(self.config).keeps_features or not len(self.state["unlabeled_idx"]):
            return "the checkpoint is no head on a frozen trunk that trained on unlabeled images"
        if len(self.state["unlabeled_idx"]) < 2 * FOLDS:
            return (f"{len(self.state['unlabeled_idx'])} unlabeled images are too few for {FOLDS} heads that each "
                    f"leave a quarter out")
        root, state = data_dir or self.config.data_dir, self.state
        try:  # strong: the heads train as it was
            state, data = restored_as_now(state, root, echo=echo, device=self.device, strong=True)
        except UserError as e:
            return e.message
        if not len(held_out(state, data).y):
            return "it has no held-out images to calibrate heads on"
        self.unseen = UnseenHeads.trained(state, data, root, checkpoint_key, self.model_name, self.model,
                                          self.device, echo)
        self.calibration = self.unseen.calibration()
        self.uncalibrated = self.calibration.uncalibrated
        return None

    def predict_files(self, paths, batch_size=256):
        """A Prediction for each file of paths (one path, or a list of them), in order, a batch at a
        time (a generator)."""
        return predict_files(self.model, checked_paths(paths, "paths"), self.classes, self.image_size, self.mean,
                             self.std, batch_size=checked_batch_size(batch_size), temperature=self.temperature,
                             ceiling=self.ceiling, unseen=self.unseen, framing=self.framing)

    def predict(self, targets, batch_size=256):
        """[Prediction] for the image files among targets (a file or a folder searched recursively, or a
        list of them)."""
        batch_size = checked_batch_size(batch_size)
        paths, _, _ = image_paths(checked_paths(targets))
        return list(self.predict_files(paths, batch_size))

    def classify(self, images):
        """(class indices, calibrated probabilities (n, classes)) of uint8 images (n, 3, S, S) at the
        checkpoint's image size, framed as it frames them (self.framing)."""
        size = (3, self.image_size, self.image_size)
        if not (isinstance(images, torch.Tensor) and images.dtype == torch.uint8 and images.dim() == 4
                and tuple(images.shape[1:]) == size):
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"images must be a uint8 tensor of shape (n, {', '.join(map(str, size))}), not "
                             f"{getattr(images, 'dtype', '')} {shape}")
        logits = outputs(self.model, images, self.mean, self.std)[1]
        probabilities = torch.softmax(logits.double() / self.temperature, 1)
        return probabilities.argmax(1), probabilities.clamp(max=self.ceiling)


def checkpoint_identity(path):
    """What tells a checkpoint file from any other and from itself after a change (cache.identity)."""
    return [os.path.abspath(path), *identity(os.stat(path))]


def load(path, *, model="teacher", device="auto", calibrate=True, data_dir=None, unseen=False):
    """The Classifier of a checkpoint (a .pt of train_mt.py or finetune_lc.py), calibrated on its
    held-out images where it can be (calibrate=True). unseen=True: for a head on a frozen trunk, the
    heads of `evaluate.py --predict` answer instead (unseen.py: each image by one that never trained
    on it; trained on the first call, then kept), so that both give an image one class and one
    confidence; where they cannot be had, the checkpoint's own head, and `answers` says why."""
    path, model, device = checked_path(path, "path"), checked_model(model), checked_device(device)
    if data_dir is not None:
        checked_path(data_dir, "data_dir")
    for name, value in (("calibrate", calibrate), ("unseen", unseen)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, not {value!r}")
    classifier = Classifier(load_checkpoint(path), model=model, device=device)
    why_not = classifier.calibrate_unseen(checkpoint_identity(path), data_dir) if unseen and calibrate else None
    if calibrate and classifier.unseen is None:
        classifier.calibrate(data_dir)
    classifier.why_not_unseen = why_not
    return classifier


__all__ = ["Classifier", "Prediction", "load"]


class Prediction(NamedTuple):
    path: Path
    label: Optional[str]          # None: the file could not be read (reason says why)
    confidence: Optional[float]   # the label's probability, rounded as the CSV writes it
    runner_up: Optional[str]      # the second most likely class
    features: Optional[torch.Tensor] = None  # the pooled features (the vectors LC acts on)
    reason: Optional[str] = None  # why the file could not be read
    digest: Optional[str] = None  # the hash of the file's bytes (files.file_digest): which image the row is for
    # its distance to the nearest labeled images over theirs to each other, in a pretrained trunk's
    # features (outliers.py; None: not measured): over TRUNK_OUTLIER_MARGIN it is like no class
    outlier_ratio: Optional[float] = None

    @property
    def like_no_class(self):
        return self.outlier_ratio is not None and self.outlier_ratio > TRUNK_OUTLIER_MARGIN


def predict_files(model, paths, classes, image_size, mean, std, *, batch_size=256, temperature=1.0, ceiling=1.0,
                  unseen=None, framing=SQUASH):
    """A Prediction for each path in order: the class, its probability with the logits divided by
    the temperature (calibration.py) and at most the ceiling, the runner-up class and the pooled
    features. One batch of decoded images is held at a time, the next one decoding meanwhile. With UnseenHeads, the logits
    are those of the head that never saw the image."""
    device = next(model.parameters()).device
    for chunk, x, failed, digests in decode_batches(paths, image_size, batch_size, framing=framing):
        ratios = None
        if unseen is not None:
            features, logits, ratios = unseen.outputs(x, [d or "0" * 32 for d in digests])
        else:
            features, logits = (t.cpu() for t in model_outputs(model, x.to(device), mean, std))
        predicted, confidence = confidences(logits, temperature, ceiling)
        runner_up = logits.topk(min(2, logits.shape[1]), dim=1).indices[:, -1]
        for i, path in enumerate(chunk):
            if i in failed:
                yield Prediction(path, None, None, None, reason=failed[i], digest=digests[i])
            else:
                yield Prediction(path, classes[predicted[i]], float(confidence[i]), classes[runner_up[i]], features[i],
                                 digest=digests[i], outlier_ratio=None if ratios is None else round(float(ratios[i]), 4))


def held_out_calibration(state, held, model, device):
    """The calibration of the model's confidences on the checkpoint's held-out labeled images
    (checkpoints.HeldOut: its test images, else its --val hold-out), those relabeled with label.py
    counted as errors."""
    mean, std = normalization(state["config"], device)
    return Calibration.fit(outputs(model, held.x, mean, std)[1].numpy(), held.y.numpy(), held.source,
                           doubted=held.relabeled.numpy())


def labeled_features(state, model, device, data_dir=None, echo=lambda line: None):
    """The pooled features (n, D) of the images labeled so far, which the choice of the images to
    label next covers first: an own-images folder's labeled/ as it is now (label.py's moves since
    training included), decoded a batch at a time; another dataset's labeled training images."""
    root = Path(data_dir or state["config"].data_dir)
    config = state["config"]
    mean, std = normalization(config, device)
    if config.dataset == "folder" and is_own_layout(root):
        parts = []
        if (root / "labeled").is_dir():
            for _, x, failed, _ in decode_batches(ImageFiles([root / "labeled"]), config.image_size, 256,
                                                  framing=config.framed):
                readable = [i for i in range(len(x)) if i not in failed]
                if readable:
                    parts.append(model_outputs(model, x[readable].to(device), mean, std)[0].cpu())
        return torch.cat(parts).numpy() if parts else np.zeros((0, model.feature_dim), np.float32)
    data = restore_data(state, data_dir, echo=echo)
    return outputs(model, data.train_x, mean, std, state["labeled_idx"])[0].numpy()
