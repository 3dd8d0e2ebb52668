"""Predictions of a trained model for image files: the files under the given paths, read as in
training (the checkpoint's image size and normalization), classified a batch at a time so that
memory stays bounded however many there are, one CSV row per file; their confidences calibrated on
held-out images, and the images to label next.
"""
import collections
import hashlib
import os
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
import torch

from ..data.batches import normalization
from .calibration import Calibration, confidences
from ..errors import UserError
from ..train.checkpoints import restore_data
from ..disk.console import csv_writer
from ..data.datasets import is_own_layout
from ..data.files import DIGEST_COLUMN, is_hidden, is_image_name, walk_images
from ..data.images import decode_batches
from ..train.inference import model_outputs, outputs
from .selection import suggest

CSV_HEADER = ("path", "prediction", "confidence", "runner_up")


class ImageFiles:
    """The files to predict, in the order given: a file as it is, a folder's images (files.walk_images:
    recursively, by extension, hidden files and folders left out) in sorted order, streamed: a
    million files are never a list. Each image once: a path given twice, or a file or folder that a
    folder given also lists, is left to that folder (links resolved). A path that does not exist exits
    2 before any work. `others` and `hidden` count the other files and the hidden ones left out, once
    a pass is over, and `left_out` holds walk_images's counts (files.describe_others)."""

    def __init__(self, targets):
        missing = [t for t in targets if not Path(t).exists()]
        if missing:
            raise UserError(f"--predict: {', '.join(map(str, missing))} does not exist")
        self.targets = distinct_targets([Path(t) for t in targets])
        self.others = self.hidden = 0
        self.left_out = collections.Counter()

    def entries(self):
        """(path, (size, modification and change time)) of each file, in order."""
        counts = collections.Counter()
        for target in self.targets:
            if target.is_dir():
                for relative, *stamp in walk_images(target, counts):
                    yield target / relative, stamp
            else:
                try:
                    st = os.stat(target)
                    yield target, [st.st_size, st.st_mtime_ns, st.st_ctime_ns]
                except OSError:
                    yield target, [-1, -1, -1]
        self.others, self.hidden, self.left_out = counts["others"], counts["hidden"], counts

    def __iter__(self):
        return (path for path, _ in self.entries())

    def survey(self, outputs):
        """One pass before any work: (the number of files, a key of the listing: the hash of every
        path, size and time, so that work kept from an interrupted run is taken up only for the very
        same files). Exit 2 where an output {option: path} would replace one of the files (a file
        in a folder given to --predict, links resolved)."""
        folders = [os.path.realpath(t) + os.sep for t in self.targets if t.is_dir()]
        inside = {os.path.realpath(path): name for name, path in outputs.items()
                  if path and any(os.path.realpath(path).startswith(f) for f in folders)}
        count, key = 0, hashlib.sha256()
        for path, stamp in self.entries():
            count += 1
            key.update("\0".join(map(str, (path, *stamp))).encode("utf-8", "surrogateescape") + b"\n")
            if inside and os.path.realpath(path) in inside:
                name = inside[os.path.realpath(path)]
                raise UserError(f"{name} {outputs[name]} is one of the images --predict reads: give the output "
                                f"another name")
        return count, key.hexdigest()


def distinct_targets(targets):
    """The targets without those another one covers: the same path again (links resolved), or one that
    a folder among them lists itself (under it, no hidden part on the way, an image's name for a file)."""
    real = [os.path.realpath(t) for t in targets]
    folders = [r for r, t in zip(real, targets) if t.is_dir()]
    kept, seen = [], set()
    for target, path in zip(targets, real):
        listed_by = [f for f in folders if f != path and path.startswith(f.rstrip(os.sep) + os.sep)
                     and not any(is_hidden(part) for part in Path(os.path.relpath(path, f)).parts)]
        if path in seen or (listed_by and (target.is_dir() or is_image_name(target.name))):
            continue
        seen.add(path)
        kept.append(target)
    return kept


def image_paths(targets):
    """(the files ImageFiles finds under targets as a list, number of other files, number of hidden
    ones left out)."""
    files = ImageFiles(targets)
    paths = list(files)
    return paths, files.others, files.hidden


