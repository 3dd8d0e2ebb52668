"""An option that would do nothing is refused in one line before any work: --model with --audit or
with only --curves --plot, --data-dir/--json/--device with only --curves --plot, --seed on a plain
evaluation; and an option given twice, whose first value click would drop, in every script."""
import pytest

import evaluate
import finetune_lc
import label
import train_mt
from conftest import invoke


@pytest.fixture
def curves(tmp_path):
    (tmp_path / "mt_metrics.jsonl").write_text('{"epoch": 1, "loss": 1.0}\n')
    return ["--curves", tmp_path / "mt_metrics.jsonl", "--plot", tmp_path / "c.png"]


@pytest.mark.parametrize("extra, message", [
    (["--model", "student"], "--model goes with --ckpt"),
    (["--data-dir", "."], "--data-dir goes with --ckpt"),
    (["--json"], "--json goes with --ckpt"),
    (["--device", "cpu"], "--device goes with --ckpt"),
])
def test_options_of_checkpoints_with_only_curves_are_refused(curves, tmp_path, extra, message):
    result = invoke(evaluate, [*curves, *extra])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "c.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--audit", "audit.csv", "--model", "student"], "--model does nothing with --audit: leave it out"),
    (["--seed", "3"], "--seed goes with --tsne or --suggest or --audit"),
    (["--predict", ".", "--order", "random"], "--order goes with --suggest"),
])
def test_options_a_job_does_not_read_are_refused(tmp_path, args, message):
    result = invoke(evaluate, ["--ckpt", tmp_path / "missing.pt", *[tmp_path / a if a.endswith(".csv") else a
                                                                   for a in args]])
    assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.parametrize("script, args, option", [
    (evaluate, ["--ckpt", "a.pt", "--predict", ".", "--csv", "a.csv", "--csv", "b.csv"], "--csv is given 2 times"),
    (evaluate, ["--ckpt", "a.pt", "--predict", ".", "--max-error", "1", "--max-error=20"], "--max-error is given 2 times"),
    (train_mt, ["--dataset", "digits", "--epochs", "1", "--epochs", "2", "--epochs", "3"], "--epochs is given 3 times"),
    (finetune_lc, ["--ckpt", "a.pt", "--lam", "1", "--lam", "2"], "--lam is given 2 times"),
    (label, ["--data-dir", "d", "--apply", "a.csv", "--apply", "b.csv"], "--apply is given 2 times"),
])
def test_an_option_given_twice_is_refused(tmp_path, script, args, option):
    result = invoke(script, [*args, "--out", tmp_path / "out"] if script in (train_mt, finetune_lc) else args)
    assert result.exit_code == 2 and f"{option}: give it once" in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_options_that_take_many_values_take_them(tmp_path):
    result = invoke(evaluate, ["--ckpt", tmp_path / "a.pt", "--ckpt", tmp_path / "b.pt"])
    assert result.exit_code == 2 and "given 2 times" not in result.output and "does not exist" in result.output
