"""conftest.run's scripts in the test's own process (tests/in_process.py) against a fresh Python: the
same exit status, stdout and stderr; what a script changes in the process ends with its run; what a run
in this process cannot be given is a process of its own."""
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import in_process
import label
from conftest import ROOT, run


@pytest.mark.parametrize("args", [
    ["label.py", "--help"],
    ["label.py", "--bogus"],  # click's usage error: 2, with the usage
    ["label.py", "--data-dir", "/nonexistent", "--undo"],  # the project's UserError: 2, one line
    ["evaluate.py", "--ckpt", "/nonexistent.pt", "--json"],
], ids=["help", "usage error", "UserError", "evaluate.py"])
def test_a_script_run_in_process_is_as_a_fresh_python_runs_it(args):
    ours = run(*args)
    fresh = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, errors="surrogateescape")
    assert (ours.returncode, ours.stdout, ours.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert ours.args == [sys.executable, *args]


def test_the_run_ends_as_python_ends_a_script(monkeypatch):
    """An uncaught exception: its traceback on stderr and status 1; SystemExit's code, or its message
    on stderr and status 1."""
    def raises(error):
        def hook():
            raise error
        monkeypatch.setattr(label, "robust_streams", hook)
    raises(RuntimeError("broken here"))
    res = run("label.py", "--undo", "--data-dir", ROOT)
    assert res.returncode == 1 and res.stderr.startswith("Traceback (most recent call last):\n"), res.stderr
    assert res.stderr.endswith("RuntimeError: broken here\n") and "tests/in_process.py" not in res.stderr
    raises(SystemExit(3))
    assert run("label.py", "--undo", "--data-dir", ROOT).returncode == 3
    raises(SystemExit("a message"))
    res = run("label.py", "--undo", "--data-dir", ROOT)
    assert (res.returncode, res.stderr) == (1, "a message\n")


def test_a_run_has_its_argv_folder_environment_and_streams(monkeypatch, tmp_path):
    """And what it writes on fd 1 and 2 without Python's streams (a C library) is its output too; its
    warnings reach its stderr as Python prints them, not pytest's record."""
    def report():
        print(sys.argv[1:], os.getcwd(), os.environ.get("MTLC_CONFIG_DIR"), sys.stdout.encoding, sys.stdout.errors)
        os.write(1, b"fd 1\n")
        os.write(2, b"fd 2\n")
        warnings.warn("take care")
        sys.exit(0)
    monkeypatch.setattr(label, "robust_streams", report)
    res = run(ROOT / "label.py", "--undo", "--data-dir", "x", cwd=tmp_path, env=dict(MTLC_CONFIG_DIR="/elsewhere"))
    assert res.returncode == 0, res.stderr
    encoding = f"{sys.__stdout__.encoding} {sys.__stdout__.errors}"
    assert res.stdout == f"['--undo', '--data-dir', 'x'] {tmp_path} /elsewhere {encoding}\nfd 1\n"
    assert res.stderr.startswith("fd 2\n") and "UserWarning: take care" in res.stderr
    assert os.getcwd() != str(tmp_path) and os.environ.get("MTLC_CONFIG_DIR") != "/elsewhere"


def test_what_a_run_changes_in_the_process_ends_with_it(monkeypatch):
    """Signal handlers, torch's settings and generators, hooks, logging, warnings filters, the standard
    streams; a thread it leaves is joined before its output is taken, as Python joins it at exit."""
    def changes():
        signal.signal(signal.SIGUSR1, lambda *args: None)
        signal.signal(signal.SIGTERM, lambda *args: None)
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(5)
        torch.use_deterministic_algorithms(True)
        threading.excepthook = lambda args: None
        logging.getLogger().addHandler(logging.NullHandler())
        warnings.simplefilter("error")
        sys.stdout.reconfigure(errors="replace")  # as robust_streams() reconfigures them
        threading.Thread(target=lambda: (time.sleep(0.3), print("the thread's line", flush=True))).start()
    monkeypatch.setattr(label, "robust_streams", changes)
    streams = sys.stdout, sys.stderr, sys.stdout.errors
    fds = [os.fstat(fd) for fd in (1, 2)]
    before = (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM), torch.get_default_dtype(),
              torch.get_rng_state(), torch.are_deterministic_algorithms_enabled(), threading.excepthook,
              list(logging.getLogger().handlers), list(warnings.filters))
    res = run("label.py", "--undo", "--data-dir", "/nonexistent")
    assert res.returncode == 2 and res.stdout == "the thread's line\n", res
    after = (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM), torch.get_default_dtype(),
             torch.get_rng_state(), torch.are_deterministic_algorithms_enabled(), threading.excepthook,
             list(logging.getLogger().handlers), list(warnings.filters))
    assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a is b or a == b for a, b in zip(before, after))
    assert (sys.stdout, sys.stderr, sys.stdout.errors) == streams
    assert [(s.st_dev, s.st_ino) for s in fds] == [(s.st_dev, s.st_ino) for s in map(os.fstat, (1, 2))]


