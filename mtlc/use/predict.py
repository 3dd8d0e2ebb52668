"""The --predict job of evaluate.py: a Classifier of the checkpoint, calibrated on its held-out
images; the acceptance threshold of --max-error; one CSV row per image (or, with --suggest, per
image to label next) streamed to a file or stdout; the review page; one summary line per outcome.
The files are streamed as they are found, never listed whole; with a file to write (or a threshold to
find: it is for the images' own class proportions, label_shift.py, so it waits for the last image), the
predictions are kept on disk as they are made (prediction_rows.py), beside the file so that a run
interrupted goes on where it stopped, and the outputs are made from them at the end, a row at a time.
"""
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional

import click
import numpy as np
from tqdm import tqdm

from ..data.files import ImageFiles, describe_hidden, describe_others
from ..disk.console import is_text, path_text, shown, stdout_rows
from ..disk.runs import atomic_write
from ..disk.work import Work, claimed, work_folder
from ..errors import UserError
from ..train.checkpoints import restore_data
from ..train.model import ModelConfig
from . import label_studio
from .class_shift import class_shift
from .label_shift import threshold_for
from .classifier import Classifier, checkpoint_identity, labeled_features
from .figures import plot_coverage
from .outliers import OUTLIER_MARGIN, TRUNK_OUTLIER_MARGIN
from .prediction_rows import PredictionStore, is_accepted, write_rows
from .report import describe_acceptance, describe_calibration, method_name
from .review import write_audit_review, write_review
from .orders import DEFAULT_ORDER, suggested_rows
from .unseen import FOLDS


@dataclass
class PredictOptions:
    """What --predict was asked for (evaluate.py's options of the same names)."""
    model_name: str = "teacher"
    csv_path: Optional[str] = None
    batch_size: int = 256
    data_dir: Optional[str] = None
    max_error: Optional[float] = None
    coverage: Optional[str] = None
    suggest_n: Optional[int] = None
    order: str = DEFAULT_ORDER
    seed: int = 0
    as_json: bool = False
    review: Optional[str] = None
    review_per_class: int = 1000
    review_max: int = 2000
    label_studio: Optional[str] = None
    label_studio_root: Optional[str] = None


class Tally:
    """The predictions that pass through it, counted: rows, unreadable files (each reported as it
    passes, above the progress bar where there is one), names that are not UTF-8 text and, with a
    threshold, accepted ones; and the images predicted a class (those like no class left out, as they are
    never accepted), in the order of classes."""

    def __init__(self, threshold, classes, bar=None):
        self.threshold, self.bar, self.classes = threshold, bar, list(classes)
        self.rows = self.failed = self.accepted = self.not_text = self.strays = 0
        self.per_class, self.index = np.zeros(len(self.classes), int), {c: k for k, c in enumerate(self.classes)}

    def count(self, predictions):
        for p in predictions:
            self.rows += 1
            self.not_text += not is_text(str(p.path))
            if self.bar is not None:
                self.bar.update()
            if p.label is None:
                self.failed += 1
                message = f"cannot read {shown(p.path)}: {p.reason}"
                self.bar.write(message, file=sys.stderr) if self.bar is not None else say(message)
            else:
                self.strays += p.like_no_class
                self.per_class[self.index[p.label]] += not p.like_no_class
                self.accepted += self.threshold is not None and is_accepted(p, self.threshold)
            yield p


def say(line):
    click.echo(line, err=True)


def predict(path, state, targets, device, options):
    """--predict of the checkpoint at path (its state loaded) on the image files under targets.
    Returns the number of files that could not be read."""
    o = options
    files = ImageFiles(targets)
    count, listing = files.survey(dict(zip(("--csv", "--review", "--coverage", "--label-studio", "its labeling config"),
                                           (o.csv_path, o.review, o.coverage, o.label_studio,
                                            o.label_studio and label_studio.config_path(o.label_studio)))))
    where = ", ".join(map(str, targets))
    if files.hidden:
        say(describe_hidden(files.hidden, where))
    if not count:
        raise UserError(f"--predict: no image files in {where}" + (f": {describe_others(files.left_out, where)}"
                                                                 if files.others else ""))
    if files.others:
        say(describe_others(files.left_out, where))
    # before any work: the images must lie where Label Studio can serve them
    studio = label_studio.local_storage(files, o.label_studio_root) if o.label_studio else None
    output = o.csv_path or o.review or o.label_studio
    with claimed(work_folder(output) if output else None) as claim:  # a busy or unwritable output: refused now
        return predicted(path, state, device, o, (files, count, listing, targets), output, studio, claim)


