"""Predictions of a trained model for image files: the files under the given paths, read as in
training (the checkpoint's image size and normalization), classified a batch at a time so that
memory stays bounded however many there are, one CSV row per file.
"""
import csv
from pathlib import Path

import torch

from data import normalize
from images import decode_batches, find_images
from runs import UserError

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


@torch.no_grad()
def class_probabilities(model, x, mean, std):
    """Softmax over the classes of the model (eval mode) for uint8 images x: (n, classes), float32."""
    model.eval()
    _, logits = model(normalize(x, mean, std))
    return torch.softmax(logits.float(), 1)


def predict_files(model, paths, classes, image_size, mean, std, device, batch_size):
    """For each path in order: (path, predicted class name, its probability, the runner-up class
    name), or (path, None, reason, None) for a file that cannot be read. One batch of decoded images
    is held at a time."""
    for chunk, x, failed in decode_batches(paths, image_size, batch_size):
        probs = class_probabilities(model, x.to(device), mean, std).cpu()
        top = probs.topk(min(2, probs.shape[1]), dim=1)
        for i, path in enumerate(chunk):
            if i in failed:
                yield path, None, failed[i], None
            else:
                idx = top.indices[i].tolist()
                yield path, classes[idx[0]], top.values[i, 0].item(), classes[idx[-1]]


def write_rows(text_file, rows, on_bad):
    """Write the CSV header and one row per prediction; a failed file gets a row with an empty
    prediction and `on_bad(path, reason)`. Returns (rows written, files that failed)."""
    writer = csv.writer(text_file, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    n = failed = 0
    for path, prediction, confidence, runner_up in rows:
        n += 1
        if prediction is None:
            failed += 1
            on_bad(path, confidence)
            writer.writerow((str(path), "", "", ""))
        else:
            writer.writerow((str(path), prediction, f"{confidence:.4f}", runner_up))
    return n, failed
