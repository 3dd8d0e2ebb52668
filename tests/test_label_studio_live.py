"""serve.py against Label Studio itself (tools/studio_session.py): the pip package started on localhost
(sqlite, its own data folder, a user and token from its environment variables), a project made through
label-studio-sdk with the config evaluate.py --label-studio writes, the backend connected, tasks
imported, predictions retrieved, annotations submitted, and the labeling page looked at in headless
Chromium.

Label Studio is an extra (its own virtual environment: .ci/run makes one): $MTLC_LABEL_STUDIO names
its `label-studio` command, else the one on PATH; without it these tests skip, except under
MTLC_REQUIRE_LABEL_STUDIO (CI), where they must run."""
import json
import os
import shutil
import time

import pytest
import requests

import evaluate
from conftest import invoke, needs_backbone, train_backbone_run
from mtlc.label import kept_labels
from mtlc.use.label_studio import labeling_config
from test_serve import Served
from tools.studio_session import labeling_page, project_with_backend, retrieve_predictions, start_label_studio, stop

pytestmark = [needs_backbone("efficientnet-lite0"), pytest.mark.slow]


def label_studio_command():
    command = os.environ.get("MTLC_LABEL_STUDIO") or shutil.which("label-studio")
    if command and os.path.exists(command):
        return command
    if os.environ.get("MTLC_REQUIRE_LABEL_STUDIO"):
        pytest.fail("MTLC_REQUIRE_LABEL_STUDIO is set but no label-studio command was found ($MTLC_LABEL_STUDIO)")
    pytest.skip("Label Studio is not installed (pip install label-studio, in a virtual environment of its own; "
                "$MTLC_LABEL_STUDIO names its label-studio command)")


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    """(Label Studio's URL, the folder it serves local files from, with a run trained on it beside)."""
    command = label_studio_command()
    root = tmp_path_factory.mktemp("studio")
    train_backbone_run(root, "--unlabeled-batch", "4", n_labeled=4, n_unlabeled=16, n_test=8)
    process, url = start_label_studio(command, root, root / "d", root / "studio.log")
    yield url, root
    stop(process)


def predictions_of(task):
    return [p if isinstance(p, dict) else p.dict() for p in task.predictions]


def served_tasks(root, tmp_path):
    """(evaluate.py --label-studio's tasks file of the run's unlabeled images, a backend serving them)."""
    tasks_file = tmp_path / "tasks.json"
    assert invoke(evaluate, ["--ckpt", root / "run" / "mt.pt", "--predict", root / "d" / "unlabeled",
                             "--label-studio", tasks_file]).exit_code == 0
    return tasks_file, Served(root, labels=tmp_path / "labels.csv")


def test_label_studio_shows_the_backends_predictions_and_its_labels_train_a_new_version(studio, browser, tmp_path):
    url, root = studio
    tasks_file, backend = served_tasks(root, tmp_path)
    try:
        ls, project = project_with_backend(url, tasks_file, root / "d" / "unlabeled", backend.url)
        tasks = list(ls.tasks.list(project=project.id, fields="all"))
        assert len(tasks) == 16 == len(json.loads(tasks_file.read_text()))
        # every task: one prediction, the backend's class and score for the task's image
        direct = backend.post("/predict", {"tasks": [{"data": t.data} for t in tasks]}).json()["results"]
        first = direct[0]["model_version"]
        for task, expected in zip(tasks, direct):
            (prediction,) = predictions_of(task)
            assert prediction["model_version"] == first and prediction["result"] == expected["result"]
            assert prediction["score"] == pytest.approx(expected["score"], abs=1e-3)
        # annotations submitted through the API reach the labels file, and a head trained on them
        given = dict(zip([t.id for t in tasks[:3]], ["owl", "dog", "cat"]))
        for task_id, label in given.items():
            ls.annotations.create(id=task_id, result=[{"from_name": "label", "to_name": "image", "type": "choices",
                                                       "value": {"choices": [label]}}])
        paths = {t.id: os.path.relpath(t.data["path"], root / "d") for t in tasks}
        deadline = time.time() + 120
        while time.time() < deadline and "+3 labels" not in requests.get(backend.url + "/health").json()["model_version"]:
            time.sleep(0.5)
        rows = kept_labels.read_rows(tmp_path / "labels.csv")
        assert {path: label for path, (label, _) in rows.items()} == {paths[i]: label for i, label in given.items()}
        new = requests.get(backend.url + "/health").json()["model_version"]
        assert "+3 labels" in new, backend.lines
        retrieve_predictions(ls, project.id)
        later = list(ls.tasks.list(project=project.id, fields="all"))
        assert all(new in {p["model_version"] for p in predictions_of(t)} for t in later)
        # an unlabeled task's labeling page: its image, a prediction's class preselected
        shot = tmp_path / "labeling.png"
        checked = labeling_page(browser[0], url, project.id, tasks[5].id, shot)
        offered = {p["result"][0]["value"]["choices"][0] for p in predictions_of(later[5])}
        assert len(checked) == 1 and checked[0] in offered and shot.stat().st_size > 10_000, checked
        # a project whose choices are not the checkpoint's classes: refused at /setup, the reason shown
        from label_studio_sdk.core.api_error import ApiError
        other = ls.projects.create(title="other", label_config=labeling_config(["cat", "dog", "zebra"]))
        with pytest.raises(ApiError, match="not the checkpoint's classes: missing owl"):
            ls.ml.create(project=other.id, url=backend.url, title="mtlc")
    finally:
        backend.close()


def sorted_by_score(ls, project):
    """The project's task ids as its Data Manager sorts them by Prediction score, lowest first."""
    query = json.dumps({"ordering": ["tasks:predictions_score"]})
    return [t.id for t in ls.tasks.list(project=project, query=query, fields="all")]


def test_the_data_manager_sorts_the_tasks_least_confident_first_by_the_latest_version(studio, tmp_path):
    """Label Studio's Data Manager sorts by Prediction score (tasks:predictions_score): with the backend's
    predictions retrieved, its order is the backend's scores ascending (use/orders.py's least-confident
    order), first of the heads of --predict, then, after a round of labels, of the new version."""
    url, root = studio
    tasks_file, backend = served_tasks(root, tmp_path)
    try:
        ls, project = project_with_backend(url, tasks_file, root / "d" / "unlabeled", backend.url)
        tasks = list(ls.tasks.list(project=project.id, fields="all"))

        def scores(version):
            return {t.id: p["score"] for t in ls.tasks.list(project=project.id, fields="all")
                    for p in predictions_of(t) if p["model_version"] == version}
        first = requests.get(backend.url + "/health").json()["model_version"]
        by_score = scores(first)
        order = sorted_by_score(ls, project.id)
        assert [by_score[i] for i in order] == sorted(by_score.values()), (order, by_score)
        for task in tasks[:2]:
            ls.annotations.create(id=task.id, result=[{"from_name": "label", "to_name": "image", "type": "choices",
                                                       "value": {"choices": ["cat"]}}])
        deadline = time.time() + 120
        while time.time() < deadline and requests.get(backend.url + "/health").json()["model_version"] == first:
            time.sleep(0.5)
        new = requests.get(backend.url + "/health").json()["model_version"]
        assert new != first, backend.lines
        retrieve_predictions(ls, project.id)
        by_score = scores(new)
        order = [i for i in sorted_by_score(ls, project.id) if i in by_score]
        assert [by_score[i] for i in order] == sorted(by_score.values()), (order, by_score, scores(first))
    finally:
        backend.close()
