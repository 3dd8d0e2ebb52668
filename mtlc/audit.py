"""Is my folder right? What a checkpoint and its own-images folder say about the folder itself,
before a wrong label, a copy or a stray image misleads a run:

- label: a labeled/ or test/ image whose label is likely wrong, ranked by 1 - p(its label), p out
  of sample (labeled/: cross-fitted networks that never saw its label, crossfit.py; test/: the
  checkpoint's teacher, which never trained on it), with the class it more likely is;
- duplicate: the same image twice within the training folders or within test/ (copies.py), with its copy;
- leak: a test/ image that is also in labeled/ or unlabeled/, with its copy: it makes the test
  error optimistic;
- outlier: an image least like any class, farther from its nearest labeled images (in the
  network's features or in its pixels) than any labeled image is from the others.

Each is a Finding: one row of the audit CSV (kind,path,score,suggestion, then given, detail and the
hash of the image's bytes), which label.py applies: a doubtful label relabeled from the audit page's
labels.csv, the copies, leaks and strays set aside (label.py --set-aside).
"""
import contextlib
from dataclasses import astuple, dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.neighbors import NearestNeighbors

from .batches import normalization
from .calibration import fitted_or_one
from .checkpoints import restore_models
from .console import csv_writer, path_text
from .copies import exact_groups, near_pairs, thumbnails
from .crossfit import DEFAULT_FOLDS, DEFAULT_STEPS, crossfit_logits, out_of_sample_probabilities
from .data import is_own_layout
from .errors import UserError
from .files import DIGEST_COLUMN, file_digest, read_regular
from .inference import outputs
from .runs import atomic_write

AUDIT_HEADER = ("kind", "path", "score", "suggestion", "given", "detail", DIGEST_COLUMN)
KINDS = ("label", "duplicate", "leak", "outlier")
OUTLIER_NEIGHBOURS = 5  # labeled images an image's distance to the classes is measured to
# How much farther than the farthest labeled image an outlier must be, set on the two 5% folders of
# docs/audit.md and checked on the 10% ones: on digits with photos among them, 15 of 18 found and
# none wrongly; on a CIFAR-10 folder with digits among the photos, none found, none wrongly (1.0
# flagged 84 photos there).
OUTLIER_MARGIN = 1.25


@dataclass
class Finding:
    kind: str          # one of KINDS
    path: str          # as evaluate.py --predict writes paths: the folder joined with the file's name
    score: float       # higher: more likely a problem
    suggestion: str    # label: the class it more likely is; duplicate, leak: the copy's path; outlier: ""
    given: str = ""    # label: the class the folder gives it
    detail: str = ""
    digest: str = ""   # the hash of its file's bytes: label.py acts on a row only for that very image


def label_findings(paths, labels, probabilities, classes, where):
    """The images whose most likely class (out of sample) is not their label, by 1 - p(label)."""
    predicted = probabilities.argmax(1)
    return [Finding("label", paths[i], float(1 - probabilities[i, labels[i]]), classes[predicted[i]], classes[labels[i]],
                    f"{where}: p({classes[labels[i]]}) {probabilities[i, labels[i]]:.3f}, "
                    f"p({classes[predicted[i]]}) {probabilities[i, predicted[i]]:.3f}")
            for i in range(len(labels)) if predicted[i] != labels[i]]


def copy_findings(paths, images, is_test):
    """Copies among the images (training, then test): exact (the same bytes) and near (copies.py).
    Each copy after the first of its group is a finding pointing at the first; a copy that pairs a
    test image with a training one is a leak, reported on the test image."""
    found = {}
    for group in exact_groups(paths):
        for i in group[1:]:
            found[(group[0], i)] = (1.0, "exact: the same bytes")
    for i, j, distance in near_pairs(images):
        found.setdefault((i, j), (1.0 - distance, f"near: standardized difference {distance:.3f}"))
    findings, reported = [], set()
    for (i, j), (score, detail) in sorted(found.items()):
        if is_test[i] != is_test[j]:
            test, train = (i, j) if is_test[i] else (j, i)
            kind, which, copy = "leak", test, train
        else:
            kind, which, copy = "duplicate", j, i
        if which not in reported:
            reported.add(which)
            findings.append(Finding(kind, paths[which], score, paths[copy], detail=detail))
    return findings


def outlier_scores(features, thumbs, labeled):
    """Each image's outlier score: in the network's features (L2-normalized) and in the images' 8 x 8
    thumbnails (copies.thumbnails), its mean distance to its OUTLIER_NEIGHBOURS nearest labeled images
    over the largest such distance of a labeled image (to the others), the larger of the two ratios.
    None where fewer than 2 images are labeled."""
    k = min(OUTLIER_NEIGHBOURS, int(labeled.sum()) - 1)
    if k < 1:
        return None
    ratios = []
    for space in (torch.nn.functional.normalize(features, dim=1).numpy(), thumbs):
        distance, _ = NearestNeighbors(n_neighbors=k + 1).fit(space[labeled]).kneighbors(space)
        mean = np.where(labeled, distance[:, 1:].mean(1), distance[:, :k].mean(1))  # a labeled image is its own nearest
        ratios.append(mean / max(mean[labeled].max(), 1e-12))
    return np.maximum(*ratios)


