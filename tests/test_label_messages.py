"""What label.py shows and reads of a stranger's names and hand-made files: a control character in a
file name is escaped wherever it is shown, never sent to the terminal as itself; a labels file whose
column is named twice is refused; Excel's "Unicode text" (UTF-16, tab-separated) is read; a log write
the OS cuts short leaves the log whole and names it."""
import errno
import os

import pytest

import label
from conftest import invoke, run, snapshot, write_labels
from fakedata import write_own_folder
from mtlc.disk import spill
from mtlc.errors import UserError, WriteFailed

STRANGE = "tab\tesc\x1b[31m\nfake line.png"  # a TAB, an ANSI colour and a newline in one name


def own_folder(tmp_path, n_unlabeled=9):
    write_own_folder(tmp_path / "d", n_labeled=2, n_unlabeled=n_unlabeled, n_test=0, unlabeled_dirs=("",))
    return tmp_path / "d"


def test_a_name_with_control_characters_is_shown_escaped(tmp_path):
    """--dry-run lists the move with the name escaped; the undo that cannot put the file back names
    it escaped too; no output holds an ESC, a TAB or a line of the name's own."""
    folder = own_folder(tmp_path)
    os.rename(folder / "unlabeled" / "u0000.png", folder / "unlabeled" / STRANGE)
    labels = write_labels(tmp_path / "l.csv", [(f"unlabeled/{STRANGE}", "cat")])
    res = run("label.py", "--data-dir", folder, "--apply", labels, "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "unlabeled/tab\\tesc\\x1b[31m\\nfake line.png -> labeled/cat/tab\\tesc\\x1b[31m\\nfake line.png" in res.stdout
    assert not {"\x1b", "\t"} & set(res.stdout) and len(res.stdout.splitlines()) == 2
    assert run("label.py", "--data-dir", folder, "--apply", labels).returncode == 0
    (folder / "unlabeled" / STRANGE).write_bytes(b"another file under the name")  # the name taken again
    res = run("label.py", "--data-dir", folder, "--undo")
    assert res.returncode == 2 and "the name is taken" in res.stderr, res.stderr
    assert "tab\\tesc\\x1b[31m\\nfake line.png" in res.stderr and not {"\x1b", "\t"} & set(res.stderr)
    assert len(res.stderr.splitlines()) == 1


def test_a_new_class_with_characters_that_do_not_print_is_shown_escaped(tmp_path):
    """DEL and a C1 control (CSI on an 8-bit console) may name a folder: the summary shows them escaped."""
    folder = own_folder(tmp_path)
    labels = write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "\x9b31mred\x7f")])
    res = run("label.py", "--data-dir", folder, "--apply", labels, "--dry-run", "--new-classes")
    assert res.returncode == 0 and "into labeled/ (\\x9b31mred\\x7f 1)" in res.stdout, res.stdout
    assert not {"\x9b", "\x7f"} & set(res.stdout)


def test_a_plan_the_disk_refuses_when_it_is_read_back_is_one_line():
    """The last records appended may still be in the buffer when the plan is first read back: a disk
    that refuses them then is the temporary file's failure, before anything moves."""
    plan = spill.Spill()
    plan.append(["unlabeled/a.png", "labeled/cat/a.png"])

    def refused():
        raise OSError(errno.ENOSPC, "No space left on device")
    plan.file.flush = refused
    with pytest.raises(WriteFailed, match="cannot write a temporary file in .*: No space left on device"):
        plan.chunk(0)


def test_every_error_is_one_line_whatever_it_quotes():
    assert UserError(f"cannot read {STRANGE}\r\x00").format_message() == \
        "cannot read tab\\tesc\\x1b[31m\\nfake line.png\\r\\x00"
    assert UserError("café: 猫").format_message() == "café: 猫"  # printable text stays as it is


def test_a_column_named_twice_is_refused(tmp_path):
    """Python's csv reader keeps the last of two columns of one name: the file is refused instead of
    moving the image the other column names."""
    folder = own_folder(tmp_path)
    before = snapshot(folder)
    for header in (("path", "label", "path"), ("path", "label", "label"), ("path", "label", "note", "note")):
        labels = write_labels(tmp_path / "l.csv", [("unlabeled/u0000.png", "cat", "unlabeled/u0001.png", "x")[:len(header)]],
                              header=header)
        res = invoke(label, ["--data-dir", folder, "--apply", labels, "--dry-run"])
        if header[-1] == "note":  # a column label.py does not read may come twice
            assert res.exit_code == 0 and "u0000.png -> labeled/cat/u0000.png" in res.output, res.output
        else:
            assert res.exit_code == 2 and f"has the column {header[-1]} twice" in res.output, res.output
    assert snapshot(folder) == before


def test_excels_unicode_text_is_read(tmp_path):
    """Excel's "Unicode text": UTF-16 with a byte-order mark, columns separated by tabs, CRLF."""
    folder = own_folder(tmp_path)
    labels = tmp_path / "l.txt"
    labels.write_bytes("path\tlabel\r\nunlabeled/u0000.png\tcat\r\nunlabeled/u0001.png\tdog\r\n".encode("utf-16"))
    res = invoke(label, ["--data-dir", folder, "--apply", labels])
    assert res.exit_code == 0 and "moved 2 images" in res.output, res.output
    assert (folder / "labeled" / "cat" / "u0000.png").exists() and (folder / "labeled" / "dog" / "u0001.png").exists()


def test_a_log_write_cut_short_leaves_the_log_whole(tmp_path):
    """A file-size limit reached inside the log's rows: the part written is cut off again (the log ends
    with a whole row and reads back), nothing moves, and the one line names the log."""
    folder = own_folder(tmp_path, n_unlabeled=30)
    first = write_labels(tmp_path / "first.csv", [(f"unlabeled/u{k:04d}.png", "cat") for k in range(15)])
    assert invoke(label, ["--data-dir", folder, "--apply", first]).exit_code == 0
    log = folder / "label-log.csv"
    size = log.stat().st_size
    limit_kb = size // 1024 + 1  # room for less than 1 KB more: the next 12 rows need about 1.7 KB
    assert size >= 1024  # and the temporary file of 12 planned moves fits under the limit
    rest = write_labels(tmp_path / "rest.csv", [(f"unlabeled/u{k:04d}.png", "dog") for k in range(15, 27)])
    before, before_log = snapshot(folder), log.read_bytes()
    res = run("label.py", "--data-dir", folder, "--apply", rest, limit_kb=limit_kb)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"writing {log} failed (File too large)" in res.stderr and "nothing was moved" in res.stderr
    assert snapshot(folder) == before
    data = log.read_bytes()
    assert data[:size] == before_log
    assert data.endswith(b"\r\n") and len(data) <= limit_kb * 1024, data[-200:]
    res = invoke(label, ["--data-dir", folder, "--undo"])  # the log reads back: the first batch is undone
    assert res.exit_code == 0 and "put back the 15 images of batch 1" in res.output, res.output
    assert (folder / "unlabeled" / "u0000.png").exists()
