"""The plan of a labels file: each row checked before anything moves, and the move it asks for:
an unlabeled/ image into labeled/<class>/, a labeled/ or test/ image relabeled into the class folder
of its part, a copy, a leak or a stray set aside into set-aside/, which training never reads.

A folder may come from someone else: every path read from labels.csv or from the log must name a
place inside the folder (relative, no '..', no link even to inside it), every source be a regular
file, or nothing moves. A row that carries the hash of its image's bytes (every CSV this project
writes does) moves that image only: a file replaced since (a camera that restarted its numbering) is
refused. Names are compared as a case- and normalization-insensitive file system compares them, so
two images never get one name on any disk; a class's name as a person reads it (loose), so that a
label names exactly one class folder.

At any size: planning is linear in the rows; the labels file and the log are read a row at a time,
the planned moves wait in a temporary file (spill.py), files are hashed on a pool of threads. Memory
holds what the checks across rows need (each row's path and file, the names taken in the folders
moved into): about a few hundred bytes a row.
"""
import heapq
import os
import posixpath
import stat
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .console import PATH_ENCODING, PATH_ERRORS, is_text, shown
from .errors import UserError
from .files import file_digest, is_hidden, is_image_name, read_regular
from .iterables import batched
from .label_files import ASIDE, SOURCES, inside, linked_folder, outside_reason, remembered_realpath, target_part
from .label_log import applied_moves, undone_batches
from .spill import Spill

PLAN_CHUNK = 4096     # rows checked at a time (their files hashed together on a pool of threads)
PROBLEMS_SHOWN = 10   # rows named in a refusal; the others are counted


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


def loose(name):
    """A class name as a person reads it: its compatibility form (a fullwidth 'ｃ' is a 'c'), case folded,
    white space and invisible characters (a zero-width space) left out: 'red ', 'Red' and 'r\u200bed'
    are one class to a reader, three folders to a file system."""
    folded = unicodedata.normalize("NFKC", name).casefold()
    return "".join(c for c in folded if not c.isspace() and unicodedata.category(c) != "Cf")


# Planning: every row checked before anything moves ---------------------------------------------------

def known_classes(data_dir):
    labeled = data_dir / "labeled"
    return sorted(p.name for p in labeled.iterdir() if p.is_dir() and not is_hidden(p.name)) if labeled.is_dir() else []


