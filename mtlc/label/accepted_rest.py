"""The rest of a folder that needs no person: every image still unlabeled, answered by the live model's
current version (each by the head that never saw it, live_model.py), with `accepted` where --max-error's
threshold on the held-out images takes it, as evaluate.py --predict computes it (in the rest's own class
proportions where they are apart from the held-out images': use/label_shift.py); written as the CSV
--predict writes, which `label.py --apply FILE --accepted` takes. Beside the labels the person gave
(kept_labels.py, `label.py --apply`), it finishes the folder: what is neither accepted nor labeled is
what the person still has to look at, least confident first (use/orders.py).
"""

import numpy as np
import torch

from ..data.nearest import in_memory
from ..disk.console import path_text
from ..disk.runs import atomic_write
from ..use.calibration import confidences
from ..use.classifier import Prediction
from ..use.label_shift import threshold_for
from ..use.outliers import LabeledSpread
from ..use.prediction_rows import write_rows
from ..use.selection import unit_rows

BATCH = 65_536  # images answered at a time: memory stays at a batch of features however large the folder


def still_unlabeled(state, given):
    """The checkpoint's unlabeled training rows the person has given no label ({row: class})."""
    rows = state["unlabeled_idx"].numpy()
    return rows[~np.isin(rows, np.fromiter(given, np.int64, len(given)))]


def rest_predictions(model, version, given, folder):
    """A Prediction for each image still unlabeled (its path under folder), a batch at a time: the
    class and calibrated confidence of its fold's head of `version`, and how far it lies from the
    labeled images (the checkpoint's and those given), which marks the ones like no class."""
    unseen, cal = model.unseen, version.calibration
    state, data = unseen.state, unseen.data
    labeled = np.concatenate([state["labeled_idx"].numpy(), np.fromiter(given, np.int64, len(given))])
    spread = LabeledSpread(in_memory(unit_rows(data.features.train[labeled, 0].float().numpy())))
    names, digests = data.files["train"], np.asarray(data.digests["train"](), "S32")
    pool = still_unlabeled(state, given)
    for start in range(0, len(pool), BATCH):
        rows = pool[start:start + BATCH]
        features = data.features.train[torch.from_numpy(rows), 0].float()
        with torch.no_grad():
            logits = unseen.logits(features, unseen.fold_of_row[rows], version.heads)[1]
        predicted, confidence = confidences(logits, cal.temperature, cal.ceiling)
        runner_up = logits.topk(min(2, logits.shape[1]), dim=1).indices[:, -1].numpy()
        ratios = spread.ratios(features.numpy()) if spread.largest else None
        for i, row in enumerate(rows.tolist()):
            yield Prediction(folder / names[row], model.classes[predicted[i]], float(confidence[i]),
                             model.classes[runner_up[i]], digest=digests[row].decode(),
                             outlier_ratio=None if ratios is None else round(float(ratios[i]), 4))


def write_accepted_rest(model, given, folder, max_error, path):
    """Write the rest (module docstring) of the current version to path, whole or not at all; returns
    (images accepted, images still unlabeled, the threshold found or None)."""
    version = model.current
    found, threshold = threshold_for(version.calibration, rest_predictions(model, version, given, folder),
                                     model.classes, max_error)
    counts = [0, 0]

    def counted(predictions):
        for p in predictions:
            counts[0] += p.confidence >= threshold and not p.like_no_class
            counts[1] += 1
            yield p

    def write(binary_file):
        text = path_text(binary_file)
        write_rows(text, counted(rest_predictions(model, version, given, folder)), threshold, strays=True)
        text.flush()
        text.detach()  # leave the file to atomic_write
    atomic_write(path, write)
    return counts[0], counts[1], found
