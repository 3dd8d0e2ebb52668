"""Every name a stranger chose reaches a terminal escaped: a class folder named with an OSC title
sequence in evaluate.py's per-class line (a log too), an image named ESC[2J.png in --predict's CSV
at a terminal; a CSV into a file keeps the names as they are, for label.py to read."""
import os
import pty
import select
import subprocess
import sys

import pytest

from conftest import ROOT, run
from fakedata import write_own_folder

TITLE = "\x1b]0;owned\x07cat"  # an OSC sequence: sets the terminal's title, shows nothing


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("terminal")
    folder = root / "d"
    write_own_folder(folder, n_labeled=4, n_unlabeled=8, n_test=2)
    for part in ("labeled", "test"):
        os.rename(folder / part / "cat", folder / part / TITLE)
    os.rename(folder / "unlabeled" / "u0000.png", folder / "unlabeled" / "\x1b[2J.png")
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--consistency", "mt", "--data-dir", folder, "--width", "0.125",
              "--labeled-batch", "8", "--unlabeled-batch", "8", "--epochs", "1", "--decay-epochs", "0",
              "--device", "cpu", "--out", root / "run")
    assert res.returncode == 0, res.stderr
    return folder, root / "run" / "mt_final.pt", res


def test_no_control_character_reaches_the_console_or_a_log(hostile):
    folder, ckpt, trained = hostile
    res = run("evaluate.py", "--ckpt", ckpt)
    assert res.returncode == 0, res.stderr
    for text in (trained.stdout, trained.stderr, res.stdout, res.stderr):
        assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;owned\\x07cat" in res.stdout  # the per-class line names the class, escaped


def at_a_terminal(args):
    """What `python evaluate.py ARGS` writes to a terminal (a pseudo-terminal's other end)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "evaluate.py", *map(str, args)], cwd=ROOT, stdout=follower,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        try:
            chunk = os.read(leader, 65536) if ready else b""
        except OSError:  # the other end closed
            chunk = b""
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(60) == 0
    return b"".join(chunks)


@pytest.mark.slow
def test_the_predict_csv_escapes_names_at_a_terminal_and_keeps_them_in_a_file(hostile, tmp_path):
    folder, ckpt, _ = hostile
    shown = at_a_terminal(["--ckpt", ckpt, "--predict", folder / "unlabeled"])
    assert b"\x1b" not in shown and b"\\x1b[2J.png" in shown
    with open(tmp_path / "rows.csv", "wb") as f:
        assert subprocess.run([sys.executable, "evaluate.py", "--ckpt", ckpt, "--predict", folder / "unlabeled"],
                              cwd=ROOT, stdout=f).returncode == 0
    assert "\x1b[2J.png".encode() in (tmp_path / "rows.csv").read_bytes()  # lossless for label.py
