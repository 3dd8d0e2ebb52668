"""Labels back into an own-images folder: each listed image moves from unlabeled/ into
labeled/<class>/, checked in full before anything moves, never overwriting, one atomic rename per
file, every move logged in <folder>/label-log.csv so that a rerun skips what is done and the last
batch can be put back.

A folder may come from someone else: every path read from labels.csv or from the log must name a
place inside the folder (relative, no '..', no link to a folder outside it), or nothing moves. One
label.py at a time per folder (a lock on the folder). A move the OS refuses midway (a full disk, a
read-only file system) puts back the moves of its batch before it ends; a log line a full disk left
torn is cut off before the log is written again.
"""
import contextlib
import fcntl
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

import click

from .console import PATH_ENCODING, PATH_ERRORS, is_text
from .errors import MoveFailed, UserError
from .files import is_hidden
from .label_files import Log, applied_moves, inside, read_log, target_part

# Where the images label.py moves may come from.
SOURCES = ("unlabeled", "labeled", "test")


@dataclass
class Move:
    source: str   # relative to the folder, '/'-separated: unlabeled/...
    target: str   # labeled/<label>/<name>
    label: str


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


def free_name(folder, name, taken):
    """name, or name-1, name-2, ... with its extension: the first that neither exists nor is taken."""
    stem, suffix = Path(name).stem, Path(name).suffix
    candidate, k = name, 0
    while os.path.lexists(folder / candidate) or f"{folder}/{candidate}" in taken:
        k += 1
        candidate = f"{stem}-{k}{suffix}"
    return candidate


def plan(data_dir, rows, new_classes=False, sources=SOURCES):
    """The moves the rows [(line, path, label)] ask for, in order (each with the free name it will
    take), and the number of rows applied before (or already so); exits 2 naming every row that
    cannot be applied (unknown class, missing file, a path outside unlabeled/, labeled/ and test/ or
    through a link, a duplicate, a name the file system refuses, a file on another file system, a
    folder that cannot be written) before any move. An unlabeled/ image goes to labeled/<label>/; a
    labeled/ or test/ image whose label is wrong (evaluate.py --audit) to <its part>/<label>/. `sources`:
    the parts rows may come from (--accepted: unlabeled/ only, never a label a person gave)."""
    data_dir = Path(data_dir)
    labeled = data_dir / "labeled"
    classes, done = set(known_classes(data_dir)), applied_moves(read_log(data_dir))
    longest = name_max(labeled if labeled.is_dir() else data_dir)
    device = os.stat(labeled if labeled.is_dir() else data_dir).st_dev
    moves, problems, seen, taken, skipped = [], [], set(), set(), 0
    for line, path, label in rows:
        source = relative_source(data_dir, path)
        where = f"line {line} ({path})"
        problem = None
        parts = None if source is None else source.split("/")
        if parts is None or parts[0] not in sources or len(parts) < (2 if parts[0] == "unlabeled" else 3):
            problem = f"not a file under {' or '.join(str(data_dir / part) for part in sources)}"
        elif not inside(data_dir, source, SOURCES):
            problem = "it leads outside the folder through a link"
        elif source in seen:
            problem = "listed twice"
        else:
            problem = label_problem(label, labeled, longest)
        if problem is None and parts[0] == "test" and label not in classes:
            problem = f"a test image can only take a class labeled/ has ({', '.join(sorted(classes))})"
        if problem is None and label not in classes and not new_classes:
            problem = f"unknown class {label!r} (labeled/ has {', '.join(sorted(classes))}; --new-classes creates it)"
        if problem is None and not os.path.isfile(data_dir / source):
            target, done_label = done.get(source, (None, None))
            if target and done_label == label and (data_dir / target).is_file():
                skipped += 1
            else:
                problem = "no such file"
        elif problem is None and parts[0] != "unlabeled" and parts[1] == label:
            skipped += 1  # labeled so already
        elif problem is None:
            folder = f"{target_part(source)}/{label}"
            problem = move_problem(data_dir, source, folder, device)
            if problem is None:
                name = free_name(data_dir / folder, posixpath.basename(source), taken)
                if len(name.encode(PATH_ENCODING, PATH_ERRORS)) > longest:
                    problem = f"the name {name!r} is longer than the file system takes"
                else:
                    taken.add(f"{data_dir / folder}/{name}")
                    moves.append(Move(source, f"{folder}/{name}", label))
        if problem:
            problems.append(f"{where}: {problem}")
        if source is not None:
            seen.add(source)
    if problems:
        shown = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise UserError(f"nothing was moved: {len(problems)} of {len(rows)} rows cannot be applied: {shown}")
    return moves, skipped


