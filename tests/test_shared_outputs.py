"""Two runs at once on one output, outputs over the files the tools keep, and every writer on a full
disk (TensorBoard's thread, stdout): one run holds a work folder and the other is refused in one line;
a run reads back the rows it counted or writes nothing; --resume continues the run it names; no output
replaces label-log.csv, a lock, a cache file, a work folder's file or a checkpoint; a stdout or a
TensorBoard folder that refuses a write is one line, never a traceback or a torn row; a checkpoint's
keys agree with each other; an image given twice is predicted once."""
import csv
import errno
import io
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

import evaluate
import train_mt
from conftest import ROOT, invoke, overriding, read_rows, run
from mtlc.use import predict, prediction_rows
from mtlc.disk.runs import staging_folder
from mtlc.use.audit import AUDIT_HEADER
from mtlc.errors import UserError
from mtlc.disk import outputs
from mtlc.disk.opening import lock_folder
from mtlc.disk.work import Work, work_folder


def test_a_work_folder_is_held_by_one_run_at_a_time(tmp_path):
    """The second Work on one folder is refused in one line while the first holds it, and takes it
    once the first has let go."""
    first = Work(tmp_path / ".out.csv.mtlc-work", dict(step="predict"))
    with pytest.raises(Exception, match="another run is writing the same output"):
        Work(tmp_path / ".out.csv.mtlc-work", dict(step="predict"))
    first.close()
    second = Work(tmp_path / ".out.csv.mtlc-work", dict(step="predict"))
    second.remove()
    assert not (tmp_path / ".out.csv.mtlc-work").exists()


def test_a_folder_of_someone_elses_under_a_work_folders_name_is_left_alone(trained, tmp_path):
    """A folder under the work folder's name that holds someone's files and no manifest (the work of
    every run writes one first): --predict refuses in one line and removes nothing. Work of this
    tool's for other inputs (another key) is cleared and done again, as before."""
    folder, ckpt = trained
    theirs = work_folder(tmp_path / "x.csv")
    theirs.mkdir()
    (theirs / "notes.txt").write_text("precious")
    res = invoke(evaluate, ["--ckpt", ckpt, "--predict", folder / "unlabeled", "--csv", tmp_path / "x.csv"])
    assert res.exit_code == 2 and "holds files that are not this tool's work (notes.txt" in res.output, res.output
    assert (theirs / "notes.txt").read_text() == "precious" and not (tmp_path / "x.csv").exists()
    older = Work(work_folder(tmp_path / "y.csv"), dict(step="predict", key="other inputs"))
    older.appended("rows.jsonl").write(b"rows of other inputs\n")
    older.close()
    res = invoke(evaluate, ["--ckpt", ckpt, "--predict", folder / "unlabeled", "--csv", tmp_path / "y.csv"])
    assert res.exit_code == 0 and len(read_rows((tmp_path / "y.csv").read_text())) == 24, res.output
    assert not work_folder(tmp_path / "y.csv").exists()


def test_a_csv_output_replaces_only_a_csv_of_its_own_kind(trained, tmp_path):
    """--csv over a labels file corrected by hand (or any file it did not write): refused before any
    work, the file as it was; over its own earlier predictions and over an empty file: written. Through
    a link, the file it leads to is the output (the link stays): refused where that is the labels file,
    written where it is a CSV of its own."""
    folder, ckpt = trained
    args = ["--ckpt", ckpt, "--predict", folder / "unlabeled"]
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\nunlabeled/u0000.png,cat\n")
    res = invoke(evaluate, [*args, "--csv", labels])
    assert res.exit_code == 2 and "is a file --csv did not write (its first line: path,label)" in res.output, res.output
    assert labels.read_text() == "path,label\nunlabeled/u0000.png,cat\n"
    for target in (tmp_path / "p.csv", tmp_path / "p.csv", tmp_path / "empty.csv"):
        target.touch()
        assert invoke(evaluate, [*args, "--csv", target]).exit_code == 0
        assert len(read_rows(target.read_text())) == 24
    (tmp_path / "link.csv").symlink_to(labels)
    assert invoke(evaluate, [*args, "--csv", tmp_path / "link.csv"]).exit_code == 2
    assert labels.read_text() == "path,label\nunlabeled/u0000.png,cat\n" and (tmp_path / "link.csv").is_symlink()
    (tmp_path / "own.csv").symlink_to(tmp_path / "p.csv")
    assert invoke(evaluate, [*args, "--csv", tmp_path / "own.csv"]).exit_code == 0
    assert (tmp_path / "own.csv").is_symlink() and len(read_rows((tmp_path / "p.csv").read_text())) == 24


