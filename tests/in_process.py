"""The project's four scripts (train_mt.py, finetune_lc.py, evaluate.py, label.py) run in the test's own
process as `python SCRIPT ARGS` runs them, without the seconds a fresh Python spends importing torch,
numpy and the project (conftest.run).

A run gets what a fresh Python would start with, and the worker gets its own state back after it:
  - stdout and stderr are files on fd 1 and 2 (what the C level writes is caught too), with new text
    streams made as Python makes them at start (the worker's encoding and errors, stderr line-buffered),
    so that the scripts' robust_streams() reconfigures those and never the worker's; stdin is the null
    device; the output is decoded as subprocess.run(text=True) decodes it (universal newlines);
  - the exit status is Python's: 0, SystemExit's code (its message printed), 1 after an uncaught
    exception's traceback; click's usage errors and the project's errors exit as click makes them
    (2 for UserError, the codes mtlc/errors.py gives); 120 where stdout cannot be flushed at the end;
  - argv, the working folder and the environment (`env`, for the run only) are the run's;
  - torch's settings (default dtype, threads, grad mode, deterministic and TF32 flags, cudnn.benchmark)
    are a fresh Python's (OMP_NUM_THREADS's thread count: fp32 sums in other thread counts differ);
    torch's, Python's and numpy's global generators start from fresh entropy, as in a fresh process
    (torch.initial_seed() differs from one to the next); the worker's settings and generators, the
    signal handlers, sys.excepthook and threading.excepthook, the umask, the warnings filters (Python's own
    during the run, pytest's recorder left out, so that a warning reaches stderr as it would) and the
    root logger's handlers (none during the run: logging's last resort prints to stderr, as in a
    fresh process) are put back after it;
  - what the project keeps per process is cleared before and after: the seal secret read from
    MTLC_CONFIG_DIR (mtlc.disk.seal.secret), torch.compile's compiled code (torch._dynamo.reset) and a
    process group left by torch.distributed; the non-daemon threads a script started are joined, as
    Python joins them at exit (a library's thread pool excepted: it waits for the pool's next use);
  - a timeout is honoured where the test runs in the main thread (SIGALRM interrupts the script, and
    the call raises subprocess.TimeoutExpired as subprocess.run does); elsewhere it is ignored.

What a fresh Python reads at its start (PYTHONIOENCODING, PYTHONUTF8, locale variables, torch's and
Triton's start-up variables, CUDA_VISIBLE_DEVICES, ...) cannot be given to a run in this process:
`env` may hold only RUN_TIME_VARIABLES, the variables the project reads when a function runs;
conftest.run starts a process for anything else.
"""
import concurrent.futures.thread
import contextlib
import importlib
import io
import locale
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("train_mt.py", "finetune_lc.py", "evaluate.py", "label.py")
# Read by the project (and by click and shutil: the terminal's size) only inside the functions that use them,
# and by no library at its import. (Not HOME or XDG_CONFIG_HOME: matplotlib reads them at its import.)
RUN_TIME_VARIABLES = {"MTLC_CACHE_DIR", "MTLC_CONFIG_DIR", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                      "MASTER_ADDR", "MASTER_PORT", "COLUMNS", "LINES"}
THREADS_JOINED_FOR = 60  # seconds: a non-daemon thread a run left that is still alive then fails the run


def script_of(args, cwd):
    """The top-level script that `python ARGS` in cwd would run, or None where it is anything else (another
    script, -c, -m, a flag)."""
    if not args or str(args[0]).startswith("-"):
        return None
    path = Path(cwd, args[0])
    return path.name if path.name in SCRIPTS and path.resolve() == ROOT / path.name else None


def can_run(args, env, cwd):
    return script_of(args, cwd) is not None and set(env or {}) <= RUN_TIME_VARIABLES


class TimedOut(BaseException):
    """Raised in the script by SIGALRM: a BaseException, so that no `except Exception` in the code takes it."""


