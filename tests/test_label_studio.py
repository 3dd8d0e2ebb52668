"""Label Studio's formats, checked against its own library (label-studio-sdk): the labeling config,
the tasks and their pre-annotations as it validates them, and its JSON, JSON-MIN and CSV exports (the
last two made from the first by its own converter) read back as label.py's rows."""
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtlc.errors import UserError
from mtlc.use.label_studio import (FROM_NAME, TO_NAME, is_export, labeling_config, local_files_url, local_storage,
                               read_export, task, write_tasks)

sdk = pytest.importorskip("label_studio_sdk")
from label_studio_sdk.converter import Converter  # noqa: E402
from label_studio_sdk.label_interface import LabelInterface  # noqa: E402
from label_studio_sdk.label_interface.objects import AnnotationValue  # noqa: E402

CLASSES = ["cat", "dog", 'say "cheese" & <smile>', "chat-é"]


def prediction(path, label, confidence=0.875, digest="ab" * 32, like_no_class=False):
    return SimpleNamespace(path=str(path), label=label, confidence=confidence, digest=digest, like_no_class=like_no_class)


@pytest.fixture
def images(tmp_path):
    paths = []
    for i, name in enumerate(["a/u0.png", "a/b/u1 space.png", "u2#.png", "u3.png", "u4.png"]):
        path = tmp_path / "mydata" / "unlabeled" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        paths.append(path)
    return paths


def test_labeling_config_is_one_choice_among_the_classes():
    interface = LabelInterface(labeling_config(CLASSES))
    control = interface.get_control(FROM_NAME)
    assert control.labels == CLASSES  # names with quotes, & and < survive the XML
    assert [o.name for o in interface.objects] == [TO_NAME]


def test_tasks_are_what_label_studio_validates(images, tmp_path):
    interface = LabelInterface(labeling_config(CLASSES))
    root, storage = local_storage(images)
    assert (root, storage) == (tmp_path / "mydata", tmp_path / "mydata" / "unlabeled")
    assert local_storage(images, tmp_path) == (tmp_path, tmp_path / "mydata")
    with pytest.raises(UserError, match="must lie in a folder under it"):
        local_storage(images, tmp_path / "mydata" / "unlabeled")
    tasks = [task(prediction(p, CLASSES[i % 4]), root, "mtlc lc.pt") for i, p in enumerate(images)]
    for t in tasks:  # the SDK's validate_task fails on any task with predictions (it calls
        # validate_prediction without one, label-studio-sdk 2.1.2): the data and the prediction apart
        assert interface.validate_task({"data": t["data"]})
        assert interface.validate_prediction(t["predictions"][0], return_errors=True) == []
    assert tasks[1]["data"][TO_NAME] == "/data/local-files/?d=unlabeled/a/b/u1%20space.png"
    assert tasks[2]["data"][TO_NAME] == "/data/local-files/?d=unlabeled/u2%23.png"  # '#' would end the URL
    assert tasks[0]["predictions"][0]["score"] == 0.875 and tasks[0]["data"]["path"] == str(images[0])
    unreadable = task(prediction(images[0], None, None, None), root, "m")
    assert "predictions" not in unreadable and interface.validate_task(unreadable)
    stray = task(prediction(images[0], CLASSES[0], like_no_class=True), root, "m")  # a blank page, say
    assert "predictions" not in stray and stray["data"]["like_no_class"] is True and interface.validate_task(stray)


def label_studio_export(tasks, labels=("dog", CLASSES[2], "cat")):
    """The JSON export Label Studio makes of a project: the tasks with ids and their annotations, as
    its AnnotationValue model has them: task 1 labeled labels[0], task 2 labeled twice (labels[2],
    then labels[1]: the later one counts), task 3 cancelled, task 4 never annotated, task 5 labeled as
    the prediction said."""
    def annotation(label, created, cancelled=False):
        value = AnnotationValue(completed_by=1, was_cancelled=cancelled, result=[] if cancelled else [
            {"id": "r1", "from_name": FROM_NAME, "to_name": TO_NAME, "type": "choices",
             "value": {"choices": [label]}}]).model_dump()
        return dict(value, id=hash(created) % 1000, created_at=created, updated_at=created)
    annotations = [[annotation(labels[0], "2026-11-28T10:00:00Z")],
                   [annotation(labels[2], "2026-11-28T10:01:00Z"), annotation(labels[1], "2026-11-28T10:05:00Z")],
                   [annotation("cat", "2026-11-28T10:02:00Z", cancelled=True)],
                   [],
                   [annotation(tasks[4]["data"]["prediction"], "2026-11-28T10:03:00Z")]]
    return [dict(t, id=i, annotations=a, project=1) for i, (t, a) in enumerate(zip(tasks, annotations), 1)]


