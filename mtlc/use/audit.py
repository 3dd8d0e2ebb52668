"""Is my folder right? What a checkpoint and its own-images folder say about the folder itself,
before a wrong label, a copy or a stray image misleads a run:

- label: a labeled/ or test/ image whose label is likely wrong, ranked by 1 - p(its label), p out
  of sample (labeled/: cross-fitted networks that never saw its label, crossfit.py; test/: the
  checkpoint's teacher, which never trained on it), with the class it more likely is;
- duplicate: the same image twice within the training folders or within test/ (copies.py), with its copy;
- leak: a test/ image that is also in labeled/ or unlabeled/, with its copy: it makes the test
  error optimistic;
- outlier: an image least like any class, farther from its nearest labeled images (in the
  network's features, a pretrained trunk's where there is one, or in its pixels) than any labeled
  image is from the others.

Each is a Finding: one row of the audit CSV (kind,path,score,suggestion, then given, detail and the
hash of the image's bytes), which label.py applies: a doubtful label relabeled from the audit page's
labels.csv, the copies, leaks and strays set aside (label.py --set-aside).

At any size: the images are read a batch at a time from the memory-mapped decode cache (never all
in memory), the teacher's features and logits are kept on disk as they are made, the neighbours are
faiss's (nearest.py), the files' hashes are the cache's own, and each part's result is kept in a
work folder (work.py) so that an audit interrupted goes on after the last part (or batch) it kept.
"""
from dataclasses import astuple, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..data.batches import ImageRows
from ..data.copies import copy_pairs
from ..data.layout import is_own_layout
from ..data.files import DIGEST_COLUMN
from ..data.mapped import mapped_work_rows
from ..data.views import normalization
from ..disk.console import csv_writer, path_text
from ..disk.runs import atomic_write
from ..errors import UserError
from ..train.checkpoints import restore_models
from ..train.inference import chance_verdict, chance_words, model_outputs
from .calibration import fitted_or_one
from .crossfit import DEFAULT_FOLDS, DEFAULT_STEPS, crossfit_logits, out_of_sample_probabilities
from .outliers import OUTLIER_MARGIN, TRUNK_OUTLIER_MARGIN, outlier_scores, trunk_vectors

AUDIT_HEADER = ("kind", "path", "score", "suggestion", "given", "detail", DIGEST_COLUMN)
KINDS = ("label", "conflict", "duplicate", "leak", "outlier")
OUTPUTS_BATCH = 500  # images through the teacher at a time


@dataclass
class Finding:
    kind: str          # one of KINDS
    path: str          # as evaluate.py --predict writes paths: the folder joined with the file's name
    score: float       # higher: more likely a problem
    suggestion: str    # label: the class it more likely is; conflict, duplicate, leak: the copy's path; outlier: ""
    given: str = ""    # label, conflict: the class the folder gives it
    detail: str = ""
    digest: str = ""   # the hash of its file's bytes: label.py acts on a row only for that very image


class FolderPaths:
    """The path of each of a folder's images (its training images, then its test images), joined
    when asked for: a million paths are no list."""

    def __init__(self, root, names):
        self.root, self.names = str(Path(root)), names

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        return f"{self.root}/{self.names[i]}"


class Names:
    """Several lists of names as one sequence, never joined into one list."""

    def __init__(self, *parts):
        self.parts, self.starts = parts, np.cumsum([0] + [len(p) for p in parts])

    def __len__(self):
        return int(self.starts[-1])

    def __getitem__(self, i):
        i = int(i)
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.parts[k][i - int(self.starts[k])]


def warn_at_chance(logits, labels, steps, echo):
    """A warning where the cross-fitted networks cannot be told from chance on the labels they never
    saw: their ranking of doubtful labels would then say little about the labels."""
    chance_warning("the cross-fitted networks are", "on the labeled images they never saw", "their doubtful labels",
                   f"give --audit-steps more than {steps:,}, or more labels", logits, labels, echo)


def warn_teacher_at_chance(where, logits, labels, echo):
    """A warning where the checkpoint's teacher cannot be told from chance on its held-out images: the
    doubtful labels it finds there, and the outliers by its features, rest on it."""
    chance_warning("the checkpoint's teacher is", f"on {where}",
                   "the doubtful labels it finds there and the outliers by its features",
                   "train it longer, or with more labels", logits, labels, echo)


def chance_warning(networks, where, findings, remedy, logits, labels, echo):
    """The one warning of a network at chance (inference.chance_verdict) and of the findings resting on
    it; `remedy` where it is no better than chance, more labels where too few tell."""
    error = 100 * float(np.mean(logits.argmax(1).numpy() != labels))
    verdict = chance_verdict(error, labels)
    if verdict is not None:
        echo(f"warning: audit: {networks} {chance_words(verdict, error, labels)} {where}: {findings} are a guess; "
             + (remedy if verdict == "no better" else "more labels would tell"))


