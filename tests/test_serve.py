"""serve.py: a checkpoint served to Label Studio as an ML backend, called here as Label Studio's client
calls it (label_studio/ml/api_connector.py); test_label_studio_live.py runs Label Studio itself."""
import base64
import json
import os
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch

import serve
from conftest import needs_backbone, train_backbone_run
from mtlc.data.files import file_digest
from mtlc.label import kept_labels
from mtlc.use.label_studio import labeling_config, local_files_url

BACKBONE = "efficientnet-lite0"
pytestmark = needs_backbone(BACKBONE)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    train_backbone_run(root, "--unlabeled-batch", "4", n_labeled=4, n_unlabeled=16, n_test=8)
    return root


class Served:
    """A backend serving in a thread of this process: url, lines said, post(route, body)."""

    def __init__(self, run, auth=None, labels=None, accepted=(None, 5.0)):
        self.lines = []
        self.server, self.backend = serve.started(run / "run" / "mt.pt", run / "d", None, labels, "127.0.0.1", 0,
                                                   auth, torch.device("cpu"), self.lines.append, accepted=accepted)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def post(self, route, body, **kwargs):
        return requests.post(self.url + route, json=body, timeout=60, **kwargs)

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        if self.backend.training is not None:
            self.backend.training.close()


@pytest.fixture
def served(run, tmp_path):
    backend = Served(run, labels=tmp_path / "labels.csv")
    yield backend
    backend.close()


def tasks_of(run, part="unlabeled"):
    return [{"id": i, "data": {"image": local_files_url(p, run / "d"), "path": str(p)}}
            for i, p in enumerate(sorted((run / "d" / part).rglob("*.png")))]


def config_of(classes):
    return labeling_config(classes)


def test_each_task_gets_the_class_and_calibrated_confidence_of_the_head_that_never_saw_it(served, run):
    import mtlc
    health = requests.get(served.url + "/health", timeout=10).json()
    assert health["status"] == "UP" and health["model_version"].startswith("mt.pt@")
    classes = mtlc.load(run / "run" / "mt.pt", device="cpu").classes
    setup = served.post("/setup", {"project": "1.1", "schema": config_of(classes)})
    assert setup.status_code == 200 and setup.json()["model_version"] == health["model_version"]
    tasks = tasks_of(run)
    answer = served.post("/predict", {"tasks": tasks, "label_config": config_of(classes)}).json()["results"]
    # the same as evaluate.py --predict's heads through the Python API, which decodes each image again
    same = mtlc.load(run / "run" / "mt.pt", device="cpu", unseen=True)
    for task, result, prediction in zip(tasks, answer, same.predict_files([t["data"]["path"] for t in tasks])):
        assert result["result"] == [{"from_name": "label", "to_name": "image", "type": "choices",
                                     "value": {"choices": [prediction.label]}}]
        assert result["score"] == pytest.approx(prediction.confidence, abs=2e-3)
        assert result["model_version"] == health["model_version"]


def test_a_config_with_other_choices_is_refused_at_setup_with_a_line_label_studio_shows(served):
    refused = served.post("/setup", {"project": "1.1", "schema": config_of(["cat", "dog", "zebra"])})
    assert refused.status_code == 400
    assert "not the checkpoint's classes" in refused.reason and "missing owl" in refused.reason
    assert "not classes of the checkpoint: zebra" in refused.json()["error"]
    for schema in ("<View>", "<!DOCTYPE x [<!ENTITY a 'b'>]><View/>", None, '<View><Image name="i" value="$i"/></View>'):
        assert served.post("/setup", {"project": "1.1", "schema": schema}).status_code == 400


