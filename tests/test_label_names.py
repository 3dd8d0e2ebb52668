"""label.py and the names a folder holds: every name round-trips through the labels file and the log
whatever it holds (a carriage return, a backslash) and whatever the console's encoding; two images
never get one name, even on a file system that folds case; planning stays linear in the rows; the
papercuts (hidden files, a missing labeled/, a test/ relabel's message, re-applying after a later
relabel); and the audit's copies, leaks and strays set aside, logged and undone."""
import csv
import os
import time

import pytest

from conftest import run, snapshot, write_labels
from fakedata import write_own_folder
from mtlc.label import log as label_log
from mtlc.data.files import file_digest


@pytest.fixture
def folder(tmp_path):
    write_own_folder(tmp_path / "d", n_labeled=2, n_unlabeled=9, n_test=2)
    return tmp_path / "d"


def test_a_name_with_a_carriage_return_round_trips(folder, tmp_path):
    """Logged quoted (CRLF rows): the undo and every later apply read the log as written."""
    odd = folder / "unlabeled" / "two\rlines\n.png"
    os.rename(folder / "unlabeled" / "u0000.png", odd)
    before = snapshot(folder)
    labels = write_labels(tmp_path / "l.csv", [(odd, "cat")])
    assert run("label.py", "--data-dir", folder, "--apply", labels).returncode == 0
    assert (folder / "labeled" / "cat" / odd.name).is_file()
    again = run("label.py", "--data-dir", folder, "--apply", write_labels(tmp_path / "m.csv", [("unlabeled/u0003.png", "dog")]))
    assert again.returncode == 0, again.stderr
    assert run("label.py", "--data-dir", folder, "--undo").returncode == 0
    res = run("label.py", "--data-dir", folder, "--undo")
    assert res.returncode == 0, res.stderr
    assert snapshot(folder) == before


def test_a_backslash_is_a_character_of_a_name(folder, tmp_path):
    os.rename(folder / "unlabeled" / "u0000.png", folder / "unlabeled" / "a\\b.png")
    res = run("label.py", "--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [("unlabeled/a\\b.png", "cat")]))
    assert res.returncode == 0 and (folder / "labeled" / "cat" / "a\\b.png").is_file(), res.stderr
    assert run("label.py", "--data-dir", folder, "--undo").returncode == 0


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_names_survive_any_console_encoding(folder, tmp_path, encoding):
    """label.py prints its moves and reads back the names it is given, whatever PYTHONIOENCODING."""
    os.rename(folder / "unlabeled" / "u0000.png", folder / "unlabeled" / "chat-é.png")
    labels = write_labels(tmp_path / "l.csv", [("unlabeled/chat-é.png", "cat")])
    env = dict(PYTHONIOENCODING=encoding)
    dry = run("label.py", "--data-dir", folder, "--apply", labels, "--dry-run", env=env)
    assert dry.returncode == 0 and "Traceback" not in dry.stderr and "would move 1" in dry.stdout, dry.stderr
    assert run("label.py", "--data-dir", folder, "--apply", labels, env=env).returncode == 0
    assert (folder / "labeled" / "cat" / "chat-é.png").is_file()


def test_names_a_case_insensitive_disk_would_fold_get_their_own(folder, tmp_path):
    """IMG.JPG and img.jpg into one class, and a name that differs from one already there only in
    case or Unicode form: each gets a name of its own on any file system."""
    for name, source in (("IMG.png", "u0000.png"), ("img.png", "u0003.png"), ("Caf\u00e9.png", "u0006.png")):
        os.rename(folder / "unlabeled" / source, folder / "unlabeled" / name)
    (folder / "labeled" / "cat" / "Cafe\u0301.png").write_bytes((folder / "labeled" / "cat" / "0.png").read_bytes())
    rows = [("unlabeled/IMG.png", "cat"), ("unlabeled/img.png", "cat"), ("unlabeled/Caf\u00e9.png", "cat")]
    res = run("label.py", "--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", rows))
    assert res.returncode == 0, res.stderr
    names = sorted(os.listdir(folder / "labeled" / "cat"))
    assert names == sorted(["0.png", "1.png", "Cafe\u0301.png", "IMG.png", "img-1.png", "Caf\u00e9-1.png"])


