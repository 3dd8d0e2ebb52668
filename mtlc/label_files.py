"""What label.py reads and writes besides the images: the labels file (labels.csv, a predictions
CSV's accepted rows, or an audit CSV's findings to set aside), the log of every move
(<folder>/label-log.csv), and the check that a path read from either names a place inside the
folder. Both files may come with a folder from someone else: nothing in them is trusted, and the log
is opened without following a link (nofollow.py).
"""
import contextlib
import csv
import functools
import hashlib
import io
import os
import posixpath
import re
import time
from typing import NamedTuple, Optional

from . import label_studio
from .console import PATH_ERRORS, csv_writer, path_text
from .errors import MoveFailed, UserError
from .files import DIGEST_BYTES, DIGEST_COLUMN, open_regular
from .nofollow import open_kept

LOG_NAME = "label-log.csv"
# Paths relative to the folder; blake2b: the hash of the moved file's bytes (logs written before it
# have the first six columns only).
LOG_HEADER = ("batch", "time", "action", "source", "target", "label", DIGEST_COLUMN)
# Where label.py sets an image aside (a copy, a leak into test/, an image like no class): training
# reads labeled/, unlabeled/ and test/ only. The image keeps its path under it:
# test/dog/2.png -> set-aside/test/dog/2.png.
ASIDE = "set-aside"
# The parts of a folder label.py moves images from.
SOURCES = ("unlabeled", "labeled", "test")
# The values of a labels file's optional `action` column.
ACTIONS = ("label", "set-aside")
# The kinds of an audit CSV's findings that --set-aside takes (audit.KINDS but `label`).
ASIDE_KINDS = ("duplicate", "leak", "outlier")


class LabelRow(NamedTuple):
    line: int
    path: str
    label: str             # "" for a row that sets its image aside
    digest: Optional[str]  # the hash of the bytes of the image the row was written for; None: not given
    aside: bool = False


def text_of(binary, path, what):
    """A text stream of a CSV file's bytes, read as needed: UTF-16 where it starts with that
    byte-order mark (Excel's "Unicode text"), else UTF-8 (a BOM skipped) with undecodable bytes kept as
    surrogate escapes: a path written from a name that is not UTF-8 reads back to the same name, and a
    path in another encoding (cp1252) names no file and is refused as such."""
    head = binary.peek(2)[:2] if hasattr(binary, "peek") else b""
    if head in (b"\xff\xfe", b"\xfe\xff"):
        return io.TextIOWrapper(binary, encoding="utf-16", newline="")
    return io.TextIOWrapper(binary, encoding="utf-8-sig", errors=PATH_ERRORS, newline="")


def csv_records(text, path, what):
    """(the columns, a stream of (line number, {column: value})) of a CSV text stream; exit 2 for a
    file the csv module cannot parse (a NUL byte, an unclosed quote) or a UTF-16 file that is not."""
    def guarded(step):
        try:
            return step()
        except csv.Error as exc:
            raise UserError(f"cannot read {what} {path} as CSV: {exc}") from None
        except UnicodeDecodeError:
            raise UserError(f"{what} {path} starts as UTF-16 but is not: save it as UTF-8") from None

    reader = csv.DictReader(text)
    columns = guarded(lambda: reader.fieldnames) or []

    def records():
        while True:
            row = guarded(lambda: next(reader, None))
            if row is None:
                return
            yield reader.line_num, row
    return columns, records()


def open_labels(csv_path):
    """The labels file as a buffered binary file (a link you named is followed, a pipe refused)."""
    try:
        return open(open_regular(csv_path), "rb")
    except FileNotFoundError:
        raise UserError(f"--apply: {csv_path} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot read labels file {csv_path}: {exc.strerror or exc}") from None


