"""label.py: labels back into the folder. Every refusal moves nothing; moves never overwrite; a
rerun is idempotent; --undo restores the folder bitwise; a run cut short leaves each file whole in
one place."""
import csv
import errno
import os
import shutil
from pathlib import Path

import pytest

import label
from mtlc.label import log as label_log
from mtlc.label import plan as label_plan
from mtlc.label import apply as labeling
from mtlc.label.plan import Move
from mtlc.label.leaks import copies_of_test_images
from mtlc.disk import spill
from conftest import invoke, run, snapshot, write_labels
from fakedata import write_own_folder



@pytest.fixture
def folder(tmp_path):
    write_own_folder(tmp_path / "d", n_labeled=2, n_unlabeled=9, n_test=0)
    return tmp_path / "d"


def test_apply_moves_each_listed_image_into_its_class(folder, tmp_path):
    before = snapshot(folder)[0]
    labels = write_labels(tmp_path / "l.csv", [(folder / "unlabeled" / "u0000.png", "cat"),
                                               ("unlabeled/a/u0001.png", "dog")])  # relative to the folder
    result = invoke(label, ["--data-dir", folder, "--apply", labels])
    assert result.exit_code == 0, result.output
    assert "moved 2 images into labeled/ (cat 1, dog 1)" in result.output
    after = snapshot(folder)[0]
    assert after["labeled/cat/u0000.png"] == before["unlabeled/u0000.png"]
    assert after["labeled/dog/u0001.png"] == before["unlabeled/a/u0001.png"]
    assert "unlabeled/u0000.png" not in after and len(after) == len(before)
    log = list(csv.DictReader(open(folder / label_log.LOG_NAME)))
    assert [(r["action"], r["source"], r["target"]) for r in log] == [
        ("move", "unlabeled/u0000.png", "labeled/cat/u0000.png"), ("move", "unlabeled/a/u0001.png", "labeled/dog/u0001.png")]


@pytest.mark.parametrize("rows, message", [  # all with --new-classes but the first
    ([("unlabeled/u0000.png", "cat"), ("unlabeled/u0001.png", "zebra")], "unknown class 'zebra'"),
    ([("unlabeled/u0000.png", "cat"), ("unlabeled/nope.png", "dog")], "no such file"),
    ([("mtlc-cache/0.png", "dog")], "not a file under"),
    ([("../elsewhere.png", "dog")], "not a file under"),
    ([("unlabeled/u0000.png", "cat"), ("unlabeled/u0000.png", "cat")], "listed twice"),
    ([("unlabeled/u0000.png", "")], "the label is blank"),
    ([("unlabeled/u0000.png", ".hidden")], "cannot be a class folder's name"),
    ([("unlabeled/u0000.png", "a/b")], "cannot be a class folder's name"),
])
def test_every_refusal_exits_2_and_moves_nothing(folder, tmp_path, rows, message):
    before = snapshot(folder)
    (tmp_path / "elsewhere.png").write_bytes(b"x")
    flag = "--dry-run" if "unknown class" in message else "--new-classes"
    result = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", rows), flag])
    assert result.exit_code == 2 and message in result.output and "nothing was moved" in result.output
    assert snapshot(folder) == before and not (folder / label_log.LOG_NAME).exists()