def label_findings(paths, labels, probabilities, classes, where):
    """The images whose most likely class (out of sample) is not their label, by 1 - p(label)."""
    predicted = probabilities.argmax(1)
    return [Finding("label", paths[i], float(1 - probabilities[i, labels[i]]), classes[predicted[i]], classes[labels[i]],
                    f"{where}: p({classes[labels[i]]}) {probabilities[i, labels[i]]:.3f}, "
                    f"p({classes[predicted[i]]}) {probabilities[i, predicted[i]]:.3f}")
            for i in range(len(labels)) if predicted[i] != labels[i]]


def copy_findings(paths, images, is_test, digests, labels, classes, progress=lambda n: None):
    """Copies among the images (training, then test; ImageRows or a tensor): exact (the same bytes:
    the digest of each image's file) and near (copies.py). Each copy after the first of its group is
    a finding pointing at the first: a conflict where both carry a label and the labels differ (the
    same image under two classes: one of them is wrong, and neither is a copy to set aside), else a
    leak where it pairs a test image with a training one (reported on the test image), else a
    duplicate. labels: each image's class, -1 for an unlabeled one."""
    findings, reported = [], set()
    for (i, j), (score, detail) in sorted(copy_pairs(digests, images, progress).items()):
        given = ""
        if labels[i] >= 0 and labels[j] >= 0 and labels[i] != labels[j]:
            kind, which, copy = "conflict", j, i
            given, detail = classes[labels[j]], f"{detail}; labeled {classes[labels[j]]} here, {classes[labels[i]]} there"
        elif is_test[i] != is_test[j]:
            test, train = (i, j) if is_test[i] else (j, i)
            kind, which, copy = "leak", test, train
        else:
            kind, which, copy = "duplicate", j, i
        if which not in reported:
            reported.add(which)
            findings.append(Finding(kind, paths[which], score, paths[copy], given=given, detail=detail))
    return findings


def outlier_findings(paths, features, images, labeled, feature_margin=OUTLIER_MARGIN):
    """The images that are not labeled whose outlier score is above OUTLIER_MARGIN: farther from the
    labeled images, in features or in pixels, than any labeled image is from the others (by
    feature_margin in features). images: ImageRows or a tensor, or None (features alone); labeled: a bool mask."""
    score = outlier_scores(features, images, labeled, feature_margin)
    if score is None:
        return []
    return [Finding("outlier", paths[i], float(score[i]), "", detail="distance to the nearest labeled images, over "
                    f"the largest of a labeled image ({'features or thumbnails' if images is not None else 'features'})")
            for i in np.flatnonzero(~labeled & (score > OUTLIER_MARGIN))]


def teacher_inputs(data, mean, std):
    """(what the teacher takes for every image, training then test (ImageRows), its mean and std):
    the uint8 images, or for a head on a frozen trunk the trunk's kept features of their plain view
    (the trunk never runs again)."""
    if data.features is None:
        return ImageRows(data.train_x, data.test_x), mean, std
    return ImageRows(data.features.train[:, 0], data.features.test[:, 0]), None, None


def teacher_outputs(teacher, images, mean, std, work, classes):
    """(features (n, D), logits (n, classes)) of the teacher for every image (images: teacher_inputs),
    memory-mapped from the work folder where they are kept a batch at a time (an interrupted audit
    goes on after the last batch kept)."""
    device = next(teacher.parameters()).device
    features, logits = work.appended("features.f32"), work.appended("logits.f32")
    done = work.state.setdefault("outputs", 0)
    with tqdm(total=len(images), initial=done, desc="audit: the teacher's features", unit="img", disable=None,
              leave=False) as bar:
        for start in range(done, len(images), OUTPUTS_BATCH):
            batch = images.gather(np.arange(start, min(start + OUTPUTS_BATCH, len(images))))
            f, z = (t.cpu() for t in model_outputs(teacher, batch.to(device), mean, std))
            features.write(f.numpy().astype(np.float32).tobytes())
            logits.write(z.numpy().astype(np.float32).tobytes())
            work.state["outputs"] = start + len(batch)
            work.commit()
            bar.update(len(batch))
    work.commit(force=True)
    return (mapped_work_rows(work, "features.f32", np.float32, teacher.feature_dim),  # 1 GB at a million images
            work.rows("logits.f32", np.float32, classes))


