"""label.py trusts nothing it reads: a log or a labels file from a stranger, names the file system
refuses, a folder that cannot be written, a CSV in another encoding, a disk that fills up midway,
two label.py at once. Every case: refused before anything moves (exit 2) or recovered exactly, one
line, never a traceback, nothing outside the folder touched."""
import csv
import errno
import fcntl
import hashlib
import os

import pytest

import label
from mtlc.label import log as label_log
from mtlc.label import apply as labeling
from conftest import invoke, run, snapshot, write_labels
from fakedata import write_own_folder

STRICT = dict(PYTHONIOENCODING="utf-8:strict")  # no surrogate escapes on stdout unless the script asks


@pytest.fixture
def folder(tmp_path):
    write_own_folder(tmp_path / "d", n_labeled=2, n_unlabeled=9, n_test=0)
    return tmp_path / "d"


def write_log(folder, rows):
    with open(folder / label_log.LOG_NAME, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(label_log.LOG_HEADER)
        writer.writerows(list(r) + [""] * (len(label_log.LOG_HEADER) - len(r)) for r in rows)


@pytest.mark.parametrize("source", ["/tmp/elsewhere/x.png", "../x.png", "unlabeled/../../x.png", "mtlc-cache/0.png",
                                    "unlabeled/link/x.png"])
def test_undo_refuses_a_log_that_names_places_outside_the_folder(folder, tmp_path, source):
    """A log row that would put a file outside the folder (or outside unlabeled/): exit 2, nothing
    moves, nothing is created or removed outside, the log is left as it was."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (folder / "unlabeled" / "link").symlink_to(outside, target_is_directory=True)
    write_log(folder, [(1, "t", "move", source, "labeled/cat/u0000.png", "cat")])
    os.rename(folder / "unlabeled" / "u0000.png", folder / "labeled" / "cat" / "u0000.png")
    before, log = snapshot(folder), (folder / label_log.LOG_NAME).read_bytes()
    res = run("label.py", "--data-dir", folder, "--undo")
    assert res.returncode == 2 and "Traceback" not in res.stderr and "cannot be trusted" in res.stderr, res.stderr
    assert snapshot(folder) == before and (folder / label_log.LOG_NAME).read_bytes() == log
    assert list(outside.iterdir()) == [] and not (tmp_path / "x.png").exists() and not os.path.exists("/tmp/elsewhere")


@pytest.mark.parametrize("source, target", [("test/cat/0.png", "labeled/cat/t0.png"),
                                            ("labeled/dog/0.png", "test/dog/l0.png")])
def test_undo_refuses_a_log_that_crosses_between_labeled_and_test(folder, source, target):
    """A relabel stays in its part: a forged log row whose undo would move a training image into
    test/ (or a test image into labeled/) is refused, nothing moves."""
    for c in ("cat", "dog"):
        (folder / "test" / c).mkdir(parents=True)
        (folder / "test" / c / "0.png").write_bytes((folder / "labeled" / c / "1.png").read_bytes())
    (folder / target).parent.mkdir(parents=True, exist_ok=True)
    os.rename(folder / source, folder / target)
    write_log(folder, [(1, "t", "move", source, target, target.split("/")[1])])
    before = snapshot(folder)
    res = run("label.py", "--data-dir", folder, "--undo")
    assert res.returncode == 2 and "cannot be trusted" in res.stderr, res.stderr
    assert snapshot(folder) == before


def test_a_target_through_a_link_is_refused(folder, tmp_path):
    (tmp_path / "outside").mkdir()
    (folder / "labeled" / "owl").rename(folder / "owl-real")
    (folder / "labeled" / "owl").symlink_to(tmp_path / "outside", target_is_directory=True)
    res = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "owl")])])
    assert res.exit_code == 2 and "leads outside the folder through a link" in res.output
    assert list((tmp_path / "outside").iterdir()) == []


@pytest.mark.parametrize("rows, message", [
    ([("unlabeled/u0000.png", "x" * 300)], "longer than the file system takes"),
    ([("unlabeled/u0000.png", "notes.txt")], "is a file, not a class folder"),
    ([("unlabeled/u0000.png", "tab\there")], "cannot be a class folder's name"),
    ([("unlabeled/link/x.png", "cat")], "leads outside the folder through a link"),
])
def test_names_and_places_the_file_system_refuses_are_refused_before_any_move(folder, tmp_path, rows, message):
    (folder / "labeled" / "notes.txt").write_text("not a class")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "x.png").write_bytes(b"x")
    (folder / "unlabeled" / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    before = snapshot(folder)
    rows = [("unlabeled/u0001.png", "cat")] + rows  # a good row first: it must not move either
    res = run("label.py", "--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", rows), "--new-classes")
    assert res.returncode == 2 and message in res.stderr and "nothing was moved" in res.stderr, res.stderr
    assert "or take them out of the CSV, and apply it again (a batch moves all its rows or none)" in res.stderr
    assert "Traceback" not in res.stderr and snapshot(folder) == before and not (folder / label_log.LOG_NAME).exists()


def test_a_nul_byte_or_a_short_row_is_refused(folder, tmp_path):
    nul = tmp_path / "nul.csv"
    nul.write_bytes(b"path,label\nunlabeled/u0000.png,c\x00at\n")
    short = tmp_path / "short.csv"
    short.write_text("path,label\nunlabeled/u0000.png,cat\nunlabeled/u0001.png\n")
    before = snapshot(folder)
    for labels, message in ((nul, "cannot be a class folder"), (short, "line 3")):
        res = run("label.py", "--data-dir", folder, "--apply", labels)
        assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert snapshot(folder) == before


def test_another_file_system_is_refused(folder, tmp_path, monkeypatch):
    """A file that lies on another file system (a mount inside the folder): a rename cannot cross
    it (EXDEV), so the row is refused before anything moves."""
    real_stat = os.lstat

    def stat(path, *args, **kwargs):
        result = real_stat(path, *args, **kwargs)
        if str(path).endswith("u0003.png"):
            return os.stat_result((result.st_mode, result.st_ino, result.st_dev + 1) + tuple(result)[3:])
        return result
    monkeypatch.setattr(labeling.os, "lstat", stat)
    res = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [
        ("unlabeled/u0000.png", "cat"), ("unlabeled/u0003.png", "dog")])])
    assert res.exit_code == 2 and "another file system" in res.output and (folder / "unlabeled" / "u0000.png").exists()


def test_a_read_only_folder_is_refused(folder, tmp_path, monkeypatch):
    # As root, chmod cannot make a folder read-only to this process: the check is os.access's answer.
    monkeypatch.setattr(labeling.os, "access", lambda path, mode: not str(path).endswith("unlabeled"))
    res = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "cat")])])
    assert res.exit_code == 2 and "cannot be written (read-only)" in res.output


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS, errno.EXDEV])
def test_a_move_the_os_refuses_midway_puts_the_batch_back(folder, tmp_path, monkeypatch, error):
    before = snapshot(folder)
    calls, real_rename = [], labeling.rename_no_replace

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(error, os.strerror(error))
        real_rename(src, dst)
    monkeypatch.setattr(labeling, "rename_no_replace", rename)
    rows = [(f"unlabeled/u{i:04d}.png", "zebra") for i in (0, 3, 6)] + [("unlabeled/a/u0001.png", "zebra")]
    res = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", rows), "--new-classes"])
    assert res.exit_code == 1 and "were put back; nothing was moved" in res.output and os.strerror(error) in res.output
    assert snapshot(folder) == before  # labeled/zebra/ is gone too
    monkeypatch.undo()
    assert "nothing to undo" in invoke(label, ["--data-dir", folder, "--undo"]).output  # the batch is marked undone
    assert invoke(label, ["--data-dir", folder, "--apply", tmp_path / "l.csv", "--new-classes"]).exit_code == 0


def test_a_torn_log_line_is_cut_off_and_two_undos_restore_the_folder(folder, tmp_path):
    """A full disk cut the log's last line short (no newline; its move never happened): the next
    run cuts it off (said), appends whole lines, and undos put every file back."""
    before = snapshot(folder)
    assert invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "a.csv", [("unlabeled/u0000.png", "cat")])]).exit_code == 0
    with open(folder / label_log.LOG_NAME, "a") as f:
        f.write("2,2026-11-27T10:00:00,move,unlabeled/u0001.png,labe")
    res = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "b.csv", [("unlabeled/u0003.png", "dog")])])
    assert res.exit_code == 0 and "cut off the torn last line" in res.output, res.output
    assert all(line.count(",") == len(label_log.LOG_HEADER) - 1 for line in (folder / label_log.LOG_NAME).read_text().splitlines())
    assert "batch 2" in invoke(label, ["--data-dir", folder, "--undo"]).output
    assert "batch 1" in invoke(label, ["--data-dir", folder, "--undo"]).output
    assert snapshot(folder) == before


def test_one_label_py_at_a_time(folder, tmp_path):
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a running label.py holds it
        res = run("label.py", "--data-dir", folder, "--undo")
        assert res.returncode == 2 and "another label.py is changing" in res.stderr
    finally:
        os.close(fd)
    assert run("label.py", "--data-dir", folder, "--undo").returncode == 0


def test_an_undo_that_cannot_put_a_file_back_leaves_the_batch_open(folder, tmp_path):
    labels = write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "cat"), ("unlabeled/u0003.png", "dog")])
    assert invoke(label, ["--data-dir", folder, "--apply", labels]).exit_code == 0
    (folder / "unlabeled" / "u0003.png").write_bytes(b"a new file under the old name")
    moved = snapshot(folder)
    res = invoke(label, ["--data-dir", folder, "--undo"])
    assert res.exit_code == 2 and "stays applied" in res.output and "the name is taken" in res.output
    assert snapshot(folder) == moved
    (folder / "unlabeled" / "u0003.png").unlink()
    assert "put back the 2 images of batch 1" in invoke(label, ["--data-dir", folder, "--undo"]).output


def test_utf16_and_cp1252_labels_files(folder, tmp_path):
    """UTF-16 (Excel's "Unicode text") is read; a cp1252 path names no file and a cp1252 class is not
    text: both refused, nothing moved."""
    os.rename(folder / "unlabeled" / "u0000.png", folder / "unlabeled" / "café.png")
    utf16 = tmp_path / "u16.csv"
    utf16.write_bytes("path,label\nunlabeled/café.png,owl\n".encode("utf-16"))
    assert invoke(label, ["--data-dir", folder, "--apply", utf16]).exit_code == 0 and (folder / "labeled" / "owl" / "café.png").exists()
    before = snapshot(folder)
    for text, message in (("path,label\nunlabeled/u0003.png,caf\xe9\n", "is not text"),
                          ("path,label\nunlabeled/s\xe9.png,cat\n", "no such file")):
        cp1252 = tmp_path / "cp.csv"
        cp1252.write_bytes(text.encode("cp1252"))
        res = invoke(label, ["--data-dir", folder, "--apply", cp1252, "--new-classes"])
        assert res.exit_code == 2 and message in res.output, res.output
    assert snapshot(folder) == before


def test_a_name_that_is_not_utf8_round_trips(folder, tmp_path):
    """A file whose name is not UTF-8 (an old archive): the labels file holds its bytes as they are
    (evaluate.py writes them so), label.py moves exactly that file, and nothing prints a traceback
    even with a strict output encoding."""
    name = os.fsencode(folder / "unlabeled") + b"/bad\xff.png"
    os.rename(folder / "unlabeled" / "u0000.png", name)
    labels = tmp_path / "l.csv"
    labels.write_bytes(b"path,label\nunlabeled/bad\xff.png,cat\n")
    res = run("label.py", "--data-dir", folder, "--apply", labels, "--dry-run", env=STRICT)
    assert res.returncode == 0 and "Traceback" not in res.stderr and "would move 1" in res.stdout
    res = run("label.py", "--data-dir", folder, "--apply", labels, env=STRICT)
    assert res.returncode == 0, res.stderr
    assert os.path.exists(os.fsencode(folder / "labeled" / "cat") + b"/bad\xff.png")
    assert run("label.py", "--data-dir", folder, "--undo", env=STRICT).returncode == 0
    assert os.path.exists(name)


def test_accepted_rows_of_a_predictions_csv_and_a_dry_run_that_lists_moves(folder, tmp_path):
    preds = tmp_path / "preds.csv"
    preds.write_text("path,prediction,confidence,runner_up,accepted\n"
                     f"{folder / 'unlabeled' / 'u0000.png'},owl,0.9900,cat,1\n"
                     f"{folder / 'unlabeled' / 'u0003.png'},dog,0.5100,cat,0\n"
                     f"{folder / 'unlabeled' / 'a' / 'bad.png'},,,,0\n"
                     f"{folder / 'unlabeled' / 'u0006.png'},cat,0.9700,dog,1\n")
    dry = invoke(label, ["--data-dir", folder, "--apply", preds, "--accepted", "--dry-run"])
    assert dry.exit_code == 0 and dry.output.splitlines()[:2] == [
        "unlabeled/u0000.png -> labeled/owl/u0000.png", "unlabeled/u0006.png -> labeled/cat/u0006.png"]
    assert "would move 2 images into labeled/ (cat 1, owl 1)" in dry.output
    res = invoke(label, ["--data-dir", folder, "--apply", preds, "--accepted"])
    assert res.exit_code == 0 and (folder / "labeled" / "owl" / "u0000.png").exists()
    assert (folder / "unlabeled" / "u0003.png").exists()
    no_column = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "p.csv", [], ("path", "prediction")),
                       "--accepted"])
    assert no_column.exit_code == 2 and "only with --max-error" in no_column.output
    # A predictions CSV of the whole folder lists labeled/ and test/ images too: --accepted never
    # puts a prediction over a label a person gave.
    whole = tmp_path / "whole.csv"
    whole.write_text("path,prediction,confidence,runner_up,accepted\n"
                     f"{folder / 'labeled' / 'cat' / '0.png'},dog,0.9900,cat,1\n"
                     f"{folder / 'test' / 'cat' / '0.png'},owl,0.9900,cat,1\n")
    before = snapshot(folder)
    refused = invoke(label, ["--data-dir", folder, "--apply", whole, "--accepted"])
    assert refused.exit_code == 2 and "not a file under" in refused.output and snapshot(folder) == before


@pytest.mark.parametrize("make", ["link", "dangling", "fifo", "hardlink"])
def test_a_log_that_is_not_a_regular_file_of_its_own_is_refused(folder, tmp_path, make):
    """label-log.csv a link to a file outside (which the log's writes would rewrite), a link to a file
    that does not exist yet (which they would create: a shell's start-up file made from an image's
    name), a pipe (which would hang even --dry-run) or a hard link: one line, exit 2, nothing moved,
    nothing written outside."""
    outside = tmp_path / "outside.txt"
    log = folder / label_log.LOG_NAME
    if make == "link":
        outside.write_text("someone's file\n")
        log.symlink_to(outside)
    elif make == "dangling":
        log.symlink_to(tmp_path / ".bash_profile")
    elif make == "fifo":
        os.mkfifo(log)
    else:
        outside.write_text("someone's file\n")
        os.link(outside, log)
    before = snapshot(folder)
    labels = write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "cat")])
    for args in (["--apply", labels, "--dry-run"], ["--apply", labels], ["--undo"]):
        res = run("label.py", "--data-dir", folder, *args, timeout=60)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert ("a pipe" if make == "fifo" else "names" if make == "hardlink" else "a symbolic link") in res.stderr
    assert snapshot(folder) == before and not (tmp_path / ".bash_profile").exists()
    assert make in ("dangling", "fifo") or outside.read_text() == "someone's file\n"


def test_a_row_whose_image_was_replaced_since_is_refused(folder, tmp_path):
    """A predictions CSV binds each row to its image's bytes: a camera that restarted its numbering
    put another picture under u0000.png since; its row is refused before anything moves, and the
    row of the unchanged image would have moved."""
    def digest(name):
        return hashlib.blake2b((folder / "unlabeled" / name).read_bytes(), digest_size=16).hexdigest()
    rows = [("unlabeled/u0003.png", "dog", digest("u0003.png")), ("unlabeled/u0000.png", "cat", digest("u0000.png"))]
    (folder / "unlabeled" / "u0000.png").write_bytes((folder / "unlabeled" / "u0006.png").read_bytes())
    before = snapshot(folder)
    labels = write_labels(tmp_path / "l.csv", rows, ("path", "label", "blake2b"))
    res = run("label.py", "--data-dir", folder, "--apply", labels)
    assert res.returncode == 2 and "line 3 (unlabeled/u0000.png): its image is not the one this row was written for" \
        in res.stderr and "nothing was moved" in res.stderr, res.stderr
    assert snapshot(folder) == before
    rows[1] = ("unlabeled/u0000.png", "cat", digest("u0000.png"))  # predicted again
    assert run("label.py", "--data-dir", folder, "--apply", write_labels(tmp_path / "m.csv", rows, ("path", "label", "blake2b"))).returncode == 0
    log = list(csv.DictReader(open(folder / label_log.LOG_NAME, newline="")))
    assert [r["blake2b"] for r in log] == [r[2] for r in rows]
    (folder / "labeled" / "cat" / "u0000.png").write_bytes(b"another image")  # replaced after the move: undo refuses
    res = run("label.py", "--data-dir", folder, "--undo")
    assert res.returncode == 2 and "another image than the one label.py moved there" in res.stderr


def test_a_file_made_between_planning_and_the_move_is_never_replaced(folder, tmp_path, monkeypatch):
    """The name was free when planned; another program takes it before the rename: the OS refuses to
    rename over it, the batch is put back, both files are whole."""
    real_apply = labeling.apply

    def apply_after_someone_else(data_dir, moves, **options):
        (folder / list(moves)[-1].target).write_bytes(b"made meanwhile")
        return real_apply(data_dir, moves, **options)
    monkeypatch.setattr(label, "apply", apply_after_someone_else)
    before = snapshot(folder)
    rows = [("unlabeled/u0000.png", "cat"), ("unlabeled/u0003.png", "dog")]
    res = invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", rows)])
    assert res.exit_code == 1 and "File exists" in res.output and "put back" in res.output, res.output
    assert (folder / "labeled" / "dog" / "u0003.png").read_bytes() == b"made meanwhile"
    assert snapshot(folder)[0] == dict(before[0], **{"labeled/dog/u0003.png": hashlib.sha256(b"made meanwhile").hexdigest()})


def test_a_batch_number_that_is_no_ascii_number_is_one_line(folder):
    write_log(folder, [("²", "t", "undo", "", "", "")])
    res = run("label.py", "--data-dir", folder, "--undo")
    assert res.returncode == 2 and "is not a number" in res.stderr and "Traceback" not in res.stderr


def test_a_log_from_before_the_hash_was_kept_goes_on_in_its_own_columns(folder, tmp_path):
    """A log written before the blake2b column: read as it is, appended in its six columns, undone."""
    with open(folder / label_log.LOG_NAME, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerow(label_log.LOG_HEADER[:-1])
    before = snapshot(folder)
    assert invoke(label, ["--data-dir", folder, "--apply", write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "cat")])]).exit_code == 0
    rows = list(csv.reader(open(folder / label_log.LOG_NAME, newline="")))
    assert all(len(r) == len(label_log.LOG_HEADER) - 1 for r in rows) and rows[1][2:5] == ["move", "unlabeled/u0000.png", "labeled/cat/u0000.png"]
    assert "put back the 1 images" in invoke(label, ["--data-dir", folder, "--undo"]).output
    assert snapshot(folder) == before