@pytest.mark.parametrize("leads_to", ["/dev/stdout", "/dev/null", "fifo", "folder", "loop"])
def test_an_output_through_a_link_to_no_file_is_refused_and_the_link_stays(trained, tmp_path, leads_to):
    """--csv /dev/stdout said "wrote /dev/stdout" and left a plain file there for the whole machine (the
    finished file renamed over the link): a link to a stream, device, pipe, folder or itself is refused in
    one line, before any work, the link as it was and nothing created beside what it leads to."""
    folder, ckpt = trained
    link = tmp_path / "out.csv"
    if leads_to == "fifo":
        os.mkfifo(tmp_path / "fifo")
    elif leads_to == "folder":
        (tmp_path / "folder").mkdir()
    target = link if leads_to == "loop" else tmp_path / leads_to if leads_to in ("fifo", "folder") else leads_to
    link.symlink_to(target)
    before = sorted(os.listdir(tmp_path)), sorted(os.listdir("/dev"))
    for option in ("--csv", "--review", "--label-studio"):
        res = invoke(evaluate, ["--ckpt", ckpt, "--predict", folder / "unlabeled", option, link])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert (f"{option} {link} is a link" in res.output and len(res.output.strip().splitlines()) == 1
                or leads_to == "folder" and "is a directory" in res.output), res.output  # click's own refusal
    assert os.readlink(link) == str(target) and (sorted(os.listdir(tmp_path)), sorted(os.listdir("/dev"))) == before


def test_a_link_into_a_stream_by_a_folder_link_or_dot_dots_is_refused(tmp_path, trained):
    """/proc/self/fd as a folder link (fd/1), and ../../dev/fd/1: streams all the same; and the labeling
    config beside --label-studio's tasks, a link to /dev/null, is refused before any work."""
    (tmp_path / "fd").symlink_to("/proc/self/fd")
    up = "../" * len(tmp_path.parts)
    (tmp_path / "rel").symlink_to(f"{up}dev/fd/1")
    for path in (tmp_path / "fd" / "1", tmp_path / "rel"):
        with pytest.raises(UserError, match="is a link to"):
            outputs.written_at("--csv", path)
    folder, ckpt = trained
    (tmp_path / "t.label-config.xml").symlink_to("/dev/null")
    res = invoke(evaluate, ["--ckpt", ckpt, "--predict", folder / "unlabeled", "--label-studio", tmp_path / "t.json"])
    assert res.exit_code == 2 and "labeling config" in res.output and "predicted" not in res.output, res.output
    assert not (tmp_path / "t.json").exists()


def test_written_at_follows_a_link_to_a_file_or_to_nothing_yet(tmp_path):
    (tmp_path / "real.csv").write_text("x")
    (tmp_path / "a").symlink_to(tmp_path / "real.csv")
    (tmp_path / "b").symlink_to(tmp_path / "not-yet.csv")
    assert outputs.written_at("--csv", str(tmp_path / "a")) == str(tmp_path / "real.csv")
    assert outputs.written_at("--csv", tmp_path / "b") == tmp_path / "not-yet.csv"
    assert outputs.written_at("--csv", tmp_path / "plain.csv") == tmp_path / "plain.csv"
    assert outputs.written_at("--csv", None) is None


def test_an_audit_output_replaces_only_an_audit(tmp_path):
    (tmp_path / "audit.csv").write_bytes(b"\xef\xbb\xbf" + ",".join(AUDIT_HEADER).encode() + b"\r\n")  # as Excel saves it
    (tmp_path / "notes.csv").write_text("kind of notes\n")
    outputs.check_outputs({"--audit": tmp_path / "audit.csv", "--csv": None}, kinds=evaluate.OWN_KINDS)
    with pytest.raises(UserError, match="--audit .*notes.csv is a file --audit did not write"):
        outputs.check_outputs({"--audit": tmp_path / "notes.csv"}, kinds=evaluate.OWN_KINDS)