def test_bad_input(folder, tmp_path):
    assert "must have the columns path,label" in invoke(label, [
        "--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [], ("file", "class"))]).output
    predictions = invoke(label, ["--data-dir", folder, "--apply", write_labels(
        tmp_path / "p.csv", [("unlabeled/u0000.png", "cat")], ("path", "prediction"))])
    assert predictions.exit_code == 2 and "these are evaluate.py's predictions; --accepted applies" in predictions.output
    findings = invoke(label, ["--data-dir", folder, "--apply", write_labels(
        tmp_path / "a.csv", [("label", "labeled/cat/0.png", "dog")], ("kind", "path", "suggestion"))])
    assert findings.exit_code == 2 and "these are evaluate.py --audit's findings; --set-aside KINDS" in findings.output
    assert invoke(label, ["--data-dir", folder]).exit_code == 2
    assert invoke(label, ["--data-dir", folder, "--apply", tmp_path / "missing.csv"]).exit_code == 2
    assert invoke(label, ["--data-dir", tmp_path / "nowhere", "--undo"]).exit_code == 2
    res = run("label.py", "--data-dir", folder, "--apply", tmp_path / "x.csv")
    assert res.returncode == 2 and "Traceback" not in res.stderr and "does not exist" in res.stderr


def test_new_classes_and_a_name_clash(folder, tmp_path):
    (folder / "labeled" / "cat" / "u0000.png").write_bytes(b"an earlier image of that name")
    rows = [("unlabeled/u0000.png", "cat"), ("unlabeled/a/u0001.png", "zebra")]
    assert invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", rows)]).exit_code == 2
    result = invoke(label, ["--data-dir", folder, "--apply", tmp_path / "l.csv", "--new-classes"])
    assert result.exit_code == 0, result.output
    assert (folder / "labeled" / "cat" / "u0000.png").read_bytes() == b"an earlier image of that name"
    assert (folder / "labeled" / "cat" / "u0000-1.png").is_file() and (folder / "labeled" / "zebra" / "u0001.png").is_file()


def test_a_rerun_is_idempotent_and_undo_restores_the_folder_bitwise(folder, tmp_path):
    before = snapshot(folder)
    rows = [("unlabeled/u0000.png", "cat"), ("unlabeled/a/u0001.png", "owl"), ("unlabeled/a/b/u0002.png", "kiwi")]
    labels = write_labels(tmp_path / "l.csv", rows)
    assert invoke(label, ["--data-dir", folder, "--apply", labels, "--new-classes"]).exit_code == 0
    moved = snapshot(folder)
    again = invoke(label, ["--data-dir", folder, "--apply", labels, "--new-classes"])
    assert again.exit_code == 0 and "nothing to move: all 3 rows" in again.output and snapshot(folder) == moved
    more = write_labels(tmp_path / "m.csv", rows + [("unlabeled/u0003.png", "dog")])
    partly = invoke(label, ["--data-dir", folder, "--apply", more])
    assert partly.exit_code == 0 and "moved 1 image " in partly.output and "3 applied before" in partly.output
    assert "put back the 1 images of batch 2" in invoke(label, ["--data-dir", folder, "--undo"]).output
    assert snapshot(folder) == moved
    assert "put back the 3 images of batch 1" in invoke(label, ["--data-dir", folder, "--undo"]).output
    assert snapshot(folder) == before  # bytes, names and folders (labeled/kiwi/ is gone)
    assert "nothing to undo" in invoke(label, ["--data-dir", folder, "--undo"]).output


def test_a_run_cut_short_leaves_each_file_in_one_place(folder, tmp_path, monkeypatch):
    before = snapshot(folder)[0]
    rows = [(f"unlabeled/u{i:04d}.png", "cat") for i in (0, 3, 6)]
    renames, real_rename = [], labeling.rename_no_replace

    class Killed(Exception):
        pass

    def rename_twice_then_die(src, dst):
        if len(renames) == 2:
            raise Killed  # after logging the third move, before making it
        renames.append(dst)
        real_rename(src, dst)
    monkeypatch.setattr(labeling, "rename_no_replace", rename_twice_then_die)
    labels = write_labels(tmp_path / "l.csv", rows)
    assert isinstance(invoke(label, ["--data-dir", folder, "--apply", labels]).exception, Killed)
    monkeypatch.undo()
    now = snapshot(folder)[0]
    for source, _ in rows:  # each file whole, in exactly one place
        name = Path(source).name
        places = [p for p in (source, f"labeled/cat/{name}") if p in now]
        assert len(places) == 1 and now[places[0]] == before[source]
    result = invoke(label, ["--data-dir", folder, "--apply", labels])  # the rerun finishes the batch
    assert result.exit_code == 0 and "moved 1 image " in result.output and "2 applied before" in result.output
    assert all(f"labeled/cat/{Path(s).name}" in snapshot(folder)[0] for s, _ in rows)


def test_paths_with_spaces_accents_commas_and_quotes(folder, tmp_path):
    odd = folder / "unlabeled" / "a" / 'my photo, été "1".png'
    (folder / "unlabeled" / "u0000.png").rename(odd)
    labels = write_labels(tmp_path / "l.csv", [(odd, "owl"), ('unlabeled/u0003.png', "cat")])
    assert '"' in labels.read_text()  # quoted as CSV quotes it
    result = invoke(label, ["--data-dir", folder, "--apply", labels])
    assert result.exit_code == 0, result.output
    assert (folder / "labeled" / "owl" / odd.name).is_file() and not odd.exists()
    assert invoke(label, ["--data-dir", folder, "--undo"]).exit_code == 0 and odd.is_file()


@pytest.fixture
def small_chunks(monkeypatch):
    """Rows checked, moves logged and batches put back 3 at a time (thousands in use), and the
    log's flushes to disk counted."""
    monkeypatch.setattr(spill, "CHUNK", 3)
    monkeypatch.setattr(labeling, "CHUNK", 3)
    monkeypatch.setattr(label_plan, "PLAN_CHUNK", 3)
    flushes, real_fsync = [], label_log.os.fsync
    monkeypatch.setattr(label_log.os, "fsync", lambda fd: flushes.append(fd) or real_fsync(fd))
    return flushes


EIGHT = [(f"unlabeled/u{i:04d}.png", "cat") for i in (0, 3, 6)] + [(f"unlabeled/a/u{i:04d}.png", "dog") for i in (1, 4, 7)] \
    + [("unlabeled/a/b/u0002.png", "owl"), ("unlabeled/a/b/u0005.png", "cat")]


def test_a_batch_of_many_chunks_is_logged_a_chunk_at_a_time_and_undone_whole(folder, tmp_path, small_chunks):
    """8 moves in chunks of 3: the log is flushed once a chunk (3 times, and once for its header), not
    once a move; the files land as in one chunk; one --undo puts all 8 back, bitwise."""
    before = snapshot(folder)
    res = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", EIGHT), "--new-classes"])
    assert res.exit_code == 0 and "moved 8 images into labeled/ (cat 4, dog 3, owl 1)" in res.output, res.output
    assert len(small_chunks) == 1 + 3
    assert sorted(p.relative_to(folder).as_posix() for p in (folder / "labeled").rglob("u*.png")) == sorted(
        f"labeled/{label_}/{path.rsplit('/', 1)[1]}" for path, label_ in EIGHT)
    with open(folder / label_log.LOG_NAME, newline="") as f:
        log = list(csv.DictReader(f))
    assert sum(r["action"] == "move" for r in log) == 8 and {r["batch"] for r in log} == {"1"}
    undone = invoke(label, ["--data-dir", folder, "--undo"])
    assert undone.exit_code == 0 and "put back the 8 images of batch 1" in undone.output
    assert snapshot(folder) == before


def test_a_move_refused_in_a_later_chunk_puts_every_earlier_chunk_back(folder, tmp_path, monkeypatch, small_chunks):
    before = snapshot(folder)
    calls, real_rename = [], labeling.rename_no_replace

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 5:  # the second of the second chunk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_rename(src, dst)
    monkeypatch.setattr(labeling, "rename_no_replace", rename)
    res = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", EIGHT), "--new-classes"])
    assert res.exit_code == 1 and "the 4 images moved before it were put back" in res.output, res.output
    assert snapshot(folder) == before


def test_moving_a_copy_of_a_test_image_into_labeled_is_said_before_it_moves(tmp_path, monkeypatch):
    """An unlabeled image whose bytes are a test/ image's, moved into labeled/: label.py names the
    pair (the move still happens; --dry-run says it too); a test image of the same size but other
    bytes, and a copy only set aside, are not named."""
    folder = tmp_path / "d"
    write_own_folder(folder, n_labeled=2, n_unlabeled=6, n_test=2)
    test_image = sorted((folder / "test").rglob("*.png"))[0]
    (folder / "unlabeled" / "u0000.png").write_bytes(test_image.read_bytes())
    same_size = bytearray(test_image.read_bytes())
    same_size[-1] ^= 1
    (folder / "unlabeled" / "u0001.png").write_bytes(bytes(same_size))
    labels = write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "cat"), ("unlabeled/u0001.png", "dog")])
    named = f"unlabeled/u0000.png = test/{test_image.relative_to(folder / 'test').as_posix()}"
    for dry in (["--dry-run"], []):
        result = invoke(label, ["--data-dir", folder, "--apply", labels, *dry])
        assert result.exit_code == 0, result.output
        assert f"warning: 1 of the images moved into labeled/ are byte-for-byte copies of test/ images ({named})" \
            in result.output and "u0001" not in result.output.split("warning:")[1].split("\n")[0]
    assert (folder / "labeled" / "cat" / "u0000.png").exists()
    (folder / "unlabeled" / "u0002.png").write_bytes(test_image.read_bytes())
    assert copies_of_test_images(folder, [Move("unlabeled/u0002.png", "set-aside/unlabeled/u0002.png", "")]) == []
    assert len(copies_of_test_images(folder, [Move("unlabeled/u0002.png", "labeled/dog/u0002.png", "dog")])) == 1
    shutil.rmtree(folder / "test")  # no test/ image: not one moved file is looked at
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **k: pytest.fail("a moved file was looked at")
                        if "u0002" in str(path) else real_stat(path, *a, **k))
    assert copies_of_test_images(folder, [Move("unlabeled/u0002.png", "labeled/dog/u0002.png", "dog")]) == []
