"""The places label.py moves files into and out of, and the names of classes, trusted no more than the
files: a folder it moves into that is a link (even to inside the folder), a folder named like an
image, a label that differs from a class folder only in white space or case (in every reader), a
path no file name can hold, a full disk before the log's first row. Each: exit 2 or one line,
nothing moved."""
import json

import pytest

import label
from conftest import invoke, run, snapshot, write_labels
from fakedata import write_own_folder
from mtlc.data.files import file_digest


@pytest.fixture
def folder(tmp_path):
    write_own_folder(tmp_path / "d", classes=("red", "blue"), n_labeled=2, n_unlabeled=6, n_test=2)
    return tmp_path / "d"


def refused(folder, labels, *options, message):
    before = snapshot(folder)
    res = invoke(label, ["--data-dir", folder, "--apply", labels, *options])
    assert res.exit_code == 2 and message in res.output, res.output
    assert snapshot(folder) == before
    return res


@pytest.mark.parametrize("place, rows, options", [
    ("set-aside", [("kind", "path", "score", "suggestion"), ("outlier", "unlabeled/u0000.png", "0.9", "")],
     ["--set-aside", "outlier"]),
    ("labeled/blue", [("path", "label"), ("unlabeled/u0000.png", "blue")], []),
    ("test/blue", [("path", "label"), ("test/red/0.png", "blue")], []),
])
def test_a_folder_moved_into_that_is_a_link_inside_the_folder_is_refused(folder, tmp_path, place, rows, options):
    """set-aside/ shipped as a link to labeled/red would make an image set aside a training image of
    class red; a class folder or test/<class> that is a link to another class folder likewise: refused
    before anything moves, whatever it points to."""
    target = folder / place
    if target.exists():
        for f in target.iterdir():
            f.unlink()
        target.rmdir()
    target.symlink_to(folder / "labeled" / "red", target_is_directory=True)
    labels = write_labels(tmp_path / "l.csv", rows[1:], header=rows[0])
    refused(folder, labels, *options, message=f"{place}/ is a link")


def test_a_folder_moved_from_through_a_link_inside_the_folder_is_refused(folder, tmp_path):
    (folder / "unlabeled" / "more").symlink_to(folder / "labeled" / "red", target_is_directory=True)
    refused(folder, write_labels(tmp_path / "l.csv", [("unlabeled/more/0.png", "blue")]),
            message="unlabeled/more/ is a link")


def test_only_regular_files_move_and_undo_puts_back_exactly_them(folder, tmp_path):
    """A folder named like an image (a row with a trailing slash and no hash) or a link is no source;
    the image files of the batch move and undo puts back exactly those."""
    (folder / "unlabeled" / "batch.png").mkdir()
    (folder / "unlabeled" / "batch.png" / "inner.png").write_bytes((folder / "unlabeled" / "u0000.png").read_bytes())
    (folder / "unlabeled" / "alias.png").symlink_to(folder / "unlabeled" / "u0003.png")
    for path in ("unlabeled/batch.png/", "unlabeled/batch.png", "unlabeled/alias.png"):
        refused(folder, write_labels(tmp_path / "l.csv", [(path, "red")]), message="not a regular file")
    before = snapshot(folder)
    res = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "red")])])
    assert res.exit_code == 0, res.output
    assert invoke(label, ["--data-dir", folder, "--undo"]).exit_code == 0
    assert snapshot(folder) == before