def test_a_class_differing_only_in_case_is_refused(folder, tmp_path):
    res = run("label.py", "--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "Cat")]),
              "--new-classes")
    assert res.returncode == 2 and "differs from the class folder 'cat' only in case" in res.stderr


def test_planning_is_linear_in_rows_sharing_a_name(tmp_path):
    """3,000 images named alike in 3,000 folders, all into one class: planned and moved in seconds
    (quadratic planning took 24-38 s), each with its own suffix."""
    write_own_folder(tmp_path / "d", n_labeled=1, n_unlabeled=0, n_test=0)
    data = (tmp_path / "d" / "labeled" / "cat" / "0.png").read_bytes()
    rows = []
    for i in range(3000):
        (tmp_path / "d" / "unlabeled" / f"f{i}").mkdir(parents=True)
        (tmp_path / "d" / "unlabeled" / f"f{i}" / "photo.png").write_bytes(data)
        rows.append((f"unlabeled/f{i}/photo.png", "cat"))
    start = time.perf_counter()
    res = run("label.py", "--data-dir", tmp_path / "d", "--apply", write_labels(tmp_path / "l.csv", rows))
    assert res.returncode == 0, res.stderr
    assert time.perf_counter() - start < 15
    assert len(os.listdir(tmp_path / "d" / "labeled" / "cat")) == 3001 and (tmp_path / "d" / "labeled" / "cat" / "photo-2999.png").is_file()


@pytest.mark.parametrize("name, message", [
    (".hidden.png", "hidden file"), (".git/x.png", "hidden file"), ("__MACOSX/x.png", "hidden file"),
    ("notes.txt", "not an image file name"),
])
def test_files_training_would_never_see_are_refused(folder, tmp_path, name, message):
    (folder / "unlabeled" / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / "unlabeled" / name).write_bytes((folder / "unlabeled" / "u0000.png").read_bytes())
    before = snapshot(folder)
    res = run("label.py", "--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [(f"unlabeled/{name}", "cat")]))
    assert res.returncode == 2 and message in res.stderr and snapshot(folder) == before, res.stderr


def test_new_classes_without_labeled_makes_it_and_undo_removes_it(tmp_path):
    write_own_folder(tmp_path / "d", n_labeled=0, n_unlabeled=4, n_test=0)
    folder = tmp_path / "d"
    assert not (folder / "labeled").exists()
    before = snapshot(folder)
    res = run("label.py", "--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "cat")]),
              "--new-classes")
    assert res.returncode == 0 and (folder / "labeled" / "cat" / "u0000.png").is_file(), res.stderr
    assert run("label.py", "--data-dir", folder, "--undo").returncode == 0
    assert snapshot(folder) == before and not (folder / "labeled").exists()


def test_a_test_relabel_says_where_it_went(folder, tmp_path):
    res = run("label.py", "--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [
        ("test/owl/0.png", "cat"), ("unlabeled/u0000.png", "dog")]))
    assert res.returncode == 0 and "moved 2 images into other classes of test/ (cat 1), into labeled/ (dog 1)" in res.stdout


def test_applying_a_csv_again_after_a_later_relabel_skips_its_rows(folder, tmp_path):
    """u0000.png labeled cat, then relabeled dog from the audit: the first CSV again moves nothing
    and fails nothing; a row asking for a third class says where the image is now."""
    first = write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "cat"), ("unlabeled/u0003.png", "owl")])
    assert run("label.py", "--data-dir", folder, "--apply", first).returncode == 0
    assert run("label.py", "--data-dir", folder, "--apply", write_labels(tmp_path / "fix.csv", [
        ("labeled/cat/u0000.png", "dog")])).returncode == 0
    again = run("label.py", "--data-dir", folder, "--apply", first)
    assert again.returncode == 0 and "all 2 rows" in again.stdout, again.stderr
    other = run("label.py", "--data-dir", folder, "--apply", write_labels(tmp_path / "o.csv", [("unlabeled/u0000.png", "owl")]))
    assert other.returncode == 2 and "it is now labeled/dog/u0000.png" in other.stderr


