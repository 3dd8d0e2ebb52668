"""Labels back into an own-images folder: the moves a plan (plan.py) checked in full, each made
with one rename that never replaces a file, every move logged in <folder>/label-log.csv first
(log.py) so that a run cut short leaves each file in its old place or its new one, a rerun
skips what is done and the last batch can be put back (undo). One label.py at a time per folder (a
lock on the folder). A move the OS refuses midway (a full disk, a read-only file system) puts back
the moves of its batch before it ends.

At any size: applying and undoing are linear in the rows; the batch to put back waits in a temporary
file (spill.py), files are hashed on a pool of threads, and the log is written a chunk of moves at a
time (one fsync a chunk, before the chunk's moves).
"""
import contextlib
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

from ..data.files import DIGEST_COLUMN
from ..disk.opening import lock_folder, rename_no_replace
from ..disk.spill import CHUNK, Spill
from ..errors import MoveFailed, UserError
from .inputs import linked_folder
from .log import CONFIRM, MOVES, Log, log_rows, next_batch, undone_batches
from .plan import digest_problem, file_digest_or_error, no_bar

# Changing the folder: one label.py at a time, logged, all or nothing ---------------------------------

@contextlib.contextmanager
def locked(data_dir):
    """While the block runs, this process is the only label.py changing data_dir (a lock on the
    folder itself, the OS's: it ends with the process, never stale, and writes no file)."""
    fd = lock_folder(data_dir, f"another label.py is changing {data_dir}: let it finish, then run this again",
                     follow_link=True)
    try:
        yield
    finally:
        os.close(fd)


def folders_to_make(data_dir, folder, existing):
    """The folders of the path `folder` (relative) that do not exist yet, outermost first; `existing`:
    the folders known to exist (added to as they are found)."""
    parts = folder.split("/")
    needed = []
    for k in range(1, len(parts) + 1):
        prefix = "/".join(parts[:k])
        if prefix not in existing:
            if os.path.lexists(data_dir / prefix):
                existing.add(prefix)
            else:
                needed.append(prefix)
    return needed


def folder_label(folder):
    """The label a mkdir row of the log carries: the class of a class folder, "" for another folder."""
    parts = folder.split("/")
    return parts[1] if len(parts) == 2 and parts[0] in ("labeled", "test") else ""


def apply(data_dir, moves, echo=click.echo, bar=no_bar, accepted=False):
    """Move each image to its target (a Plan's), each with one rename that never replaces a file; the
    folders it needs are made; accepted: the labels are a model's predictions (label.py --accepted),
    logged as such (log.MOVES), so that training can tell them from a person's; a confirmation
    (Move.confirms) is logged and moves nothing. A chunk of moves at a time, the log's rows for the
    whole chunk are written and flushed to disk (one fsync) before any of its moves is made, so that
    a run cut short leaves every file in its old place or its new one, logged. Returns the batch
    number. If the OS refuses a step, the batch's moves are put back (latest first) and its folders
    removed before MoveFailed says so."""
    data_dir = Path(data_dir)
    batch = next_batch(data_dir)
    log, done, moved, made, existing, failed = Log(data_dir, echo), 0, 0, [], set(), None  # done: moves and confirmations
    progress = bar(len(moves), "moving")
    try:
        for chunk in moves.chunks():
            steps, rows = [], []  # steps: (the folders to make first, the move)
            for move in chunk:
                if move.confirms:  # logged, nothing moves
                    rows.append(log.row(batch, CONFIRM, move.source, move.target, move.label, move.digest))
                    steps.append(((), move))
                    continue
                folders = folders_to_make(data_dir, posixpath.dirname(move.target), existing)
                rows += [log.row(batch, "mkdir", target=folder, label=folder_label(folder)) for folder in folders]
                action = "aside" if move.aside else "accept" if accepted else "move"
                rows.append(log.row(batch, action, move.source, move.target, move.label, move.digest))
                steps.append((folders, move))
                existing.update(folders)
            log.put(rows)
            for folders, failed in steps:
                for folder in folders:
                    (data_dir / folder).mkdir()
                    made.append(data_dir / folder)
                if not failed.confirms:
                    rename_no_replace(data_dir / failed.source, data_dir / failed.target)
                    moved += 1
                done += 1
            failed = None
            progress(len(chunk))
    except OSError as exc:
        stuck = rename_back(data_dir, ((m.source, m.target) for m in moves.reversed(done)), made)
        with contextlib.suppress(OSError):
            log.write(batch, "undo")
        what = f"moving {failed.source}" if failed else f"writing {log.path}" if exc.filename == str(log.path) \
            else "reading the planned moves"
        raise MoveFailed(f"{what} failed ({exc.strerror or exc}): " + (
            f"the {moved} images moved before it were put back; nothing was moved" if not stuck else
            f"and {len(stuck)} of the {moved} images moved before it could not be put back: {'; '.join(stuck[:5])}")) from None
    finally:
        log.close()
    return batch


def rename_back(data_dir, renames, made):
    """Undo renames already made [(from, to)], latest first, and remove the folders made for them
    (latest first, if empty); returns '<to> (reason)' for each file that could not be renamed back."""
    stuck = []
    for old, new in renames:
        if old == new:  # a confirmation: nothing moved
            continue
        try:
            rename_no_replace(data_dir / new, data_dir / old)
        except OSError as exc:
            stuck.append(f"{new} ({exc.strerror})")
    for folder in reversed(made):
        with contextlib.suppress(OSError):
            folder.rmdir()
    return stuck