def teacher_findings(state, data, all_logits, paths, echo):
    """The doubtful labels of the images the checkpoint trained without their labels, by its teacher
    (calibrated on each set apart): test/, a --val hold-out, and label.py --accepted's images (their
    labels a model's: its chance warning would say nothing of the teacher)."""
    classes, n_train = state["config"].classes, len(data.train_y)
    val_idx, unlabeled_idx = state["val_idx"].numpy(), state["unlabeled_idx"].numpy()
    accepted_idx = unlabeled_idx[data.train_y.numpy()[unlabeled_idx] >= 0]  # in labeled/, trained unlabeled
    findings = []
    for name, held, labels, warn in (("test/", np.arange(n_train, n_train + len(data.test_y)), data.test_y, True),
                                     ("labeled/ (--val hold-out)", val_idx, data.train_y[val_idx], True),
                                     ("labeled/ by label.py --accepted", accepted_idx, data.train_y[accepted_idx], False)):
        if len(labels):
            logits = torch.from_numpy(np.array(all_logits[held]))
            if warn:
                warn_teacher_at_chance(name, logits, labels.numpy(), echo)
            temperature = fitted_or_one(logits.numpy(), labels.numpy())
            probabilities = torch.softmax(logits.double() / temperature, 1).numpy()
            findings += label_findings([paths[i] for i in held], labels.numpy(), probabilities, classes,
                                       f"{name}, the checkpoint's teacher")
    return findings


def kept(work, name, make):
    """A part's findings: kept in the work folder from before, else made (make()) and kept."""
    if name in work.state:
        return [Finding(*f) for f in work.state[name]]
    findings = make()
    work.state[name] = [list(astuple(f)) for f in findings]
    work.commit(force=True)
    return findings


def audit(state, data, root, device, work, *, folds=DEFAULT_FOLDS, steps=DEFAULT_STEPS, seed=0,
          echo=lambda line: None):
    """Every Finding for the checkpoint's own-images folder at root (its data restored), each kind in
    descending score; the parts done are kept in `work` (work.py) as they end."""
    config = state["config"]
    if data.files is None or not is_own_layout(root):
        raise UserError(f"--audit looks at an own-images folder (labeled/, unlabeled/, test/); "
                        f"{root if data.files is not None else config.dataset} is not one")
    classes, (mean, std) = config.classes, normalization(config, device)
    paths = FolderPaths(root, Names(data.files["train"], data.files["test"]))
    n_train = len(data.files["train"])
    images = ImageRows(data.train_x, data.test_x)
    _, teacher = restore_models(state, device)
    labeled_idx = state["labeled_idx"]
    findings = []
    try:
        logits, used = crossfit_logits(state, data, device, folds=folds, steps=steps, seed=seed, echo=echo, work=work)
    except UserError as e:  # a class with one labeled image: the rest of the audit still holds
        echo(f"audit: the labels of labeled/ are not checked: {e.message}")
    else:
        labels = data.train_y[labeled_idx].numpy()
        warn_at_chance(logits, labels, steps, echo)
        probabilities, _ = out_of_sample_probabilities(logits, labels)
        findings += label_findings([paths[i] for i in labeled_idx], labels, probabilities, classes,
                                   f"labeled/, {used}-fold cross-fitted")
    features, all_logits = teacher_outputs(teacher, *teacher_inputs(data, mean, std), work, len(classes))
    findings += teacher_findings(state, data, all_logits, paths, echo)
    digests = np.concatenate([data.digests["train"](), data.digests["test"]()])
    is_test = np.arange(len(images)) >= n_train
    all_labels = np.concatenate([data.train_y.numpy(), data.test_y.numpy()])
    with tqdm(total=len(images), desc="audit: copies", unit="img", disable=None, leave=False) as bar:
        findings += kept(work, "copies", lambda: copy_findings(paths, images, is_test, digests, all_labels, classes,
                                                               bar.update))
    labeled = np.zeros(len(images), bool)
    labeled[labeled_idx.numpy()] = True
    # a pretrained trunk's features alone (TRUNK_OUTLIER_MARGIN); a network's own, with thumbnails
    space, thumbnails, margin = ((features, images, OUTLIER_MARGIN) if data.features is None
                                 else (trunk_vectors(data), None, TRUNK_OUTLIER_MARGIN))
    findings += kept(work, "outliers", lambda: outlier_findings(paths, space, thumbnails, labeled, margin))
    wanted = {f.path for f in findings}
    digest_of = {p: digests[i].decode() for i, p in enumerate(paths[i] for i in range(len(paths))) if p in wanted}
    for finding in findings:
        finding.digest = digest_of.get(finding.path, "")
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
    for kind, what in (("label", "doubtful labels (labeled/ and test/)"),
                       ("conflict", "copies under two labels (one of the two is wrong)"), ("duplicate", "duplicates (within training, or within test/)"),
                       ("leak", "test images that are also in labeled/ or unlabeled/"),
                       ("outlier", "images like no class")):
        mine = [f for f in findings if f.kind == kind]
        shown = ", ".join(Path(f.path).name + (f" -> {f.suggestion}" if kind == "label" else
                                               f" ({f.given}) = {Path(f.suggestion).name}" if kind == "conflict" else "")
                          for f in mine[:3])
        lines.append(f"audit: {len(mine):,} {what}" + (f": {shown}{', ...' if len(mine) > 3 else ''}" if mine else ""))
    return lines
