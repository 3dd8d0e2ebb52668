"""Labels back into an own-images folder: each listed image moves from unlabeled/ into
labeled/<class>/ (a labeled/ or test/ image relabeled: into the class folder of its part; a copy, a
leak or a stray set aside: into set-aside/, which training never reads), checked in full before
anything moves, never replacing a file, one rename per file, every move logged in
<folder>/label-log.csv so that a rerun skips what is done and the last batch can be put back.

A folder may come from someone else: every path read from labels.csv or from the log must name a
place inside the folder (relative, no '..', no link to a folder outside it), or nothing moves. A row
that carries the hash of its image's bytes (every CSV this project writes does) moves that image only:
a file replaced since (a camera that restarted its numbering) is refused. Names are compared as a
case- and normalization-insensitive file system compares them, so two images never get one name on
any disk. One label.py at a time per folder (a lock on the folder). A move the OS refuses midway (a
full disk, a read-only file system) puts back the moves of its batch before it ends; a log line a
full disk left torn is cut off before the log is written again. Planning is linear in the rows.
"""
import contextlib
import fcntl
import os
import posixpath
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import click

from .console import PATH_ENCODING, PATH_ERRORS, is_text
from .errors import MoveFailed, UserError
from .files import DIGEST_COLUMN, file_digest, is_hidden, is_image_name, read_regular
from .label_files import (ASIDE, SOURCES, Log, applied_moves, inside, outside_reason, read_log, target_part,
                          undone_batches)
from .renaming import rename_no_replace


@dataclass
class Move:
    source: str   # relative to the folder, '/'-separated: unlabeled/...
    target: str   # labeled/<label>/<name>, test/<label>/<name> or set-aside/<source's folder>/<name>
    label: str    # "" for a move aside
    digest: Optional[str] = None  # the hash of the file's bytes, where the row gave one (checked)

    @property
    def aside(self):
        return self.target.startswith(ASIDE + "/")


def fold(name):
    """A name as a case- and normalization-insensitive file system (macOS, exFAT, SMB) compares it:
    'IMG.JPG' and 'img.jpg' are one name there, and so are an 'é' composed and one decomposed."""
    return unicodedata.normalize("NFC", name).casefold()


# Planning: every row checked before anything moves ---------------------------------------------------

def known_classes(data_dir):
    labeled = data_dir / "labeled"
    return sorted(p.name for p in labeled.iterdir() if p.is_dir() and not is_hidden(p.name)) if labeled.is_dir() else []


def relative_source(data_dir, path):
    """The path of a labels.csv row relative to the folder, '/'-separated: taken as given (relative to
    the working directory) or else relative to the folder, the first that exists; None where it lies
    outside."""
    if not path or "\0" in path:
        return None
    given, root = Path(path), Path(os.path.abspath(data_dir))
    found = []
    for candidate in [given] if given.is_absolute() else [Path.cwd() / given, root / given]:
        absolute = Path(os.path.normpath(os.path.abspath(candidate)))
        if absolute.is_relative_to(root):
            if os.path.lexists(absolute):
                return absolute.relative_to(root).as_posix()
            found.append(absolute.relative_to(root).as_posix())
    return found[0] if found else None


def name_max(folder):
    """The longest file name (bytes) the folder's file system takes."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def label_problem(label, labeled, longest):
    """Why a label cannot be a class folder's name under labeled/, or None."""
    if (not label or label in (".", "..") or is_hidden(label) or any(c in label for c in "/\\\0")
            or any(ord(c) < 32 for c in label)):
        return f"{label!r} cannot be a class folder's name"
    if not is_text(label):
        return f"{label!r} is not text (save the CSV as UTF-8)"
    if len(label.encode()) > longest:
        return f"a class name of {len(label.encode())} bytes is longer than the file system takes ({longest})"
    folder = labeled / label
    if os.path.lexists(folder) and not folder.is_dir():
        return f"labeled/{label} is a file, not a class folder"
    if folder.is_dir() and not inside(labeled.parent, f"labeled/{label}/x", ("labeled",)):
        return f"labeled/{label} leads outside the folder through a link"
    return None


class Names:
    """The names taken in each folder a plan moves files into: what is there (listed once a folder)
    and what the plan gives, compared as fold does; a name taken gets the first free suffix
    (photo-1.jpg), counted on from the last one given for that name, so that a thousand rows of one
    name cost a thousand tries, not half a million."""

    def __init__(self, data_dir):
        self.data_dir, self.taken, self.next = data_dir, {}, {}

    def in_folder(self, folder):
        if folder not in self.taken:
            path = self.data_dir / folder
            self.taken[folder] = {fold(name) for name in os.listdir(path)} if path.is_dir() else set()
        return self.taken[folder]

    def free(self, folder, name):
        taken = self.in_folder(folder)
        candidate, stem, suffix = name, posixpath.splitext(name)[0], posixpath.splitext(name)[1]
        key = (folder, fold(stem), fold(suffix))
        k = self.next.get(key, 1)
        while fold(candidate) in taken:
            candidate = f"{stem}-{k}{suffix}"
            k += 1
        self.next[key] = k
        taken.add(fold(candidate))
        return candidate


