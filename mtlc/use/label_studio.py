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
import itertools
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote
from xml.sax.saxutils import quoteattr

from ..disk.json_arrays import JSON_SPACE, json_array_items
from ..disk.outputs import written_at
from ..errors import UserError

FROM_NAME, TO_NAME = "label", "image"  # the Choices control and the Image object of labeling_config
LOCAL_FILES = "/data/local-files/?d="


def labeling_config(classes):
    """The labeling config of a project for these classes: the image, one choice among the classes."""
    choices = "\n".join(f"    <Choice value={quoteattr(str(c))}/>" for c in classes)
    return (f'<View>\n  <Image name="{TO_NAME}" value="${TO_NAME}"/>\n'
            f'  <Choices name="{FROM_NAME}" toName="{TO_NAME}" choice="single" showInLine="true">\n'
            f"{choices}\n  </Choices>\n</View>\n")


def common_folder(paths):
    """The deepest folder holding every one of the files, by their absolute paths as named (links are
    not followed: a link in the folder must not widen what Label Studio is told to serve); one pass,
    constant memory."""
    common = None
    for path in paths:
        folder = os.path.dirname(os.path.abspath(path))
        common = folder if common is None else os.path.commonpath([common, folder])
    return Path(common)


def local_storage(paths, root=None):
    """(LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT, the local storage's absolute path) that serve the files:
    Label Studio's storage must be a folder under the document root, and a task addresses a file by
    its path under the root, which starts with the storage's folder (guide/storage, "Tasks with local
    storage file references"). Default root: the folder above the deepest one holding every file."""
    common = common_folder(paths)
    if root is None and common == common.parent:
        raise UserError(f"--label-studio: the images lie in no common folder below {common} (Label Studio serves "
                        f"a storage folder below its document root): predict images of one folder")
    root = Path(os.path.abspath(root)) if root else common.parent
    if root == common or root not in common.parents:
        raise UserError(f"--label-studio-root {root}: the images must lie in a folder under it (they are all under "
                        f"{common}); Label Studio serves a storage folder below its document root")
    return root, root / common.relative_to(root).parts[0]


def local_files_url(path, root):
    """Where Label Studio's local files storage serves the file `path` from, under `root`: the path's
    bytes URL-quoted (a name that is not UTF-8 included)."""
    relative = os.path.relpath(os.path.abspath(path), root).replace(os.sep, "/")
    return LOCAL_FILES + quote(os.fsencode(relative), safe=b"/")


def task(prediction, root, model_version):
    """One import task: the image, its path and bytes' hash, and the prediction as a pre-annotation
    (score: the calibrated confidence). A file that could not be read gets no pre-annotation, nor an
    image like no class (Prediction.like_no_class: its class would only mislead whoever labels it)."""
    data = {TO_NAME: local_files_url(prediction.path, root), "path": str(prediction.path),
            "blake2b": prediction.digest or ""}
    if prediction.label is None:
        return {"data": data}
    data.update(prediction=prediction.label, confidence=prediction.confidence)
    if prediction.like_no_class:
        return {"data": dict(data, like_no_class=True)}
    result = {"from_name": FROM_NAME, "to_name": TO_NAME, "type": "choices", "value": {"choices": [prediction.label]}}
    return {"data": data, "predictions": [{"model_version": model_version, "score": prediction.confidence,
                                           "result": [result]}]}


def write_tasks(text_file, predictions, root, model_version):
    """The tasks of `predictions` as Label Studio's import JSON (a list), one task a line, written as
    they come (a million predictions need no list in memory); returns how many."""
    text_file.write("[")
    count = 0
    for count, prediction in enumerate(predictions, 1):
        # ASCII: a name that is not UTF-8 keeps its bytes as \udcXX escapes, which label.py reads back
        text_file.write(("\n" if count == 1 else ",\n") + json.dumps(task(prediction, root, model_version)))
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
    if digest in (None, ""):
        return path, None
    if not isinstance(digest, str):
        raise UserError(f"{where}: its blake2b is not a hash ({digest!r})")
    return path, digest.strip().lower()


def is_true(flag):
    """Label Studio's true (a JSON true; "true" or 1 where a converter turned it into text)."""
    return flag is True or flag == 1 or (isinstance(flag, str) and flag.strip().lower() in ("true", "1"))