def test_a_run_draws_as_a_fresh_process_draws(monkeypatch):
    """Global generators seeded afresh, as a fresh Python seeds them (torch's too: its initial seed
    differs from one fresh Python to the next), whatever the worker drew; the worker's own back after."""
    draws = "print(torch.initial_seed(), torch.rand(1).item(), random.random(), np.random.random())"
    monkeypatch.setattr(label, "robust_streams", lambda: sys.exit(exec(draws)))

    def seeded():
        torch.manual_seed(1)
        random.seed(1)
        np.random.seed(1)
    seeded()
    expected = torch.rand(1).item(), random.random(), np.random.random()
    seeded()
    ours = [run("label.py", "--undo", "--data-dir", "x").stdout for _ in range(2)]
    assert ours[0] != ours[1] and all(len(o.split()) == 4 for o in ours), ours
    assert (torch.rand(1).item(), random.random(), np.random.random()) == expected and torch.initial_seed() == 1


def test_a_run_computes_with_a_fresh_pythons_settings(monkeypatch):
    """torch's thread count and default dtype as a fresh Python given the worker's environment has them,
    whatever the worker set (fp32 sums over other thread counts differ: a resume would not be bitwise)."""
    settings = "print(torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled())"
    monkeypatch.setattr(label, "robust_streams", lambda: sys.exit(exec(settings)))
    fresh = subprocess.run([sys.executable, "-c", f"import torch; {settings}"], capture_output=True, text=True).stdout
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            assert run("label.py", "--undo", "--data-dir", "x").stdout == fresh
        assert torch.get_num_threads() == threads + 1 and torch.get_default_dtype() == torch.float64
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(torch.float32)


def test_a_run_past_its_timeout_is_stopped(monkeypatch):
    monkeypatch.setattr(label, "robust_streams", lambda: time.sleep(60))
    handler = signal.getsignal(signal.SIGALRM)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run("label.py", "--undo", "--data-dir", ROOT, timeout=1)
    assert time.monotonic() - started < 30 and signal.getsignal(signal.SIGALRM) is handler


def test_what_a_python_reads_at_its_start_gets_a_process_of_its_own(monkeypatch):
    """PYTHONIOENCODING (and any variable outside in_process.RUN_TIME_VARIABLES), a file-size limit,
    another script or -c: a fresh Python; a run-time variable: this process."""
    monkeypatch.setattr(in_process, "run", lambda *args: pytest.fail("ran in this process"))
    res = run("label.py", "--help", env=dict(PYTHONIOENCODING="ascii"))
    assert res.returncode == 0 and "--data-dir" in res.stdout
    assert run("label.py", "--help", limit_kb=100).returncode == 0
    assert run("-c", "print(1)").stdout == "1\n"
    assert not in_process.can_run(["tools/gpu_check.py"], None, ROOT)
    assert in_process.can_run([ROOT / "label.py"], dict(MTLC_CACHE_DIR="x", WORLD_SIZE="2"), "/")
