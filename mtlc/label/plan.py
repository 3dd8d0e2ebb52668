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
import functools
import heapq
import os
import posixpath
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..data.files import file_digest, is_hidden, is_image_name
from ..disk.console import PATH_ENCODING, PATH_ERRORS, shown
from ..disk.opening import read_regular
from ..disk.spill import Spill, batched
from ..errors import UserError
from .inputs import ASIDE, SOURCES, linked_folder, outside_reason, remembered_realpath, target_part
from .log import accepted_places, applied_moves, undone_batches
from .names import Names, class_problem, known_classes, label_problem, loose, name_max

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

    @property
    def confirms(self):
        """A person's label given as label.py --accepted gave it: nothing moves, the label becomes theirs."""
        return self.source == self.target


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
                            + (f"; and {self.count - len(shown)} more" if self.count > len(shown) else "")
                            + ": mend those rows, or take them out of the CSV, and apply it again (a batch moves "
                              "all its rows or none)")


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
        self.moves, self.skipped, self.rows, self.confirmed = Spill(), 0, 0, 0
        self.overruled = 0  # rows of a model's labels (--accepted) for images a person moved otherwise before

    def add(self, move):
        self.moves.append([move.source, move.target, move.label, move.digest])
        self.confirmed += move.confirms

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


class RowChecks:
    """Each row checked against the folder (Checks) and against the rows before it: its class among the
    class folders (one name each, as a person reads it), its source listed once, its file named once."""

    def __init__(self, data_dir, sources, new_classes, accepted=dict):
        self.data_dir, self.new_classes, self.labeled = data_dir, new_classes, data_dir / "labeled"
        self.accepted = accepted  # () -> the places of label.py --accepted's images (log.accepted_places)
        self.classes = set(known_classes(data_dir))
        self.spelled = {}  # the spellings of each class as loose reads it: one class folder each, or a refusal
        for c in self.classes:
            self.spelled.setdefault(loose(c), []).append(c)
        home = self.labeled if self.labeled.is_dir() else data_dir
        self.longest = name_max(home)
        self.folder = Checks(data_dir, sources, os.stat(home).st_dev)
        self.labels, self.seen, self.files = {}, set(), {}

    def source_of(self, row):
        """(why the row cannot be applied or None, its source relative to the folder, whether a file is
        there, that file's stat)."""
        source, there = self.folder.relative_source(row.path)
        problem, st = self.folder.source_problem(source), None
        if problem is None and source in self.seen:
            problem = "listed twice"
        if problem is None and not row.aside:
            if row.label not in self.labels:
                self.labels[row.label] = label_problem(row.label, self.labeled, self.longest, self.folder.realpath)
            problem = self.labels[row.label] or class_problem(row.label, source, self.classes, self.spelled,
                                                              self.new_classes)
        if problem is None and there:
            problem, st = self.file_of(row, source)
        if source is not None:
            self.seen.add(source)
        return problem, source, there, st

    def file_of(self, row, source):
        """(why the file at source cannot move or None, its stat): a regular file, not named by a row before."""
        try:
            st = os.lstat(self.data_dir / source)
        except OSError as exc:
            return exc.strerror, None
        if not stat.S_ISREG(st.st_mode):  # a folder named like an image, a link, a pipe
            return "not a regular file (a folder, a link or a device): only image files move", None
        first = self.files.setdefault((st.st_dev, st.st_ino), row.line)
        if first != row.line:
            return f"the same file as line {first} names (another spelling of one name?)", None
        return None, st

    def move_of(self, row, source, st, actual, names):
        """(why the row's file cannot move or None, its Move or None where it is labeled so already);
        actual: the digest of the file's bytes (file_digest_or_error) where the row gives one or the
        file was hashed anyway (the Move keeps it)."""
        problem = digest_problem(actual, row.digest) if row.digest or isinstance(actual, OSError) else None
        if problem:
            return problem, None
        if not row.aside and source.split("/")[0] != "unlabeled" and source.split("/")[1] == row.label:
            # labeled so already: nothing moves, but a person's label on a model's is logged as theirs
            return None, (Move(source, source, row.label, row.digest) if source in self.accepted() else None)
        folder = f"{ASIDE}/{posixpath.dirname(source)}" if row.aside else f"{target_part(source)}/{row.label}"
        problem = self.folder.move_problem(source, st, folder)
        if problem:
            return problem, None
        name = names.free(folder, posixpath.basename(source))
        if len(name.encode(PATH_ENCODING, PATH_ERRORS)) > self.longest:
            return f"the name {name!r} is longer than the file system takes", None
        return None, Move(source, f"{folder}/{name}", row.label, row.digest or actual)


