"""serve.py against a hostile client and odd folders (a review, round 6): bursts and idle or dribbling
connections, framing two readers could read two ways, malformed fields and odd tasks each refused alone,
what a refusal tells a stranger, and live learning through the end of a labeling round and a cache
replaced under it."""
import json
import os
import shutil
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import Pipe
from pathlib import Path

import pytest
import requests

from mtlc.label import studio_server
from mtlc.label.live_training import LiveTraining
from test_serve import Served, ServedOn, config_of, run, tasks_of, wait_for_version  # noqa: F401 (run: a fixture)

CHOICE = [{"from_name": "label", "to_name": "image", "type": "choices", "value": {"choices": ["owl"]}}]


@pytest.fixture
def served(run, tmp_path):  # noqa: F811
    backend = Served(run, labels=tmp_path / "labels.csv")
    assert backend.post("/setup", {"schema": config_of(["cat", "dog", "owl"])}).status_code == 200
    yield backend
    backend.close()


def raw_exchange(port, request, timeout=10):
    """Everything the server answers to raw request bytes, until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        raw.sendall(request)
        answer = b""
        while chunk := raw.recv(4096):
            answer += chunk
    return answer


def test_a_burst_up_to_the_slots_is_answered_and_past_them_refused_with_a_status(served):
    def health(_):
        try:
            return requests.get(served.url + "/health", timeout=30).status_code
        except requests.ConnectionError as exc:
            return type(exc).__name__
    for burst in (20, 32, 60):
        with ThreadPoolExecutor(burst) as pool:
            statuses = list(pool.map(health, range(burst)))
        assert set(statuses) <= {200, 503}, statuses
        assert statuses.count(200) >= min(burst, studio_server.CONNECTIONS) // 2


def test_idle_and_dribbling_clients_cannot_keep_an_authenticated_one_out(run, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(studio_server, "CONNECTIONS", 4)
    monkeypatch.setattr(studio_server, "HEADER_DEADLINE_S", 2)
    backend = Served(run, auth=("u", "p"), labels=tmp_path / "labels.csv")
    port = backend.server.server_address[1]
    try:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(8)]
        time.sleep(0.3)
        start = time.monotonic()
        assert requests.get(backend.url + "/health", auth=("u", "p"), timeout=10).status_code == 200
        assert time.monotonic() - start < 3
        dribbling = socket.create_connection(("127.0.0.1", port), timeout=10)
        start, closed = time.monotonic(), False
        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40:
            try:
                dribbling.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.2)
        assert closed and time.monotonic() - start < 2 + 4, "the dribbling connection was kept past its deadline"
        for s in idle + [dribbling]:
            s.close()
    finally:
        backend.close()


@pytest.mark.parametrize("framing", [
    b"Transfer-Encoding: identity, chunked\r\nContent-Length: 2\r\n",
    b"Transfer-Encoding: chunked \r\nContent-Length: 2\r\n",
    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
    b"Content-Length: 2\r\nContent-Length: 40\r\n",
    b"Content-Length: +2\r\n",
    b"Content-Length: 0_2\r\n"])
def test_ambiguous_framing_is_refused_with_400_and_the_connection_closed(served, framing):
    request = b"POST /setup HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n{}GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = raw_exchange(served.server.server_address[1], request)
    assert answer.startswith(b"HTTP/1.1 400") and answer.count(b"HTTP/1.1 ") == 1, answer[:300]
    assert b"framing is ambiguous" in answer


def test_malformed_fields_are_each_a_400_with_a_line_and_the_rest_is_answered(served, run):  # noqa: F811
    tasks = tasks_of(run)
    answer = served.post("/predict", {"tasks": tasks[:2], "label_config": ["<View/>"]})
    assert answer.status_code == 400 and "not text" in answer.reason
    surrogate = b'{"tasks": [{"id": 1, "data": {"image": "/data/local-files/?d=\\ud800.png"}}, ' + json.dumps(
        tasks[0]).encode() + b"]}"
    results = requests.post(served.url + "/predict", data=surrogate, timeout=30).json()["results"]
    assert "lone surrogate" in results[0]["error"] and results[1]["result"]
    answer = served.post("/train", {"annotations": 5})
    assert answer.status_code == 400 and "annotations" in answer.reason
    answer = served.post("/train", {"annotations": [dict(tasks[0], annotations=5),
                                                    dict(tasks[1], annotations=[{"result": CHOICE}])]})
    assert answer.status_code == 200 and answer.json()["kept"] == 1
    created = {"action": "ANNOTATIONS_CREATED", "task": [dict(tasks[2], id={"x": 1})],
               "annotation": [{"task": {"x": 1}, "result": CHOICE}]}
    answer = served.post("/webhook", created)
    assert answer.status_code == 400 and "annotation and task" in answer.reason


def open_files():
    return len(os.listdir("/proc/self/fd"))


def test_a_task_naming_a_folder_gets_its_own_error_and_no_handle_is_left_open(served, run):  # noqa: F811
    good = tasks_of(run)[:2]
    odd = [{"id": 90, "data": {"path": "unlabeled"}}, {"id": 91, "data": {"image": "/data/local-files/?d=unlabeled"}},
           {"id": 92, "data": {"path": str(run / "d" / "unlabeled")}}]
    served.post("/predict", {"tasks": good + odd})  # the first request opens what every later one shares
    before = open_files()
    for _ in range(30):
        results = served.post("/predict", {"tasks": good + odd}).json()["results"]
        assert [bool(r["result"]) for r in results] == [True, True, False, False, False]
    assert all("not a regular file" in r["error"] or "names no image" in r["error"] for r in results[2:]), results
    assert open_files() <= before + 2


def test_a_refusal_tells_no_path_of_the_server_and_no_python_version(served, run, tmp_path):  # noqa: F811
    answer = served.post("/predict", {"tasks": [{"id": 1, "data": {"path": "/etc/passwd"}}]})
    assert str(run) not in answer.text and "outside the folder" in answer.json()["results"][0]["error"]
    assert answer.headers["Server"] == "mtlc-label-studio-backend"
    (tmp_path / "labels.csv").write_text("not,a,labels,file\n")  # another file in its place: refused, 507
    answer = served.post("/webhook", {"action": "ANNOTATION_CREATED", "task": tasks_of(run)[0],
                                      "annotation": {"result": CHOICE}})
    assert answer.status_code == 507 and str(tmp_path) not in answer.text and str(tmp_path) not in answer.reason
    assert any(str(tmp_path) in line for line in served.lines)  # the server's own log names it


class FakeChild:
    """The training process's end of the pipe, played by a thread: ready, then a failed round."""

    def __init__(self, conn):
        self.conn = conn
        threading.Thread(target=self.play, daemon=True).start()

    def play(self):
        self.conn.send(("ready", None))
        self.conn.recv()
        self.conn.send(("not trained", "FileNotFoundError: the cache went away"))