def listed(value, what, where):
    """A JSON list, or none for null; anything else is not what Label Studio writes."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise UserError(f"{where}: its {what} are not a list ({type(value).__name__})")
    return value


def latest_label(annotations, where):
    """The label of the latest of a task's annotations ({created_at, label}), refused where annotations
    made at the same time give different classes (nothing tells which counts)."""
    made = max(str(a["created_at"] or "") for a in annotations)  # ISO times sort as text
    labels = {a["label"] for a in annotations if str(a["created_at"] or "") == made}
    if len(labels) > 1:
        raise UserError(f"{where}: annotations made at the same time give different classes "
                        f"({', '.join(sorted(labels))}): keep one in Label Studio and export again")
    return labels.pop()


def from_json(tasks, name):
    """A JSON export: every task with its annotations."""
    labels = ExportLabels("Label Studio JSON")
    for n, item in enumerate(tasks, 1):
        where = f"{name}: task {item.get('id', n) if isinstance(item, dict) else n}"
        if not isinstance(item, dict):
            raise UserError(f"{where} is not a task (a JSON object)")
        path, digest = task_path(item.get("data"), where)
        annotations = listed(item.get("annotations"), "annotations", where)
        if any(not isinstance(a, dict) for a in annotations):
            raise UserError(f"{where}: an annotation is not a JSON object")
        kept = [a for a in annotations if not (is_true(a.get("was_cancelled")) or is_true(a.get("skipped")))]
        if not annotations:
            labels.no_annotation += 1
            continue
        if not kept:
            labels.cancelled += 1
            continue
        found = []
        for a in kept:
            results = listed(a.get("result"), "results", where)
            picked = {choice(r.get("value"), where) for r in results
                      if isinstance(r, dict) and r.get("from_name") == FROM_NAME}
            if len(picked) > 1:
                raise UserError(f"{where}: one annotation gives {len(picked)} classes ({', '.join(sorted(picked))})")
            if results and not picked:
                controls = sorted({str(r.get("from_name")) for r in results if isinstance(r, dict)})
                raise UserError(f"{where}: its annotation chose with {', '.join(controls)}, not the control "
                                f"'{FROM_NAME}' of the labeling config evaluate.py --label-studio wrote")
            if picked:
                found.append(dict(created_at=a.get("created_at"), label=picked.pop()))
        if not found:
            labels.no_annotation += 1
            continue
        labels.rows.append((path, latest_label(found, where), digest))
    return labels


def from_records(records, name, what):
    """JSON-MIN or CSV: one record per annotation (several for a task annotated several times: the
    latest counts), a task without annotations as a record without the label; Label Studio leaves
    tasks whose annotations were all cancelled out of these exports. A task is its id, or its path
    where a record has none."""
    labels = ExportLabels(what)
    tasks = {}  # task -> (path, digest, [annotations])
    for n, record in enumerate(records, 1):
        where = f"{name}: record {n}"
        if not isinstance(record, dict):
            raise UserError(f"{where} is not a record (a JSON object)")
        path, digest = task_path(record, where)
        key = record.get("id")
        if key in (None, ""):
            key = ("path", path)
        elif not isinstance(key, (int, str)):
            raise UserError(f"{where}: its task id is not a number ({key!r})")
        known = tasks.setdefault(key, (path, digest, []))
        if known[0] != path:
            raise UserError(f"{where}: task {key} names two images ({known[0]} and {path})")
        value = record.get(FROM_NAME)
        if value not in (None, ""):
            known[2].append(dict(created_at=record.get("created_at"), label=choice(value, where)))
    for key, (path, digest, annotations) in tasks.items():
        if annotations:
            labels.rows.append((path, latest_label(annotations, f"{name}: task {key}"), digest))
        else:
            labels.no_annotation += 1
    return labels


def csv_records(text, name):
    """The rows of a CSV export (a text stream) as dicts, a row at a time; a choice given as JSON
    ({"choices": [...]}) decoded."""
    try:
        for row in csv.DictReader(text):
            value = row.get(FROM_NAME)
            if value and value.startswith("{"):
                try:
                    row[FROM_NAME] = json.loads(value)
                except ValueError:
                    pass
            yield row
    except csv.Error as exc:
        raise UserError(f"cannot read {name} as CSV: {exc}") from None


def export_items(text, name, start):
    """The tasks (or JSON-MIN records) of a JSON export's text stream, one at a time (json_arrays);
    anything that is not a list of them is one line."""
    try:
        yield from json_array_items(text, start)
    except json.JSONDecodeError as exc:
        raise UserError(f"{name} is not JSON ({exc.msg} at character {exc.pos})") from None
    except (ValueError, RecursionError) as exc:  # not a list; a number too long to read; nesting too deep
        raise UserError(f"{name} is not a Label Studio export, a list of tasks ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:120]})") from None


def is_export(path, text):
    """Whether a labels file is a Label Studio export: a .json file, or a CSV with Label Studio's
    annotation columns."""
    if Path(path).suffix.lower() == ".json":
        return True
    header = text.split("\n", 1)[0]
    return "annotation_id" in header and "annotator" in header


def read_export(path, text):
    """ExportLabels of a Label Studio export (JSON, JSON-MIN or CSV) read from a text stream a task
    at a time: an export of any size takes the memory of its rows, not of its text."""
    name = str(path)
    if Path(path).suffix.lower() != ".json":
        return from_records(csv_records(text, name), name, "Label Studio CSV")
    try:
        head = text.read(1)
        while head and head in JSON_SPACE:
            head = text.read(1)
        tasks = iter([json.loads(head + text.read())]) if head == "{" else export_items(text, name, head)
        first = next(tasks, None)
        if first is None:
            return ExportLabels("Label Studio JSON")
        tasks = itertools.chain([first], tasks)
        if isinstance(first, dict) and "data" in first:
            return from_json(tasks, name)
        return from_records(tasks, name, "Label Studio JSON-MIN")
    except json.JSONDecodeError as exc:
        raise UserError(f"{name} is not JSON ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:  # a number too long to read, nesting too deep
        raise UserError(f"{name} is not a Label Studio export ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:120]})") from None


def write_project(tasks_path, predictions, classes, root, model_version):
    """The import tasks of `predictions` (served from under `root`) and, beside them, the labeling
    config (config_path), each written whole or not at all; returns the number of tasks. A file at
    the config's path is replaced only where it is a labeling config (this command's, before)."""
    from ..disk.runs import atomic_write  # imports torch: label.py, which reads exports, does not need it
    config = written_at("--label-studio's labeling config", config_path(tasks_path))
    if os.path.lexists(config) and not is_labeling_config(config):
        raise UserError(f"{config} is there and is no labeling config: --label-studio writes its config there; "
                        f"move that file or give the tasks another name")
    count = []

    def write(binary_file):
        text = io.TextIOWrapper(binary_file, encoding="utf-8", newline="\n")
        count.append(write_tasks(text, predictions, root, model_version))
        text.flush()
        text.detach()  # leave the file to atomic_write
    atomic_write(tasks_path, write)
    atomic_write(config, lambda f: f.write(labeling_config(classes).encode()))
    return count[0]


def is_labeling_config(path):
    """Whether a file starts as a labeling config does (<View>)."""
    try:
        with open(path, "rb") as f:
            return f.read(6) == b"<View>"
    except OSError:
        return False


def config_path(tasks_path):
    """Where the labeling config goes: beside the tasks, tasks.json -> tasks.label-config.xml."""
    return Path(tasks_path).with_suffix(".label-config.xml")


def setup_lines(root, storage, tasks_path, labels_folder):
    """How to open the tasks in Label Studio, step by step (guide/storage, "Local storage"); the
    commands' paths quoted for a POSIX shell."""
    q = lambda path: shlex.quote(str(path))  # noqa: E731
    return ["Label Studio, to label these images with the model's suggestions preselected:",
            f"  1. start it serving the files: LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED=true "
            f"LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT={q(root)} label-studio start",
            f"  2. create a project; Settings > Labeling Interface > Code: paste {config_path(tasks_path)}",
            f"  3. Settings > Cloud Storage > Add Source Storage > Local files, absolute local path {storage}, "
            f"'Treat every bucket object as a source file' off; Add Storage (do not Sync)",
            f"  4. Import {tasks_path}; label; Export as JSON, JSON-MIN or CSV, then: "
            f"python label.py --data-dir {q(labels_folder)} --apply <the export>"]