def read_labels(csv_path, accepted=False, set_aside=()):
    """(a stream of LabelRow, the Label Studio export or None) of a labels.csv (columns path,label;
    optional blake2b, the image each row was written for, and action: label or set-aside), or, with
    accepted, of the rows of a predictions CSV (evaluate.py --predict --max-error --csv) that
    --max-error accepted, the prediction as the label, or, with set_aside (kinds), of the findings of
    those kinds of an audit CSV (evaluate.py --audit), each to be set aside; or of a Label Studio
    export (JSON, JSON-MIN or CSV) of the tasks evaluate.py --label-studio wrote (label_studio.ExportLabels:
    a row per labeled task, the tasks without a label counted). The CSV's columns are checked here;
    its rows are read as the stream is (a million rows are never in memory at once), and a row without
    a path or label, or with an action it does not know, exits 2 when it is reached, naming its line:
    before anything moves, since label.py plans every row first. The file may be a link (you named
    it), never a pipe."""
    binary = open_labels(csv_path)
    text = text_of(binary, csv_path, "labels file")
    try:
        header = text.readline()
        text.seek(0)
    except UnicodeDecodeError:
        raise UserError(f"labels file {csv_path} starts as UTF-16 but is not: save it as UTF-8") from None
    if label_studio.is_export(csv_path, header):
        if accepted or set_aside:
            raise UserError(f"--accepted and --set-aside read evaluate.py's CSVs; {csv_path} is a Label Studio export")
        with text:
            export = label_studio.read_export(csv_path, text)
        return [LabelRow(n, path, label, digest) for n, (path, label, digest) in enumerate(export.rows, 1)], export
    columns, records = csv_records(text, csv_path, "labels file")
    needed = (("kind", "path") if set_aside else ("path", "prediction", "accepted") if accepted else ("path", "label"))
    if not set(needed) <= set(columns):
        text.close()
        hint = (" (evaluate.py --predict writes `accepted` only with --max-error)" if accepted and
                {"path", "prediction"} <= set(columns) else " (evaluate.py --audit writes it)" if set_aside else "")
        raise UserError(f"{csv_path} must have the columns {','.join(needed)} (it has {', '.join(columns)}){hint}")
    return label_rows(csv_path, text, records, accepted, set_aside), None


def label_rows(csv_path, text, records, accepted, set_aside):
    """The LabelRows of a labels file's records (read_labels), the file closed at the end."""
    column = "kind" if set_aside else "prediction" if accepted else "label"
    with text:
        for line, r in records:
            if accepted and (r.get("accepted") or "").strip() != "1":
                continue
            if set_aside and (r.get("kind") or "").strip() not in set_aside:
                continue
            if r.get("path") is None or r.get(column) is None or None in r:
                raise UserError(f"nothing was moved: line {line} of {csv_path} has another number of columns than its "
                                f"header")
            action = "set-aside" if set_aside else (r.get("action") or "label").strip()
            if action not in ACTIONS:
                raise UserError(f"nothing was moved: line {line} of {csv_path}: action {action!r} is none of "
                                f"{', '.join(ACTIONS)}")
            label = "" if set_aside else r[column]  # as written: a label names exactly one class folder
            if action == "set-aside" and label:
                raise UserError(f"nothing was moved: line {line} of {csv_path} sets its image aside and gives it the "
                                f"label {label!r}: one or the other")
            digest = (r.get(DIGEST_COLUMN) or "").strip().lower() or None
            yield LabelRow(line, r["path"], label, digest, action == "set-aside")


def remembered_realpath():
    """os.path.realpath remembered per path: a million rows in a thousand folders resolve each folder
    once (within one run of checks, before anything moves)."""
    return functools.lru_cache(maxsize=2 ** 16)(os.path.realpath)