class Prediction(NamedTuple):
    path: Path
    label: Optional[str]          # None: the file could not be read (reason says why)
    confidence: Optional[float]   # the label's probability, rounded as the CSV writes it
    runner_up: Optional[str]      # the second most likely class
    features: Optional[torch.Tensor] = None  # the pooled features (the vectors LC acts on)
    reason: Optional[str] = None  # why the file could not be read
    digest: Optional[str] = None  # the hash of the file's bytes (files.file_digest): which image the row is for


def predict_files(model, paths, classes, image_size, mean, std, *, batch_size=256, temperature=1.0):
    """A Prediction for each path in order: the class, its probability with the logits divided by
    the temperature (calibration.py), the runner-up class and the pooled features. One batch of
    decoded images is held at a time, the next one decoding meanwhile."""
    device = next(model.parameters()).device
    for chunk, x, failed, digests in decode_batches(paths, image_size, batch_size):
        features, logits = (t.cpu() for t in model_outputs(model, x.to(device), mean, std))
        predicted, confidence = confidences(logits, temperature)
        runner_up = logits.topk(min(2, logits.shape[1]), dim=1).indices[:, -1]
        for i, path in enumerate(chunk):
            if i in failed:
                yield Prediction(path, None, None, None, reason=failed[i], digest=digests[i])
            else:
                yield Prediction(path, classes[predicted[i]], float(confidence[i]), classes[runner_up[i]], features[i],
                                 digest=digests[i])


def write_rows(text_file, rows, threshold=None, extra=None):
    """Write the CSV header and one row per prediction; a file that could not be read gets an empty
    prediction. With a threshold, a column `accepted`: 1 where the confidence is at least the
    threshold. extra: (column name, value per row) columns after those; last, blake2b: the hash of the
    bytes of the image the row was written for (label.py refuses the row where the file holds another
    image by then). Paths are written as str (a text file opened with console.path_text keeps
    undecodable bytes); every name reads back as itself (console.csv_writer)."""
    writer = csv_writer(text_file)
    extra = extra or ()
    writer.writerow(CSV_HEADER + (("accepted",) if threshold is not None else ()) + tuple(name for name, _ in extra)
                    + (DIGEST_COLUMN,))
    for i, row in enumerate(rows):
        if row.label is None:
            cells = [str(row.path), "", "", ""]
        else:
            cells = [str(row.path), row.label, f"{row.confidence:.4f}", row.runner_up]
        if threshold is not None:
            cells.append(int(is_accepted(row, threshold)))
        writer.writerow(cells + [values[i] for _, values in extra] + [row.digest or ""])


def is_accepted(row, threshold):
    return row.label is not None and row.confidence >= threshold


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
    root = Path(data_dir or state["config"]["data_dir"])
    config = state["config"]
    mean, std = normalization(config, device)
    if config["dataset"] == "folder" and is_own_layout(root):
        parts = []
        if (root / "labeled").is_dir():
            for _, x, failed, _ in decode_batches(ImageFiles([root / "labeled"]), config["image_size"], 256):
                readable = [i for i in range(len(x)) if i not in failed]
                if readable:
                    parts.append(model_outputs(model, x[readable].to(device), mean, std)[0].cpu())
        return torch.cat(parts).numpy() if parts else np.zeros((0, model.feature_dim), np.float32)
    data = restore_data(state, data_dir, echo=echo)
    return outputs(model, data.train_x, mean, std, state["labeled_idx"])[0].numpy()


def suggest_rows(store, labeled, *, n, seed):
    """The n kept predictions (prediction_store.PredictionStore; readable files only) whose images
    TypiClust (selection.py) would label next, best first, and the cluster of each; labeled: the
    labeled images' features."""
    picks, clusters = suggest(store.features(), labeled, n, seed)
    wanted = {int(p): k for k, p in enumerate(picks)}
    chosen, readable = [None] * len(picks), 0
    for row in store.rows():
        if row.label is not None:
            if readable in wanted:
                chosen[wanted[readable]] = row
            readable += 1
    return chosen, clusters.tolist()