@pytest.mark.parametrize("kind", ["JSON", "JSON-MIN", "CSV"])
def test_exports_read_back_as_labels(images, tmp_path, kind):
    root, _ = local_storage(images)
    tasks = [task(prediction(p, CLASSES[i % 4]), root, "m") for i, p in enumerate(images)]
    export = tmp_path / "export.json"
    export.write_text(json.dumps(label_studio_export(tasks)))
    converter = Converter(config=labeling_config(CLASSES), project_dir=str(tmp_path), download_resources=False)
    if kind == "JSON-MIN":
        converter.convert_to_json_min(str(export), str(tmp_path / "min"), is_dir=False)
        export = tmp_path / "min" / "result.json"
    elif kind == "CSV":
        converter.convert_to_csv(str(export), str(tmp_path / "csv"), is_dir=False, sep=",")  # what Label Studio passes
        export = tmp_path / "csv" / "result.csv"
    text = export.read_text()
    assert is_export(export, text)
    labels = read_export(export, io.StringIO(text, newline=""))
    digest = "ab" * 32
    assert sorted(labels.rows) == sorted([(str(images[0]), "dog", digest), (str(images[1]), CLASSES[2], digest),
                                          (str(images[4]), CLASSES[0], digest)])
    assert labels.no_annotation == 1
    # Label Studio's JSON-MIN and CSV leave a task whose annotations were all cancelled out
    assert labels.cancelled == (1 if kind == "JSON" else 0)


def test_written_tasks_are_one_json_list(images, tmp_path):
    root, _ = local_storage(images)
    path = tmp_path / "tasks.json"
    with open(path, "w", encoding="utf-8") as f:
        assert write_tasks(f, (prediction(p, "cat") for p in images), root, "m") == 5
    loaded = json.loads(path.read_text(encoding="utf-8"))
    assert [t["data"]["path"] for t in loaded] == [str(p) for p in images]
    with open(tmp_path / "none.json", "w", encoding="utf-8") as f:
        assert write_tasks(f, iter(()), root, "m") == 0
    assert json.loads((tmp_path / "none.json").read_text()) == []


def annotated(*annotations, path="u.png"):
    return json.dumps([{"id": 7, "data": {"path": path}, "annotations": list(annotations)}])


def result(*labels, control="label"):
    return [{"from_name": control, "to_name": "image", "type": "choices", "value": {"choices": [c]}} for c in labels]


@pytest.mark.parametrize("export, message", [
    ("{not json", "is not JSON"),
    ('"a string"', "a list of tasks"),
    ('[{"data": {"image": "x"}, "annotations": []}]', "no 'path'"),
    ('[{"data": {"path": "u.png"}, "annotations": [{"result": [{"from_name": "label", "value": {"choices": '
     '["cat", "dog"]}}]}]}]', "2 classes chosen"),
    ('[{"data": {"path": "u.png"}, "annotations": 5}]', "annotations are not a list"),
    ('[{"data": {"path": "u.png"}, "annotations": [5]}]', "an annotation is not a JSON object"),
    ('[{"data": {"path": "u.png"}, "annotations": [{"result": 5}]}]', "results are not a list"),
    ('[{"data": {"path": "u.png", "n": ' + "9" * 5000 + '}}]', "not a Label Studio export"),
    ("[" * 100000, "not a Label Studio export"),
    ('[{"path": "u.png", "label": "cat", "id": [1]}]', "task id is not a number"),
    ('[{"path": "u.png", "label": "cat", "id": 1}, {"path": "v.png", "label": "cat", "id": 1}]', "names two images"),
    ('[{"data": {"path": "u.png", "blake2b": 5}, "annotations": []}]', "blake2b is not a hash"),
    (annotated({"result": result("cat", "dog")}), "one annotation gives 2 classes"),
    (annotated({"result": result("cat", control="choice")}), "chose with choice, not the control 'label'"),
    (annotated({"result": result("cat"), "created_at": "2026-11-28T10:00:00Z"},
               {"result": result("dog"), "created_at": "2026-11-28T10:00:00Z"}), "same time give different classes"),
    ('[{"path": "u.png", "label": "cat"}, {"path": "u.png", "label": "dog"}]', "same time give different classes"),
])
def test_bad_exports_are_one_line(tmp_path, export, message):
    with pytest.raises(UserError, match=message):
        read_export(tmp_path / "export.json", io.StringIO(export))


