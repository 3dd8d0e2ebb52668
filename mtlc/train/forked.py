"""Independent jobs on a CPU's cores at once: forked processes of one thread each. A small head's
step is too little work for two threads (a head of 3,055 steps on a frozen trunk's features, 2-core
AMD EPYC: 27 s on two threads, 23 s on one, and 23 s each for two at once in two processes), so
jobs such as use/unseen.py's heads run one a core instead of one after another. Where the platform
starts processes by spawning them (macOS, Windows: forking a process whose system frameworks have
started can crash it), the processes are spawned and each job is pickled to them: it must be an
object of a module (use/unseen.py's FoldJob rebuilds its data in each process), not a closure."""
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

_JOB = None  # the job of the processes being forked: inherited by them, never pickled


def cpu_workers(device, jobs):
    """How many processes `jobs` jobs take at once: on the CPU one a core this process may use, at
    most its torch thread count (a thread count set for a run is kept); elsewhere 1 (a GPU's
    work stays in this process: CUDA does not survive a fork)."""
    if torch.device(device).type != "cpu":
        return 1
    return max(1, min(jobs, usable_cores(), torch.get_num_threads()))


def usable_cores():
    """The cores this process may run on: its affinity where the platform has one (Linux), else all."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def start_method():
    """How worker processes start: by forking where that is the platform's default (Linux), else by
    spawning them (module docstring)."""
    return "fork" if multiprocessing.get_context().get_start_method() == "fork" else "spawn"


def each_at_once(job, items, workers):
    """(item, job(item)) of each item as its job ends: in this process where workers is 1, else in
    that many processes of one thread each (start_method's; spawned, each is sent the job pickled).
    An exception in a job, or this process interrupted, ends the others."""
    if workers <= 1:
        for item in items:
            yield item, job(item)
        return
    global _JOB
    method = start_method()
    _JOB = job
    sys.stdout.flush()  # a buffer not yet written would be written again by each process forked
    sys.stderr.flush()
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method), initializer=_started,
                               initargs=(job if method == "spawn" else None,))
    ended = False
    try:
        futures = {pool.submit(_run, item): item for item in items}
        for done in as_completed(futures):
            yield futures[done], done.result()
        ended = True
    finally:
        _JOB = None
        if not ended:  # the running jobs' processes would finish their jobs first
            for process in list((pool._processes or {}).values()):
                process.terminate()
        pool.shutdown(wait=ended, cancel_futures=True)


def _started(job):
    """A worker's start: one thread; a spawned one keeps the job it was sent."""
    global _JOB
    torch.set_num_threads(1)
    if job is not None:
        _JOB = job


def _run(item):
    return _JOB(item)