def run(args, env=None, timeout=None, cwd=ROOT):
    """`python ARGS` in cwd run in this process: a subprocess.CompletedProcess (text, undecodable bytes as
    surrogate escapes), as subprocess.run(capture_output=True, text=True) would return it."""
    args = [str(a) for a in args]
    command = [sys.executable, *args]
    name = script_of(args, cwd)
    assert name is not None and set(env or {}) <= RUN_TIME_VARIABLES, (args, env)
    module = importlib.import_module(name[:-3])
    threads = set(threading.enumerate())
    with worker_state_kept(env, cwd, argv=args), fresh_start(), standard_streams() as outputs:
        with alarm(timeout):
            status = exit_status(lambda: module.main.main(args[1:], prog_name=name, standalone_mode=True))
        join_threads_left(threads)  # before stdout is flushed, as Python does at exit
        status = flushed(status)
    if status is None:
        raise subprocess.TimeoutExpired(command, timeout, *outputs)
    return subprocess.CompletedProcess(command, status, *outputs)


def exit_status(main):
    """The status Python exits with after main(): None where the run timed out."""
    try:
        main()
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except TimedOut:
        return None
    except BaseException as exc:  # what Python prints for an uncaught exception, this file's frames left out
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
        return 1


def flushed(status):
    """Python flushes stdout and stderr at exit: where stdout cannot take what is left, the status is 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            if stream is sys.stdout and status is not None:
                status = 120
    return status


@contextlib.contextmanager
def alarm(timeout):
    if timeout is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise TimedOut()
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


TORCH_SETTINGS = {  # (get, set) of torch's process-wide settings a script could change
    "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "threads": (torch.get_num_threads, torch.set_num_threads),
    "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
    "deterministic": (lambda: (torch.are_deterministic_algorithms_enabled(),
                               torch.is_deterministic_algorithms_warn_only_enabled()),
                      lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1])),
    "float32 matmul": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "cudnn": (lambda: (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
                       torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32),
              lambda value: [setattr(module, name, v) for (module, name), v in zip(
                  ((torch.backends.cudnn, "benchmark"), (torch.backends.cudnn, "deterministic"),
                   (torch.backends.cudnn, "allow_tf32"), (torch.backends.cuda.matmul, "allow_tf32")), value)]),
}


# torch's settings as this process started with them, which a fresh Python given its environment starts
# with too; its thread count is OMP_NUM_THREADS's where that is set (torch reads it at its start).
FRESH_SETTINGS = {name: get() for name, (get, _) in TORCH_SETTINGS.items()}


def fresh_settings():
    threads = os.environ.get("OMP_NUM_THREADS", "")
    return dict(FRESH_SETTINGS, threads=int(threads)) if threads.isdigit() and int(threads) > 0 else FRESH_SETTINGS


def put_settings(settings):
    for name, (get, put) in TORCH_SETTINGS.items():
        if get() != settings[name]:
            put(settings[name])


def signal_handlers():
    handlers = {}
    for number in signal.valid_signals():
        try:
            handlers[number] = signal.getsignal(number)
        except (OSError, ValueError):
            pass
    return handlers


def forget_per_process_state():
    """What the project keeps for the rest of a process, read from the environment of the run that made it."""
    from mtlc.disk import seal
    seal.secret.cache_clear()
    if "torch._dynamo" in sys.modules:  # what torch.compile compiled: a fresh process compiles it again
        torch._dynamo.reset()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@contextlib.contextmanager
def worker_state_kept(env=None, cwd=None, argv=None):
    """For the block: env added to os.environ, cwd the working folder, argv sys.argv; after it, the
    worker's own state back (the module docstring's list) and the run's threads joined."""
    settings = {name: get() for name, (get, _) in TORCH_SETTINGS.items()}
    generators = torch.get_rng_state(), random.getstate(), np.random.get_state()
    cuda_generators = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    handlers, hooks = signal_handlers(), (sys.excepthook, threading.excepthook)
    threads, folder, saved_argv, saved_path = set(threading.enumerate()), os.getcwd(), sys.argv, list(sys.path)
    umask = os.umask(0o22)
    os.umask(umask)
    forget_per_process_state()
    try:
        with mock.patch.dict(os.environ, env or {}):
            if cwd is not None:
                os.chdir(cwd)
            if argv is not None:
                sys.argv = list(argv)
            yield
    finally:
        os.chdir(folder)
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.umask(umask)
        join_threads_left(threads)
        forget_per_process_state()
        put_settings(settings)
        torch.set_rng_state(generators[0])
        random.setstate(generators[1])
        np.random.set_state(generators[2])
        if cuda_generators is not None:
            torch.cuda.set_rng_state_all(cuda_generators)
        for number, handler in handlers.items():
            if handler is not None and signal.getsignal(number) is not handler:
                signal.signal(number, handler)
        sys.excepthook, threading.excepthook = hooks