def outside_reason(root, relative, first_parts, realpath=os.path.realpath):
    """Why `relative` ('/'-separated, as the log and the plan write paths) does not name a place
    inside the folder root under one of first_parts, or None: an absolute path, a '..', '.' or
    empty part, a NUL, another first part, or a parent folder that leads outside root through a
    link (links resolved, by `realpath`). A backslash is a character of a name like any other."""
    if not relative or "\0" in relative:
        return "an empty path or one with a NUL byte"
    try:
        os.fsencode(relative)
    except UnicodeError:  # a lone surrogate (valid in JSON): no file name can hold it
        return "a path no file name on this system can hold (a lone surrogate)"
    if relative.startswith("/"):
        return "an absolute path"
    parts = relative.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "a path with an empty, '.' or '..' part"
    if parts[0] not in first_parts:
        return f"not a path under {' or '.join(f'{p}/' for p in first_parts)}"
    real_root = realpath(os.fspath(root))
    parent = realpath(os.path.join(real_root, posixpath.dirname(relative)))
    if parent != real_root and not parent.startswith(real_root + os.sep):
        return "it leads outside the folder through a link"
    return None


def linked_folder(root, folder):
    """The first folder of the path `folder` (relative to root, '/'-separated) that is a link, even one
    leading inside the folder (set-aside/ shipped as a link to labeled/red would make an image set
    aside a training image of class red), or None: label.py moves files between real folders only. A
    part that does not exist yet (label.py makes it) ends the search."""
    path = os.fspath(root)
    for part in folder.split("/") if folder else ():
        path = os.path.join(path, part)
        if os.path.islink(path):
            return posixpath.relpath(path.replace(os.sep, "/"), os.fspath(root).replace(os.sep, "/"))
        if not os.path.lexists(path):
            return None
    return None


def inside(root, relative, first_parts, realpath=os.path.realpath):
    """Whether `relative` names a place inside root under one of first_parts (outside_reason)."""
    return outside_reason(root, relative, first_parts, realpath) is None


def target_part(source):
    """Where a labeled file goes: an unlabeled/ or labeled/ image into labeled/<class>/, a test/
    image (relabeled) into test/<class>/."""
    return "test" if source.startswith("test/") else "labeled"


def is_batch_number(text):
    """A batch number as this project writes it: ASCII digits ('²' is a digit to str.isdigit)."""
    return re.fullmatch(r"[0-9]{1,18}", text) is not None


def log_problem(data_dir, row, realpath=os.path.realpath):
    """Why a row of the log cannot be trusted, or None: another form than this project writes, or
    a path that leads outside the folder (links resolved by `realpath`)."""
    if None in row.values() or None in row:
        return "it does not have the log's columns"
    if not is_batch_number(row["batch"]):
        return f"its batch {row['batch']!r} is not a number"
    action, source, target, label = row["action"], row["source"], row["target"], row["label"]
    digest = row.get(DIGEST_COLUMN) or ""
    if digest and not re.fullmatch(f"[0-9a-f]{{{2 * DIGEST_BYTES}}}", digest):
        return f"its {DIGEST_COLUMN} {digest!r} is not a hash this project writes"
    if action == "undo":
        return None if not (source or target or label or digest) else "an undo names no files"
    if action == "mkdir":
        parts = target.split("/")
        ok = (not source and not digest and inside(data_dir, target, ("labeled", "test", ASIDE), realpath) and (
            (target == "labeled" and not label) or (len(parts) == 2 and parts[0] in ("labeled", "test") and parts[1] == label)
            or (parts[0] == ASIDE and not label)))
        return None if ok else (f"{target!r} is not a folder label.py makes (labeled/, labeled/<class>, test/<class> or "
                                f"under {ASIDE}/) inside the folder")
    if action not in ("move", "aside"):
        return f"its action {action!r} is none of move, aside, mkdir, undo"
    if not inside(data_dir, source, SOURCES, realpath):
        return f"{source!r} is not a path under unlabeled/, labeled/ or test/ inside the folder"
    if action == "aside":
        folder = posixpath.dirname(target)
        ok = (not label and folder == f"{ASIDE}/{posixpath.dirname(source)}" and inside(data_dir, target, (ASIDE,), realpath))
        return None if ok else f"{target!r} is not a path under {ASIDE}/{posixpath.dirname(source)}/ inside the folder"
    part = target_part(source)
    if target.count("/") != 2 or target.split("/")[1] != label or not inside(data_dir, target, (part,), realpath):
        return f"{target!r} is not a path {part}/{label}/<name> inside the folder"
    return None


