"""Jobs at once in forked processes (train/forked.py): each result, a failure ends the rest."""
import time

import pytest
import torch

from mtlc.train.forked import cpu_workers, each_at_once


def test_each_job_gives_its_result_in_this_process_or_forked_ones():
    parent = []
    for workers in (1, 2):
        assert dict(each_at_once(lambda k: (k * k, torch.get_num_threads()), range(5), workers)) == {
            k: (k * k, 1 if workers == 2 else torch.get_num_threads()) for k in range(5)}
    assert dict(each_at_once(lambda k: parent.append(k), range(3), 2)) == {0: None, 1: None, 2: None}
    assert parent == []  # a forked job's work stays in its process: only its result comes back


def test_a_failing_job_ends_the_others_and_its_error_reaches_the_caller():
    def job(k):
        if k == 1:
            raise ValueError("job 1 failed")
        time.sleep(60)
    start = time.perf_counter()
    with pytest.raises(ValueError, match="job 1 failed"):
        list(each_at_once(job, range(3), 2))
    assert time.perf_counter() - start < 20


def test_jobs_stay_in_this_process_off_the_cpu_and_within_its_threads(monkeypatch):
    assert cpu_workers("cuda", 4) == 1 and cpu_workers("meta", 4) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert cpu_workers("cpu", 4) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 64)
    assert cpu_workers("cpu", 3) <= 3 and cpu_workers("cpu", 0) == 1
