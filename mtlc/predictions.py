"""Predictions of a trained model for image files: the files under the given paths, read as in
training (the checkpoint's image size and normalization), classified a batch at a time so that
memory stays bounded however many there are, one CSV row per file; their confidences calibrated on
held-out images, and the images to label next.
"""
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from .batches import normalization
from .calibration import Calibration, confidences
from .errors import UserError
from .console import csv_writer
from .files import DIGEST_COLUMN, find_images
from .images import decode_batches
from .inference import model_outputs, outputs
from .selection import suggest

CSV_HEADER = ("path", "prediction", "confidence", "runner_up")


def image_paths(targets):
    """The files to predict, in the order given: a file as it is, a folder's images (searched
    recursively, by extension, hidden files and folders left out) sorted. A path that does not exist
    exits 2 before any work. Returns (paths, number of other files, number of hidden ones left out)."""
    missing = [t for t in targets if not Path(t).exists()]
    if missing:
        raise UserError(f"--predict: {', '.join(map(str, missing))} does not exist")
    paths, others, hidden = [], 0, 0
    for target in map(Path, targets):
        if target.is_dir():
            found, other, hidden_inside = find_images(target)
            paths += found
            others += other
            hidden += hidden_inside
        else:
            paths.append(target)
    return paths, others, hidden


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


def suggest_rows(rows, state, data, model, device, *, n, seed):
    """The n predictions (readable files only) whose images TypiClust (selection.py) would label next,
    best first, and the cluster of each."""
    readable = [r for r in rows if r.label is not None]
    mean, std = normalization(state["config"], device)
    labeled = outputs(model, data.train_x, mean, std, state["labeled_idx"])[0]
    picks, clusters = suggest(torch.stack([r.features for r in readable]).numpy(), labeled.numpy(), n, seed)
    return [readable[i] for i in picks], clusters.tolist()