def last_line_end(fd, size):
    """The length of a file's bytes up to its last newline (a torn last line left out), read from the end."""
    end = size
    while end > 0:
        start = max(0, end - 2 ** 16)
        block = os.pread(fd, end - start, start)
        at = block.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


class Prefix(io.RawIOBase):
    """The first `length` bytes of an open file descriptor, as a raw stream."""

    def __init__(self, fd, length):
        self.fd, self.length, self.at = fd, length, 0

    def readable(self):
        return True

    def readinto(self, buffer):
        data = os.pread(self.fd, min(len(buffer), self.length - self.at), self.at)
        buffer[:len(data)] = data
        self.at += len(data)
        return len(data)


def log_rows(data_dir):
    """The rows of <folder>/label-log.csv (dicts), each checked as it is read, a row at a time (a log
    of a million moves is never in memory): exit 2 naming the line where one is not a row this project
    writes (a log edited, or come with the folder from elsewhere); its paths must lie inside the
    folder, and the log must be a regular file (not a link, not a pipe). A last line without its
    newline (a write a full disk cut short) is left out: Log cuts it off before writing. Callers read
    the whole stream before they move anything."""
    path = data_dir / LOG_NAME
    try:
        fd = open_kept(path, os.O_RDONLY, "move log", writing=True)
    except FileNotFoundError:
        return
    try:
        text = text_of(io.BufferedReader(Prefix(fd, last_line_end(fd, os.fstat(fd).st_size))), path, "log")
        columns, records = csv_records(text, path, "log")
        if columns and tuple(columns) not in (LOG_HEADER, LOG_HEADER[:-1]):
            raise UserError(f"{path} cannot be trusted: its columns are not the log's ({', '.join(LOG_HEADER)}); the "
                            f"log may have been edited, or come with the folder from elsewhere: nothing was moved")
        realpath = remembered_realpath()
        for line, row in records:
            problem = log_problem(data_dir, row, realpath)
            if problem:
                raise UserError(f"{path} line {line} cannot be trusted: {problem}; the log may have been edited, or "
                                f"come with the folder from elsewhere: nothing was moved (mend or remove that line)")
            yield row
    finally:
        os.close(fd)


def undone_batches(data_dir):
    """The batches of the log that were put back (undo)."""
    return {r["batch"] for r in log_rows(data_dir) if r["action"] == "undo"}


def next_batch(data_dir):
    """The number the next batch of moves gets in the log."""
    return 1 + max((int(r["batch"]) for r in log_rows(data_dir)), default=0)


class Journey:
    """The moves of batches not undone that one file made, in order: where it was before the first
    and where the last took it."""

    def __init__(self, first):
        self.first, self.now = first, first


class Applied(NamedTuple):
    """One move of a batch not undone, and where its file is now."""
    journey: Journey
    label: str             # the class the move gave it ("" for a move aside)
    digest: Optional[str]  # the hash of its bytes when it was moved (None: not known)


def applied_moves(data_dir, sources, undone):
    """{each of `sources` (paths relative to the folder) that a move of a batch not undone (`undone`:
    undone_batches) took a file from: Applied}, each such file's later moves followed in order (a file
    labeled, then relabeled from the audit: its journey ends where the last move took it). One pass
    over the log, memory in proportion to the sources asked about."""
    sources = set(sources)
    journeys, applied = {}, {}  # journeys: {where a followed file is now: its Journey}
    for r in log_rows(data_dir):
        if r["action"] in ("move", "aside") and r["batch"] not in undone:
            journey = journeys.pop(r["source"], None)
            if journey is None and r["source"] in sources:
                journey = Journey(r["source"])
            if journey is not None:
                journey.now = r["target"]
                journeys[r["target"]] = journey
                if r["source"] in sources:
                    applied[r["source"]] = Applied(journey, r["label"], r.get(DIGEST_COLUMN) or None)
    return applied