def test_a_csv_export_with_a_field_too_large_is_one_line(tmp_path):
    text = "annotation_id,annotator,path,label\n1,1,u.png," + "x" * 200_000 + "\n"
    with pytest.raises(UserError, match="cannot read .* as CSV"):
        read_export(tmp_path / "export.csv", io.StringIO(text, newline=""))


def test_what_label_studio_writes_as_text_reads_as_it_means():
    """A was_cancelled turned to text by a converter ("false") is not a cancel; a hash is compared in
    lower case, as label.py compares a labels CSV's."""
    labels = read_export("e.json", io.StringIO(annotated({"result": result("cat"), "was_cancelled": "false"},
                                              path="u.png").replace('"u.png"}', '"u.png", "blake2b": "AB12"}')))
    assert labels.rows == [("u.png", "cat", "ab12")] and labels.cancelled == 0
    assert read_export("e.json", io.StringIO(annotated({"result": [], "was_cancelled": "true"}))).cancelled == 1


def test_local_files_url_is_relative_to_the_document_root(tmp_path):
    (tmp_path / "r" / "x").mkdir(parents=True)
    assert local_files_url(tmp_path / "r" / "x" / "é.png", tmp_path / "r") == "/data/local-files/?d=x/%C3%A9.png"


@pytest.fixture
def folder_copy(trained, tmp_path):
    """The trained fixture's own-images folder, copied (label.py moves its files)."""
    import shutil
    folder, checkpoint = trained
    shutil.copytree(folder, tmp_path / "d", ignore=shutil.ignore_patterns("mtlc-cache", "label-log.csv"))
    return tmp_path / "d", checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["JSON", "JSON-MIN", "CSV"])