def outlier_findings(paths, features, images, labeled):
    """The images that are not labeled whose outlier score is above OUTLIER_MARGIN: farther from the
    labeled images, in features or in pixels, than any labeled image is from the others."""
    score = outlier_scores(features, thumbnails(images).numpy(), labeled)
    if score is None:
        return []
    return [Finding("outlier", paths[i], float(score[i]), "", detail="distance to the nearest labeled images, over "
                    "the largest of a labeled image (features or thumbnails)")
            for i in np.flatnonzero(~labeled & (score > OUTLIER_MARGIN))]


def audit(state, data, root, device, *, folds=DEFAULT_FOLDS, steps=DEFAULT_STEPS, seed=0, echo=lambda line: None):
    """Every Finding for the checkpoint's own-images folder at root (its data restored), each kind in
    descending score."""
    config = state["config"]
    if data.files is None or not is_own_layout(root):
        raise UserError(f"--audit looks at an own-images folder (labeled/, unlabeled/, test/); "
                        f"{root if data.files is not None else config['dataset']} is not one")
    classes, mean_std = config["classes"], normalization(config, device)
    names = data.files["train"] + data.files["test"]
    paths = [str(Path(root) / name) for name in names]
    n_train = len(data.files["train"])
    _, teacher = restore_models(state, device)
    labeled_idx = state["labeled_idx"]
    findings = []
    try:
        logits, used = crossfit_logits(state, data, device, folds=folds, steps=steps, seed=seed, echo=echo)
    except UserError as e:  # a class with one labeled image: the rest of the audit still holds
        echo(f"audit: the labels of labeled/ are not checked: {e.message}")
    else:
        labels = data.train_y[labeled_idx].numpy()
        probabilities, _ = out_of_sample_probabilities(logits, labels)
        findings += label_findings([paths[i] for i in labeled_idx], labels, probabilities, classes,
                                   f"labeled/, {used}-fold cross-fitted")
    train_features, train_logits = outputs(teacher, data.train_x, *mean_std)
    test_features, test_logits = outputs(teacher, data.test_x, *mean_std)
    val_idx = state["val_idx"]
    for where, logits_never_trained, labels_held, held_paths in (
            ("test/, the checkpoint's teacher", test_logits, data.test_y, paths[n_train:]),
            ("labeled/ (--val hold-out), the checkpoint's teacher", train_logits[val_idx], data.train_y[val_idx],
             [paths[i] for i in val_idx])):
        if len(labels_held):
            temperature = fitted_or_one(logits_never_trained.numpy(), labels_held.numpy())
            held_probabilities = torch.softmax(logits_never_trained.double() / temperature, 1).numpy()
            findings += label_findings(held_paths, labels_held.numpy(), held_probabilities, classes, where)
    images = torch.cat([data.train_x, data.test_x]) if len(data.test_x) else data.train_x
    is_test = np.arange(len(paths)) >= n_train
    findings += copy_findings(paths, images, is_test)
    all_features = torch.cat([train_features, test_features])
    labeled = np.zeros(len(paths), bool)
    labeled[labeled_idx.numpy()] = True
    findings += outlier_findings(paths, all_features, images, labeled)
    for finding in findings:
        with contextlib.suppress(OSError):
            finding.digest = file_digest(read_regular(finding.path))
    return sorted(findings, key=lambda f: (KINDS.index(f.kind), -f.score, f.path))


def write_audit(path, findings):
    """The audit CSV: a header, then one row per finding (scores with 4 decimals)."""
    def write(f):
        text = path_text(f)
        writer = csv_writer(text)
        writer.writerow(AUDIT_HEADER)
        for finding in findings:
            row = list(astuple(finding))
            row[2] = f"{row[2]:.4f}"
            writer.writerow(row)
        text.flush()
        text.detach()
    atomic_write(path, write)


def describe_audit(findings):
    """One line per kind: how many, and the first few."""
    lines = []
    for kind, what in (("label", "doubtful labels (labeled/ and test/)"), ("duplicate", "duplicates (within training, or within test/)"),
                       ("leak", "test images that are also in labeled/ or unlabeled/"),
                       ("outlier", "images like no class")):
        mine = [f for f in findings if f.kind == kind]
        shown = ", ".join(Path(f.path).name + (f" -> {f.suggestion}" if kind == "label" else "") for f in mine[:3])
        lines.append(f"audit: {len(mine):,} {what}" + (f": {shown}{', ...' if len(mine) > 3 else ''}" if mine else ""))
    return lines