def test_a_failed_retrain_shows_in_health_and_the_log_with_its_reason():
    training = object.__new__(LiveTraining)  # the feeder alone, its process a thread
    lines, trained = [], []
    training.trained, training.echo = (lambda *a: trained.append(a)), lines.append
    training.status, training.wanted, training.changed = "starting", None, threading.Condition()
    training.conn, child = Pipe()
    FakeChild(child)
    threading.Thread(target=training.loop, daemon=True).start()
    training.want({1: 0, 2: 1})
    deadline = time.time() + 10
    while "failed" not in training.status and time.time() < deadline:
        time.sleep(0.05)
    assert training.status == "ready, but the head on 2 labels failed: FileNotFoundError: the cache went away"
    assert lines == ["no head on 2 labels: FileNotFoundError: the cache went away"] and not trained


@pytest.mark.slow
def test_live_learning_goes_on_with_every_image_labeled_and_its_cache_replaced(run, tmp_path):  # noqa: F811
    folder = tmp_path / "d"
    shutil.copytree(run / "d", folder, ignore=shutil.ignore_patterns("mtlc-cache"))
    backend = ServedOn(run, folder, tmp_path / "labels.csv", (None, 5.0))
    try:
        assert backend.post("/setup", {"schema": config_of(["cat", "dog", "owl"])}).status_code == 200
        tasks = tasks_of(run)
        for task in tasks:
            task["data"] = {"path": str(folder / Path(task["data"]["path"]).relative_to(run / "d"))}
        version = requests.get(backend.url + "/health", timeout=10).json()["model_version"]
        every = backend.post("/train", {"annotations": [dict(t, annotations=[{"result": CHOICE}]) for t in tasks]})
        assert every.json()["kept"] == len(tasks) == 16  # no unlabeled image left
        version = wait_for_version(backend, version)
        shutil.rmtree(folder / "mtlc-cache")  # another run rebuilds the folder's caches
        backend.post("/webhook", {"action": "ANNOTATION_UPDATED", "task": tasks[0], "annotation": {"result": [
            dict(CHOICE[0], value={"choices": ["cat"]})]}})
        version = wait_for_version(backend, version)
        assert requests.get(backend.url + "/health", timeout=10).json()["learning"] == "ready"
        backend.post("/webhook", {"action": "ANNOTATION_UPDATED", "task": tasks[1], "annotation": {"result": [
            dict(CHOICE[0], value={"choices": ["dog"]})]}})
        os.kill(backend.backend.training.process.pid, signal.SIGKILL)  # kill -9 in the middle of the round
        wait_for_version(backend, version)
        assert any("the training process ended" in line and "started again" in line for line in backend.lines)
    finally:
        backend.close()


def test_a_labels_file_cut_short_by_another_writer_is_refused_whole(tmp_path):
    from mtlc.errors import UserError
    from mtlc.label import kept_labels
    path = tmp_path / "label-studio-labels.csv"
    whole = kept_labels.csv_bytes({"unlabeled/a.png": ("cat", "ab" * 16), "unlabeled/b.png": ("dog", "cd" * 16)})
    for cut in (whole[:-1], whole[:-20]):  # its line end, or inside the last row's hash
        path.write_bytes(cut)
        with pytest.raises(UserError, match="is not a labels file this backend kept"):
            kept_labels.read_rows(path)
    path.write_bytes(whole)
    assert len(kept_labels.read_rows(path)) == 2