def join_threads_left(before):
    """Python joins every non-daemon thread at exit; a run's thread that outlives it would run on in the worker.
    The threads of a thread pool a library keeps for the process (inductor's compile pool) are left to it:
    Python's exit tells them to end (concurrent.futures' exit hook), and they wait for the pool's next use."""
    pools = set(concurrent.futures.thread._threads_queues)
    left = [t for t in threading.enumerate() if t not in before and not t.daemon and t not in pools]
    for thread in left:
        thread.join(THREADS_JOINED_FOR)
    alive = [t.name for t in left if t.is_alive()]
    assert not alive, f"the run left threads that do not end: {alive}"


def pytests_filter(entry):
    """The filters pytest adds around each test (DeprecationWarning shown always, its own warnings as errors)."""
    action, _, category, module, _ = entry
    return (action == "always" and category in (DeprecationWarning, PendingDeprecationWarning) and module is None) or \
        (isinstance(category, type) and category.__module__.startswith("_pytest"))


def show_warning(message, category, filename, lineno, file=None, line=None):
    """warnings' own printing (pytest records them instead), to the stderr of the run."""
    try:
        (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))
    except OSError:
        pass


@contextlib.contextmanager
def fresh_start():
    """What a fresh Python starts from: torch's settings, the global generators' seeds, Python's warnings
    filters and printing, no logging handler (worker_state_kept puts the worker's own back after)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with warnings.catch_warnings():
        warnings.filters[:] = [entry for entry in warnings.filters if not pytests_filter(entry)]
        warnings.showwarning = show_warning
        warnings._filters_mutated()  # the "once" and "default" registries start afresh
        for handler in handlers:
            root.removeHandler(handler)
        root.setLevel(logging.WARNING)
        put_settings(fresh_settings())
        torch.seed()
        random.seed()
        np.random.seed()
        try:
            yield
        finally:
            for handler in list(root.handlers):
                root.removeHandler(handler)
            for handler in handlers:
                root.addHandler(handler)
            root.setLevel(level)


def text_stream(fd, like):
    """A text stream on fd as Python makes sys.stdout (1) or sys.stderr (2) at start, with the encoding and
    errors of the worker's own (a child given the worker's environment has them)."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    raw = io.FileIO(fd, "w", closefd=False)
    encoding = getattr(like, "encoding", None) or "utf-8"
    errors = getattr(like, "errors", None) or ("backslashreplace" if fd == 2 else "strict")
    return io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding=encoding, errors=errors,
                            newline="\n", line_buffering=fd == 2 and not unbuffered, write_through=unbuffered)


def decoded(data):
    """As subprocess.run(text=True, errors="surrogateescape") decodes a child's output."""
    text = data.decode(locale.getpreferredencoding(False), "surrogateescape")
    return text.replace("\r\n", "\n").replace("\r", "\n")


@contextlib.contextmanager
def standard_streams():
    """For the block: fd 1 and 2 files, sys.stdout and sys.stderr new streams on them, sys.stdin the null
    device. Yields a list that holds (stdout, stderr) after the block."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    streams = sys.stdin, sys.stdout, sys.stderr
    outputs = []
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdin = open(os.devnull)
            sys.stdout, sys.stderr = text_stream(1, sys.__stdout__), text_stream(2, sys.__stderr__)
            yield outputs
        finally:
            for stream in (sys.stdout, sys.stderr):  # a run's own streams, if it replaced them
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            sys.stdin.close()
            sys.stdin, sys.stdout, sys.stderr = streams
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            for f in (out, err):
                f.seek(0)
                outputs.append(decoded(f.read()))