def test_a_work_folder_cut_short_while_it_is_removed_is_still_the_tools(tmp_path, monkeypatch):
    """Its manifest goes last: a run killed while its work is removed leaves a folder the next run
    takes for this tool's work (and clears), never one it refuses as someone's."""
    work = Work(tmp_path / ".out.csv.mtlc-work", dict(step="predict"))
    work.appended("rows.jsonl").write(b"rows\n")
    work.commit(force=True)
    real, removed, listed = os.unlink, [], os.scandir
    # the manifest listed first: the order most likely to leave a folder without one
    monkeypatch.setattr(os, "scandir", lambda path: sorted(listed(path), key=lambda e: e.name != "manifest.json"))

    def killed_after_one(path):
        if removed:
            raise KeyboardInterrupt
        removed.append(os.path.basename(path))
        real(path)
    monkeypatch.setattr(os, "unlink", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        work.remove()
    monkeypatch.setattr(os, "unlink", real)
    monkeypatch.setattr(os, "scandir", listed)
    work.close()  # as the killed process's end does
    assert removed == ["rows.jsonl"]
    Work(tmp_path / ".out.csv.mtlc-work", dict(step="predict", key="the next run's")).remove()


def test_a_work_that_cannot_start_lets_go_of_its_folder(tmp_path):
    """A manifest that cannot be written (here a folder under its name): the error, and the folder's
    lock let go, so that the same process (the decode cache's fallback) and the next run are not held."""
    folder = tmp_path / ".out.csv.mtlc-work"
    (folder / "manifest.json").mkdir(parents=True)
    with pytest.raises(Exception):
        Work(folder, dict(step="predict"))
    os.close(lock_folder(folder, "still held"))


def test_an_output_that_cannot_be_read_is_not_replaced(tmp_path, monkeypatch):
    """Whether it is an earlier CSV of the option's cannot be told: refused (as root every file reads,
    so the refusal of the OS is played)."""
    (tmp_path / "p.csv").write_text("someone's\n")

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(outputs, "open", refused, raising=False)
    with pytest.raises(UserError, match="cannot be read \\(Permission denied\\)"):
        outputs.check_outputs({"--csv": tmp_path / "p.csv"}, kinds=evaluate.OWN_KINDS)


def test_a_predict_run_on_an_output_another_run_is_writing_is_refused(trained, tmp_path):
    """While another run holds the work folder of labels.csv (mid-way through its predictions), a
    --predict run writing labels.csv is refused in one line (exit 2) and touches nothing of it; once
    the other has let go, the same command runs."""
    folder, ckpt = trained
    holder = Work(work_folder(tmp_path / "labels.csv"), dict(step="predict"))
    holder.appended("rows.jsonl").write(b"the other run's rows\n")
    args = ["evaluate.py", "--ckpt", ckpt, "--predict", folder / "unlabeled", "--csv", tmp_path / "labels.csv"]
    res = run(*args)
    assert res.returncode == 2 and "another run is writing the same output" in res.stderr, res.stderr
    assert "temperature" not in res.stdout + res.stderr  # refused when it starts, before calibrating
    assert "Traceback" not in res.stderr and not (tmp_path / "labels.csv").exists()
    assert (work_folder(tmp_path / "labels.csv") / "rows.jsonl").read_bytes() == b"the other run's rows\n"
    holder.close()
    res = run(*args)
    assert res.returncode == 0, res.stderr
    assert len(read_rows((tmp_path / "labels.csv").read_text())) == 24


def test_an_output_that_cannot_be_written_is_refused_before_any_work(trained, tmp_path, monkeypatch):
    """A read-only folder for --csv (the OS's refusal played: as root every folder is writable) is
    refused when the run starts, before the checkpoint is calibrated, and leaves nothing."""
    folder, ckpt = trained
    real_mkdir = pathlib.Path.mkdir

    def mkdir(path, *args, **kwargs):
        if path.name.endswith(outputs.WORK_SUFFIX):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkdir(path, *args, **kwargs)
    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    monkeypatch.setattr(predict, "calibrated", lambda *args: pytest.fail("calibrated before its output was claimed"))
    res = invoke(evaluate, ["--ckpt", ckpt, "--predict", folder / "unlabeled", "--csv", tmp_path / "p.csv"])
    assert res.exit_code == 1 and "Read-only file system (so nothing of this output was written)" in res.output, res.output
    assert sorted(os.listdir(tmp_path)) == []


def test_rows_read_back_that_are_not_the_images_counted_write_nothing(trained, tmp_path, monkeypatch):
    """Work that lost rows (written by another run, say): the run refuses to write a short CSV."""
    folder, ckpt = trained
    real = prediction_rows.PredictionStore.rows
    monkeypatch.setattr(prediction_rows.PredictionStore, "rows", lambda self: list(real(self))[1:])
    res = invoke(evaluate, ["--ckpt", ckpt, "--predict", folder / "unlabeled", "--csv", tmp_path / "p.csv"])
    assert res.exit_code == 2 and "rows for the 24 images listed" in res.output, res.output
    assert not (tmp_path / "p.csv").exists() and not work_folder(tmp_path / "p.csv").exists()


@pytest.mark.parametrize("name", ["label-log.csv", ".mtlc-run.lock", "mtlc-cache/train-32px-x.u8", "mt.pt", "MT.PT",
                                  "run/lc_last.pt", ".labels.csv.mtlc-work/rows.jsonl", ".mtlc-next-mt/mt_last.pt",
                                  "through-a-link/train-32px-x.u8"])
def test_no_output_replaces_a_file_the_tools_keep(trained, tmp_path, name):
    """By name whatever its case, in the tools' folders even through a link to one."""
    folder, ckpt = trained
    (folder / "mtlc-cache").mkdir(exist_ok=True)
    if not (folder / "through-a-link").exists():
        (folder / "through-a-link").symlink_to(folder / "mtlc-cache", target_is_directory=True)
    target = folder / name
    res = invoke(evaluate, ["--ckpt", ckpt, "--predict", folder / "unlabeled" / "u0000.png", "--csv", target])
    assert res.exit_code == 2 and "writing it would replace it" in res.output, res.output
    assert not target.exists()


@pytest.mark.parametrize("option", ["--out", "--tensorboard"])
def test_no_run_writes_into_a_folder_the_tools_keep(trained, tmp_path, monkeypatch, option):
    """A training run's --out or --tensorboard in a decode cache, a work or staging folder, or
    $MTLC_CACHE_DIR reached through a link: refused before any work."""
    folder, _ = trained
    (tmp_path / "caches").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "caches", target_is_directory=True)
    monkeypatch.setenv("MTLC_CACHE_DIR", str(tmp_path / "link"))
    for place in (folder / "mtlc-cache" / "x", tmp_path / "r" / ".mtlc-next-mt", tmp_path / ".p.csv.mtlc-work",
                  tmp_path / "caches" / "k"):
        args = ["--out", tmp_path / "r"] if option == "--tensorboard" else []
        res = invoke(train_mt, ["--epochs", "1", option, place, *args])
        assert res.exit_code == 2 and "a folder the tools keep" in res.output, res.output
        assert not place.exists()