def predicted(path, state, device, o, listed, output, studio, claim):
    """predict's work once its inputs are checked (listed: the ImageFiles, their count, listing and
    targets) and its output's work folder claimed."""
    files, count, listing, targets = listed
    classifier, cal = calibrated(state, device, o, path)
    summary = dict(checkpoint=str(path), model=o.model_name, **(cal.summary() if cal else dict(temperature=None)),
                   unseen_heads=FOLDS if classifier.unseen else 0, like_no_class=0 if classifier.strays else None)
    bar = tqdm(total=count, desc="predicting", unit="img", disable=None, file=sys.stderr)
    if not (output or o.suggest_n or o.max_error is not None or o.coverage):  # rows straight to stdout as they come
        tally = Tally(None, classifier.classes, bar)
        write_stdout(tally.count(classifier.predict_files(files, o.batch_size)), None, strays=classifier.strays)
        bar.close()
        return report(path, o, tally, files.others, summary, None, cal)
    key = dict(step="predict", checkpoint=checkpoint_identity(path), model=o.model_name,
               temperature=classifier.temperature, ceiling=classifier.ceiling, listing=listing,
               features=bool(o.suggest_n), unseen=classifier.unseen is not None, strays=classifier.strays)
    with kept_predictions(output, key, classifier.model.feature_dim if o.suggest_n else None, claim) as kept:
        if kept.done:
            say(f"going on from {kept.work.folder}: {kept.done:,} of {count:,} images were predicted before")
            bar.update(kept.done)
        kept.fill(classifier.predict_files(itertools.islice(files, kept.done, None), o.batch_size), bar.update,
                  o.batch_size)
        bar.close()
        # the threshold once every image is predicted: it is for their class proportions (label_shift.py)
        found, threshold = (threshold_for(cal, kept.rows(), classifier.classes, o.max_error) if o.max_error is not None
                            else (None, None))
        if o.coverage:
            plot_coverage(cal, o.max_error, found, o.coverage,
                          f"{state['config'].dataset}, {method_name(state)} {o.model_name}: held-out {cal.source} images")
            say(f"wrote {o.coverage}")
        tally = Tally(threshold, classifier.classes)
        for _ in tally.count(kept.rows()):
            pass
        if tally.rows != count:  # work this run did not write, or a folder changed under it: never a short output
            kept.work.remove()
            raise UserError(f"the predictions kept for this output are {tally.rows:,} rows for the {count:,} images "
                            f"listed (the images changed while it ran?); nothing was written: run it again")
        chosen = write_outputs(kept, Outcome(path, state, targets, classifier, cal, found, threshold, tally), o, studio)
        kept.work.remove()
    return report(path, o, tally, files.others, summary, found, cal, suggested=chosen)


def calibrated(state, device, o, path):
    """(the Classifier of --model, its calibration on the held-out images or None); refused here, before
    any work, where --max-error or --coverage has no held-out images to stand on."""
    classifier = Classifier(state, model=o.model_name, device=device)
    cal = unseen_calibration(classifier, path, o) or classifier.calibrate(o.data_dir, echo=say)
    # the heads' own temperature: not the checkpoint's (evaluate.py --json), whose head saw the images
    model = f"{FOLDS} heads' {o.model_name}s" if classifier.unseen else o.model_name
    say(describe_calibration(dict(model=model, **cal.summary())) if cal else
        f"confidences are uncalibrated (the raw softmax): {classifier.uncalibrated}")
    if cal is None and (o.max_error is not None or o.coverage):
        raise UserError(f"--max-error and --coverage need the checkpoint's held-out labeled images: "
                        f"{classifier.uncalibrated}")
    return classifier, cal


