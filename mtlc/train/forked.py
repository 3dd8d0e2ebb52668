"""Independent jobs on a CPU's cores at once: forked processes of one thread each. A small head's
step is too little work for two threads (a head of 3,055 steps on a frozen trunk's features, 2-core
AMD EPYC: 27 s on two threads, 23 s on one, and 23 s each for two at once in two processes), so
jobs such as use/unseen.py's heads run one a core instead of one after another."""
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
    return max(1, min(jobs, len(os.sched_getaffinity(0)), torch.get_num_threads()))


def each_at_once(job, items, workers):
    """(item, job(item)) of each item as its job ends: in this process where workers is 1, else in
    that many forked processes of one thread each. An exception in a job, or this process
    interrupted, ends the others."""
    if workers <= 1:
        for item in items:
            yield item, job(item)
        return
    global _JOB
    _JOB = job
    sys.stdout.flush()  # a buffer not yet written would be written again by each process forked
    sys.stderr.flush()
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=torch.set_num_threads, initargs=(1,))
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


def _run(item):
    return _JOB(item)
