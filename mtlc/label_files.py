"""What label.py reads and writes besides the images: the labels file (labels.csv, or a predictions
CSV's accepted rows), the log of every move (<folder>/label-log.csv), and the check that a path read
from either names a place inside the folder. Both files may come with a folder from someone else:
nothing in them is trusted.
"""
import contextlib
import csv
import io
import os
import posixpath
import time
from pathlib import Path

from .console import PATH_ERRORS, path_text
from .errors import MoveFailed, UserError


LOG_NAME = "label-log.csv"
LOG_HEADER = ("batch", "time", "action", "source", "target", "label")  # paths relative to the folder


def decoded_csv(path, what):
    """The text of a CSV file: UTF-16 where it starts with that byte-order mark (Excel's "Unicode
    text"), else UTF-8 (a BOM skipped) with undecodable bytes kept as surrogate escapes: a path
    written from a name that is not UTF-8 reads back to the same name, and a path in another encoding
    (cp1252) names no file and is refused as such."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}") from None
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            raise UserError(f"{what} {path} starts as UTF-16 but is not: save it as UTF-8") from None
    return data.decode("utf-8-sig", errors=PATH_ERRORS)


def csv_rows(text, path, what):
    """[(line number, {column: value})] of a CSV's text and its columns; exit 2 for a file the csv
    module cannot parse (a NUL byte, an unclosed quote)."""
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        return [(reader.line_num, row) for row in reader], reader.fieldnames or []
    except csv.Error as exc:
        raise UserError(f"cannot read {what} {path} as CSV: {exc}") from None


def read_labels(csv_path, accepted=False):
    """[(line, path, label)] of a labels.csv (columns path,label) or, with accepted, of the rows of a
    predictions CSV (evaluate.py --predict --max-error --csv) that --max-error accepted, the
    prediction as the label. A row without a path or label is refused here, naming its line."""
    rows, columns = csv_rows(decoded_csv(csv_path, "labels file"), csv_path, "labels file")
    needed = ("path", "prediction", "accepted") if accepted else ("path", "label")
    if not set(needed) <= set(columns):
        hint = (" (evaluate.py --predict writes `accepted` only with --max-error)" if accepted and
                {"path", "prediction"} <= set(columns) else "")
        raise UserError(f"{csv_path} must have the columns {','.join(needed)} (it has {', '.join(columns)}){hint}")
    if accepted:
        rows = [(line, r) for line, r in rows if (r.get("accepted") or "").strip() == "1"]
    column = "prediction" if accepted else "label"
    short = [line for line, r in rows if r.get("path") is None or r.get(column) is None]
    if short:
        raise UserError(f"nothing was moved: line {short[0]} of {csv_path} has fewer columns than its header"
                        + (f" (and {len(short) - 1} more lines)" if len(short) > 1 else ""))
    return [(line, r["path"], r[column].strip()) for line, r in rows]


def inside(root, relative, first_parts):
    """Whether `relative` ('/'-separated) names a place inside the folder root: no absolute path, no
    '..', '.' or empty part, no NUL, its first part one of first_parts, and its parent folder, links
    resolved, inside root (a link to a folder elsewhere is refused)."""
    if not relative or "\0" in relative or relative.startswith("/") or "\\" in relative:
        return False
    parts = relative.split("/")
    if parts[0] not in first_parts or any(p in ("", ".", "..") for p in parts):
        return False
    real_root = os.path.realpath(root)
    parent = os.path.realpath(os.path.join(real_root, posixpath.dirname(relative)))
    return parent == real_root or parent.startswith(real_root + os.sep)


def target_part(source):
    """Where a labeled file goes: an unlabeled/ or labeled/ image into labeled/<class>/, a test/
    image (relabeled) into test/<class>/."""
    return "test" if source.startswith("test/") else "labeled"


def log_problem(data_dir, row, columns_ok):
    """Why a row of the log cannot be trusted, or None: another form than this project writes, or
    a path that leads outside the folder."""
    if not columns_ok or None in row.values() or None in row:
        return "it does not have the log's columns"
    if not row["batch"].isdigit():
        return f"its batch {row['batch']!r} is not a number"
    action, source, target, label = row["action"], row["source"], row["target"], row["label"]
    if action == "undo":
        return None if not (source or target) else "an undo names no files"
    if action == "mkdir":
        ok = target.count("/") == 1 and target.split("/")[1] == label
        return (None if ok and inside(data_dir, target, ("labeled", "test")) else
                f"{target!r} is not a class folder labeled/<class> or test/<class> inside the folder")
    if action == "move":
        if not inside(data_dir, source, ("unlabeled", "labeled", "test")):
            return f"{source!r} is not a path under unlabeled/, labeled/ or test/ inside the folder"
        part = target_part(source)
        if target.count("/") != 2 or target.split("/")[1] != label or not inside(data_dir, target, (part,)):
            return f"{target!r} is not a path {part}/{label}/<name> inside the folder"
        return None
    return f"its action {action!r} is none of move, mkdir, undo"


def read_log(data_dir):
    """The rows of <folder>/label-log.csv (dicts), each checked: exit 2 naming the line where one
    is not a row this project writes (a log edited, or come with a folder from elsewhere); its paths
    must lie inside the folder. A last line without its newline (a write a full disk cut short)
    is left out: Log cuts it off before writing."""
    path = data_dir / LOG_NAME
    if not path.exists():
        return []
    text = decoded_csv(path, "log")
    if text and not text.endswith("\n"):
        text = text[:text.rfind("\n") + 1]
    rows, columns = csv_rows(text, path, "log")
    columns_ok = tuple(columns) == LOG_HEADER
    for line, row in rows:
        problem = log_problem(data_dir, row, columns_ok)
        if problem:
            raise UserError(f"{path} line {line} cannot be trusted: {problem}; the log may have been edited, or "
                            f"come with the folder from elsewhere: nothing was moved (mend or remove that line)")
    return [row for _, row in rows]


def applied_moves(log):
    """{source: (target, label)} of the moves of batches not undone."""
    undone = {r["batch"] for r in log if r["action"] == "undo"}
    return {r["source"]: (r["target"], r["label"]) for r in log if r["action"] == "move" and r["batch"] not in undone}


class Log:
    """label-log.csv, appended a row at a time and flushed to disk before the move it records. A
    torn last line (no newline: a write a full disk cut short, whose move never happened) is cut off
    first and said."""

    def __init__(self, data_dir, echo):
        self.path = data_dir / LOG_NAME
        try:
            new = not self.path.exists()
            if not new:
                with open(self.path, "rb+") as f:
                    data = f.read()
                    if data and not data.endswith(b"\n"):
                        f.truncate(data.rfind(b"\n") + 1)
                        echo(f"cut off the torn last line of {self.path} (a write cut short: its move never happened)")
            self.file = path_text(open(self.path, "ab"))
        except OSError as exc:
            raise MoveFailed(f"nothing was moved: cannot write {self.path}: {exc.strerror}") from None
        self.writer = csv.writer(self.file, lineterminator="\n")
        if new:
            self.put(LOG_HEADER)

    def write(self, batch, action, source, target, label):
        self.put((batch, time.strftime("%Y-%m-%dT%H:%M:%S"), action, source, target, label))

    def put(self, row):
        self.writer.writerow(row)
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self):
        with contextlib.suppress(OSError):
            self.file.close()