def plan(data_dir, rows, new_classes=False, sources=SOURCES, bar=no_bar, expected=None, persons=True):
    """The Plan of the rows (label_files.LabelRow, a stream read once): the moves they ask for, in
    order (each with the free name it will take), the number of rows applied before (or already so)
    and of rows read; exits 2 naming the rows that cannot be applied (unknown class, missing file, a
    file another row names too, an image replaced since its row was written, a path outside
    unlabeled/, labeled/ and test/ or through a link, a hidden file or a file that is no image
    (training would never see it), a name the file system refuses, a file on another file system, a
    folder that cannot be written) before any move. An unlabeled/ image goes to labeled/<label>/; a
    labeled/ or test/ image whose label is wrong (evaluate.py --audit) to <its part>/<label>/; a row
    that sets its image aside to set-aside/<its path>. `sources`: the parts rows may come from
    (--accepted: unlabeled/ only, never a label a person gave). persons: the rows are a person's, so
    one that keeps the class label.py --accepted gave an image (by its path now or before) confirms
    it (Move.confirms); else a model's, and a row for an image a person moved since (another label,
    or aside) is passed over and counted (Plan.overruled): the person's decision stands. Linear in the rows: the planned moves
    go to a temporary file, the files named are hashed on a pool of threads a chunk of rows at a time,
    and what the checks across rows need (each row's path and file, the names taken) is what memory
    holds. bar(expected rows, what) gives the update function of a progress bar."""
    data_dir = Path(data_dir)
    undone = undone_batches(data_dir)  # the log read (and checked: one that cannot be trusted moves nothing) first
    progress = bar(expected, "checking rows")
    # persons: the rows are a person's labels, which confirm label.py --accepted's (never its own rows again)
    accepted = functools.cache(lambda: accepted_places(data_dir, undone) if persons else {})  # read where needed
    checks, names = RowChecks(data_dir, sources, new_classes, accepted), Names(data_dir)
    result, problems, gone = Plan(), Problems(), []
    with ThreadPoolExecutor(2 * (os.cpu_count() or 1)) as pool:
        for chunk in batched(rows, PLAN_CHUNK):
            result.rows += len(chunk)
            checked = []  # (row, source, its stat) of the rows whose file is to be hashed and moved
            for row in chunk:
                problem, source, there, st = checks.source_of(row)
                if problem:
                    problems.add(row, problem)
                elif not there:
                    gone.append((row, source))  # applied before? the log says, once every row is read
                else:
                    checked.append((row, source, st))
            # label.py --accepted's files are hashed even without a hash in the row: training tells by it a
            # file replaced since (a person's)
            hashed = [bool(row.digest) or not persons for row, _, _ in checked]
            actual = pool.map(file_digest_or_error, [data_dir / source for (_, source, _), h in zip(checked, hashed) if h])
            for (row, source, st), h in zip(checked, hashed):
                problem, move = checks.move_of(row, source, st, next(actual) if h else None, names)
                if problem:
                    problems.add(row, problem)
                elif move:
                    result.add(move)
                else:
                    result.skipped += 1  # labeled so already
            progress(len(chunk))
    applied = applied_moves(data_dir, [source for _, source in gone], undone) if gone else {}
    for row, source in gone:
        problem = applied_before(data_dir, row, applied.get(source))
        now = applied[source].journey.now if source in applied else None
        if problem and not persons and source in applied and applied[source].action != "accept":
            result.overruled += 1  # a model's label for an image a person labeled or set aside: theirs stands
        elif problem:
            problems.add(row, problem)
        elif now in accepted():  # label.py --accepted gave it this label, and a person gives it again
            result.add(Move(now, now, row.label, row.digest))
        else:
            result.skipped += 1
    problems.refuse(result.rows)
    return result


def applied_before(data_dir, row, applied):
    """Why a row whose file is no longer at its path cannot be taken as applied before, or None: a
    move of a batch not undone took the file from that path, as this row asks (its label, or aside),
    the same file (its hash, where both are known), and the file is still where its later moves
    (a relabel since, say) took it."""
    if applied is None:
        return "no such file"
    if applied.label != row.label:
        what = ("set aside" if not applied.label else f"labeled {applied.label!r}"
                + " (label.py --accepted: a model's label; a row for its new path relabels it)" * (applied.action == "accept"))
        return f"no such file: label.py {what} it before (it is now {applied.journey.now})"
    if row.digest and applied.digest and row.digest != applied.digest:
        return "the image label.py moved from this path before is not the one this row was written for"
    if not os.path.lexists(data_dir / applied.journey.now):
        return f"no such file: label.py moved it to {applied.journey.now}, which is gone"
    return None
