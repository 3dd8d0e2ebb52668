"""serve.py's speed and its live head's labels, on a folder with a truth file (examples/own_images.py):
the backend started in this process as serve.py starts it, called over HTTP as Label Studio calls it.

    python tools/bench_serve.py --ckpt runs/readme-ham3/lc.pt --data-dir data/photo-ham \\
        --truth data/photo-ham-truth.csv --give 100 --json docs/label-studio/serve-ham.json

Measured: the start (the checkpoint, the folder and its kept features read; embedding too where
nothing is kept yet); /predict for --tasks tasks of unlabeled/ (the median and the slowest of
--repeat calls), before and while the head trains again; --give labels from the truth file sent as
ANNOTATION_CREATED webhooks, one a call, each kept before its answer; the time from the last one to the
new model version (a round of the heads that never saw an image) and to its --accepted file written,
and the training process's own time; the next round's order: /predict of every task of unlabeled/
in one call, as Label Studio retrieves them before its Data Manager sorts them by score; the labels'
error on the rest of unlabeled/ (the images not given) before and after, through /predict. The labels file is written
beside the JSON (LABELS.csv): label.py --apply reads it, for train_mt.py on the same labeled images.
"""
import csv
import json
import platform
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import click
import requests
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import serve  # noqa: E402
from mtlc.use.label_studio import labeling_config, local_files_url  # noqa: E402


def timed(call, repeat):
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return dict(median_s=round(statistics.median(seconds), 3), max_s=round(max(seconds), 3), calls=repeat)


def labels_error(url, tasks, truth, skip):
    """The error of /predict's classes on the tasks whose path is not in `skip`, and the version."""
    rest = [t for t in tasks if t["data"]["path"] not in skip]
    results = requests.post(url + "/predict", json={"tasks": rest}, timeout=600).json()["results"]
    wrong = sum(r["result"][0]["value"]["choices"][0] != truth[t["rel"]] for t, r in zip(rest, results))
    return dict(error_percent=round(100 * wrong / len(rest), 2), images=len(rest), version=results[0]["model_version"])