def place_key(path):
    """A path as 16 bytes (BLAKE2b): a million places a file was moved to, remembered in little memory."""
    return hashlib.blake2b(path.encode("utf-8", PATH_ERRORS), digest_size=16).digest()


def relabeled_images(data_dir):
    """The paths (relative to the folder) of the labeled/ and test/ images that label.py moved from
    one class folder of their part to another (relabeled, e.g. from the audit's suggestion) in
    batches not undone, where they are now: held-out images among them are no longer independent of
    the model that suggested their new label (none where the folder has no log); exit 2 for a log that
    cannot be trusted: a run must not take relabeled images for independent ones. A file's journey is
    followed only where it starts in labeled/ or test/ (not where an earlier move brought it): the
    million images moved from unlabeled/ cost a set of 16-byte keys."""
    undone = undone_batches(data_dir)
    arrived, journeys, started = set(), {}, []
    for r in log_rows(data_dir):
        if r["action"] not in ("move", "aside") or r["batch"] in undone:
            continue
        journey, source = journeys.pop(r["source"], None), place_key(r["source"])
        if journey is None and r["source"].split("/")[0] in ("labeled", "test") and source not in arrived:
            journey = Journey(r["source"])
            started.append(journey)
        if journey is not None:
            journey.now = r["target"]
            journeys[r["target"]] = journey
        arrived.discard(source)  # the place is free: a file put there later starts a journey of its own
        arrived.add(place_key(r["target"]))
    return sorted(j.now for j in started if j.now != j.first and j.now.split("/")[0] == j.first.split("/")[0])


class Log:
    """label-log.csv, appended a batch of rows at a time and flushed to disk (one fsync a batch) before
    the moves they record, opened without following a link and checked to be a regular file of one
    name (nofollow.open_kept). A torn last line (no newline: a write a full disk cut short, whose move
    never happened) is cut off first and said; the log is never read whole."""

    def __init__(self, data_dir, echo):
        self.path = data_dir / LOG_NAME
        try:
            fd = open_kept(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, "move log", writing=True)
        except OSError as exc:
            raise MoveFailed(f"nothing was moved: cannot write {self.path}: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            whole = last_line_end(fd, size)
            if whole < size:
                os.ftruncate(fd, whole)
                echo(f"cut off the torn last line of {self.path} (a write cut short: its move never happened)")
            first = os.pread(fd, 2 ** 16, 0) if whole else b""
            self.header = first[:first.find(b"\n")].strip() if whole else None
            self.file = path_text(open(fd, "ab"))
        except OSError as exc:
            os.close(fd)
            raise MoveFailed(f"nothing was moved: cannot write {self.path}: {exc.strerror}") from None
        self.writer = csv_writer(self.file)
        self.columns = len(LOG_HEADER) if self.header is None or self.header.count(b",") + 1 == len(LOG_HEADER) \
            else len(LOG_HEADER) - 1  # a log from before the hash was kept keeps its six columns
        if self.header is None:
            try:
                self.put([LOG_HEADER])
            except OSError as exc:  # a full disk before the first row: no empty log is left behind
                self.close()
                with contextlib.suppress(OSError):
                    if self.path.stat().st_size == 0:
                        self.path.unlink()
                raise MoveFailed(f"nothing was moved: cannot write {self.path}: {exc.strerror or exc}") from None

    def row(self, batch, action, source="", target="", label="", digest=""):
        """A row of the log, as write takes it."""
        return (batch, time.strftime("%Y-%m-%dT%H:%M:%S"), action, source, target, label, digest or "")[:self.columns]

    def write(self, batch, action, source="", target="", label="", digest=""):
        self.put([self.row(batch, action, source, target, label, digest)])

    def put(self, rows):
        """Append rows and flush them to disk before anything they record happens."""
        self.writer.writerows(rows)
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self):
        with contextlib.suppress(OSError):
            self.file.close()