def digest_problem(data_dir, source, digest):
    """Why the file `source` is not the image whose bytes hash to digest, or None."""
    try:
        actual = file_digest(read_regular(data_dir / source))
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if actual != digest:
        return ("its image is not the one this row was written for (the file's bytes changed since: replaced by "
                "another picture of the same name?); predict it again")
    return None


def plan(data_dir, rows, new_classes=False, sources=SOURCES):
    """The moves the rows [label_files.LabelRow] ask for, in order (each with the free name it will
    take), and the number of rows applied before (or already so); exits 2 naming every row that cannot
    be applied (unknown class, missing file, a file another row names too, an image replaced since its
    row was written, a path outside unlabeled/, labeled/ and test/ or through a link, a hidden file or
    a file that is no image (training would never see it), a name the file system refuses, a file on
    another file system, a folder that cannot be written) before any move. An unlabeled/ image goes to
    labeled/<label>/; a labeled/ or test/ image whose label is wrong (evaluate.py --audit) to <its
    part>/<label>/; a row that sets its image aside to set-aside/<its path>. `sources`: the parts rows
    may come from (--accepted: unlabeled/ only, never a label a person gave)."""
    data_dir = Path(data_dir)
    labeled = data_dir / "labeled"
    classes, applied = set(known_classes(data_dir)), applied_moves(read_log(data_dir))
    spelled = {fold(c): c for c in classes}  # the spelling a class has, or the first new one takes
    longest = name_max(labeled if labeled.is_dir() else data_dir)
    device = os.stat(labeled if labeled.is_dir() else data_dir).st_dev
    names = Names(data_dir)
    moves, problems, seen, files, skipped = [], [], set(), {}, 0
    for row in rows:
        source = relative_source(data_dir, row.path)
        problem, moved = source_problem(data_dir, source, sources), False
        if problem is None and source in seen:
            problem = "listed twice"
        if problem is None and not row.aside:
            problem = label_problem(row.label, labeled, longest) or class_problem(row.label, source, classes, spelled,
                                                                                  new_classes)
        if problem is None and not os.path.lexists(data_dir / source):
            problem, moved = applied_before(data_dir, row, applied.get(source)), True
        elif problem is None:
            problem = (same_file_problem(data_dir, source, files, row.line)
                       or (digest_problem(data_dir, source, row.digest) if row.digest else None))
        if problem is None and moved:
            skipped += 1
        elif problem is None and not row.aside and source.split("/")[0] != "unlabeled" and source.split("/")[1] == row.label:
            skipped += 1  # labeled so already
        elif problem is None:
            folder = f"{ASIDE}/{posixpath.dirname(source)}" if row.aside else f"{target_part(source)}/{row.label}"
            problem = move_problem(data_dir, source, folder, device)
            if problem is None:
                name = names.free(folder, posixpath.basename(source))
                if len(name.encode(PATH_ENCODING, PATH_ERRORS)) > longest:
                    problem = f"the name {name!r} is longer than the file system takes"
                else:
                    moves.append(Move(source, f"{folder}/{name}", row.label, row.digest))
        if problem:
            problems.append(f"line {row.line} ({row.path}): {problem}")
        if source is not None:
            seen.add(source)
    if problems:
        shown = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise UserError(f"nothing was moved: {len(problems)} of {len(rows)} rows cannot be applied: {shown}")
    return moves, skipped


def source_problem(data_dir, source, sources):
    """Why the path of a row (relative to the folder) names no image label.py may move, or None."""
    parts = None if source is None else source.split("/")
    if parts is None or parts[0] not in sources or len(parts) < (2 if parts[0] == "unlabeled" else 3):
        return f"not a file under {' or '.join(str(data_dir / part) for part in sources)}"
    reason = outside_reason(data_dir, source, SOURCES)
    if reason:
        return reason
    if any(is_hidden(part) for part in parts[1:]):
        return "a hidden file or one in a hidden folder (a name starting with '.', or __MACOSX): training never reads it"
    if not is_image_name(parts[-1]):
        return "not an image file name (training reads only the formats it knows, by extension)"
    return None