def last_batch(data_dir):
    """The number (text) of the last batch of the log with moves that is not undone, or None."""
    undone, last = undone_batches(data_dir, checked=False), None  # every row is checked by the pass below
    for r in log_rows(data_dir):
        if (r["action"] in MOVES or r["action"] == CONFIRM) and r["batch"] not in undone:
            last = r["batch"]
    return last


def undo_checks(data_dir, mine, bar):
    """(a byte per move of `mine` (a Spill of [source, target, label, digest]): 1 where its file is to
    be put back, the problems that keep some from it): each file checked where it is, hashed on a pool
    of threads a chunk at a time."""
    back, problems, writable = bytearray(len(mine)), set(), {}
    progress = bar(len(mine), "checking")
    with ThreadPoolExecutor(2 * (os.cpu_count() or 1)) as pool:
        for k, chunk in enumerate(mine.chunks()):
            present = []
            for i, (source, target, label, digest) in enumerate(chunk, k * CHUNK):
                if os.path.lexists(data_dir / source):
                    if os.path.lexists(data_dir / target):
                        problems.add(f"{source}: the name is taken by another file ({target} is still there)")
                    continue  # already back (a move a kill cut short never happened)
                if not (data_dir / target).is_file() or (data_dir / target).is_symlink():
                    problems.add(f"{target}: gone (it was moved or deleted since)")
                    continue
                link = linked_folder(data_dir, posixpath.dirname(source)) or linked_folder(data_dir, posixpath.dirname(target))
                if link:
                    problems.add(f"{link}/ is a link now (label.py puts files back into the folder's own folders only)")
                    continue
                present.append((i, source, target, digest))
            actual = pool.map(file_digest_or_error, [data_dir / target for _, _, target, digest in present if digest])
            for i, source, target, digest in present:
                if digest and digest_problem(next(actual), digest):
                    problems.add(f"{target}: another image than the one label.py moved there (replaced since)")
                    continue
                parent = next(p for p in (data_dir / source).parents if p.exists())
                for folder in {(data_dir / target).parent, parent}:
                    if folder not in writable:
                        writable[folder] = os.access(folder, os.W_OK)
                    if not writable[folder]:
                        problems.add(f"{folder.relative_to(data_dir)}/ cannot be written (read-only)")
                back[i] = 1
            progress(len(chunk))
    return back, problems


def undo(data_dir, echo=click.echo, bar=no_bar):
    """Put the last batch not yet undone back: each moved file to where it was (never replacing a
    file), the folders it created removed (if empty), its confirmations taken back (their labels the
    model's again). Returns (batch, files put back, confirmations taken back), or None where there is
    nothing to undo. Every file is checked first: where one cannot be put back (its old name
    taken by another file, gone from both places, another image at its new place than the one moved,
    a folder that cannot be written) nothing moves, the batch stays open and exit 2 names the files.
    The batch's moves are read from the log into a temporary file (spill.py), checked a chunk at a
    time (the moved files hashed on a pool of threads) and put back latest first."""
    data_dir = Path(data_dir)
    batch = last_batch(data_dir)
    if batch is None:
        return None
    mine, made_by_batch, confirmed = Spill(), [], 0
    for r in log_rows(data_dir):
        confirmed += r["batch"] == batch and r["action"] == CONFIRM
        if r["batch"] == batch and r["action"] in MOVES:
            mine.append([r["source"], r["target"], r["label"], r.get(DIGEST_COLUMN) or None])
        elif r["batch"] == batch and r["action"] == "mkdir":
            made_by_batch.append(r["target"])
    back, problems = undo_checks(data_dir, mine, bar)
    if problems:
        raise UserError(f"batch {batch} stays applied, nothing was put back: {len(problems)} of its files cannot "
                        f"be: {'; '.join(sorted(problems)[:5])}" + (" ..." if len(problems) > 5 else ""))
    log, restored, made = Log(data_dir, echo), [], []
    progress = bar(sum(back), "putting back")
    try:
        for i, (source, target, label, digest) in zip(range(len(mine) - 1, -1, -1), mine.reversed()):
            if back[i]:
                for folder in reversed([p for p in (data_dir / source).parents if not p.exists()]):
                    folder.mkdir()
                    made.append(folder)
                rename_no_replace(data_dir / target, data_dir / source)
                restored.append(i)
                progress(1)
        for folder in reversed(made_by_batch):
            folder = data_dir / folder
            if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
                folder.rmdir()
        log.write(batch, "undo")
    except OSError as exc:
        put_back = set(restored)
        stuck = rename_back(data_dir, ((target, source) for i, (source, target, _, _) in enumerate(mine)
                                       if i in put_back), made)
        where = f"writing {log.path}: " if exc.filename == str(log.path) else ""
        raise MoveFailed(f"putting back batch {batch} failed ({where}{exc.strerror or exc}): " + (
            "its files are where they were before the undo; the batch stays applied" if not stuck else
            f"{len(stuck)} files are neither here nor there: {'; '.join(stuck[:5])}")) from None
    finally:
        log.close()
    return int(batch), len(restored), confirmed