@pytest.mark.slow
def test_resume_continues_the_run_it_names(tmp_path, monkeypatch):
    """A run with --overwrite killed (its staging folder left), then a newer run killed in the folder
    itself: --resume refuses in one line naming both; a new run removes a stale staging folder, so that
    --resume then takes up that run."""
    from test_resume import MT_ARGS, interrupt_write
    out = tmp_path / "r"
    assert invoke(train_mt, [*MT_ARGS, "--out", out]).exit_code == 0
    interrupt_write(monkeypatch, "mt_last.pt", 2)
    assert invoke(train_mt, [*overriding(MT_ARGS, "--seed", "7"), "--overwrite", "--out", out]).exit_code != 0
    monkeypatch.undo()
    assert (staging_folder(out, "mt") / "mt_last.pt").exists()
    for name in ("mt.pt", "mt_final.pt", "mt_last.pt", "mt_metrics.jsonl"):
        (out / name).unlink()
    os.utime(staging_folder(out, "mt") / "mt_last.pt", (time.time() - 60,) * 2)  # the older run
    interrupt_write(monkeypatch, "mt_last.pt", 2)
    assert invoke(train_mt, [*overriding(MT_ARGS, "--seed", "2"), "--out", out]).exit_code != 0  # a new run: the staging goes
    monkeypatch.undo()
    assert not staging_folder(out, "mt").exists()
    result = invoke(train_mt, ["--resume", "--out", out])
    assert result.exit_code == 0 and f"resuming {out / 'mt_last.pt'}" in result.output, result.output
    assert torch.load(out / "mt_final.pt", weights_only=True)["config"]["seed"] == 2
    # Both left behind (as an older version could leave them): refused, naming both.
    staging_folder(out, "mt").mkdir()
    (staging_folder(out, "mt") / "mt_last.pt").write_bytes((out / "mt_last.pt").read_bytes())
    os.utime(staging_folder(out, "mt") / "mt_last.pt", (time.time() - 60,) * 2)
    result = invoke(train_mt, ["--resume", "--out", out])
    assert result.exit_code == 2 and "holds two interrupted runs" in result.output, result.output


