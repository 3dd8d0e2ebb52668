"""label.py's log of every move (<folder>/label-log.csv): appended a chunk of moves at a time and flushed
to disk before the moves it records, read a row at a time, each row checked (the log may have been
edited, or come with the folder from elsewhere: it is trusted no more than a labels file), never
followed through a link (disk/opening.py); and what it tells: the batches to undo, where each moved file
is now, which held-out images were relabeled.
"""
import contextlib
import hashlib
import io
import os
import posixpath
import re
import time
from typing import NamedTuple, Optional

from ..data.files import DIGEST_BYTES, DIGEST_COLUMN
from ..disk.console import PATH_ENCODING, PATH_ERRORS, WholeWrites, csv_writer, shown
from ..disk.csv_text import csv_records, csv_text
from ..disk.opening import open_kept
from ..disk.outputs import LOG_NAME
from ..errors import MoveFailed, UserError
from .inputs import ASIDE, SOURCES, inside, remembered_realpath, target_part

# Paths relative to the folder; blake2b: the hash of the moved file's bytes (logs written before it
# have the first six columns only).
LOG_HEADER = ("batch", "time", "action", "source", "target", "label", DIGEST_COLUMN)
# The actions that move a file: a label a person gave (move), a model's prediction taken as the label
# (accept: label.py --accepted, unlabeled/ to labeled/<class>/), set aside (aside). A person's label
# given as a model's was (confirm) moves nothing: from then on the label is theirs.
MOVES = ("move", "accept", "aside")
CONFIRM = "confirm"


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
    if action not in MOVES + (CONFIRM,):
        return f"its action {action!r} is none of {', '.join(MOVES)}, {CONFIRM}, mkdir, undo"
    if action == CONFIRM and (source != target or not source.startswith("labeled/")):
        return "a confirmation names one labeled/ image as its source and its target"
    if not inside(data_dir, source, ("unlabeled",) if action == "accept" else SOURCES, realpath):
        return (f"{source!r} is not a path under {'unlabeled/' if action == 'accept' else 'unlabeled/, labeled/ or test/'}"
                f" inside the folder")
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


def log_rows(data_dir, checked=True):
    """The rows of <folder>/label-log.csv (dicts), each checked as it is read, a row at a time (a log
    of a million moves is never in memory): exit 2 naming the line where one is not a row this project
    writes (a log edited, or come with the folder from elsewhere); its paths must lie inside the
    folder, and the log must be a regular file (not a link, not a pipe). A last line without its
    newline (a write a full disk cut short) is left out: Log cuts it off before writing. Callers read
    the whole stream before they move anything. checked=False: the rows as they are (three quarters
    of the time goes to the checks), only for a pass that a checked one follows before anything is
    used."""
    path = data_dir / LOG_NAME
    try:
        fd = open_kept(path, os.O_RDONLY, "move log", writing=True)
    except FileNotFoundError:
        return
    try:
        text = csv_text(io.BufferedReader(Prefix(fd, last_line_end(fd, os.fstat(fd).st_size))))
        columns, records = csv_records(text, path, "log")
        if columns and tuple(columns) not in (LOG_HEADER, LOG_HEADER[:-1]):
            raise UserError(f"{path} cannot be trusted: its columns are not the log's ({', '.join(LOG_HEADER)}); the "
                            f"log may have been edited, or come with the folder from elsewhere: nothing was moved")
        realpath = remembered_realpath()
        for line, row in records:
            problem = log_problem(data_dir, row, realpath) if checked else None
            if problem:
                raise UserError(f"{path} line {line} cannot be trusted: {problem}; the log may have been edited, or "
                                f"come with the folder from elsewhere: nothing was moved (mend or remove that line)")
            yield row
    finally:
        os.close(fd)


def undone_batches(data_dir, checked=True):
    """The batches of the log that were put back (undo); checked: log_rows'."""
    return {r["batch"] for r in log_rows(data_dir, checked) if r["action"] == "undo"}


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
    action: str = "move"   # the move's (MOVES)