def name_max(folder):
    """The longest file name (bytes) the folder's file system takes."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def label_problem(label, labeled, longest, realpath=os.path.realpath):
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
    if folder.is_dir() and not inside(labeled.parent, f"labeled/{label}/x", ("labeled",), realpath):
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
        if k > 1:  # only names that met a clash are remembered: a million distinct names cost no counters
            self.next[key] = k
        taken.add(fold(candidate))
        return candidate


class Checks:
    """What planning asks of the folder, each answer remembered where it cannot change while label.py
    holds the folder: a million rows into ten classes ask about ten folders, not a million times."""

    def __init__(self, data_dir, sources, device):
        self.data_dir, self.sources, self.device = data_dir, sources, device
        self.realpath, self.writable, self.folders, self.links = remembered_realpath(), {}, {}, {}  # answers remembered
        self.cwd, self.root = os.getcwd(), os.path.abspath(data_dir)

    def linked(self, folder):
        """Why files cannot move from or into `folder` (relative): one of its folders is a link."""
        if folder not in self.links:
            link = linked_folder(self.data_dir, folder)
            self.links[folder] = (f"{link}/ is a link (label.py moves files between the folder's own folders only, "
                                  f"never through a link)") if link else None
        return self.links[folder]

    def relative_source(self, path):
        """(the path of a labels.csv row relative to the folder, '/'-separated, whether a file is
        there): taken as given (relative to the working directory) or else relative to the folder, the
        first that exists; None where it lies outside."""
        if not path or "\0" in path:
            return None, False
        found = []
        for candidate in [path] if os.path.isabs(path) else [os.path.join(self.cwd, path), os.path.join(self.root, path)]:
            absolute = os.path.normpath(candidate)
            if absolute == self.root or absolute.startswith(self.root.rstrip(os.sep) + os.sep):
                relative = Path(os.path.relpath(absolute, self.root)).as_posix()
                if os.path.lexists(absolute):
                    return relative, True
                found.append(relative)
        return (found[0] if found else None), False

    def source_problem(self, source):
        """Why the path of a row (relative to the folder) names no image label.py may move, or None."""
        parts = None if source is None else source.split("/")
        if parts is None or parts[0] not in self.sources or len(parts) < (2 if parts[0] == "unlabeled" else 3):
            return f"not a file under {' or '.join(str(self.data_dir / part) for part in self.sources)}"
        reason = outside_reason(self.data_dir, source, SOURCES, self.realpath) or self.linked(posixpath.dirname(source))
        if reason:
            return reason
        if any(is_hidden(part) for part in parts[1:]):
            return "a hidden file or one in a hidden folder (a name starting with '.', or __MACOSX): training never reads it"
        if not is_image_name(parts[-1]):
            return "not an image file name (training reads only the formats it knows, by extension)"
        return None

    def move_problem(self, source, st, folder):
        """Why the file `source` (its stat st) cannot be renamed into the folder `folder`
        (labeled/<label>, test/<label> or under set-aside/), or None: another file system (a rename
        cannot cross one), a link out of the folder, or a folder that cannot be written."""
        if st.st_dev != self.device:
            return "it lies on another file system (a mount or a link inside the folder): copy it into unlabeled/ first"
        if folder not in self.folders:
            self.folders[folder] = target_folder(self.data_dir, folder, self.realpath)
        problem, existing = self.folders[folder]
        problem = problem or self.linked(folder)
        if problem:
            return problem
        for checked in (Path(self.data_dir / source).parent, existing):
            if checked not in self.writable:
                self.writable[checked] = os.access(checked, os.W_OK)
            if not self.writable[checked]:
                return (f"{checked.relative_to(self.data_dir) if checked != self.data_dir else self.data_dir}/ cannot "
                        f"be written (read-only)")
        return None


def target_folder(data_dir, folder, realpath):
    """(why no file can be renamed into the folder `folder` (relative): a file where a folder should
    be, or a link out of the folder; None where it can be, the folder itself or the one above it that
    exists)."""
    target = data_dir / folder
    existing = next(p for p in [target, *target.parents] if os.path.lexists(p))
    if not existing.is_dir():
        return f"{existing.relative_to(data_dir)} is a file, not a folder", existing
    reason = outside_reason(data_dir, f"{folder}/x", (folder.split("/")[0],), realpath)
    return (f"{folder}: {reason}" if reason else None), existing


class Problems:
    """The rows that cannot be applied: counted, the first PROBLEMS_SHOWN (by line) kept to be named."""

    def __init__(self):
        self.count, self.first = 0, []

    def add(self, row, problem):
        self.count += 1
        heapq.heappush(self.first, (-row.line, f"line {row.line} ({shown(row.path)}): {problem}"))
        if len(self.first) > PROBLEMS_SHOWN:
            heapq.heappop(self.first)

    def refuse(self, rows):
        if self.count:
            shown = [text for _, text in sorted(self.first, reverse=True)]
            raise UserError(f"nothing was moved: {self.count} of {rows} rows cannot be applied: {'; '.join(shown)}"
                            + (f"; and {self.count - len(shown)} more" if self.count > len(shown) else ""))


def file_digest_or_error(path):
    """The digest of a file's bytes, or the OSError that kept it from being read."""
    try:
        return file_digest(read_regular(path))
    except OSError as exc:
        return exc


def digest_problem(actual, digest):
    """Why a file whose bytes hash to `actual` (or could not be read: an OSError) is not the image
    whose bytes hash to digest, or None."""
    if isinstance(actual, OSError):
        return f"it cannot be read ({actual.strerror or actual})"
    if actual != digest:
        return ("its image is not the one this row was written for (the file's bytes changed since: replaced by "
                "another picture of the same name?); predict it again")
    return None


class Plan:
    """The moves of a labels file (plan's): kept in a Spill, read back as Moves in order or in reverse."""

    def __init__(self):
        self.moves, self.skipped, self.rows = Spill(), 0, 0

    def add(self, move):
        self.moves.append([move.source, move.target, move.label, move.digest])

    def __len__(self):
        return len(self.moves)

    def __iter__(self):
        return (Move(*m) for m in self.moves)

    def chunks(self):
        for chunk in self.moves.chunks():
            yield [Move(*m) for m in chunk]

    def reversed(self, limit):
        return (Move(*m) for m in self.moves.reversed(limit))


def no_bar(total, what):
    """A progress bar's update function (label.py shows one with the time left); here: none."""
    return lambda n: None