@click.command()
@click.option("--ckpt", type=click.Path(exists=True, dir_okay=False), required=True)
@click.option("--data-dir", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--truth", type=click.Path(exists=True, dir_okay=False), required=True)
@click.option("--give", type=click.IntRange(1), default=100, help="Labels given, drawn from unlabeled/.")
@click.option("--tasks", "n_tasks", type=click.IntRange(1), default=100, help="Tasks a timed /predict call sends.")
@click.option("--repeat", type=click.IntRange(1), default=5)
@click.option("--seed", type=int, default=0)
@click.option("--against", nargs=2, type=click.Path(exists=True), default=None, metavar="CKPT FOLDER",
              help="Also score this checkpoint's own head on the same images in FOLDER (a copy of the folder "
                   "where label.py --apply moved the given images).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), required=True)
def main(ckpt, data_dir, truth, give, n_tasks, repeat, seed, against, json_path):
    folder = Path(data_dir).resolve()
    with open(truth, newline="") as f:
        classes = {r["path"]: r["class"] for r in csv.DictReader(f)}
    labels_path = Path(json_path).with_suffix(".labels.csv")
    labels_path.unlink(missing_ok=True)
    lines = []
    start = time.perf_counter()
    server, backend = serve.started(ckpt, folder, None, labels_path, "127.0.0.1", 0, None, torch.device("cpu"),
                                    lines.append)
    started_s = time.perf_counter() - start
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        config = labeling_config(backend.model.classes)
        health = requests.get(url + "/health").json()
        rel = sorted(p for p in classes if p.startswith("unlabeled/") and (folder / p).is_file())
        tasks = [dict(id=i, rel=p, data={"image": local_files_url(folder / p, folder), "path": str(folder / p)})
                 for i, p in enumerate(rel)]
        random.Random(seed).shuffle(tasks)
        sample = {"tasks": [dict(id=t["id"], data=t["data"]) for t in tasks[:n_tasks]], "label_config": config}
        assert requests.post(url + "/setup", json={"schema": config}).status_code == 200, "setup refused"
        given = tasks[-give:]
        before = labels_error(url, tasks, classes, {t["data"]["path"] for t in given})
        predict = timed(lambda: requests.post(url + "/predict", json=sample, timeout=60).raise_for_status(), repeat)
        webhook = timed_each(url, given, classes)
        waited = time.perf_counter()
        while not requests.get(url + "/health").json()["learning"].startswith("training"):
            time.sleep(0.05)  # the training process started, reading the folder: then it trains
        during = timed(lambda: requests.post(url + "/predict", json=sample, timeout=60).raise_for_status(), repeat)
        while f"+{give} labels" not in requests.get(url + "/health").json()["model_version"]:
            if time.perf_counter() - waited > 1800:
                raise click.ClickException(f"no version on {give} labels in 30 min: {lines[-5:]}")
            time.sleep(0.2)
        retrain_s = time.perf_counter() - waited
        while sum("images still unlabeled accepted" in line for line in lines) < 2:  # the start's, then this one's
            time.sleep(0.05)
        rest_s = time.perf_counter() - waited
        every = {"tasks": [dict(id=t["id"], data=t["data"]) for t in tasks], "label_config": config}
        order = timed(lambda: requests.post(url + "/predict", json=every, timeout=600).raise_for_status(), 1)
        after = labels_error(url, tasks, classes, {t["data"]["path"] for t in given})
    finally:
        server.shutdown()
        server.server_close()
        if backend.training is not None:
            backend.training.close()
    record = dict(checkpoint=str(ckpt), folder=str(data_dir), unlabeled=len(tasks), start_s=round(started_s, 1),
                  predict_100=predict, predict_while_training=during, webhooks=webhook,
                  new_version_after_last_label_s=round(retrain_s, 1), accepted_file_after_last_label_s=round(rest_s, 1),
                  predict_every_task=order,
                  accepted_line=[line for line in lines if "still unlabeled accepted" in line][-1],
                  trained_line=next((line for line in lines if line.startswith("model version")), None),
                  labels_error_before=before, labels_error_after=after, labels_file=str(labels_path), health=health,
                  train_mt_on_the_same_labels=against and against_error(*against, tasks, classes, given),
                  machine=dict(cpu=cpu_name(), threads=torch.get_num_threads()),
                  command=" ".join(sys.argv))
    Path(json_path).write_text(json.dumps(record, indent=1) + "\n")
    click.echo(json.dumps(record, indent=1))


def cpu_name():
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def against_error(ckpt, folder, tasks, classes, given):
    """The labels' error of a checkpoint's own head (train_mt.py's, trained on the given labels moved
    into labeled/ of `folder`, a copy) on the same images as the live head's."""
    import mtlc
    rest = [t for t in tasks if t not in given]
    model = mtlc.load(ckpt, device="cpu")
    predicted = model.predict_files([Path(folder) / t["rel"] for t in rest])
    wrong = sum(p.label != classes[t["rel"]] for t, p in zip(rest, predicted))
    return dict(checkpoint=str(ckpt), error_percent=round(100 * wrong / len(rest), 2), images=len(rest))


def timed_each(url, given, classes):
    seconds = []
    for t in given:
        body = {"action": "ANNOTATION_CREATED", "task": dict(id=t["id"], data=t["data"]),
                "annotation": {"result": [{"from_name": "label", "to_name": "image", "type": "choices",
                                           "value": {"choices": [classes[t["rel"]]]}}]}}
        start = time.perf_counter()
        requests.post(url + "/webhook", json=body, timeout=60).raise_for_status()
        seconds.append(time.perf_counter() - start)
    return dict(median_s=round(statistics.median(seconds), 3), max_s=round(max(seconds), 3), calls=len(seconds))


if __name__ == "__main__":
    main()
