"""The predictions of an `evaluate.py --predict` run kept on disk while it runs (work.py), not in
memory: one JSON line per image (its path, class, confidence, runner-up, hash, or why it could not be
read) and, where the images to label next are to be chosen, the pooled features of the readable ones
as float32 rows. The outputs (the CSV, the review page, the images to label next) are made from it
at the end, reading it a row at a time; a run interrupted and started again goes on after the last
batch it kept.
"""
import json
from pathlib import Path

import numpy as np

from ..disk.iterables import batched
from .predictions import Prediction

ROWS, FEATURES = "rows.jsonl", "features.f32"


def row_line(p):
    """One prediction as a JSON line (names that are not UTF-8 kept as their escapes: json writes a
    lone surrogate as \\udcxx and reads it back as itself)."""
    return json.dumps([str(p.path), p.label, p.confidence, p.runner_up, p.digest, p.reason]).encode() + b"\n"


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
                path, label, confidence, runner_up, digest, reason = json.loads(line)
                yield Prediction(Path(path), label, confidence, runner_up, None, reason, digest)

    def features(self):
        """The features of the readable predictions, in order: (n, feature_dim) float32, memory-mapped."""
        return self.work.rows(FEATURES, np.float32, self.feature_dim)
