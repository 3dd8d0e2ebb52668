"""What label.py reads besides the images: the labels file (labels.csv, a predictions CSV's accepted
rows, an audit CSV's findings to set aside, or a Label Studio export), and the checks that a path read
from it or from the log (log.py) names a place inside the folder, through no link. The file may
come from someone else: nothing in it is trusted.
"""
import functools
import os
import posixpath
from typing import NamedTuple, Optional

from ..data.files import DIGEST_COLUMN
from ..disk.csv_text import csv_records, delimiter_of, open_csv
from ..errors import UserError
from ..use import label_studio

# Where label.py sets an image aside (a copy, a leak into test/, an image like no class): training
# reads labeled/, unlabeled/ and test/ only. The image keeps its path under it:
# test/dog/2.png -> set-aside/test/dog/2.png.
ASIDE = "set-aside"
# The parts of a folder label.py moves images from.
SOURCES = ("unlabeled", "labeled", "test")
# The values of a labels file's optional `action` column.
ACTIONS = ("label", "set-aside")
# Every column a labels file's row is read from (a column of another name is left alone).
COLUMNS_READ = {"path", "label", "action", DIGEST_COLUMN, "prediction", "accepted", "kind"}
# The kinds of an audit CSV's findings that --set-aside takes (audit.KINDS but `label`).
ASIDE_KINDS = ("duplicate", "leak", "outlier")


class LabelRow(NamedTuple):
    line: int
    path: str
    label: str             # "" for a row that sets its image aside
    digest: Optional[str]  # the hash of the bytes of the image the row was written for; None: not given
    aside: bool = False


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
    text, header = open_csv(csv_path, "labels file", missing=f"--apply: {csv_path} does not exist")
    if label_studio.is_export(csv_path, header):
        if accepted or set_aside:
            raise UserError(f"--accepted and --set-aside read evaluate.py's CSVs; {csv_path} is a Label Studio export")
        with text:
            export = label_studio.read_export(csv_path, text)
        return [LabelRow(n, path, label, digest) for n, (path, label, digest) in enumerate(export.rows, 1)], export
    columns, records = csv_records(text, csv_path, "labels file", delimiter_of(header))
    twice = sorted({c for c in columns if columns.count(c) > 1} & COLUMNS_READ)
    if twice:
        text.close()
        raise UserError(f"nothing was moved: {csv_path} has the column {twice[0]} twice: which one is meant?")
    needed = (("kind", "path") if set_aside else ("path", "prediction", "accepted") if accepted else ("path", "label"))
    if not set(needed) <= set(columns):
        text.close()
        predictions, findings = {"path", "prediction"} <= set(columns), {"kind", "path", "suggestion"} <= set(columns)
        hint = (" (evaluate.py --predict writes `accepted` only with --max-error)" if accepted and predictions
                else " (evaluate.py --audit writes it)" if set_aside
                else ": these are evaluate.py's predictions; --accepted applies the rows --max-error accepted, and "
                     "the review page's Save labels.csv (or a `label` column of your own) gives each its class"
                if predictions else
                ": these are evaluate.py --audit's findings; --set-aside KINDS (say duplicate,leak,outlier) moves "
                "the images of those kinds out of training, and the audit page's Save labels.csv gives relabeled "
                "images their class" if findings else "")
        raise UserError(f"{csv_path} must have the columns {','.join(needed)} (it has {', '.join(columns)}){hint}")
    return label_rows(csv_path, text, records, accepted, set_aside), None


def label_rows(csv_path, text, records, accepted, set_aside):
    """The LabelRows of a labels file's records (read_labels), the file closed at the end. An audit
    CSV's image found as two kinds (a duplicate and an outlier) is one image set aside: one row, the
    first (the same path for another file, another digest, stays two rows, refused as listed twice)."""
    column = "kind" if set_aside else "prediction" if accepted else "label"
    aside_already = set()
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
            if set_aside:
                if (r["path"], digest) in aside_already:
                    continue
                aside_already.add((r["path"], digest))
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