def class_problem(label, source, classes, spelled, new_classes):
    """Why `label` cannot be the class of the image at source, or None: a class labeled/ lacks
    (without --new-classes; for a test/ image, ever), or one that differs from another class only in
    case or Unicode form (one folder on many file systems)."""
    other = spelled.get(fold(label))
    if other is not None and other != label:
        return (f"the class {label!r} differs from {other!r} only in case or Unicode form: on many file systems they "
                f"are one folder")
    if label in classes:
        return None
    if source.startswith("test/"):
        return f"a test image can only take a class labeled/ has ({', '.join(sorted(classes))})"
    if not new_classes:
        return f"unknown class {label!r} (labeled/ has {', '.join(sorted(classes))}; --new-classes creates it)"
    spelled[fold(label)] = label
    return None


def applied_before(data_dir, row, applied):
    """Why a row whose file is no longer at its path cannot be taken as applied before, or None: a
    move of a batch not undone took the file from that path, as this row asks (its label, or aside),
    the same file (its hash, where both are known), and the file is still where its later moves
    (a relabel since, say) took it."""
    if applied is None:
        return "no such file"
    if applied.label != row.label:
        what = "set aside" if not applied.label else f"labeled {applied.label!r}"
        return f"no such file: label.py {what} it before (it is now {applied.journey.now})"
    if row.digest and applied.digest and row.digest != applied.digest:
        return "the image label.py moved from this path before is not the one this row was written for"
    if not os.path.lexists(data_dir / applied.journey.now):
        return f"no such file: label.py moved it to {applied.journey.now}, which is gone"
    return None


def same_file_problem(data_dir, source, files, line):
    """Why `source` cannot be moved as a file of its own, or None: it is a file another row names too
    under another name (on a case-insensitive file system 'IMG.JPG' and 'img.jpg' are one file)."""
    st = os.stat(data_dir / source)
    first = files.setdefault((st.st_dev, st.st_ino), line)
    return None if first == line else f"the same file as line {first} names (another spelling of one name?)"


def move_problem(data_dir, source, folder, device):
    """Why the file `source` cannot be renamed into the folder `folder` (labeled/<label>,
    test/<label> or under set-aside/), or None: another file system (a rename cannot cross one), a
    link out of the folder, or a folder that cannot be written."""
    try:
        if os.stat(data_dir / source).st_dev != device:
            return "it lies on another file system (a mount or a link inside the folder): copy it into unlabeled/ first"
    except OSError as exc:
        return exc.strerror
    target_folder = data_dir / folder
    existing = next(p for p in [target_folder, *target_folder.parents] if os.path.lexists(p))
    if not existing.is_dir():
        return f"{existing.relative_to(data_dir)} is a file, not a folder"
    reason = outside_reason(data_dir, f"{folder}/x", (folder.split("/")[0],))
    if reason:
        return f"{folder}: {reason}"
    for checked in (Path(data_dir / source).parent, existing):
        if not os.access(checked, os.W_OK):
            return f"{checked.relative_to(data_dir) if checked != data_dir else data_dir}/ cannot be written (read-only)"
    return None


# Changing the folder: one label.py at a time, logged, all or nothing ---------------------------------

@contextlib.contextmanager
def locked(data_dir):
    """While the block runs, this process is the only label.py changing data_dir (a lock on the
    folder itself, the OS's: it ends with the process, never stale, and writes no file)."""
    try:
        fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise UserError(f"cannot open {data_dir}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another label.py is changing {data_dir}: let it finish, then run this again") from None
        except OSError as exc:  # ENOLCK: a network file system without locks
            raise UserError(f"cannot lock {data_dir} ({exc.strerror}): label.py changes a folder only where it "
                            f"can keep others out; run it on a local disk") from None
        yield
    finally:
        os.close(fd)


def next_batch(log_rows):
    return 1 + max((int(r["batch"]) for r in log_rows), default=0)


def folders_to_make(data_dir, folder):
    """The folders of the path `folder` (relative) that do not exist yet, outermost first."""
    parts = folder.split("/")
    prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
    return [p for p in prefixes if not os.path.lexists(data_dir / p)]


def folder_label(folder):
    """The label a mkdir row of the log carries: the class of a class folder, "" for another folder."""
    parts = folder.split("/")
    return parts[1] if len(parts) == 2 and parts[0] in ("labeled", "test") else ""


