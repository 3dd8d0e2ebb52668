"""The rows of an `evaluate.py --predict` run. While it runs they are kept on disk (work.py), not in
memory: one JSON line per image (its path, class, confidence, runner-up, hash, or why it could not be
read, and how far it lies from the labeled images where that is measured) and, where the images
to label next are to be chosen, the pooled features of the readable ones
as float32 rows; a run interrupted and started again goes on after the last batch it kept. At the end
its outputs are made from them a row at a time: the CSV (write_rows), the review page, the images to
label next.
"""
import json
from pathlib import Path

import numpy as np

from ..data.files import DIGEST_COLUMN
from ..data.mapped import mapped_work_rows
from ..disk.console import csv_writer
from ..disk.spill import batched
from .classifier import Prediction

ROWS, FEATURES = "rows.jsonl", "features.f32"


def row_line(p):
    """One prediction as a JSON line (names that are not UTF-8 kept as their escapes: json writes a
    lone surrogate as \\udcxx and reads it back as itself)."""
    return json.dumps([str(p.path), p.label, p.confidence, p.runner_up, p.digest, p.reason, p.outlier_ratio]).encode() \
        + b"\n"


class PredictionStore:
    """The predictions kept in a Work (work.py): `done` images so far, `add`ed a batch at a time;
    `rows()` reads them back in order as Prediction rows (without features), `features()` the
    readable ones' features as a memory map (feature_dim: None where none are kept)."""

    def __init__(self, work, feature_dim=None):
        self.work, self.feature_dim = work, feature_dim
        self.lines = work.appended(ROWS)
        self.vectors = work.appended(FEATURES) if feature_dim else None
        self.done = work.state.setdefault("images", 0)

    def add(self, predictions):
        """Keep a batch of predictions (in order, after those kept before)."""
        self.lines.write(b"".join(map(row_line, predictions)))
        if self.vectors is not None:
            readable = [p.features for p in predictions if p.label is not None]
            if readable:
                self.vectors.write(np.stack([np.asarray(f, np.float32) for f in readable]).tobytes())
        self.done += len(predictions)
        self.work.state["images"] = self.done
        self.work.commit()

    def fill(self, predictions, progress=lambda n: None, batch_size=256):
        """Keep every prediction of a stream, a batch at a time; progress(n) after each batch."""
        for batch in batched(predictions, batch_size):
            self.add(batch)
            progress(len(batch))
        self.work.commit(force=True)

    def rows(self):
        """The predictions kept, in order, as Prediction rows (features None)."""
        with open(self.lines.path, "rb") as f:
            left = self.lines.length
            for line in f:
                left -= len(line)
                if left < 0:
                    break
                path, label, confidence, runner_up, digest, reason, outlier_ratio = json.loads(line)
                yield Prediction(Path(path), label, confidence, runner_up, None, reason, digest, outlier_ratio)

    def features(self):
        """The features of the readable predictions, in order: (n, feature_dim) float32, memory-mapped
        (release_pages lets go of what a batch read)."""
        return mapped_work_rows(self.work, FEATURES, np.float32, self.feature_dim)



CSV_HEADER = ("path", "prediction", "confidence", "runner_up")


def write_rows(text_file, rows, threshold=None, extra=None, strays=False):
    """Write the CSV header and one row per prediction; a file that could not be read gets an empty
    prediction. With a threshold, a column `accepted`: 1 where the confidence is at least the
    threshold and the image is not like_no_class. With strays (the distances to the labeled images
    measured), a column `like_no_class`: 1 where the image lies farther from them than they lie from
    each other, by TRUNK_OUTLIER_MARGIN (a blank page, noise, another kind of image). extra: (column
    name, value per row) columns after those; last, blake2b: the hash of the bytes of the image the
    row was written for (label.py refuses the row where the file holds another image by then). Paths are written as str (a text file opened with console.path_text keeps
    undecodable bytes); every name reads back as itself (console.csv_writer)."""
    writer = csv_writer(text_file)
    extra = extra or ()
    writer.writerow(CSV_HEADER + (("accepted",) if threshold is not None else ()) + (("like_no_class",) if strays else ())
                    + tuple(name for name, _ in extra) + (DIGEST_COLUMN,))
    for i, row in enumerate(rows):
        if row.label is None:
            cells = [str(row.path), "", "", ""]
        else:
            cells = [str(row.path), row.label, f"{row.confidence:.4f}", row.runner_up]
        if threshold is not None:
            cells.append(int(is_accepted(row, threshold)))
        if strays:
            cells.append("" if row.label is None else int(row.like_no_class))
        writer.writerow(cells + [values[i] for _, values in extra] + [row.digest or ""])


def is_accepted(row, threshold):
    return row.label is not None and row.confidence >= threshold and not row.like_no_class
