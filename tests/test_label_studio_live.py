"""serve.py against Label Studio itself: the pip package started on localhost (sqlite, its own data
folder, a user and token from its environment variables), a project made through label-studio-sdk
with the config evaluate.py --label-studio writes, the backend connected, tasks imported, predictions
retrieved, annotations submitted, and the labeling page looked at in headless Chromium.

Label Studio is an extra (its own virtual environment: .ci/run makes one): $MTLC_LABEL_STUDIO names
its `label-studio` command, else the one on PATH; without it these tests skip, except under
MTLC_REQUIRE_LABEL_STUDIO (CI), where they must run."""
import json
import os
import shutil
import socket
import subprocess
import time

import pytest
import requests

import evaluate
from conftest import invoke, needs_backbone, train_backbone_run
from mtlc.label import kept_labels
from test_serve import Served

TOKEN = "0123456789abcdef0123456789abcdef01234567"
USER, PASSWORD = "demo@example.com", "demopass123"
pytestmark = [needs_backbone("efficientnet-lite0"), pytest.mark.slow]


def label_studio_command():
    command = os.environ.get("MTLC_LABEL_STUDIO") or shutil.which("label-studio")
    if command and os.path.exists(command):
        return command
    if os.environ.get("MTLC_REQUIRE_LABEL_STUDIO"):
        pytest.fail("MTLC_REQUIRE_LABEL_STUDIO is set but no label-studio command was found ($MTLC_LABEL_STUDIO)")
    pytest.skip("Label Studio is not installed (pip install label-studio, in a virtual environment of its own; "
                "$MTLC_LABEL_STUDIO names its label-studio command)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    """(Label Studio's URL, the folder it serves local files from, the run trained on that folder)."""
    command = label_studio_command()
    root = tmp_path_factory.mktemp("studio")
    train_backbone_run(root, "--unlabeled-batch", "4", n_labeled=4, n_unlabeled=16, n_test=8)
    port = free_port()
    env = dict(PATH=os.path.dirname(command) + os.pathsep + os.environ.get("PATH", ""), HOME=str(root),
               LABEL_STUDIO_BASE_DATA_DIR=str(root / "studio-data"), DJANGO_DB="sqlite",
               LABEL_STUDIO_USERNAME=USER, LABEL_STUDIO_PASSWORD=PASSWORD, LABEL_STUDIO_USER_TOKEN=TOKEN,
               LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN="true", LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED="true",
               LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT=str(root / "d"),
               ML_BLOCK_LOCAL_IP="false", SSRF_PROTECTION_ENABLED="false")  # it may call a backend on localhost
    with open(root / "studio.log", "wb") as log:
        process = subprocess.Popen([command, "start", "--port", str(port), "--no-browser"], env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        time.sleep(1)
    else:
        process.kill()
        pytest.fail(f"Label Studio did not start: {(root / 'studio.log').read_text()[-3000:]}")
    yield url, root
    os.killpg(process.pid, 15)
    process.wait(timeout=30)


def test_label_studio_shows_the_backends_predictions_and_its_labels_train_a_new_version(studio, browser, tmp_path):
    from label_studio_sdk import LabelStudio
    url, root = studio
    tasks_file = tmp_path / "tasks.json"
    assert invoke(evaluate, ["--ckpt", root / "run" / "mt.pt", "--predict", root / "d" / "unlabeled",
                             "--label-studio", tasks_file]).exit_code == 0
    backend = Served(root, labels=tmp_path / "labels.csv")
    try:
        ls = LabelStudio(base_url=url, api_key=TOKEN)
        project = ls.projects.create(title="live", label_config=(tmp_path / "tasks.label-config.xml").read_text())
        ls.import_storage.local.create(project=project.id, path=str(root / "d" / "unlabeled"), use_blob_urls=False)
        ls.projects.import_tasks(id=project.id, request=[{"data": t["data"]} for t in json.loads(tasks_file.read_text())])
        ls.ml.create(project=project.id, url=backend.url, title="mtlc")
        ls.actions.create(id="retrieve_tasks_predictions", project=project.id, selected_items={"all": True, "excluded": []})
        tasks = list(ls.tasks.list(project=project.id, fields="all"))
        # every task: the backend's prediction, its class and score those the backend gives the task's image
        direct = backend.post("/predict", {"tasks": [{"data": t.data} for t in tasks]}).json()["results"]
        first = direct[0]["model_version"]
        assert len(tasks) == 16
        for task, expected in zip(tasks, direct):
            (prediction,) = [p for p in task.predictions]
            prediction = prediction if isinstance(prediction, dict) else prediction.dict()
            assert prediction["model_version"] == first and prediction["result"] == expected["result"]
            assert prediction["score"] == pytest.approx(expected["score"])
        # annotations submitted through the API reach the labels file, and a head trained on them
        given = dict(zip([t.id for t in tasks[:3]], ["owl", "dog", "cat"]))
        for task_id, label in given.items():
            ls.annotations.create(id=task_id, result=[{"from_name": "label", "to_name": "image", "type": "choices",
                                                       "value": {"choices": [label]}}])
        paths = {t.id: t.data["path"] for t in tasks}
        deadline = time.time() + 120
        while time.time() < deadline and "+3 labels" not in requests.get(backend.url + "/health").json()["model_version"]:
            time.sleep(0.5)
        rows = kept_labels.read_rows(tmp_path / "labels.csv")
        assert {path: label for path, (label, _) in rows.items()} == {paths[i]: label for i, label in given.items()}
        new = requests.get(backend.url + "/health").json()["model_version"]
        assert "+3 labels" in new, backend.lines
        ls.actions.create(id="retrieve_tasks_predictions", project=project.id, selected_items={"all": True, "excluded": []})
        later = list(ls.tasks.list(project=project.id, fields="all"))
        assert all(new in {(p if isinstance(p, dict) else p.dict())["model_version"] for p in t.predictions} for t in later)
        # the labeling page of an unlabeled task: its image, the backend's class preselected
        shot = labeling_page(browser[0], url, USER, PASSWORD, project.id, tasks[5].id, tmp_path / "labeling.png")
        predicted = direct[5]["result"][0]["value"]["choices"][0]
        assert shot == [predicted], shot
    finally:
        backend.close()


def labeling_page(driver, url, user, password, project, task, screenshot):
    """Log in, open a task's labeling page, save its screenshot; the choices shown checked."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(url + "/user/login/")
    driver.find_element(By.NAME, "email").send_keys(user)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit], input[type=submit]").click()
    WebDriverWait(driver, 60).until(lambda d: "/user/login" not in d.current_url)
    driver.get(f"{url}/projects/{project}/data?task={task}")
    checked = []
    deadline = time.time() + 60
    while time.time() < deadline and not checked:
        time.sleep(0.5)
        boxes = driver.find_elements(By.CSS_SELECTOR, "input[type=checkbox]:checked")
        checked = [b.find_element(By.XPATH, "./ancestor::label[1]").text.split("[")[0].strip() for b in boxes
                   if b.find_elements(By.XPATH, "./ancestor::label[1]")]
        checked = [c for c in checked if c]
    WebDriverWait(driver, 30).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "img")))
    driver.save_screenshot(str(screenshot))
    return checked
