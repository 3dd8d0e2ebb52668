"""Label Studio itself with serve.py's backend: started on localhost (sqlite, its own data folder, a user
and token from its environment variables), a project made through label-studio-sdk with the config
evaluate.py --label-studio writes, the folder's local storage, the tasks imported, the backend
connected and its predictions retrieved, then a task's labeling page in headless Chromium, saved.
tests/test_label_studio_live.py runs it on a small folder; docs/label-studio.md's screenshot is

    python tools/studio_session.py --label-studio ../ls-venv/bin/label-studio --ckpt runs/readme-dtd/lc.pt \\
        --data-dir data/photo-dtd --screenshot docs/label-studio/labeling.png

Label Studio is an extra: pip install label-studio in a virtual environment of its own.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import click
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOKEN = "0123456789abcdef0123456789abcdef01234567"
USER, PASSWORD = "demo@example.com", "demopass123"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Label Studio 1.23's Data Manager scores a task by its predictions of the project's model version, which
# it sets to the backend's title (no prediction has it: the column stays empty, nothing sorts by it); with
# this feature flag on, by those of the version the backend says it serves now (data_manager/managers.py)
SCORE_BY_THE_BACKENDS_VERSION = "ff_front_dev_1682_model_version_dropdown_070622_short"


def start_label_studio(command, home, document_root, log_path, seconds=300):
    """(the process, its URL) of Label Studio serving local files under document_root, its data in
    home; ML_BLOCK_LOCAL_IP and SSRF_PROTECTION_ENABLED off: it may call a backend on localhost; its
    Prediction score the backend's current version's (SCORE_BY_THE_BACKENDS_VERSION)."""
    port = free_port()
    env = dict(PATH=os.path.dirname(os.path.abspath(command)) + os.pathsep + os.environ.get("PATH", ""),
               HOME=str(home), LABEL_STUDIO_BASE_DATA_DIR=str(Path(home) / "studio-data"), DJANGO_DB="sqlite",
               LABEL_STUDIO_USERNAME=USER, LABEL_STUDIO_PASSWORD=PASSWORD, LABEL_STUDIO_USER_TOKEN=TOKEN,
               LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN="true", LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED="true",
               LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT=str(document_root),
               ML_BLOCK_LOCAL_IP="false", SSRF_PROTECTION_ENABLED="false", **{SCORE_BY_THE_BACKENDS_VERSION: "true"})
    with open(log_path, "wb") as log:
        process = subprocess.Popen([command, "start", "--port", str(port), "--no-browser"], env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}", time.time() + seconds
    while time.time() < deadline and process.poll() is None:
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except requests.ConnectionError:
            pass
        time.sleep(1)
    stop(process)
    raise RuntimeError(f"Label Studio did not start: {Path(log_path).read_text()[-3000:]}")


def stop(process):
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def project_with_backend(url, tasks_file, storage, backend_url):
    """(the SDK's client, the project): the tasks of evaluate.py --label-studio imported without their
    pre-annotations, the backend connected, its predictions retrieved for every task."""
    from label_studio_sdk import LabelStudio
    ls = LabelStudio(base_url=url, api_key=TOKEN)
    config = Path(tasks_file).with_suffix(".label-config.xml").read_text()
    project = ls.projects.create(title="live", label_config=config)
    ls.import_storage.local.create(project=project.id, path=str(storage), use_blob_urls=False)
    ls.projects.import_tasks(id=project.id, request=[{"data": t["data"]} for t in json.loads(Path(tasks_file).read_text())])
    ls.ml.create(project=project.id, url=backend_url, title="mtlc")
    retrieve_predictions(ls, project.id)
    return ls, project


def retrieve_predictions(ls, project):
    ls.actions.create(id="retrieve_tasks_predictions", project=project, selected_items={"all": True, "excluded": []})


def labeling_page(driver, url, project, task, screenshot):
    """Log in, open a task's labeling page, save its screenshot; the choices shown checked."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(url + "/user/login/")
    driver.find_element(By.NAME, "email").send_keys(USER)
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit], input[type=submit]").click()
    WebDriverWait(driver, 60).until(lambda d: "/user/login" not in d.current_url)
    driver.get(f"{url}/projects/{project}/data?task={task}")
    checked, deadline = [], time.time() + 60
    while time.time() < deadline and not checked:
        time.sleep(0.5)
        labels = [box.find_elements(By.XPATH, "./ancestor::label[1]")
                  for box in driver.find_elements(By.CSS_SELECTOR, "input[type=checkbox]:checked")]
        checked = [found[0].text.split("[")[0].strip() for found in labels if found and found[0].text.strip()]
    WebDriverWait(driver, 30).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "img")))
    time.sleep(2)  # the image drawn, not only its element
    driver.save_screenshot(str(screenshot))
    return checked


def headless_chromium():
    os.environ["SE_AVOID_STATS"] = "true"  # or Selenium Manager tries the internet
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,860"):
        options.add_argument(arg)
    options.binary_location = "/usr/bin/chromium"
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


@click.command()
@click.option("--label-studio", "command", type=click.Path(exists=True, dir_okay=False), required=True)
@click.option("--ckpt", type=click.Path(exists=True, dir_okay=False), required=True)
@click.option("--data-dir", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--screenshot", type=click.Path(dir_okay=False), required=True)
@click.option("--task", type=click.IntRange(1), default=1, help="Which task's labeling page (its position).")
def main(command, ckpt, data_dir, screenshot, task):
    import torch
    import serve
    folder = Path(data_dir).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        tasks_file = Path(tmp) / "tasks.json"
        subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--ckpt", ckpt, "--predict", str(folder / "unlabeled"),
                        "--label-studio", str(tasks_file)], check=True, stdout=subprocess.DEVNULL)
        server, backend = serve.started(ckpt, folder, None, Path(tmp) / "labels.csv", "127.0.0.1", 0, None,
                                        torch.device("cpu"), print)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        process, url = start_label_studio(command, tmp, folder, Path(tmp) / "studio.log")
        try:
            ls, project = project_with_backend(url, tasks_file, folder / "unlabeled",
                                               f"http://127.0.0.1:{server.server_address[1]}")
            tasks = list(ls.tasks.list(project=project.id, fields="all"))
            driver = headless_chromium()
            try:
                checked = labeling_page(driver, url, project.id, tasks[task - 1].id, screenshot)
            finally:
                driver.quit()
            click.echo(f"wrote {screenshot}: task {tasks[task - 1].id}, {checked} preselected")
        finally:
            stop(process)
            server.shutdown()
            if backend.training is not None:
                backend.training.close()


if __name__ == "__main__":
    main()