def applied_moves(data_dir, sources, undone):
    """{each of `sources` (paths relative to the folder) that a move of a batch not undone (`undone`:
    undone_batches) took a file from: Applied}, each such file's later moves followed in order (a file
    labeled, then relabeled from the audit: its journey ends where the last move took it). One pass
    over the log, memory in proportion to the sources asked about."""
    sources = set(sources)
    journeys, applied = {}, {}  # journeys: {where a followed file is now: its Journey}
    for r in log_rows(data_dir):
        if r["action"] in MOVES and r["batch"] not in undone:
            journey = journeys.pop(r["source"], None)
            if journey is None and r["source"] in sources:
                journey = Journey(r["source"])
            if journey is not None:
                journey.now = r["target"]
                journeys[r["target"]] = journey
                if r["source"] in sources:
                    applied[r["source"]] = Applied(journey, r["label"], r.get(DIGEST_COLUMN) or None, r["action"])
    return applied


def place_key(path):
    """A path as 16 bytes (BLAKE2b): a million places a file was moved to, remembered in little memory."""
    return hashlib.blake2b(path.encode("utf-8", PATH_ERRORS), digest_size=16).digest()


class AcceptedPlaces(dict):
    """{where an image label.py --accepted labeled is now: the hash of its bytes then (None: not
    logged)}, kept up as the log's rows of batches not undone are seen in order: a person's move or
    confirmation of one since makes its label theirs."""

    def see(self, row):
        if row["action"] in MOVES or row["action"] == CONFIRM:
            self.pop(row["source"], None)
        if row["action"] == "accept":
            self[row["target"]] = row.get(DIGEST_COLUMN) or None


def accepted_places(data_dir, undone):
    """The AcceptedPlaces of the log (rows checked by an earlier pass: undone_batches')."""
    places = AcceptedPlaces()
    for r in log_rows(data_dir, checked=False):
        if r["batch"] not in undone:
            places.see(r)
    return places


class History(NamedTuple):
    """What label-log.csv tells training about the images label.py moved (batches not undone)."""
    relabeled: list  # labeled/ and test/ images moved from one class folder of their part to another, where they are now
    accepted: dict   # AcceptedPlaces


def label_history(data_dir):
    """The History of a folder's log (empty where it has none), in one pass; exit 2 for a log that
    cannot be trusted: a run must not take relabeled images for independent ones.

    relabeled: held-out images among them are no longer independent of the model that suggested their
    new label (the audit's, say). A file's journey is followed only where it starts in labeled/ or
    test/ (not where an earlier move brought it: the million images moved from unlabeled/ cost a set
    of 16-byte keys), or at an image label.py --accepted labeled (a relabel of a model's label). accepted: the files whose last move was an accepted prediction; a person's move
    or confirmation of one since (the audit's relabel, a same-label row) makes its label a person's."""
    undone = undone_batches(data_dir, checked=False)  # every row is checked by the pass below
    arrived, journeys, started, accepted = set(), {}, [], AcceptedPlaces()
    for r in log_rows(data_dir):
        if r["batch"] in undone:
            continue
        was_accepted = r["source"] in accepted
        accepted.see(r)
        if r["action"] not in MOVES:
            continue
        journey, source = journeys.pop(r["source"], None), place_key(r["source"])
        if journey is None and (was_accepted or r["source"].split("/")[0] in ("labeled", "test") and source not in arrived):
            journey = Journey(r["source"])
            started.append(journey)
        if journey is not None:
            journey.now = r["target"]
            journeys[r["target"]] = journey
        arrived.discard(source)  # the place is free: a file put there later starts a journey of its own
        arrived.add(place_key(r["target"]))
    relabeled = sorted(j.now for j in started if j.now != j.first and j.now.split("/")[0] == j.first.split("/")[0])
    return History(relabeled, accepted)


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
                echo(f"cut off the torn last line of {shown(self.path)} (a write cut short: its move never happened)")
            first = os.pread(fd, 2 ** 16, 0) if whole else b""
            self.header = first[:first.find(b"\n")].strip() if whole else None
        except OSError as exc:
            os.close(fd)
            raise MoveFailed(f"nothing was moved: cannot write {self.path}: {exc.strerror}") from None
        self.fd = fd
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
        """Append rows and flush them to disk before anything they record happens. Where the OS takes
        part of them and refuses the rest (a full disk, a file-size limit), the part is cut off again:
        the log ends with a whole row, and the OSError says which file."""
        text = io.StringIO(newline="")
        csv_writer(text).writerows(rows)
        size = os.fstat(self.fd).st_size
        try:
            WholeWrites(self.fd).write(text.getvalue().encode(PATH_ENCODING, PATH_ERRORS))
            os.fsync(self.fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, size)
            exc.filename = str(self.path)
            raise

    def close(self):
        with contextlib.suppress(OSError):
            os.close(self.fd)