@pytest.mark.parametrize("folders, label_given, message", [
    (("red ",), "red ", "differs from the class folder 'red' only in case, white space"),   # red and 'red ' both there
    (("red ",), "red", "differs from the class folder 'red ' only in case, white space"),
    ((), "Red", "differs from the class folder 'red' only in case"),
    ((), " blue", "differs from the class folder 'blue' only in case, white space"),
    ((), "bl\u200bue", "'bl\\u200bue' differs from the class folder 'blue'"),   # a zero-width space
    ((), "\uff42lue", "'\\uff42lue' differs from the class folder 'blue'"),       # a fullwidth b
    (("caf\u00e9",), "cafe\u0301", "'cafe\\u0301' differs from the class folder 'caf\\xe9'"),  # decomposed
])
def test_a_label_differing_from_a_class_folder_only_in_white_space_or_case_is_refused(
        folder, tmp_path, folders, label_given, message):
    """Both names given; with --new-classes too (it never makes a second 'cat')."""
    for name in folders:
        (folder / "labeled" / name).mkdir()
    for options in ([], ["--new-classes"]):
        refused(folder, write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", label_given)]), *options,
                message=message)


def test_a_label_names_exactly_its_class_folder(folder, tmp_path):
    """With only 'cat ' (a trailing space) as a class, the label 'cat ' goes there, as written."""
    (folder / "labeled" / "blue").rename(folder / "labeled" / "cat ")
    res = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "cat ")])])
    assert res.exit_code == 0, res.output
    assert (folder / "labeled" / "cat " / "u0000.png").exists()


def label_studio_export(folder, path, choice):
    digest = file_digest((folder / path).read_bytes()) if (folder / path).exists() else None
    return [{"id": 1, "data": {"image": "/data/local-files/?d=x.png", "path": path, "blake2b": digest},
             "annotations": [{"id": 1, "created_at": "2026-11-28T10:00:00Z", "was_cancelled": False,
                              "result": [{"from_name": "label", "to_name": "image", "type": "choices",
                                          "value": {"choices": [choice]}}]}]}]


@pytest.mark.parametrize("choice", ["red ", " Red"])
def test_label_studio_exports_read_labels_as_the_csv_reader_does(folder, tmp_path, choice):
    """The export's label differs from a class folder only in white space or case: refused as a CSV row is."""
    export = tmp_path / "export.json"
    export.write_text(json.dumps(label_studio_export(folder, "unlabeled/u0000.png", choice)))
    refused(folder, export, message="differs from the class folder 'red' only in case")


def test_control_characters_of_a_path_are_escaped_in_messages(folder, tmp_path):
    """A path holding an escape sequence (a stranger's export) is shown escaped, never sent to the terminal."""
    export = tmp_path / "export.json"
    export.write_text(json.dumps(label_studio_export(folder, "unlabeled/\x1b]0;pwned\x07.png", "red")))
    res = run("label.py", "--data-dir", folder, "--apply", export)
    assert res.returncode == 2 and "\x1b" not in res.stderr and "\\x1b]0;pwned\\x07.png" in res.stderr, res.stderr


def test_a_path_no_file_name_can_hold_is_one_line(folder, tmp_path):
    """A Label Studio export whose path holds a lone surrogate (valid JSON): refused, no traceback."""
    export = tmp_path / "export.json"
    export.write_text(json.dumps(label_studio_export(folder, "unlabeled/\ud800/u000.png", "red")))
    res = run("label.py", "--data-dir", folder, "--apply", export)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "lone surrogate" in res.stderr, res.stderr


def test_a_full_disk_before_the_logs_first_row_leaves_no_log(folder, tmp_path, monkeypatch):
    """label.py --apply where the disk is full and there is no log yet: one line, nothing moved, no
    empty label-log.csv left; and where not even a temporary file can be written (a file-size limit of
    0), one line too."""
    from mtlc.label import log as label_log
    labels = write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "red")])
    before = snapshot(folder)
    res = run("label.py", "--data-dir", folder, "--apply", labels, limit_kb=0)
    assert res.returncode == 1 and "Traceback" not in res.stderr and "nothing was moved" in res.stderr, res.stderr
    assert snapshot(folder) == before and not (folder / "label-log.csv").exists()

    def full(self, rows):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(label_log.Log, "put", full)
    res = invoke(label, ["--data-dir", folder, "--apply", labels])
    assert res.exit_code == 1 and "cannot write" in res.output and "No space left on device" in res.output, res.output
    assert snapshot(folder) == before and not (folder / "label-log.csv").exists()