def test_bad_requests_get_a_line_and_the_server_goes_on(served, run, tmp_path):
    classes = ["cat", "dog", "owl"]
    assert served.post("/setup", {"schema": config_of(classes)}).status_code == 200
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes((run / "d" / "test" / "cat" / "0.png").read_bytes())
    tasks = tasks_of(run)[:2] + [{"id": 9, "data": {"path": str(outside)}}, {"id": 10, "data": {"image": "http://x/y"}},
                                 "not a task", {"id": 11}]
    results = served.post("/predict", {"tasks": tasks}).json()["results"]
    assert [bool(r["result"]) for r in results] == [True, True, False, False, False, False]
    assert "outside the folder" in results[2]["error"] and "another host's URL" in results[3]["error"]
    for body, status in ((b"{not json", 400), (b"[1, 2]", 400), (json.dumps({"tasks": []}).encode(), 400)):
        assert requests.post(served.url + "/predict", data=body, timeout=10).status_code == status
    assert requests.post(served.url + "/nothing", data=b"{}", timeout=10).status_code == 404
    port = served.server.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:  # a length no client library would send
        raw.sendall(f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: {2 ** 40}\r\n\r\n{{}}".encode())
        assert raw.recv(200).startswith(b"HTTP/1.1 413 the request is 1,099,511,627,776 bytes")
    webhook = {"action": "ANNOTATION_CREATED", "task": tasks_of(run)[0],
               "annotation": {"result": [{"from_name": "label", "type": "choices", "value": {"choices": ["zebra"]}}]}}
    assert served.post("/webhook", webhook).status_code == 400 and "zebra" in served.post("/webhook", webhook).reason
    assert not (tmp_path / "labels.csv").exists()
    assert served.post("/webhook", {"action": "PROJECT_UPDATED"}).json()["status"] == "ignored"
    assert requests.get(served.url + "/health", timeout=10).json()["status"] == "UP"
    with ThreadPoolExecutor(4) as pool:  # requests at once
        answers = list(pool.map(lambda _: served.post("/predict", {"tasks": tasks_of(run)}).json(), range(8)))
    for answer in answers:  # the same (the scores to float rounding: threads split the sums each their way)
        for result, first in zip(answer["results"], answers[0]["results"]):
            assert result["result"] == first["result"] and result["score"] == pytest.approx(first["score"], abs=1e-3)


def test_basic_auth_is_needed_where_given(run, tmp_path):
    backend = Served(run, auth=("ls", "s3cret"), labels=tmp_path / "labels.csv")
    try:
        assert requests.get(backend.url + "/health", timeout=10).status_code == 401
        assert requests.get(backend.url + "/health", auth=("ls", "wrong"), timeout=10).status_code == 401
        assert requests.get(backend.url + "/health", auth=("ls", "s3cret"), timeout=10).status_code == 200
        token = base64.b64encode(b"ls:s3cret").decode()
        assert requests.get(backend.url + "/health", headers={"Authorization": f"Basic {token}"}).status_code == 200
    finally:
        backend.close()


def wait_for_version(served, old, seconds=180):
    deadline = time.time() + seconds
    while time.time() < deadline:
        health = requests.get(served.url + "/health", timeout=10).json()
        if health["model_version"] != old:
            return health["model_version"]
        time.sleep(0.5)
    pytest.fail(f"no new model version in {seconds} s: {served.lines}")


@pytest.mark.slow
def test_labels_are_kept_at_once_and_the_next_predictions_come_from_a_head_trained_on_them(served, run, tmp_path):
    classes = ["cat", "dog", "owl"]
    assert served.post("/setup", {"schema": config_of(classes)}).status_code == 200
    first = requests.get(served.url + "/health", timeout=10).json()["model_version"]
    tasks, held = tasks_of(run), tasks_of(run, "test")
    annotated = {"action": "ANNOTATION_CREATED", "task": tasks[0],
                 "annotation": {"result": [{"from_name": "label", "to_name": "image", "type": "choices",
                                            "value": {"choices": ["owl"]}}]}}
    answer = served.post("/webhook", annotated).json()
    assert answer["status"] == "kept" and answer["held_out"] == 0 and "background" in answer["learning"]
    rows = kept_labels.read_rows(tmp_path / "labels.csv")
    first_path = str(Path(tasks[0]["data"]["path"]).relative_to(run / "d"))
    assert rows == {first_path: ("owl", file_digest((run / "d" / first_path).read_bytes()))}
    # a held-out image's label is kept, never trained on
    answer = served.post("/webhook", dict(annotated, task=held[0])).json()
    assert answer["held_out"] == 1 and len(kept_labels.read_rows(tmp_path / "labels.csv")) == 2
    assert any("a held-out image: its label is kept, never trained on" in line for line in served.lines)
    version = wait_for_version(served, first)
    assert "+1 labels" in version
    results = served.post("/predict", {"tasks": tasks}).json()["results"]
    assert {r["model_version"] for r in results} == {version}
    # an update of the same task replaces its label; a restarted server takes the kept labels up
    updated = dict(annotated, action="ANNOTATION_UPDATED")
    updated["annotation"]["result"][0]["value"]["choices"] = ["dog"]
    assert served.post("/webhook", updated).json()["status"] == "kept"
    assert kept_labels.read_rows(tmp_path / "labels.csv")[first_path][0] == "dog"
    # label.py reads the labels file as it is: the unlabeled image into labeled/dog, the test/ image relabeled
    import label
    from conftest import invoke
    result = invoke(label, ["--data-dir", run / "d", "--apply", tmp_path / "labels.csv", "--dry-run"])
    assert result.exit_code == 0 and f"{first_path} -> labeled/dog/" in result.output, result.output


@pytest.mark.slow
def test_label_studios_start_training_and_two_servers_on_one_folder_keep_every_label(run, tmp_path):
    """Label Studio's "Start training" without its webhook flag posts every annotated task to /train;
    two servers on one folder and one labels file keep each other's labels; no file of the folder moves."""
    before = sorted(p.relative_to(run / "d") for p in (run / "d").rglob("*.png"))
    one, other = (Served(run, labels=tmp_path / "labels.csv") for _ in range(2))
    try:
        tasks = tasks_of(run)
        for backend in (one, other):
            assert backend.post("/setup", {"schema": config_of(["cat", "dog", "owl"])}).status_code == 200
        annotated = [dict(task, annotations=[
            {"created_at": "2026-12-06T10:00:00", "result": [{"from_name": "label", "value": {"choices": ["dog"]}}]},
            {"created_at": "2026-12-06T11:00:00", "result": [{"from_name": "label", "value": {"choices": [label]}}]},
            {"created_at": "2026-12-06T12:00:00", "was_cancelled": True, "result": []}])
            for task, label in zip(tasks[:2], ["owl", "cat"])]
        answer = one.post("/train", {"annotations": annotated}).json()
        assert answer["kept"] == 2 and "background" in answer["learning"]
        other.post("/webhook", {"action": "ANNOTATION_CREATED", "task": tasks[2], "annotation": {
            "result": [{"from_name": "label", "value": {"choices": ["owl"]}}]}})
        rows = kept_labels.read_rows(tmp_path / "labels.csv")
        assert sorted(label for label, _ in rows.values()) == ["cat", "owl", "owl"]
        assert "background" in one.post("/webhook", {"action": "START_TRAINING", "project": {"id": 1}}).json()["learning"]
    finally:
        one.close()
        other.close()
    assert sorted(p.relative_to(run / "d") for p in (run / "d").rglob("*.png")) == before


@pytest.mark.slow
def test_a_label_answered_is_kept_though_the_server_is_killed_at_once(run, tmp_path):
    """serve.py as a process: its label, answered, is in the labels file after kill -9 right after."""
    import re
    import signal
    import subprocess
    import sys
    from conftest import ROOT
    labels = tmp_path / "labels.csv"
    process = subprocess.Popen([sys.executable, "serve.py", "--ckpt", run / "run" / "mt.pt", "--data-dir", run / "d",
                                "--labels", labels, "--port", "0"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in process.stderr:
            found = re.search(r"to Label Studio at (http://127\.0\.0\.1:\d+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "serve.py said no URL"
        assert requests.post(url + "/setup", json={"schema": config_of(["cat", "dog", "owl"])}).status_code == 200
        task = tasks_of(run)[4]
        answer = requests.post(url + "/webhook", json={"action": "ANNOTATION_CREATED", "task": task, "annotation": {
            "result": [{"from_name": "label", "value": {"choices": ["owl"]}}]}})
        process.send_signal(signal.SIGKILL)
        assert answer.json()["status"] == "kept"
    finally:
        process.kill()
        process.wait()
    assert [label for label, _ in kept_labels.read_rows(labels).values()] == ["owl"]


def test_the_papers_network_answers_keeps_labels_and_says_it_does_not_learn_live(tmp_path):
    import train_mt
    from conftest import invoke
    from fakedata import write_own_folder
    write_own_folder(tmp_path / "d", n_labeled=4, n_unlabeled=12, n_test=6)
    args = ["--dataset", "folder", "--backbone", "convlarge", "--width", "0.0625", "--precision", "fp32",
            "--labeled-batch", "6", "--unlabeled-batch", "12", "--epochs", "1", "--decay-epochs", "1",
            "--compress", "50", "--device", "cpu", "--data-dir", tmp_path / "d", "--out", tmp_path / "run"]
    assert invoke(train_mt, args).exit_code == 0
    backend = Served(tmp_path, labels=tmp_path / "labels.csv")
    try:
        assert backend.backend.training is None
        health = requests.get(backend.url + "/health", timeout=10).json()
        assert health["learning"].startswith("does not learn live: the paper's network trains from its images")
        assert any("does not learn live" in line or "the paper's network" in line for line in backend.lines)
        assert backend.post("/setup", {"schema": config_of(["cat", "dog", "owl"])}).status_code == 200
        tasks = tasks_of(tmp_path)
        import mtlc
        own = mtlc.load(tmp_path / "run" / "mt.pt", device="cpu").predict_files([t["data"]["path"] for t in tasks])
        results = backend.post("/predict", {"tasks": tasks}).json()["results"]
        assert [r["result"][0]["value"]["choices"][0] for r in results] == [p.label for p in own]
        answer = backend.post("/webhook", {"action": "ANNOTATION_CREATED", "task": tasks[0], "annotation": {
            "result": [{"from_name": "label", "value": {"choices": ["owl"]}}]}}).json()
        assert answer.get("status") == "kept" and answer["learning"].startswith("does not learn live"), answer
        assert [label for label, _ in kept_labels.read_rows(tmp_path / "labels.csv").values()] == ["owl"]
    finally:
        backend.close()


def test_a_refused_task_has_no_score_and_a_refusal_before_the_body_closes_the_connection(served, run):
    assert served.post("/setup", {"schema": config_of(["cat", "dog", "owl"])}).status_code == 200
    (result,) = served.post("/predict", {"tasks": [{"id": "\x1b[31m", "data": {"path": "/etc/passwd"}}]}).json()["results"]
    assert result["result"] == [] and result["score"] is None and "outside the folder" in result["error"]
    assert not any("\x1b" in line for line in served.lines)  # a task's id shows as text, never as a terminal code
    port = served.server.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:  # its body unread: never a next request
        raw.sendall(b'POST /nothing HTTP/1.1\r\nHost: x\r\nContent-Length: 26\r\n\r\nGET /health HTTP/1.1\r\n\r\n')
        answer = b""
        while chunk := raw.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 404") and answer.count(b"HTTP/1.1") == 1


def test_annotations_made_from_predictions_are_kept_and_a_bad_task_of_a_training_request_alone_is_refused(served, run,
                                                                                                          tmp_path):
    assert served.post("/setup", {"schema": config_of(["cat", "dog", "owl"])}).status_code == 200
    tasks = tasks_of(run)
    many = {"action": "ANNOTATIONS_CREATED", "task": tasks[:2], "annotation": [
        {"task": tasks[0]["id"], "result": [{"from_name": "label", "value": {"choices": ["cat"]}}]},
        {"task": tasks[1]["id"], "result": [{"from_name": "label", "value": {"choices": ["dog"]}}]}]}
    assert served.post("/webhook", many).json()["kept"] == 2
    bad = dict(tasks[2], data={"path": "/etc/passwd"})
    answer = served.post("/train", {"annotations": [dict(t, annotations=[{"result": [
        {"from_name": "label", "value": {"choices": [label]}}]}]) for t, label in ((bad, "owl"), (tasks[3], "owl"))]})
    answer = answer.json()
    assert answer["kept"] == 1 and "outside the folder" in answer["refused"][0]
    assert sorted(label for label, _ in kept_labels.read_rows(tmp_path / "labels.csv").values()) == ["cat", "dog", "owl"]


@pytest.mark.slow
def test_connections_over_the_limit_and_bodies_too_slow_are_refused(run, tmp_path, monkeypatch):
    from mtlc.label import studio_server
    monkeypatch.setattr(studio_server, "CONNECTIONS", 2)
    monkeypatch.setattr(studio_server, "READ_TIMEOUT_S", 1)
    monkeypatch.setattr(studio_server, "SLOT_WAIT_S", 0.2)
    backend = Served(run, labels=tmp_path / "labels.csv")
    port = backend.server.server_address[1]
    try:  # two requests whose bodies trickle hold both slots: no idle connection to close for a third
        slow = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        for connection in slow:
            connection.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{")
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as third:
            assert third.recv(100).startswith(b"HTTP/1.1 503")
        time.sleep(1.5)
        for connection in slow:
            connection.sendall(b'"')
            assert connection.recv(100).startswith(b"HTTP/1.1 408")
            connection.close()
        time.sleep(0.3)
        assert requests.get(backend.url + "/health", timeout=10).status_code == 200
    finally:
        backend.close()


def test_basic_auth_takes_label_studios_latin_1_and_an_empty_user_is_refused(run, tmp_path):
    from conftest import invoke
    backend = Served(run, auth=("ls", "pässwörd"), labels=tmp_path / "labels.csv")
    try:
        assert requests.get(backend.url + "/health", auth=("ls", "pässwörd"), timeout=10).status_code == 200
        assert requests.get(backend.url + "/health", auth=("ls", "passwort"), timeout=10).status_code == 401
    finally:
        backend.close()
    for user, password in (("", "x"), ("ls", ""), ("a:b", "x")):
        result = invoke(serve, ["--ckpt", run / "run" / "mt.pt", "--basic-auth-user", user, "--basic-auth-pass", password])
        assert result.exit_code == 2 and "must not be empty" in result.output


def test_a_full_disk_while_a_label_is_kept_is_a_line_the_file_as_before_and_the_server_goes_on(served, run, tmp_path,
                                                                                               monkeypatch):
    import errno
    assert served.post("/setup", {"schema": config_of(["cat", "dog", "owl"])}).status_code == 200
    tasks = tasks_of(run)

    def labeled(task, label):
        return served.post("/webhook", {"action": "ANNOTATION_CREATED", "task": task, "annotation": {
            "result": [{"from_name": "label", "value": {"choices": [label]}}]}})
    assert labeled(tasks[0], "cat").status_code == 200
    before = (tmp_path / "labels.csv").read_bytes()

    def full(rows):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(kept_labels, "csv_bytes", full)
    answer = labeled(tasks[1], "dog")
    assert answer.status_code == 507 and "No space left on device" in answer.json()["error"]
    assert (tmp_path / "labels.csv").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".labels.csv")) == []  # no temporary left
    monkeypatch.undo()
    assert labeled(tasks[1], "dog").status_code == 200 and requests.get(served.url + "/health").status_code == 200


@pytest.mark.slow
def test_each_version_writes_the_rest_with_the_promise_of_predict_and_label_py_finishes_the_folder(run, tmp_path):
    """The --accepted file: every image still unlabeled with the class, confidence and `accepted` that
    evaluate.py --predict --max-error gives it (the same heads, the same calibration); after a label, a
    new version's file without that image; label.py takes the file (--accepted) and the labels file,
    and --undo puts both back."""
    import evaluate
    import label
    from conftest import invoke, read_rows
    folder = tmp_path / "d"
    shutil.copytree(run / "d", folder, ignore=shutil.ignore_patterns("mtlc-cache"))
    accepted_file = tmp_path / "rest.csv"
    assert invoke(evaluate, ["--ckpt", run / "run" / "mt.pt", "--data-dir", folder, "--predict", folder / "unlabeled",
                             "--max-error", "60", "--csv", tmp_path / "p.csv"]).exit_code == 0
    predicted = {r["path"]: r for r in read_rows((tmp_path / "p.csv").read_text(), ["accepted", "like_no_class"])}
    backend = ServedOn(run, folder, tmp_path / "labels.csv", (accepted_file, 60.0))
    try:
        rest = {r["path"]: r for r in read_rows(accepted_file.read_text(), ["accepted", "like_no_class"])}
        assert set(rest) == set(predicted) and len(rest) == 16
        for path, row in rest.items():
            assert (row["prediction"], row["accepted"], row["like_no_class"]) == (
                predicted[path]["prediction"], predicted[path]["accepted"], predicted[path]["like_no_class"])
            assert float(row["confidence"]) == pytest.approx(float(predicted[path]["confidence"]), abs=2e-3)
        assert any(" of the 16 images still unlabeled accepted at --max-error 60" in line for line in backend.lines)
        assert backend.post("/setup", {"schema": config_of(["cat", "dog", "owl"])}).status_code == 200
        first = requests.get(backend.url + "/health", timeout=10).json()["model_version"]
        task = tasks_of(run)[0]
        task["data"]["path"] = str(folder / Path(task["data"]["path"]).relative_to(run / "d"))
        task["data"]["image"] = local_files_url(Path(task["data"]["path"]), folder)
        labeled = {"action": "ANNOTATION_CREATED", "task": task,
                   "annotation": {"result": [{"from_name": "label", "to_name": "image", "type": "choices",
                                              "value": {"choices": ["owl"]}}]}}
        assert backend.post("/webhook", labeled).json()["status"] == "kept"
        wait_for_version(backend, first)
        deadline = time.time() + 30
        while time.time() < deadline and len(read_rows(accepted_file.read_text(), ["accepted", "like_no_class"])) != 15:
            time.sleep(0.2)
        rest = {r["path"] for r in read_rows(accepted_file.read_text(), ["accepted", "like_no_class"])}
        assert rest == set(predicted) - {task["data"]["path"]}
    finally:
        backend.close()
    n_accepted = sum(r["accepted"] == "1" for r in read_rows(accepted_file.read_text(), ["accepted", "like_no_class"]))
    assert invoke(label, ["--data-dir", folder, "--apply", tmp_path / "labels.csv"]).exit_code == 0
    result = invoke(label, ["--data-dir", folder, "--apply", accepted_file, "--accepted"])
    assert result.exit_code == 0, result.output
    assert (folder / "labeled" / "owl" / Path(task["data"]["path"]).name).exists()
    assert len(list((folder / "unlabeled").rglob("*.png"))) == 15 - n_accepted
    for _ in range(2):
        assert invoke(label, ["--data-dir", folder, "--undo"]).exit_code == 0
    assert len(list((folder / "unlabeled").rglob("*.png"))) == 16


class ServedOn(Served):
    """A backend of the run's checkpoint serving another copy of its folder."""

    def __init__(self, run, folder, labels, accepted):
        self.lines = []
        self.server, self.backend = serve.started(run / "run" / "mt.pt", folder, None, labels, "127.0.0.1", 0, None,
                                                   torch.device("cpu"), self.lines.append, accepted=accepted)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