def write_audit(path, rows):
    """An audit CSV as evaluate.py --audit writes it (kind,path,score,suggestion,given,detail,blake2b)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\r\n")
        writer.writerow(("kind", "path", "score", "suggestion", "given", "detail", "blake2b"))
        writer.writerows(rows)
    return path


def test_the_audits_copies_leaks_and_strays_are_set_aside_and_put_back(folder, tmp_path):
    """--set-aside takes the audit CSV's findings of the kinds named: each image moves to
    set-aside/<its path>, where training never looks, logged; a doubtful label is left alone; --undo
    puts them back and removes the folders made."""
    digest = {p: file_digest((folder / p).read_bytes()) for p in ("test/dog/1.png", "unlabeled/a/u0001.png", "unlabeled/u0003.png")}
    audit = write_audit(tmp_path / "audit.csv", [
        ("label", str(folder / "labeled/cat/0.png"), "0.9", "dog", "cat", "", ""),
        ("duplicate", str(folder / "unlabeled/a/u0001.png"), "1.0", str(folder / "unlabeled/u0000.png"), "", "exact",
         digest["unlabeled/a/u0001.png"]),
        ("leak", str(folder / "test/dog/1.png"), "1.0", str(folder / "unlabeled/u0006.png"), "", "exact", digest["test/dog/1.png"]),
        ("outlier", str(folder / "unlabeled/u0003.png"), "2.0", "", "", "", digest["unlabeled/u0003.png"])])
    before = snapshot(folder)
    res = run("label.py", "--data-dir", folder, "--apply", audit, "--set-aside", "duplicate,leak")
    assert res.returncode == 0 and "moved 2 images into set-aside/ (2; 1 of them from test/, whose error then counts 1 " \
                                   "image fewer)" in res.stdout, res.stderr
    assert (folder / "set-aside" / "unlabeled" / "a" / "u0001.png").is_file()
    assert (folder / "set-aside" / "test" / "dog" / "1.png").is_file() and (folder / "labeled" / "cat" / "0.png").is_file()
    log = list(csv.DictReader(open(folder / label_log.LOG_NAME, newline="")))
    assert [r["action"] for r in log if r["action"] != "mkdir"] == ["aside", "aside"]
    assert run("label.py", "--data-dir", folder, "--undo").returncode == 0
    assert snapshot(folder) == before and not (folder / "set-aside").exists()
    bad = run("label.py", "--data-dir", folder, "--apply", audit, "--set-aside", "label")
    assert bad.returncode == 2 and "duplicate,leak,outlier" in bad.stderr


def test_an_image_found_as_two_kinds_is_one_image_set_aside(folder, tmp_path):
    """The audit lists an image once per kind it is found as (a duplicate and an outlier): the README's
    --set-aside duplicate,leak,outlier moves it once, where it refused the audit's own CSV as 'listed twice'."""
    path = folder / "unlabeled/a/u0001.png"
    digest = file_digest(path.read_bytes())
    audit = write_audit(tmp_path / "audit.csv", [
        ("duplicate", str(path), "1.0", str(folder / "unlabeled/u0000.png"), "", "exact", digest),
        ("outlier", str(path), "2.0", "", "", "", digest)])
    res = run("label.py", "--data-dir", folder, "--apply", audit, "--set-aside", "duplicate,leak,outlier")
    assert res.returncode == 0 and "moved 1 image into set-aside/ (1)" in res.stdout, res.stdout + res.stderr
    assert (folder / "set-aside" / "unlabeled" / "a" / "u0001.png").is_file()
    other = file_digest((folder / "unlabeled/u0003.png").read_bytes())
    twice = write_audit(tmp_path / "twice.csv", [  # one path written for two different files: refused
        ("duplicate", str(folder / "unlabeled/u0003.png"), "1.0", "", "", "", other),
        ("outlier", str(folder / "unlabeled/u0003.png"), "2.0", "", "", "", "0" * len(other))])
    res = run("label.py", "--data-dir", folder, "--apply", twice, "--set-aside", "duplicate,outlier")
    assert res.returncode == 2 and "listed twice" in res.stderr, res.stdout + res.stderr
