"""Every CSV the project writes reads back as written, for any name a file system allows: a name
holding a carriage return, a newline, both, a quote or a comma is one field of one row, and the
file that holds it is still one label.py and serve.py take (the labels file of serve.py wrote such
a name unquoted, so that every later label was refused)."""
import csv
import io
from pathlib import Path

import pytest

from mtlc.disk.console import path_text
from mtlc.label import kept_labels
from mtlc.label.inputs import read_labels
from mtlc.label.log import Log, log_rows
from mtlc.use.audit import AUDIT_HEADER, Finding, write_audit
from mtlc.use.classifier import Prediction
from mtlc.use.prediction_rows import write_rows
from mtlc.use.report import write_table

NAMES = ["unlabeled/a\rb.png", "unlabeled/a\nb.png", "unlabeled/a\r\nb.png", 'unlabeled/a"b.png',
         "unlabeled/a,b.png", "unlabeled/end\r", "unlabeled/plain.png"]
DIGEST = "0" * 32


def read_back(path):
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        return list(csv.reader(f))


def test_the_labels_file_serve_keeps_reads_back_and_label_py_takes_it(tmp_path):
    path = tmp_path / "label-studio-labels.csv"
    rows = {name: ("cat", DIGEST) for name in NAMES}
    path.write_bytes(kept_labels.csv_bytes(rows))
    assert kept_labels.read_rows(path) == rows  # serve.py starts on it again
    labels, export = read_labels(path)
    assert export is None and sorted((r.path, r.label, r.digest) for r in labels) == sorted(
        (name, "cat", DIGEST) for name in NAMES)


def test_the_predictions_csv_reads_back(tmp_path):
    path = tmp_path / "predictions.csv"
    with open(path, "wb") as f:
        text = path_text(f)
        write_rows(text, [Prediction(Path(name), "cat", 0.9, "dog", digest=DIGEST) for name in NAMES], threshold=0.5)
        text.flush()
    assert [row[0] for row in read_back(path)[1:]] == NAMES
    assert [r.path for r in read_labels(path, accepted=True)[0]] == NAMES  # label.py --apply --accepted


def test_the_audit_csv_reads_back(tmp_path):
    path = tmp_path / "audit.csv"
    write_audit(path, [Finding("duplicate", name, 1.0, NAMES[(k + 1) % len(NAMES)], digest=DIGEST)
                       for k, name in enumerate(NAMES)])
    rows = read_back(path)
    assert tuple(rows[0]) == AUDIT_HEADER and [(r[1], r[3]) for r in rows[1:]] == [
        (name, NAMES[(k + 1) % len(NAMES)]) for k, name in enumerate(NAMES)]


def test_label_pys_log_reads_back(tmp_path):
    log = Log(tmp_path, echo=lambda line: None)
    for name in NAMES:
        log.write(1, "move", name, "labeled/cat/" + name.split("/")[-1], "cat", DIGEST)
    log.close()
    assert [row["source"] for row in log_rows(tmp_path, checked=False)] == NAMES


@pytest.mark.parametrize("setting", ["250 labels, seed 1", 'a "quoted" one', "two\r\nlines"])
def test_the_results_table_reads_back(tmp_path, setting, monkeypatch):
    from mtlc.use import report
    row = dict(method="MT", setting=setting, runs=3, student_mean=1.5, student_std=0.1, teacher_mean=1.2,
               teacher_std=0.2)
    monkeypatch.setattr(report, "results_table", lambda results: (["MT"], [setting], [row]))
    write_table(tmp_path / "table.csv", [])
    rows = read_back(tmp_path / "table.csv")
    assert rows[1][:3] == ["MT", setting, "3"] and len(rows) == 2