@pytest.mark.slow
def test_a_csv_to_stdout_cut_by_a_file_size_limit_ends_with_a_whole_row(trained, tmp_path):
    """evaluate.py --predict > labels.csv where the file may hold 1 KiB: one line, exit 1, no
    traceback, and the file ends with a whole row (the torn one cut off)."""
    folder, ckpt = trained
    # First a run that may write: the folder's decode caches usable (another test's run, sealed under another
    # MTLC_CONFIG_DIR, may have left them not), so that only the CSV meets the limit.
    assert run("evaluate.py", "--ckpt", ckpt, "--predict", folder / "unlabeled").returncode == 0
    with open(tmp_path / "labels.csv", "wb") as f:  # a process of its own: the limit, and stdout a file of its own
        res = subprocess.run(["bash", "-c", 'ulimit -f 1 && exec "$@"', "limited", sys.executable, "evaluate.py",
                              "--ckpt", str(ckpt), "--predict", str(folder / "unlabeled")],
                             cwd=ROOT, stdout=f, stderr=subprocess.PIPE, text=True)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "cannot write standard output: File too large (the rows before it are whole)" in res.stderr
    data = (tmp_path / "labels.csv").read_bytes()
    assert 0 < len(data) <= 1024 and data.endswith(b"\r\n")
    rows = list(csv.reader(io.StringIO(data.decode(), newline="")))
    assert all(len(r) == len(rows[0]) for r in rows) and len(rows) < 25


@pytest.mark.slow
def test_tensorboard_on_a_full_disk_is_one_line_without_the_threads_traceback(tmp_path, monkeypatch, capfd):
    """The event file's writer thread meets a full disk: the run ends in one line naming the folder
    (exit 1), the epochs before it whole, and the thread's traceback is not printed."""
    from tensorboard.summary.writer import record_writer
    from test_resume import MT_ARGS
    calls = []

    def full(self, data):
        calls.append(1)
        if len(calls) > 3:  # the file's first records pass
            raise OSError(28, "No space left on device")
    monkeypatch.setattr(record_writer.RecordWriter, "write", full)
    result = invoke(train_mt, [*MT_ARGS, "--tensorboard", tmp_path / "tb", "--out", tmp_path / "r"])
    assert result.exit_code == 1, result.output
    assert f"cannot write {tmp_path / 'tb'}: No space left on device" in result.output
    assert "Traceback" not in result.output + capfd.readouterr().err
    assert (tmp_path / "r" / "mt_last.pt").exists()


def test_a_checkpoint_whose_network_has_other_outputs_than_its_classes_is_refused(trained, tmp_path):
    folder, ckpt = trained
    state = torch.load(ckpt, weights_only=True)
    torch.save(dict(state, model_args=dict(state["model_args"], num_classes=5)), tmp_path / "c.pt")
    for args in (["--json"], ["--predict", folder / "unlabeled"]):
        res = invoke(evaluate, ["--ckpt", tmp_path / "c.pt", *args])
        assert res.exit_code == 2 and "network's 5 outputs do not fit its 3 classes" in res.output, res.output


def test_each_image_is_predicted_once(trained, tmp_path):
    """A folder and a file in it, a folder twice, a folder and a folder in it: each image one row."""
    folder, ckpt = trained
    unlabeled = folder / "unlabeled"
    for args in ([unlabeled, unlabeled / "u0000.png"], [unlabeled, f"{unlabeled}/"], [unlabeled / "a", unlabeled]):
        res = invoke(evaluate, ["--ckpt", ckpt, "--predict", *args, "--csv", tmp_path / "p.csv"])
        assert res.exit_code == 0, res.output
        rows = read_rows((tmp_path / "p.csv").read_text())
        assert len(rows) == 24 == len({os.path.realpath(r["path"]) for r in rows})


@pytest.mark.parametrize("value", ["abc", "0", "-2", "²", "99999999999999999999", "2"])
def test_a_world_size_that_is_no_count_or_not_torchruns_is_one_line(tmp_path, value):
    """Anything but a count, or a count without torchrun's other variables (RANK, MASTER_ADDR, ...)."""
    res = run("train_mt.py", "--epochs", "1", "--out", tmp_path / "r", env=dict(WORLD_SIZE=value))
    assert res.returncode == 2 and "WORLD_SIZE" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_a_closed_stdout_is_one_line(trained):
    """A process started with fd 1 closed (Python then has no sys.stdout)."""
    folder, ckpt = trained
    res = subprocess.run(f"exec >&- ; {sys.executable} evaluate.py --ckpt {ckpt} --predict {folder / 'unlabeled'}",
                         shell=True, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    assert res.returncode == 1 and "cannot write standard output" in res.stderr and "Traceback" not in res.stderr


def test_resuming_a_finished_run_is_refused(tmp_path):
    from test_resume import MT_ARGS
    assert invoke(train_mt, [*MT_ARGS, "--out", tmp_path]).exit_code == 0
    res = invoke(train_mt, ["--resume", "--out", tmp_path])
    assert res.exit_code == 2 and "is a finished run (epoch 3 of 3): nothing to resume" in res.output, res.output