def apply(data_dir, moves, echo=click.echo):
    """Move each image to its target (plan's), each with one rename that never replaces a file,
    logged first; the folders it needs are made (and logged). Returns the batch number. If the OS
    refuses a step, the batch's moves are put back and its folders removed before MoveFailed says so."""
    data_dir = Path(data_dir)
    batch = next_batch(read_log(data_dir))
    log, done, made = Log(data_dir, echo), [], []
    try:
        for move in moves:
            for folder in folders_to_make(data_dir, posixpath.dirname(move.target)):
                log.write(batch, "mkdir", target=folder, label=folder_label(folder))
                (data_dir / folder).mkdir()
                made.append(data_dir / folder)
            log.write(batch, "aside" if move.aside else "move", move.source, move.target, move.label, move.digest)
            rename_no_replace(data_dir / move.source, data_dir / move.target)
            done.append(move)
    except OSError as exc:
        failed = moves[len(done)] if len(done) < len(moves) else None
        stuck = rename_back(data_dir, [(m.source, m.target) for m in done], made)
        with contextlib.suppress(OSError):
            log.write(batch, "undo")
        what = f"moving {failed.source}" if failed else "the log"
        raise MoveFailed(f"{what} failed ({exc.strerror or exc}): " + (
            f"the {len(done)} images moved before it were put back; nothing was moved" if not stuck else
            f"and {len(stuck)} of the {len(done)} images moved before it could not be put back: {'; '.join(stuck[:5])}")) from None
    finally:
        log.close()
    return batch


def rename_back(data_dir, renames, made):
    """Undo renames already made [(from, to)], latest first, and remove the folders made for them
    (latest first, if empty); returns '<to> (reason)' for each file that could not be renamed back."""
    stuck = []
    for old, new in reversed(renames):
        try:
            rename_no_replace(data_dir / new, data_dir / old)
        except OSError as exc:
            stuck.append(f"{new} ({exc.strerror})")
    for folder in reversed(made):
        with contextlib.suppress(OSError):
            folder.rmdir()
    return stuck


def undo(data_dir, echo=click.echo):
    """Put the last batch not yet undone back: each moved file to where it was (never replacing a
    file), the folders it created removed (if empty). Returns (batch, files put back), or None where
    there is nothing to undo. Every file is checked first: where one cannot be put back (its old name
    taken by another file, gone from both places, another image at its new place than the one moved,
    a folder that cannot be written) nothing moves, the batch stays open and exit 2 names the files."""
    data_dir = Path(data_dir)
    log_rows = read_log(data_dir)
    undone = undone_batches(log_rows)
    batches = [r["batch"] for r in log_rows if r["action"] in ("move", "aside") and r["batch"] not in undone]
    if not batches:
        return None
    batch = batches[-1]
    mine = [r for r in log_rows if r["batch"] == batch]
    back, problems = [], []
    for r in reversed([r for r in mine if r["action"] in ("move", "aside")]):
        source, target = data_dir / r["source"], data_dir / r["target"]
        if os.path.lexists(source):
            if os.path.lexists(target):
                problems.append(f"{r['source']}: the name is taken by another file ({r['target']} is still there)")
            continue  # already back (a move a kill cut short never happened)
        if not target.is_file() or target.is_symlink():
            problems.append(f"{r['target']}: gone (it was moved or deleted since)")
            continue
        if r.get(DIGEST_COLUMN) and digest_problem(data_dir, r["target"], r[DIGEST_COLUMN]):
            problems.append(f"{r['target']}: another image than the one label.py moved there (replaced since)")
            continue
        parent = next(p for p in source.parents if p.exists())
        for folder in {target.parent, parent}:
            if not os.access(folder, os.W_OK):
                problems.append(f"{folder.relative_to(data_dir)}/ cannot be written (read-only)")
        back.append(Move(r["source"], r["target"], r["label"]))
    if problems:
        raise UserError(f"batch {batch} stays applied, nothing was put back: {len(problems)} of its files cannot "
                        f"be: {'; '.join(sorted(set(problems))[:5])}" + (" ..." if len(set(problems)) > 5 else ""))
    log, restored, made = Log(data_dir, echo), [], []
    try:
        for move in back:
            source = data_dir / move.source
            for folder in reversed([p for p in source.parents if not p.exists()]):
                folder.mkdir()
                made.append(folder)
            rename_no_replace(data_dir / move.target, source)
            restored.append(move)
        for r in reversed([r for r in mine if r["action"] == "mkdir"]):
            folder = data_dir / r["target"]
            if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
                folder.rmdir()
        log.write(batch, "undo")
    except OSError as exc:
        stuck = rename_back(data_dir, [(m.target, m.source) for m in restored], made)
        raise MoveFailed(f"putting back batch {batch} failed ({exc.strerror or exc}): " + (
            "its files are where they were before the undo; the batch stays applied" if not stuck else
            f"{len(stuck)} files are neither here nor there: {'; '.join(stuck[:5])}")) from None
    finally:
        log.close()
    return int(batch), len(restored)
