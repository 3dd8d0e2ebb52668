"""Label Studio: a model's predictions as import tasks with pre-annotations, the labeling config to
paste, and a project's exports read back as labels for label.py.

Formats, as Label Studio documents them (labelstud.io/guide): tasks are a JSON list of
{"data": {...}, "predictions": [{"model_version", "score", "result": [{"from_name", "to_name",
"type": "choices", "value": {"choices": [class]}}]}]} (guide/tasks, guide/predictions); images are
served from the machine's disk by local files storage, addressed as
/data/local-files/?d=<path under LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT> (guide/storage, "Local
storage"); the JSON export is the tasks with their "annotations" (each with "result" and
"was_cancelled"), JSON-MIN one flat record per annotation (the task's data keys, the control's name
holding the choice, "annotation_id", "annotator", "created_at", ...), CSV the same as columns
(guide/export). Each task's data carries the image's path as label.py reads it and the BLAKE2b of
its bytes, so an export binds every label to the image it was given for.
"""
import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote
from xml.sax.saxutils import quoteattr

from .errors import UserError

FROM_NAME, TO_NAME = "label", "image"  # the Choices control and the Image object of labeling_config
LOCAL_FILES = "/data/local-files/?d="


def labeling_config(classes):
    """The labeling config of a project for these classes: the image, one choice among the classes."""
    choices = "\n".join(f"    <Choice value={quoteattr(str(c))}/>" for c in classes)
    return (f'<View>\n  <Image name="{TO_NAME}" value="${TO_NAME}"/>\n'
            f'  <Choices name="{FROM_NAME}" toName="{TO_NAME}" choice="single" showInLine="true">\n'
            f"{choices}\n  </Choices>\n</View>\n")


def common_folder(paths):
    """The deepest folder holding every one of the files."""
    folders = [Path(p).resolve().parent for p in paths]
    common = folders[0]
    while any(common != f and common not in f.parents for f in folders):
        common = common.parent
    return common


def local_storage(paths, root=None):
    """(LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT, the local storage's absolute path) that serve the files:
    Label Studio's storage must be a folder under the document root, and a task addresses a file by
    its path under the root, which starts with the storage's folder (guide/storage, "Tasks with local
    storage file references"). Default root: the folder above the deepest one holding every file."""
    common = common_folder(paths)
    root = Path(root).resolve() if root else common.parent
    if root == common or root not in common.parents:
        raise UserError(f"--label-studio-root {root}: the images must lie in a folder under it (they are all under "
                        f"{common}); Label Studio serves a storage folder below its document root")
    return root, root / common.relative_to(root).parts[0]


def local_files_url(path, root):
    """Where Label Studio's local files storage serves the file `path` from, under `root`."""
    return LOCAL_FILES + quote(Path(path).resolve().relative_to(root).as_posix(), safe="/")


def task(prediction, root, model_version):
    """One import task: the image, its path and bytes' hash, and the prediction as a pre-annotation
    (score: the calibrated confidence). A file that could not be read gets no pre-annotation."""
    data = {TO_NAME: local_files_url(prediction.path, root), "path": str(prediction.path),
            "blake2b": prediction.digest or ""}
    if prediction.label is None:
        return {"data": data}
    data.update(prediction=prediction.label, confidence=prediction.confidence)
    result = {"from_name": FROM_NAME, "to_name": TO_NAME, "type": "choices", "value": {"choices": [prediction.label]}}
    return {"data": data, "predictions": [{"model_version": model_version, "score": prediction.confidence,
                                           "result": [result]}]}


def write_tasks(text_file, predictions, root, model_version):
    """The tasks of `predictions` as Label Studio's import JSON (a list), one task a line, written as
    they come (a million predictions need no list in memory); returns how many."""
    text_file.write("[")
    count = 0
    for count, prediction in enumerate(predictions, 1):
        text_file.write(("\n" if count == 1 else ",\n") + json.dumps(task(prediction, root, model_version),
                                                                     ensure_ascii=False))
    text_file.write("\n]\n")
    return count


@dataclass
class ExportLabels:
    """What a Label Studio export says: rows (path, label, blake2b or None) for label.py, one per
    labeled task (its latest annotation that is not cancelled), and the tasks that give no label."""
    format: str
    rows: list = field(default_factory=list)
    no_annotation: int = 0
    cancelled: int = 0


def choice(value, where):
    """The one class of a Choices result's value (JSON: {"choices": [c]}; JSON-MIN and CSV: c, or
    {"choices": [...]} where several were picked)."""
    if isinstance(value, dict):
        value = value.get("choices")
    if isinstance(value, list):
        if len(value) != 1:
            raise UserError(f"{where}: {len(value)} classes chosen for one image; one is needed")
        value = value[0]
    if not isinstance(value, str) or not value:
        raise UserError(f"{where}: no class name in the annotation ({value!r})")
    return value


def task_path(data, where):
    """(path, blake2b) of a task's data: the tasks --label-studio writes carry both."""
    path = data.get("path") if isinstance(data, dict) else None
    if not isinstance(path, str) or not path:
        raise UserError(f"{where}: the task has no 'path' in its data: label.py reads the tasks that "
                        f"evaluate.py --label-studio wrote (their data names each image's path)")
    digest = data.get("blake2b")
    return path, digest if isinstance(digest, str) and digest else None


