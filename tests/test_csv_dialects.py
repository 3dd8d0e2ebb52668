"""Every CSV reader of the project reads the same dialects (a UTF-8 BOM, Excel's UTF-16 "Unicode
text" with tabs, Excel's quoting) and refuses a path given two values, naming it: the --truth file
as label.py's labels file."""
import json

import pytest

import evaluate
from conftest import invoke
from fakedata import write_own_folder
from mtlc.data.datasets import load_dataset
from mtlc.data.splits import true_classes
from mtlc.errors import UserError
from test_folders import write_truth


def truth_rows(n_unlabeled=30):
    return [(f"unlabeled/{('', 'a/', 'a/b/')[i % 3]}u{i:04d}.png", ("cat", "dog", "owl")[i % 3])
            for i in range(n_unlabeled)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("dialects")
    write_own_folder(root / "d")
    return root, load_dataset("folder", root / "d", echo=lambda *a, **k: None)


@pytest.mark.parametrize("dialect", ["plain", "bom", "utf16-tabs", "quoted-crlf"])
def test_the_truth_file_reads_every_dialect_the_labels_file_does(folder, dialect):
    root, data = folder
    write_truth(root / "plain.csv")
    expected = true_classes(data, root / "plain.csv")
    rows = truth_rows()
    if dialect == "bom":
        payload = ("\ufeffpath,class\n" + "".join(f"{p},{c}\n" for p, c in rows)).encode("utf-8")
    elif dialect == "utf16-tabs":
        payload = ("path\tclass\r\n" + "".join(f"{p}\t{c}\r\n" for p, c in rows)).encode("utf-16")
    else:
        payload = ('"path","class"\r\n' + "".join(f'"{p}","{c}"\r\n' for p, c in rows)).encode()
    if dialect == "plain":
        payload = (root / "plain.csv").read_bytes()
    (root / f"{dialect}.csv").write_bytes(payload)
    assert true_classes(data, root / f"{dialect}.csv").tolist() == expected.tolist()


def test_a_path_given_two_classes_is_refused_naming_it(folder):
    root, data = folder
    write_truth(root / "twice.csv")
    with open(root / "twice.csv", "a") as f:
        f.write("unlabeled/u0000.png,cat\n")   # the same class again: one value
    true_classes(data, root / "twice.csv")
    with open(root / "twice.csv", "a") as f:
        f.write("unlabeled/u0000.png,dog\n")
    with pytest.raises(UserError, match=r"gives 'unlabeled/u0000.png' two values: 'cat' on line 2 and 'dog' on "
                                        r"line 33"):
        true_classes(data, root / "twice.csv")


def test_a_truth_file_without_its_columns_says_which_it_needs(folder):
    root, data = folder
    (root / "columns.csv").write_text("file,label\nunlabeled/u0000.png,cat\n")
    with pytest.raises(UserError, match="must have the columns path,class"):
        true_classes(data, root / "columns.csv")


def test_evaluate_refuses_a_truth_file_with_a_path_given_two_classes(trained, tmp_path):
    data, ckpt = trained
    write_truth(tmp_path / "truth.csv", n_unlabeled=24)
    good = invoke(evaluate, ["--ckpt", ckpt, "--pool-error", "--truth", tmp_path / "truth.csv", "--json"])
    assert good.exit_code == 0, good.output
    assert json.loads(good.output.strip().splitlines()[-1])["n_pool"] == 24
    with open(tmp_path / "truth.csv", "a") as f:
        f.write("unlabeled/u0003.png,owl\n")
    bad = invoke(evaluate, ["--ckpt", ckpt, "--pool-error", "--truth", tmp_path / "truth.csv"])
    assert bad.exit_code == 2 and "'unlabeled/u0003.png' two values: 'cat'" in bad.output, bad.output
