"""A folder with few unlabeled images (label.py accepted the rest) keeps its default schedule in steps
without tiny epochs: each epoch is as many passes over the unlabeled set as make MIN_EPOCH_STEPS steps,
in both stages; an epoch asked for with --epochs stays one pass."""
import json

import finetune_lc
import train_mt
from conftest import invoke
from fakedata import write_own_folder
from mtlc.train.presets import MIN_EPOCH_STEPS

# lr 0.01 and fp32: at lr 0.05 in bf16 this tiny folder's FixMatch diverged on one machine (steps, not results, are tested)
SMALL = ["--dataset", "folder", "--backbone", "convlarge", "--width", "0.0625", "--lr", "0.01", "--precision", "fp32",
         "--labeled-batch", "6", "--unlabeled-batch", "12", "--device", "cpu"]


def steps_of(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_default_schedule_of_few_unlabeled_images_has_epochs_of_several_passes(tmp_path):
    write_own_folder(tmp_path / "d", n_unlabeled=30)  # 2 batches of 12 a pass
    run = tmp_path / "run"
    result = invoke(train_mt, [*SMALL, "--data-dir", tmp_path / "d", "--compress", "50", "--out", run])
    assert result.exit_code == 0, result.output
    assert f"epochs of {MIN_EPOCH_STEPS} steps" in result.output
    steps = steps_of(run / "mt_metrics.jsonl")
    assert steps == list(range(MIN_EPOCH_STEPS, steps[-1] + 1, MIN_EPOCH_STEPS)) and len(steps) == 10
    result = invoke(finetune_lc, ["--ckpt", run / "mt.pt", "--out", run])
    assert result.exit_code == 0, result.output
    lc = steps_of(run / "lc_metrics.jsonl")
    assert lc and lc[0] % MIN_EPOCH_STEPS == 0 and all(b - a == MIN_EPOCH_STEPS for a, b in zip(lc, lc[1:]))


def test_epochs_asked_for_are_one_pass_each(tmp_path):
    write_own_folder(tmp_path / "d", n_unlabeled=30)
    result = invoke(train_mt, [*SMALL, "--data-dir", tmp_path / "d", "--epochs", "2", "--decay-epochs", "1",
                               "--out", tmp_path / "run"])
    assert result.exit_code == 0, result.output
    assert "2+1 epochs of 2 steps (6 steps" in result.output
    assert steps_of(tmp_path / "run" / "mt_metrics.jsonl") == [2, 4, 6]