def unseen_calibration(classifier, path, o):
    """The calibration of heads that never saw an image (unseen.py) where the checkpoint is a head
    on a frozen trunk; else None, said in a line where it is such a head but they cannot be had."""
    if not ModelConfig.of_run(classifier.config).keeps_features:
        return None
    why_not = classifier.calibrate_unseen(checkpoint_identity(path), o.data_dir, echo=say)
    if why_not:
        say(f"the images it trained on are predicted by the checkpoint itself, and it is surer of them than of the "
            f"held-out ones: {why_not}")
        return None
    say(f"each image is predicted by one of {FOLDS} heads trained as the checkpoint's was, the one that never saw it "
        f"(an image it trained on without a label, by the head that left it out): the calibration holds for them too")
    return classifier.calibration


class Outcome(NamedTuple):
    """What a --predict run found, for its outputs."""
    path: str
    state: dict
    targets: list
    classifier: Classifier
    cal: Optional[object]
    found: Optional[object]
    threshold: Optional[float]
    tally: Tally


def write_outputs(kept, r, o, studio):
    """The CSV (or the images to label next), the review page and Label Studio's tasks of the kept
    predictions (r: the run's Outcome); returns the rows --suggest chose, or None."""
    config = r.state["config"]
    rows, extra, chosen = kept.rows, None, None
    if o.suggest_n:
        labeled = labeled_features(r.state, r.classifier.model, r.classifier.device, o.data_dir, echo=say)
        chosen, clusters = suggested_rows(kept, labeled, order=o.order, n=o.suggest_n, seed=o.seed)
        rows, extra = (lambda: chosen), [("cluster", clusters)]

    def write_csv(binary_file):  # streams into atomic_write's temp file: a killed run leaves no partial CSV
        text = path_text(binary_file)
        write_rows(text, rows(), r.threshold, extra, strays=r.classifier.strays)
        text.flush()
        text.detach()  # leave the file to atomic_write

    if o.csv_path:
        atomic_write(o.csv_path, write_csv)
        if r.tally.not_text:
            say(f"{o.csv_path}: {r.tally.not_text:,} names are not UTF-8 text and are written as their own bytes "
                f"(label.py reads them back; elsewhere read the CSV with errors='surrogateescape', or rename them)")
    elif not (o.review or o.label_studio):  # with --review or --label-studio and no --csv, those are the output
        write_stdout(rows(), r.threshold, extra, strays=r.classifier.strays)
    predicted, cal = r.tally.rows - r.tally.failed, r.cal
    if o.review:
        # Every output holds what the run chose: with --suggest, the images to label next, not every one.
        shown, apart = write_review(o.review, rows(), config.classes, per_class=o.review_per_class,
                                most=o.review_max, threshold=r.found.confidence if r.found else None,
                                max_error=o.max_error, title=f"Review: {', '.join(map(str, r.targets))}",
                                summary=(f"the {len(chosen):,} to label next of " if chosen is not None else "")
                                + f"{predicted:,} images predicted by the {o.model_name} of {r.path}"
                                        + (f"; {cal.source} images calibrated its confidences (temperature "
                                           f"{cal.temperature:.2f})" if cal and not cal.uncalibrated
                                           else "; confidences uncalibrated"))
        say(f"wrote {o.review}: {shown:,} images shown" + (f"; {apart:,} listed apart on the page (unreadable, no "
                                                            f"thumbnail, or a name that is not UTF-8 text)" if apart else ""))
    if o.label_studio:
        studio_root, studio_storage = studio
        tasks = label_studio.write_project(o.label_studio, rows(), config.classes, studio_root,
                                           f"mtlc {method_name(r.state)} {o.model_name} {r.path}")
        say(f"wrote {o.label_studio} ({tasks:,} tasks) and {label_studio.config_path(o.label_studio)}")
        for line in label_studio.setup_lines(studio_root, studio_storage, o.label_studio, o.data_dir or config.data_dir):
            say(line)
    return chosen


def write_stdout(rows, threshold, extra=None, strays=False):
    """The CSV to stdout, UTF-8 whatever the console's encoding: the names label.py reads back; a
    stdout that refuses a write ends the run in one line (console.stdout_rows)."""
    with stdout_rows() as text:
        write_rows(text, rows, threshold, extra, strays)


@contextlib.contextmanager
def kept_predictions(output, key, feature_dim, claim=None):
    """The PredictionStore of a run: in the work folder beside its first output file (claim: that
    folder, held since the run began), where an interrupted run's predictions are taken up again;
    without one (--suggest to stdout), in a temporary folder."""
    with contextlib.ExitStack() as stack:
        folder = work_folder(output) if output else Path(stack.enter_context(tempfile.TemporaryDirectory())) / "work"
        work = Work(folder, key, echo=say, claim=claim)
        with work.kept_if_interrupted("the predictions made so far"):
            yield PredictionStore(work, feature_dim)