def test_round_trip_through_label_studio(folder_copy, tmp_path, kind):
    """evaluate.py --label-studio writes the tasks and the config; Label Studio's annotations (as its
    model stores them) exported in each format go back into the folder with label.py, and --undo puts
    them back; an image replaced since its task was written is refused, nothing moved."""
    import shutil

    from conftest import run, snapshot
    folder, checkpoint = folder_copy
    tasks_path = tmp_path / "tasks.json"
    res = run("evaluate.py", "--ckpt", checkpoint, "--predict", folder / "unlabeled", "--label-studio", tasks_path,
              "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert f"LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT={folder}" in res.stderr and res.stdout == ""  # no CSV asked for
    config = (tmp_path / "tasks.label-config.xml").read_text()
    interface = LabelInterface(config)
    tasks = json.loads(tasks_path.read_text())
    assert len(tasks) == len(list((folder / "unlabeled").rglob("*.png")))
    for t in tasks:
        assert interface.validate_task({"data": t["data"]}) and interface.validate_prediction(t["predictions"][0])
        assert t["data"][TO_NAME].startswith("/data/local-files/?d=unlabeled/")
        assert (folder / t["data"][TO_NAME].split("?d=")[1]).is_file()  # served from the document root
    export = tmp_path / "export.json"
    export.write_text(json.dumps(label_studio_export(tasks, labels=("dog", "owl", "cat"))))
    if kind != "JSON":
        converter = Converter(config=config, project_dir=str(tmp_path), download_resources=False)
        if kind == "JSON-MIN":
            converter.convert_to_json_min(str(export), str(tmp_path / "min"), is_dir=False)
            export = tmp_path / "min" / "result.json"
        else:
            converter.convert_to_csv(str(export), str(tmp_path / "csv"), is_dir=False, sep=",")
            export = tmp_path / "csv" / "result.csv"
    before = snapshot(folder)
    first = Path(tasks[0]["data"]["path"])
    original = first.read_bytes()
    shutil.copy(Path(tasks[3]["data"]["path"]), first)  # another picture under the first task's name
    res = run("label.py", "--data-dir", folder, "--apply", export)
    assert res.returncode == 2 and "is not the one this row was written for" in res.stderr, res.stdout + res.stderr
    first.write_bytes(original)
    assert snapshot(folder) == before  # nothing moved
    res = run("label.py", "--data-dir", folder, "--apply", export)
    assert res.returncode == 0, res.stderr
    assert f"a Label Studio {kind} export, 3 tasks labeled; 1 without annotation" in res.stdout
    assert ("and 1 cancelled move nothing" in res.stdout) == (kind == "JSON")
    assert "moved 3 images" in res.stdout
    for t, label in ((tasks[0], "dog"), (tasks[1], "owl"), (tasks[4], tasks[4]["data"]["prediction"])):
        assert (folder / "labeled" / label / Path(t["data"]["path"]).name).is_file()
        assert not Path(t["data"]["path"]).exists()
    assert all(Path(t["data"]["path"]).exists() for t in tasks[2:4])
    res = run("label.py", "--data-dir", folder, "--undo")
    assert res.returncode == 0, res.stderr
    assert snapshot(folder) == before


def test_names_that_are_not_utf8_and_links_in_the_folder(tmp_path):
    """A file name that is not UTF-8 gets a URL of its bytes and comes back from an export as the same
    name; a link in the folder does not widen what Label Studio is told to serve."""
    import os
    folder = tmp_path / "mydata" / "unlabeled"
    folder.mkdir(parents=True)
    name = os.fsdecode(b"bad\xffname.png")
    (folder / name).write_bytes(b"x")
    (tmp_path / "elsewhere").mkdir()
    (folder / "link.png").symlink_to(tmp_path / "elsewhere" / "x.png")
    paths = [str(folder / name), str(folder / "link.png")]
    root, storage = local_storage(paths)
    assert (root, storage) == (tmp_path / "mydata", folder)
    t = task(prediction(paths[0], "cat"), root, "m")
    assert t["data"][TO_NAME] == "/data/local-files/?d=unlabeled/bad%FFname.png"
    import io
    text = io.StringIO()
    write_tasks(text, [prediction(paths[0], "cat")], root, "m")
    back = json.loads(text.getvalue())[0]
    back["annotations"] = [{"result": result("dog")}]
    assert read_export("e.json", io.StringIO(json.dumps([back]))).rows == [(paths[0], "dog", "ab" * 32)]
    with pytest.raises(UserError, match="no common folder"):
        local_storage(["/a.png", "/b/c.png"])


def test_setup_lines_quote_paths_for_the_shell(tmp_path):
    import shlex
    from mtlc.use.label_studio import setup_lines
    root = tmp_path / "My Photos$(touch PWNED)"
    lines = setup_lines(root, root / "unlabeled", "tasks.json", root)
    assert f"LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT={shlex.quote(str(root))} label-studio start" in lines[1]
    assert shlex.split(lines[1].split(": ", 1)[1])[1] == f"LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT={root}"
    assert f"--data-dir {shlex.quote(str(root))} --apply" in lines[4]


def test_the_config_beside_the_tasks_replaces_only_a_labeling_config(tmp_path):
    from mtlc.use.label_studio import write_project
    (tmp_path / "t.label-config.xml").write_bytes(b"PK\x03\x04 someone's file")
    with pytest.raises(UserError, match="is no labeling config"):
        write_project(tmp_path / "t.json", [], ["cat"], tmp_path, "m")
    assert not (tmp_path / "t.json").exists()
    (tmp_path / "t.label-config.xml").write_text(labeling_config(["dog"]))
    assert write_project(tmp_path / "t.json", [], ["cat"], tmp_path, "m") == 0
    assert '"cat"' in (tmp_path / "t.label-config.xml").read_text()


def test_reading_exports_keeps_label_py_free_of_torch():
    """label.py starts without importing torch (a second, not ten); reading Label Studio's exports
    keeps it so."""
    import subprocess
    import sys
    code = "import sys, label; assert 'torch' not in sys.modules, 'torch imported'"
    from conftest import ROOT
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_json_export_is_read_a_task_at_a_time():
    """The export's tasks come one at a time from a stream read a block at a time (an export of
    200,000 tasks is never in memory whole), each exactly what json.loads gives (a lone surrogate kept,
    numbers, nesting); bad JSON anywhere is one line for label.py."""
    from mtlc.disk.json_arrays import json_array_items

    class Counted(io.StringIO):
        taken = 0

        def read(self, n=-1):
            chunk = super().read(n)
            self.taken += len(chunk)
            return chunk
    tasks = [{"id": i, "data": {"path": f"unlabeled/\ud800{i}.png", "x": [1.5, -2e-3, None, True, {"y": "é"}]}}
             for i in range(3000)]
    text = json.dumps(tasks, indent=1)
    stream = Counted(text)
    items = json_array_items(stream, block=4096)
    assert next(items) == tasks[0] and stream.taken < len(text) / 10
    assert [tasks[0], *items] == json.loads(text)
    assert list(json_array_items(io.StringIO(" [ ] "))) == []
    for bad in ("[{}, {]", "[{} {}]", "[1, 2", "{", "[" + "[" * 100000 + "]" * 100000 + "]"):
        with pytest.raises((ValueError, RecursionError)):
            list(json_array_items(io.StringIO(bad), block=64))
        with pytest.raises(UserError):  # one line, whichever check meets it first
            read_export("e.json", io.StringIO(bad))