def plan(data_dir, rows, new_classes=False, sources=SOURCES, bar=no_bar, expected=None):
    """The Plan of the rows (label_files.LabelRow, a stream read once): the moves they ask for, in
    order (each with the free name it will take), the number of rows applied before (or already so)
    and of rows read; exits 2 naming the rows that cannot be applied (unknown class, missing file, a
    file another row names too, an image replaced since its row was written, a path outside
    unlabeled/, labeled/ and test/ or through a link, a hidden file or a file that is no image
    (training would never see it), a name the file system refuses, a file on another file system, a
    folder that cannot be written) before any move. An unlabeled/ image goes to labeled/<label>/; a
    labeled/ or test/ image whose label is wrong (evaluate.py --audit) to <its part>/<label>/; a row
    that sets its image aside to set-aside/<its path>. `sources`: the parts rows may come from
    (--accepted: unlabeled/ only, never a label a person gave). Linear in the rows: the planned moves
    go to a temporary file, the files named are hashed on a pool of threads a chunk of rows at a time,
    and what the checks across rows need (each row's path and file, the names taken) is what memory
    holds. bar(expected rows, what) gives the update function of a progress bar."""
    data_dir = Path(data_dir)
    undone = undone_batches(data_dir)  # the log read (and checked: one that cannot be trusted moves nothing) first
    progress = bar(expected, "checking rows")
    labeled = data_dir / "labeled"
    classes = set(known_classes(data_dir))
    spelled = {}  # the spellings of each class as loose reads it: one class folder each, or a refusal
    for c in classes:
        spelled.setdefault(loose(c), []).append(c)
    longest = name_max(labeled if labeled.is_dir() else data_dir)
    checks = Checks(data_dir, sources, os.stat(labeled if labeled.is_dir() else data_dir).st_dev)
    names, labels = Names(data_dir), {}
    result, problems, seen, files, gone = Plan(), Problems(), set(), {}, []
    with ThreadPoolExecutor(2 * (os.cpu_count() or 1)) as pool:
        for chunk in batched(rows, PLAN_CHUNK):
            result.rows += len(chunk)
            checked = []  # (row, source, its stat) of the rows whose file is to be hashed and moved
            for row in chunk:
                source, there = checks.relative_source(row.path)
                problem = checks.source_problem(source)
                if problem is None and source in seen:
                    problem = "listed twice"
                if problem is None and not row.aside:
                    if row.label not in labels:
                        labels[row.label] = label_problem(row.label, labeled, longest, checks.realpath)
                    problem = labels[row.label] or class_problem(row.label, source, classes, spelled, new_classes)
                if problem is None and not there:
                    gone.append((row, source))  # applied before? the log says, once every row is read
                elif problem is None:
                    try:
                        st = os.lstat(data_dir / source)
                    except OSError as exc:
                        st, problem = None, exc.strerror
                    if st and not stat.S_ISREG(st.st_mode):  # a folder named like an image, a link, a pipe
                        st, problem = None, "not a regular file (a folder, a link or a device): only image files move"
                    first = files.setdefault((st.st_dev, st.st_ino), row.line) if st else row.line
                    if first != row.line:
                        problem = f"the same file as line {first} names (another spelling of one name?)"
                    elif st:
                        checked.append((row, source, st))
                if problem:
                    problems.add(row, problem)
                if source is not None:
                    seen.add(source)
            actual = pool.map(file_digest_or_error, [data_dir / source for row, source, _ in checked if row.digest])
            for row, source, st in checked:
                problem = digest_problem(next(actual), row.digest) if row.digest else None
                if problem is None and not row.aside and source.split("/")[0] != "unlabeled" and source.split("/")[1] == row.label:
                    result.skipped += 1  # labeled so already
                    continue
                if problem is None:
                    folder = f"{ASIDE}/{posixpath.dirname(source)}" if row.aside else f"{target_part(source)}/{row.label}"
                    problem = checks.move_problem(source, st, folder)
                if problem is None:
                    name = names.free(folder, posixpath.basename(source))
                    if len(name.encode(PATH_ENCODING, PATH_ERRORS)) > longest:
                        problem = f"the name {name!r} is longer than the file system takes"
                    else:
                        result.add(Move(source, f"{folder}/{name}", row.label, row.digest))
                if problem:
                    problems.add(row, problem)
            progress(len(chunk))
    applied = applied_moves(data_dir, [source for _, source in gone], undone) if gone else {}
    for row, source in gone:
        problem = applied_before(data_dir, row, applied.get(source))
        if problem:
            problems.add(row, problem)
        else:
            result.skipped += 1
    problems.refuse(result.rows)
    return result


def class_problem(label, source, classes, spelled, new_classes):
    """Why `label` cannot be the class of the image at source, or None: a class labeled/ lacks
    (without --new-classes; for a test/ image, ever), or one that differs from a class folder only in
    case, white space or Unicode form (loose: 'red ' beside 'red', 'Cat' beside 'cat'), which names two
    folders to a reader's eye and one on many file systems: both names are given."""
    others = [c for c in spelled.get(loose(label), ()) if c != label]
    if others:
        return (f"the class {label!a} differs from the class folder {others[0]!a} only in case, white space, "
                f"invisible characters or Unicode form: rename one of them so that each class has one name")
    if label in classes:
        return None
    if source.startswith("test/"):
        return f"a test image can only take a class labeled/ has ({', '.join(sorted(classes))})"
    if not new_classes:
        return f"unknown class {label!r} (labeled/ has {', '.join(sorted(classes))}; --new-classes creates it)"
    spelled.setdefault(loose(label), []).append(label)
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
