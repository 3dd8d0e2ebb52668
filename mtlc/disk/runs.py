"""Runs on disk: atomic writes, the output folder a run holds, metrics files, RNG states and
signals. What a checkpoint holds is checkpoints.py's.
"""
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path

import click
import numpy as np
import torch

from ..errors import UserError, WriteFailed
from .opening import check_folder, open_kept
from .outputs import FINAL_OUTPUT, LOCK_NAME, STAGING, not_a_file


def os_error_in(exc):
    """The OSError that caused exc, if any: torch's zip writer, for one, reports a failed write as a
    RuntimeError ('unexpected pos') whose context is the OSError."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def atomic_write(path, write, *, own_name=False):
    """Write a file via a temp file in the same folder, flush + fsync, then os.replace: a crash
    never leaves a truncated file behind; a link at path is replaced, never followed. A write the OS
    refuses raises WriteFailed; a folder, pipe, device or socket at path is refused (UserError),
    except that with own_name (a name the tools keep in their own folder, the decode cache's) a pipe,
    device or socket there is replaced like any stray file. Returns what write(f) returns."""
    path = Path(path)
    kind = not_a_file(path)
    if kind and not (own_name and kind != "a folder"):
        raise UserError(f"{path} is {kind}, not a file: give the output another name")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # the permissions a plain open() would give, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            result = write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_folder(path.parent)  # the rename itself survives a power cut
        return result
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        error = os_error_in(exc)
        if error is not None and not isinstance(exc, click.ClickException):
            raise WriteFailed(path, error) from None
        raise


def fsync_folder(folder):
    """Flush a folder's entries to disk; a file system that cannot (some network ones) is let be."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def staging_folder(out, stage_name):
    return Path(out) / STAGING.format(stage_name)


def writing_folder(out, stage_name):
    """Where a stage's run in `out` keeps its checkpoints and metrics: the staging folder where a run
    with --overwrite left its resume checkpoint there (killed before its end), else out itself. Where
    out holds a resume checkpoint written after the staging folder's (a later run, started without
    --overwrite once the files it would have replaced were gone), the two runs are named and neither
    is taken: --resume continues the run it names."""
    staging, name = staging_folder(out, stage_name), f"{stage_name}_last.pt"
    check_folder(staging, "folder a run with --overwrite writes into")  # a link would take the run elsewhere
    if not os.path.lexists(staging / name):
        return Path(out)
    with contextlib.suppress(OSError):
        if os.lstat(Path(out) / name).st_mtime_ns > os.lstat(staging / name).st_mtime_ns:
            raise UserError(f"--resume: {out} holds two interrupted runs: {Path(out) / name} and an older one in "
                            f"{staging / name} (a run with --overwrite killed before it): remove the folder "
                            f"{staging} to resume the newer, or start again")
    return staging


def remove_stale_staging(out, stage_name):
    """A new run in out (not resumed, replacing nothing) removes the staging folder of an earlier run
    with --overwrite that never ended: --resume must never take that run up instead of this one."""
    staging = staging_folder(out, stage_name)
    check_folder(staging, "folder a run with --overwrite writes into")
    if staging.is_dir():
        shutil.rmtree(staging)


def prepare_staging(out, stage_name):
    """An empty staging folder for a new run with --overwrite (what a killed one left removed)."""
    staging = staging_folder(out, stage_name)
    check_folder(staging, "folder a run with --overwrite writes into")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    return staging


def publish(staging, out, replacing=()):
    """The outputs a run wrote into its staging folder moved into out, each replacing the earlier
    run's file of its name in one rename; the earlier run's outputs (`replacing`) it did not write
    removed; the staging folder removed."""
    written = sorted(p.name for p in staging.iterdir() if not p.name.startswith("."))
    for name in written:
        os.replace(staging / name, Path(out) / name)
    for name in set(replacing) - set(written):
        (Path(out) / name).unlink(missing_ok=True)
    fsync_folder(out)
    shutil.rmtree(staging)


def existing_outputs(out, names, overwrite):
    """The files among `names` that an earlier run left in `out`; exit 2 unless told to overwrite them."""
    existing = [name for name in names if (Path(out) / name).exists()]
    if existing and not overwrite:
        # the state after an epoch without the stage's last checkpoint: a run stopped before its end
        stopped = any(f"{stage}_last.pt" in existing and final not in existing for stage, final in FINAL_OUTPUT.items())
        raise UserError(f"{out} already holds {', '.join(existing)} of an earlier run"
                        + ("; it stopped before its end: pass --resume to continue it, --overwrite to start again, "
                           "or choose another --out" if stopped else "; pass --overwrite or choose another --out"))
    return existing


def save_checkpoint(path, state):
    """torch.save through atomic_write: a checkpoint is whole or not there."""
    atomic_write(path, lambda f: torch.save(state, f))


def read_metrics(path):
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def write_metrics(path, records):
    """Rewrite the metrics file atomically, so it is never half-written."""
    atomic_write(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in records).encode()))


def rng_state():
    state = dict(torch=torch.get_rng_state(), python=random.getstate())
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Interrupted(click.ClickException):
    def __init__(self, signum):
        super().__init__(f"interrupted by {signal.Signals(signum).name}; every file on disk is complete "
                         f"(the last finished epoch is in the *_last.pt checkpoint: continue with --resume)")
        self.exit_code = 128 + signum


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT and SIGTERM end the run at once with a message; atomic writes keep the files whole."""
    def handler(signum, frame):
        raise Interrupted(signum)
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def run_folder(out, script, hold=True):
    """While the block runs, this process is the only run writing `out` (created if need be): a
    second run on the same folder exits 2 at once, naming this one. The lock is the OS's (flock on
    LOCK_NAME, opened without following a link and checked to be a regular file of one name: the
    checkpoint's folder, finetune_lc.py's default, may come from someone else): it ends with the
    process however it ends, so a killed run's folder is free again and a lock is never stale. On failure, a folder this call created and left empty is removed, and so is
a lock file it created in a folder that was there. hold=False
    (a process that writes nothing, a benchmark without --out) does nothing."""
    if not hold:
        yield
        return
    out = Path(out)
    created = not out.exists()
    path = out / LOCK_NAME
    lock_created = not os.path.lexists(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = open_kept(path, os.O_RDWR | os.O_CREAT, "run lock", writing=True)  # never truncates a file elsewhere
    except OSError as exc:
        raise WriteFailed(path, exc) from None
    locked_by_other = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            locked_by_other = True
            holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "a process that has not said which"
            raise UserError(f"{out} is being written by another run ({holder}): let it finish or stop it, or "
                            f"choose another --out") from None
        except OSError as exc:  # ENOLCK: a file system without locks (some network ones)
            raise UserError(f"cannot lock {path} ({exc.strerror}): this file system does not let one run keep "
                            f"others out of --out; choose an --out on a local disk") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{script}, pid {os.getpid()} on {socket.gethostname()}, started "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        yield
    except BaseException:
        if created and os.listdir(out) == [LOCK_NAME]:
            path.unlink()
            out.rmdir()
        elif lock_created and not locked_by_other:  # a refused start leaves the folder as it was
            path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def check_resume_flags(resume, **flags):
    """--resume continues a run as it was: it excludes the flags given here that are set."""
    for name, value in flags.items():
        if resume and value:
            raise UserError(f"--resume and --{name} exclude each other")
