"""Runs on disk: atomic writes, checkpoints (save, load safely, restore the models), metrics files,
RNG states, resume, signals, and the user-error type (exit code 2).
"""
import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import tempfile
import time
from pathlib import Path

import click
import numpy as np
import torch

from model import build_models


class UserError(click.ClickException):
    """A problem with the user's input or files: a one-line message and exit code 2, no traceback."""
    exit_code = 2


class WriteFailed(click.ClickException):
    """A file could not be written (a full disk, a file-size or quota limit, no permission): one line
    naming the file and the OS's reason, exit code 1. Nothing of the file is left behind, and the
    files written before it are whole."""
    exit_code = 1

    def __init__(self, path, error):
        self.errno = error.errno
        super().__init__(f"cannot write {path}: {error.strerror or error} (nothing of it was left behind; "
                         f"the files written before it are complete)")


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


def atomic_write(path, write):
    """Write a file via a temp file in the same folder, flush + fsync, then os.replace: a crash
    never leaves a truncated file behind. A write the OS refuses raises WriteFailed. Returns what
    write(f) returns."""
    path = Path(path)
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


def existing_outputs(out, names, overwrite):
    """The files among `names` that an earlier run left in `out`; exit 2 unless told to overwrite them."""
    existing = [name for name in names if (Path(out) / name).exists()]
    if existing and not overwrite:
        raise UserError(f"{out} already holds {', '.join(existing)} of an earlier run; "
                        f"pass --overwrite or choose another --out")
    return existing


def save_checkpoint(path, state):
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


CHECKPOINT_KEYS = ("student", "teacher", "optimizer", "epoch", "step", "config", "labeled_idx", "unlabeled_idx")
# What the scripts read from a checkpoint's config, by type (an LC checkpoint's "lc" too).
CONFIG_TYPES = dict(dataset=str, data_dir=str, labels=int, labeled_batch=int, unlabeled_batch=int, width=(int, float),
                    num_classes=int, classes=list, mean=list, std=list, seed=int, lr=(int, float), ema=(int, float),
                    cons_weight=(int, float), cons_rampup=(int, float), epochs=int, decay_epochs=int, eval_every=int,
                    bn_momentum=(int, float))
LC_CONFIG_TYPES = dict(eps=(int, float), eps_auto=bool, eps_scale=str, start=dict, lam=(int, float),
                       lc_rampup=(int, float), epochs=int, decay_epochs=int, lr=(int, float), eval_every=int,
                       mt_step=int, mt_checkpoint=str)


def unpickling_refusal(exc):
    """The line of torch's weights_only refusal that names what the file asked for, if it is one."""
    for line in str(exc).splitlines():
        if "GLOBAL" in line or "Unsupported" in line or "WeightsUnpickler" in line:
            return line.strip()
    return None


def config_problem(state):
    """What a checkpoint's config lacks or holds of the wrong type, or None."""
    config = state.get("config")
    if not isinstance(config, dict):
        return "it has no config"
    wrong = [k for k, kind in CONFIG_TYPES.items() if not isinstance(config.get(k), kind)]
    if state.get("stage") == "lc":
        lc = config.get("lc")
        if not isinstance(lc, dict):
            wrong.append("lc")
        else:
            wrong += [f"lc.{k}" for k, kind in LC_CONFIG_TYPES.items() if not isinstance(lc.get(k), kind)]
    if wrong:
        return f"its config lacks {', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''} (or holds another type)"
    if len(config["classes"]) != config["num_classes"] or len(config["mean"]) != 3 or len(config["std"]) != 3:
        return "its config's classes, mean or std do not fit its class count and 3 colour channels"
    return None


def load_checkpoint(path):
    """A checkpoint as a dict, loaded with weights_only=True (a checkpoint from elsewhere cannot run
    code) and checked to hold what the scripts read; any problem ends the run with exit code 2 and
    a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        refused = unpickling_refusal(exc)
        if refused:
            raise UserError(f"cannot load checkpoint {path}: it holds Python objects other than tensors and plain "
                            f"data ({refused}); refused, as loading them could run code (this project's "
                            f"checkpoints never hold any)") from None
        raise UserError(f"cannot load checkpoint {path}: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200] if str(exc) else 'unreadable'}") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise UserError(f"{path} is not a checkpoint of this project (missing {', '.join(missing)})")
    problem = config_problem(state)
    if problem:
        raise UserError(f"{path} is not a checkpoint this project can use: {problem}")
    return state


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


# The lock file a run holds in its output folder (runs.run_folder); hidden, so that no image search
# ever sees it.
LOCK_NAME = ".mtlc-run.lock"


@contextlib.contextmanager
def run_folder(out, script, hold=True):
    """While the block runs, this process is the only run writing `out` (created if need be): a
    second run on the same folder exits 2 at once, naming this one. The lock is the OS's (flock on
    LOCK_NAME): it ends with the process however it ends, so a killed run's folder is free again and
    a lock is never stale. On failure, a folder this call created and left empty is removed, and so is
a lock file it created in a folder that was there. hold=False
    (a process that writes nothing, a benchmark without --out) does nothing."""
    if not hold:
        yield
        return
    out = Path(out)
    created = not out.exists()
    path = out / LOCK_NAME
    lock_created = not path.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
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


def checkpoint_state(student, teacher, optimizer, stage, epoch, step, config, split, reference_spread, metrics):
    return dict(student=student.state_dict(), teacher=teacher.state_dict(), optimizer=optimizer.state_dict(),
                stage=stage.name, epoch=epoch, step=step, config=config, **split, rng=rng_state(),
                reference_spread=reference_spread, metrics=metrics)


def checkpoint_split(state):
    """The labeled / unlabeled / validation indices of a checkpoint."""
    return dict(labeled_idx=state["labeled_idx"], unlabeled_idx=state["unlabeled_idx"],
                val_idx=state.get("val_idx", torch.zeros(0, dtype=torch.long)))


def check_resume_flags(resume, **flags):
    """--resume continues a run as it was: it excludes the flags given here that are set."""
    for name, value in flags.items():
        if resume and value:
            raise UserError(f"--resume and --{name} exclude each other")


def resume_checkpoint(out, stage_name, write=True):
    """The `<stage>_last.pt` of an interrupted run in `out`, its RNG states restored, and (by the
    process that writes) the metrics file rewritten to the epochs that checkpoint has seen (it holds
    their records)."""
    path = Path(out) / f"{stage_name}_last.pt"
    if not path.exists():
        raise UserError(f"--resume: {path} does not exist (nothing to resume in {out}; a run stopped in its "
                        f"first epoch starts again without --resume)")
    state = load_checkpoint(path)
    if state.get("stage") != stage_name:
        raise UserError(f"--resume: {path} holds stage {state.get('stage')!r}, not {stage_name!r}")
    set_rng_state(state["rng"])
    if write:
        write_metrics(Path(out) / f"{stage_name}_metrics.jsonl", state["metrics"])
    return state


def restore_models(state, device):
    """Student and teacher of a checkpoint; a checkpoint of another width or class count exits 2."""
    config = state["config"]
    try:
        student, teacher = build_models(config, device)
        student.load_state_dict(state["student"])
        teacher.load_state_dict(state["teacher"])
    except (KeyError, TypeError, RuntimeError) as exc:
        raise UserError(f"checkpoint does not fit this project's model: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200]}") from None
    return student, teacher
