"""A mean over runs holds alike runs only: a checkpoint file counts once (given twice, through a link,
or copied), runs that differ in more than their seeds stay in cells of their own, and the table says
what sets each cell apart."""
import json
import shutil

import pytest

import evaluate
from conftest import invoke, run
from fakedata import write_own_folder

TRAIN = ["train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--consistency", "mt", "--labeled-batch", "8", "--unlabeled-batch", "8",
         "--epochs", "2", "--decay-epochs", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs on one tiny folder: seeds 1 and 2 at width 0.125, seed 1 at width 0.25."""
    root = tmp_path_factory.mktemp("alike")
    write_own_folder(root / "d", n_labeled=4, n_unlabeled=12, n_test=3)
    for name, args in (("s1", ["--seed", "1", "--width", "0.125"]), ("s2", ["--seed", "2", "--width", "0.125"]),
                       ("wide", ["--seed", "1", "--width", "0.25"])):
        res = run(*TRAIN, *args, "--data-dir", root / "d", "--out", root / name)
        assert res.returncode == 0, res.stderr
    return root


def results(output):
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_a_file_given_twice_linked_or_copied_counts_once(runs, tmp_path):
    ckpt = runs / "s1" / "mt_final.pt"
    (tmp_path / "link.pt").symlink_to(ckpt)
    shutil.copyfile(ckpt, tmp_path / "copy.pt")
    res = invoke(evaluate, ["--ckpt", ckpt, "--ckpt", ckpt, "--ckpt", tmp_path / "link.pt", "--ckpt",
                            tmp_path / "copy.pt", "--table", tmp_path / "t.md"])
    assert res.exit_code == 0, res.output
    assert f"--ckpt {ckpt} is {ckpt} again: counted once" in res.output
    assert f"--ckpt {tmp_path / 'link.pt'} is {ckpt} again: counted once" in res.output
    assert "copy.pt is the run of" in res.output and "the same settings and seeds" in res.output
    assert "over 2 runs" not in res.output and "+- 0.00" not in res.output
    assert "(1) |" in (tmp_path / "t.md").read_text()


def test_runs_that_differ_in_more_than_their_seeds_stay_apart(runs, tmp_path):
    ckpts = [runs / name / "mt_final.pt" for name in ("s1", "s2", "wide")]
    res = invoke(evaluate, [*(a for c in ckpts for a in ("--ckpt", c)), "--table", tmp_path / "t.md", "--json"])
    assert res.exit_code == 0, res.output
    lines = results(res.output)
    per_run = {line["checkpoint"]: line for line in lines if "checkpoint" in line}
    assert per_run[str(ckpts[0])]["alike"] == per_run[str(ckpts[1])]["alike"] != per_run[str(ckpts[2])]["alike"]
    means = [line for line in lines if "runs" in line]
    assert [(m["runs"], m["setting"]) for m in means] == [(2, "folder, 12 labels [width 0.125]")], means
    table = (tmp_path / "t.md").read_text()
    assert "folder, 12 labels [width 0.125]" in table and "folder, 12 labels [width 0.25]" in table
    assert " (2) |" in table and " (1) |" in table


def test_alike_runs_share_a_cell_without_a_mark(runs, tmp_path):
    res = invoke(evaluate, ["--ckpt", runs / "s1" / "mt_final.pt", "--ckpt", runs / "s2" / "mt_final.pt", "--table",
                            tmp_path / "t.md"])
    assert res.exit_code == 0 and "over 2 runs" in res.output, res.output
    assert "[" not in (tmp_path / "t.md").read_text()