def from_json(tasks, name):
    """A JSON export: every task with its annotations."""
    labels = ExportLabels("Label Studio JSON")
    for n, item in enumerate(tasks, 1):
        where = f"{name}: task {item.get('id', n) if isinstance(item, dict) else n}"
        if not isinstance(item, dict):
            raise UserError(f"{where} is not a task (a JSON object)")
        path, digest = task_path(item.get("data"), where)
        annotations = [a for a in item.get("annotations") or () if isinstance(a, dict)]
        kept = [a for a in annotations if not (a.get("was_cancelled") or a.get("skipped"))]
        if not annotations:
            labels.no_annotation += 1
            continue
        if not kept:
            labels.cancelled += 1
            continue
        latest = max(kept, key=lambda a: str(a.get("created_at") or ""))  # ISO times sort as text
        picked = [r for r in latest.get("result") or () if isinstance(r, dict) and r.get("from_name") == FROM_NAME]
        if not picked:
            labels.no_annotation += 1
            continue
        labels.rows.append((path, choice(picked[0].get("value"), where), digest))
    return labels


def from_records(records, name, what):
    """JSON-MIN or CSV: one record per annotation (several for a task annotated several times: the
    latest counts), a task without annotations as a record without the label; Label Studio leaves
    tasks whose annotations were all cancelled out of these exports."""
    labels = ExportLabels(what)
    latest = {}
    for n, record in enumerate(records, 1):
        where = f"{name}: record {n}"
        if not isinstance(record, dict):
            raise UserError(f"{where} is not a record (a JSON object)")
        path, digest = task_path(record, where)
        value = record.get(FROM_NAME)
        key = record.get("id", path)
        if value in (None, ""):
            latest.setdefault(key, None)
            continue
        made = str(record.get("created_at") or "")
        if latest.get(key) is None or made > latest[key][0]:
            latest[key] = (made, (path, choice(value, where), digest))
    for found in latest.values():
        if found is None:
            labels.no_annotation += 1
        else:
            labels.rows.append(found[1])
    return labels


def csv_records(text):
    """The rows of a CSV export as dicts; a choice given as JSON ({"choices": [...]}) decoded."""
    records = []
    for row in csv.DictReader(io.StringIO(text)):
        value = row.get(FROM_NAME)
        if value and value.startswith("{"):
            try:
                row[FROM_NAME] = json.loads(value)
            except json.JSONDecodeError:
                pass
        records.append(row)
    return records


def is_export(path, text):
    """Whether a labels file is a Label Studio export: a .json file, or a CSV with Label Studio's
    annotation columns."""
    if Path(path).suffix.lower() == ".json":
        return True
    header = text.split("\n", 1)[0]
    return "annotation_id" in header and "annotator" in header


def read_export(path, text):
    """ExportLabels of a Label Studio export's text (JSON, JSON-MIN or CSV)."""
    name = str(path)
    if Path(path).suffix.lower() != ".json":
        return from_records(csv_records(text), name, "Label Studio CSV")
    try:
        tasks = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{name} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if isinstance(tasks, dict):
        tasks = [tasks]
    if not isinstance(tasks, list):
        raise UserError(f"{name}: a Label Studio export is a list of tasks")
    if any(isinstance(t, dict) and "data" in t for t in tasks):
        return from_json(tasks, name)
    return from_records(tasks, name, "Label Studio JSON-MIN")


def write_project(tasks_path, predictions, classes, root, model_version):
    """The import tasks of `predictions` (served from under `root`) and, beside them, the labeling
    config (config_path), each written whole or not at all; returns the number of tasks."""
    from .runs import atomic_write  # imports torch: label.py, which reads exports, does not need it
    count = []

    def write(binary_file):
        text = io.TextIOWrapper(binary_file, encoding="utf-8", newline="\n")
        count.append(write_tasks(text, predictions, root, model_version))
        text.flush()
        text.detach()  # leave the file to atomic_write
    atomic_write(tasks_path, write)
    atomic_write(config_path(tasks_path), lambda f: f.write(labeling_config(classes).encode()))
    return count[0]


def config_path(tasks_path):
    """Where the labeling config goes: beside the tasks, tasks.json -> tasks.label-config.xml."""
    return Path(tasks_path).with_suffix(".label-config.xml")


def setup_lines(root, storage, tasks_path, labels_folder):
    """How to open the tasks in Label Studio, step by step (guide/storage, "Local storage")."""
    return [f"Label Studio, to label these images with the model's suggestions preselected:",
            f"  1. start it serving the files: LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED=true "
            f"LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT={root} label-studio start",
            f"  2. create a project; Settings > Labeling Interface > Code: paste {config_path(tasks_path)}",
            f"  3. Settings > Cloud Storage > Add Source Storage > Local files, absolute local path {storage}, "
            f"'Treat every bucket object as a source file' off; Add Storage (do not Sync)",
            f"  4. Import {tasks_path}; label; Export as JSON, JSON-MIN or CSV, then: "
            f"python label.py --data-dir {labels_folder} --apply <the export>"]