def report(path, o, tally, others, summary, found, cal, suggested=None):
    """The run's closing lines (and --json's summary); returns the number of files that could not be read."""
    n, failed = tally.rows, tally.failed
    say(f"predicted {n - failed:,} of {n:,} images with the {o.model_name} of {path}"
        + (f" ({'1 file that is not an image' if others == 1 else f'{others} files that are not images'} ignored)"
           if others else "")
        + (f"; {failed} could not be read (empty prediction)" if failed else "")
        + (f"; the {len(suggested):,} to label next, best first" if suggested is not None else "")
        + (f"; wrote {o.csv_path}" if o.csv_path else ""))
    if summary.get("like_no_class") is not None:
        summary["like_no_class"] = tally.strays
    if tally.strays:
        say(f"{tally.strays:,} of them lie farther from the labeled images than those lie from each other (a blank "
            f"page, noise, another kind of image?): like_no_class 1{', never accepted' * (o.max_error is not None)} "
            f"(in the checkpoint's own folder, "
            f"evaluate.py --audit lists them and label.py --set-aside outlier moves them out)")
    if o.max_error is not None:
        say(describe_acceptance(tally.accepted, n - failed, o.max_error, found, cal, bool(summary['unseen_heads'])))
        summary.update(max_error=o.max_error, accepted=tally.accepted, predicted=n - failed,
                       threshold=found.confidence if found else None)
        shift = class_shift(cal.predicted, tally.per_class, tally.classes) if cal is not None else None
        if shift:
            say(shift.line(cal.source))
        summary.update(class_shift=shift.summary() if shift else None)
    if o.as_json:
        click.echo(json.dumps(summary))
    return failed


def export(path, state, out, model_name, device, data_dir):
    """--onnx of the checkpoint at path: its model calibrated on its held-out images, as ONNX."""
    from .onnx_export import export_onnx
    classifier = Classifier(state, model=model_name, device=device)
    cal = classifier.calibrate(data_dir, echo=say)
    export_onnx(classifier, out, path)
    say(f"wrote {out}: the {model_name} of {path} as ONNX, uint8 images (N, 3, {classifier.image_size}, "
        f"{classifier.image_size}) in, probabilities of its {len(classifier.classes)} classes out (their names in the "
        f"model's metadata); " + (describe_calibration(dict(model=model_name, **cal.summary())) if cal
                                                 else f"uncalibrated (the raw softmax): {classifier.uncalibrated}"))


def run_audit(path, state, out, review, device, *, data_dir, folds, steps, seed, most=2000):
    """--audit of the checkpoint at path: the findings (audit.py) to the CSV `out`, one line per
    kind, and with `review` the page of doubtful labels and copies (at most `most` of each kind). The
    parts done are kept beside `out` until it is written: an interrupted audit goes on from there."""
    from .audit import audit, describe_audit, write_audit
    root = data_dir or state["config"].data_dir
    data = restore_data(state, data_dir, echo=say)
    start = time.perf_counter()
    key = dict(step="audit", checkpoint=checkpoint_identity(path), root=os.path.abspath(root), folds=folds, steps=steps,
               seed=seed, contents=data.contents, device=device.type, outliers=[OUTLIER_MARGIN, TRUNK_OUTLIER_MARGIN, "trunk alone"])
    work = Work(work_folder(out), key, echo=say)
    if work.resumed:
        say(f"audit: going on from {work.folder} (the parts an earlier run finished are kept)")
    with work.kept_if_interrupted("the audit's parts done so far"):
        findings = audit(state, data, root, device, work, folds=folds, steps=steps, seed=seed, echo=say)
        write_audit(out, findings)
    work.remove()
    for line in describe_audit(findings):
        say(line)
    say(f"wrote {out} ({len(findings):,} findings, {time.perf_counter() - start:.0f} s)")
    if review:
        shown, _ = write_audit_review(review, findings, state["config"].classes, most=most,
                                      title=f"Audit: {root}", summary=f"{len(findings):,} findings in {root}")
        say(f"wrote {review}: {shown:,} doubtful labels shown, with the copies found")
