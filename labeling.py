"""Labels back into an own-images folder: each listed image moves from unlabeled/ into
labeled/<class>/, checked in full before anything moves, never overwriting, one atomic rename per
file, every move logged in <folder>/label-log.csv so that a rerun skips what is done and the last
batch can be put back.
"""
import csv
import os
import time
from dataclasses import dataclass
from pathlib import Path

from images import is_hidden
from runs import UserError

LOG_NAME = "label-log.csv"
LOG_HEADER = ("batch", "time", "action", "source", "target", "label")  # paths relative to the folder


@dataclass
class Move:
    source: Path   # relative to the folder: unlabeled/...
    label: str


def known_classes(data_dir):
    labeled = data_dir / "labeled"
    return sorted(p.name for p in labeled.iterdir() if p.is_dir() and not is_hidden(p.name)) if labeled.is_dir() else []


def read_log(data_dir):
    path = data_dir / LOG_NAME
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def applied_moves(log):
    """{source: (target, label)} of the moves of batches not undone."""
    undone = {r["batch"] for r in log if r["action"] == "undo"}
    return {r["source"]: (r["target"], r["label"]) for r in log if r["action"] == "move" and r["batch"] not in undone}


def relative_source(data_dir, path):
    """The path of a labels.csv row relative to the folder: taken as given (relative to the working
    directory) or else relative to the folder, the first that exists; None where it lies outside."""
    given, root = Path(path), Path(os.path.abspath(data_dir))
    inside = []
    for candidate in [given] if given.is_absolute() else [Path.cwd() / given, root / given]:
        absolute = Path(os.path.normpath(os.path.abspath(candidate)))
        if absolute.is_relative_to(root):
            if absolute.exists():
                return absolute.relative_to(root)
            inside.append(absolute.relative_to(root))
    return inside[0] if inside else None


def read_labels(csv_path):
    with open(csv_path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"path", "label"} <= set(reader.fieldnames):
            raise UserError(f"{csv_path} must have the columns path,label (it has {', '.join(reader.fieldnames or [])})")
        return [(r["path"], (r["label"] or "").strip()) for r in reader]


def plan(data_dir, rows, new_classes=False):
    """The moves the rows ask for, in order, and the number of rows applied before; exits 2 naming
    every bad row (unknown class, missing file, a path outside unlabeled/, a duplicate) before any move."""
    classes, done = set(known_classes(data_dir)), applied_moves(read_log(data_dir))
    moves, problems, seen, skipped = [], [], set(), 0
    for line, (path, label) in enumerate(rows, start=2):
        source = relative_source(data_dir, path)
        where = f"line {line} ({path})"
        if source is None or source.parts[:1] != ("unlabeled",) or len(source.parts) < 2:
            problems.append(f"{where}: not a file under {data_dir / 'unlabeled'}")
        elif source in seen:
            problems.append(f"{where}: listed twice")
        elif not label or "/" in label or "\\" in label or is_hidden(label) or label in (".", ".."):
            problems.append(f"{where}: {label!r} cannot be a class folder's name")
        elif label not in classes and not new_classes:
            problems.append(f"{where}: unknown class {label!r} (labeled/ has {', '.join(sorted(classes))}; "
                            "--new-classes creates it)")
        elif not (data_dir / source).is_file():
            target, done_label = done.get(source.as_posix(), (None, None))
            if target and done_label == label and (data_dir / target).is_file():
                skipped += 1
            else:
                problems.append(f"{where}: no such file")
        else:
            moves.append(Move(source, label))
        if source is not None:
            seen.add(source)
    if problems:
        shown = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise UserError(f"nothing was moved: {len(problems)} of {len(rows)} rows cannot be applied: {shown}")
    return moves, skipped


def free_name(folder, name, taken):
    """name, or name-1, name-2, ... with its extension: the first that neither exists nor is taken."""
    stem, suffix = Path(name).stem, Path(name).suffix
    candidate, k = name, 0
    while (folder / candidate).exists() or (folder / candidate) in taken:
        k += 1
        candidate = f"{stem}-{k}{suffix}"
    return folder / candidate


class Log:
    """label-log.csv, appended a row at a time and flushed to disk before the move it records."""

    def __init__(self, data_dir):
        self.path = data_dir / LOG_NAME
        new = not self.path.exists()
        self.file = open(self.path, "a", newline="")
        self.writer = csv.writer(self.file, lineterminator="\n")
        if new:
            self.writer.writerow(LOG_HEADER)

    def write(self, batch, action, source, target, label):
        self.writer.writerow((batch, time.strftime("%Y-%m-%dT%H:%M:%S"), action, source, target, label))
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self):
        self.file.close()


def apply(data_dir, moves):
    """Move each image into labeled/<label>/ (a taken name gets a suffix), each with one rename,
    logged first. Returns the batch number."""
    log_rows = read_log(data_dir)
    batch = 1 + max((int(r["batch"]) for r in log_rows), default=0)
    log, taken = Log(data_dir), set()
    try:
        for move in moves:
            folder = data_dir / "labeled" / move.label
            if not folder.exists():
                log.write(batch, "mkdir", "", folder.relative_to(data_dir).as_posix(), move.label)
                folder.mkdir(parents=True)
            target = free_name(folder, move.source.name, taken)
            taken.add(target)
            log.write(batch, "move", move.source.as_posix(), target.relative_to(data_dir).as_posix(), move.label)
            os.rename(data_dir / move.source, target)
    finally:
        log.close()
    return batch


def undo(data_dir):
    """Put the last batch not yet undone back: each moved file to where it was, the class folders it
    created removed. Returns (batch, files put back), or None where there is nothing to undo."""
    log_rows = read_log(data_dir)
    undone = {r["batch"] for r in log_rows if r["action"] == "undo"}
    batches = [r["batch"] for r in log_rows if r["action"] == "move" and r["batch"] not in undone]
    if not batches:
        return None
    batch = batches[-1]
    mine = [r for r in log_rows if r["batch"] == batch]
    log, restored = Log(data_dir), 0
    try:
        for r in reversed([r for r in mine if r["action"] == "move"]):
            source, target = data_dir / r["source"], data_dir / r["target"]
            if target.is_file() and not source.exists():  # a move a kill cut short never happened
                source.parent.mkdir(parents=True, exist_ok=True)
                os.rename(target, source)
                restored += 1
        for r in (r for r in mine if r["action"] == "mkdir"):
            folder = data_dir / r["target"]
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        log.write(batch, "undo", "", "", "")
    finally:
        log.close()
    return int(batch), restored