def move_problem(data_dir, source, folder, device):
    """Why the file `source` cannot be renamed into the class folder `folder` (labeled/<label> or
    test/<label>), or None: another file system (a rename cannot cross one), a link out of the
    folder, or a folder that cannot be written."""
    try:
        if os.stat(data_dir / source).st_dev != device:
            return "it lies on another file system (a mount or a link inside the folder): copy it into unlabeled/ first"
    except OSError as exc:
        return exc.strerror
    target_folder, part = data_dir / folder, data_dir / folder.split("/")[0]
    if os.path.lexists(target_folder) and not target_folder.is_dir():
        return f"{folder} is a file, not a class folder"
    if target_folder.is_dir() and not inside(data_dir, f"{folder}/x", (folder.split("/")[0],)):
        return f"{folder} leads outside the folder through a link"
    for checked in (Path(data_dir / source).parent, target_folder if target_folder.is_dir() else part):
        if checked.exists() and not os.access(checked, os.W_OK):
            return f"{checked.relative_to(data_dir)}/ cannot be written (read-only)"
    if not part.exists() and not os.access(data_dir, os.W_OK):
        return f"{data_dir} cannot be written (read-only)"
    return None


# Changing the folder: one label.py at a time, logged, all or nothing ---------------------------------

@contextlib.contextmanager
def locked(data_dir):
    """While the block runs, this process is the only label.py changing data_dir (a lock on the
    folder itself, the OS's: it ends with the process, never stale, and writes no file)."""
    try:
        fd = os.open(data_dir, os.O_RDONLY)
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


def apply(data_dir, moves, echo=click.echo):
    """Move each image to its target (plan's), each with one rename, logged first; the class
    folders it needs are made (and logged). Returns the batch number. If the OS refuses a step, the
    batch's moves are put back and its folders removed before MoveFailed says so."""
    data_dir = Path(data_dir)
    batch = next_batch(read_log(data_dir))
    log, done, made = Log(data_dir, echo), [], []
    try:
        for move in moves:
            folder = data_dir / posixpath.dirname(move.target)
            if not folder.exists():
                log.write(batch, "mkdir", "", posixpath.dirname(move.target), move.label)
                folder.mkdir()
                made.append(folder)
            log.write(batch, "move", move.source, move.target, move.label)
            os.rename(data_dir / move.source, data_dir / move.target)
            done.append(move)
    except OSError as exc:
        failed = moves[len(done)] if len(done) < len(moves) else None
        stuck = rename_back(data_dir, [(m.source, m.target) for m in done], made)
        with contextlib.suppress(OSError):
            log.write(batch, "undo", "", "", "")
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
            os.rename(data_dir / new, data_dir / old)
        except OSError as exc:
            stuck.append(f"{new} ({exc.strerror})")
    for folder in reversed(made):
        with contextlib.suppress(OSError):
            folder.rmdir()
    return stuck


def undo(data_dir, echo=click.echo):
    """Put the last batch not yet undone back: each moved file to where it was, the class folders it
    created removed (if empty). Returns (batch, files put back), or None where there is nothing to
    undo. Every file is checked first: where one cannot be put back (its old name taken by another
    file, gone from both places, a folder that cannot be written) nothing moves, the batch stays
    open and exit 2 names the files."""
    data_dir = Path(data_dir)
    log_rows = read_log(data_dir)
    undone = {r["batch"] for r in log_rows if r["action"] == "undo"}
    batches = [r["batch"] for r in log_rows if r["action"] == "move" and r["batch"] not in undone]
    if not batches:
        return None
    batch = batches[-1]
    mine = [r for r in log_rows if r["batch"] == batch]
    back, problems = [], []
    for r in reversed([r for r in mine if r["action"] == "move"]):
        source, target = data_dir / r["source"], data_dir / r["target"]
        if os.path.lexists(source):
            if os.path.lexists(target):
                problems.append(f"{r['source']}: the name is taken by another file ({r['target']} is still there)")
            continue  # already back (a move a kill cut short never happened)
        if not target.is_file():
            problems.append(f"{r['target']}: gone (it was moved or deleted since)")
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
            missing = [p for p in reversed(source.parents) if not p.exists()]
            for folder in missing:
                folder.mkdir()
                made.append(folder)
            os.rename(data_dir / move.target, source)
            restored.append(move)
        for r in (r for r in mine if r["action"] == "mkdir"):
            folder = data_dir / r["target"]
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        log.write(batch, "undo", "", "", "")
    except OSError as exc:
        stuck = rename_back(data_dir, [(m.target, m.source) for m in restored], made)
        raise MoveFailed(f"putting back batch {batch} failed ({exc.strerror or exc}): " + (
            "its files are where they were before the undo; the batch stays applied" if not stuck else
            f"{len(stuck)} files are neither here nor there: {'; '.join(stuck[:5])}")) from None
    finally:
        log.close()
    return int(batch), len(restored)
