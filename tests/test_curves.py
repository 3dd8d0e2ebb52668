"""--tensorboard: the numbers of <stage>_metrics.jsonl as TensorBoard curves, both stages on one step
axis, each step once after a kill and --resume, nothing written without the flag."""
import pytest

import finetune_lc
import train_mt
from mtlc.train.curves import scalars, tag
from mtlc.disk.runs import read_metrics
from conftest import invoke, overriding
from test_resume import LC_ARGS, MT_ARGS, interrupt_write


def curves(folder):
    """{tag: [(step, value)]} of the TensorBoard events in a folder, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(folder))
    events.Reload()
    return {name: [(e.step, e.value) for e in events.Scalars(name)] for name in events.Tags()["scalars"]}


def assert_curves_are_the_metrics(folder, metrics_path):
    records = read_metrics(metrics_path)
    found = curves(folder)
    expected = {}
    for record in records:
        for name, value in scalars(record).items():
            expected.setdefault(name, []).append((record["step"], value))
    assert set(found) == set(expected)
    for name, points in expected.items():
        assert [s for s, _ in found[name]] == [s for s, _ in points], name  # each step once, in order
        assert [v for _, v in found[name]] == pytest.approx([v for _, v in points], rel=1e-6), name


def test_tags_group_the_records_keys():
    record = dict(stage="lc", epoch=2, step=30, global_epoch=5.0, loss=1.0, ce=0.5, lr=0.05, lc_weight=2.0,
                  teacher_error=12.5, neighbour_fraction=0.1, all_neighbours=False, time_s=1.5, warnings=["w"])
    assert scalars(record) == {"loss/loss": 1.0, "loss/ce": 0.5, "schedule/lr": 0.05, "schedule/lc_weight": 2.0,
                               "error/teacher_error": 12.5, "lc/neighbour_fraction": 0.1, "lc/all_neighbours": 0.0,
                               "time/epoch_seconds": 1.5, "epoch/global_epoch": 5.0}
    assert tag("d2_ratio") == "lc/d2_ratio"


@pytest.mark.slow
def test_both_stages_write_their_metrics_as_curves_on_one_axis(tmp_path):
    out, tb = tmp_path / "run", tmp_path / "tb"
    assert invoke(train_mt, [*MT_ARGS, "--out", out, "--tensorboard", tb / "mt"]).exit_code == 0
    result = invoke(finetune_lc, ["--ckpt", out / "mt.pt", *LC_ARGS, "--out", out / "lc", "--tensorboard", tb / "lc"])
    assert result.exit_code == 0, result.output
    assert_curves_are_the_metrics(tb / "mt", out / "mt_metrics.jsonl")
    assert_curves_are_the_metrics(tb / "lc", out / "lc" / "lc_metrics.jsonl")
    mt_steps = [s for s, _ in curves(tb / "mt")["loss/loss"]]
    lc_steps = [s for s, _ in curves(tb / "lc")["loss/loss"]]
    assert lc_steps[0] > mt_steps[1]  # stage 2 goes on from mt.pt's step (after epoch 2) on the same axis
    assert "lc/neighbour_fraction" in curves(tb / "lc") and "error/teacher_error" in curves(tb / "mt")


@pytest.mark.slow
def test_a_resumed_run_writes_each_step_once(tmp_path, monkeypatch):
    """Killed while writing epoch 3's checkpoint (epochs 1 and 2 already in the curves), resumed with
    the same --tensorboard: epoch 2 is written again over its purged events and epoch 3 once; without
    the flag no events at all."""
    interrupt_write(monkeypatch, "mt_last.pt", 3)
    assert invoke(train_mt, [*MT_ARGS, "--out", tmp_path / "run", "--tensorboard", tmp_path / "tb"]).exit_code != 0
    assert [s for s, _ in curves(tmp_path / "tb")["loss/loss"]] == [s for s in sorted({
        r["step"] for r in read_metrics(tmp_path / "run" / "mt_metrics.jsonl")})]
    monkeypatch.undo()
    result = invoke(train_mt, ["--resume", "--out", tmp_path / "run", "--tensorboard", tmp_path / "tb"])
    assert result.exit_code == 0, result.output
    assert_curves_are_the_metrics(tmp_path / "tb", tmp_path / "run" / "mt_metrics.jsonl")
    assert invoke(train_mt, [*MT_ARGS, "--out", tmp_path / "plain"]).exit_code == 0
    assert not list(tmp_path.glob("plain/**/events.out.tfevents*"))


def test_tensorboard_folder_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "tb").write_text("not a folder")
    result = invoke(train_mt, [*overriding(MT_ARGS, "--epochs", "1", "--decay-epochs", "0"), "--out", tmp_path / "run",
                               "--tensorboard", tmp_path / "tb"])
    assert result.exit_code == 2 and "tb" in result.output
    assert (tmp_path / "tb").read_text() == "not a folder"


@pytest.mark.slow
def test_a_resumed_run_writes_curves_only_where_its_command_says(tmp_path, monkeypatch):
    """The folder a checkpoint names is not a place to write (the checkpoint may be someone else's):
    --resume without --tensorboard writes no curves and says where the run wrote them."""
    interrupt_write(monkeypatch, "mt_last.pt", 2)
    assert invoke(train_mt, [*MT_ARGS, "--out", tmp_path / "run", "--tensorboard", tmp_path / "tb"]).exit_code != 0
    before = sorted(p.name for p in (tmp_path / "tb").iterdir())
    monkeypatch.undo()
    result = invoke(train_mt, ["--resume", "--out", tmp_path / "run"])
    assert result.exit_code == 0 and "this run wrote TensorBoard curves to" in result.output, result.output
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == before


def test_a_tensorboard_folder_that_is_a_link_or_a_pipe_is_refused_before_any_work(tmp_path):
    import os
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(tmp_path / "pipe")
    for name in ("link", "pipe"):
        result = invoke(train_mt, [*MT_ARGS, "--out", tmp_path / "run", "--tensorboard", tmp_path / name])
        assert result.exit_code == 2 and "not a folder" in result.output, result.output
    assert not list((tmp_path / "elsewhere").iterdir()) and not (tmp_path / "run").exists()


def test_a_damaged_record_to_resume_from_is_one_line(tmp_path):
    from mtlc.train.curves import TensorBoardCurves
    from mtlc.errors import UserError
    for step in ("abc", float("nan"), 10 ** 30, True):
        with pytest.raises(UserError, match="damaged"):
            TensorBoardCurves(tmp_path / "tb", dict(step=step, loss=1.0))
    assert scalars(dict(step=1, loss=10 ** 400, ce=0.5)) == {"loss/ce": 0.5}  # no float holds that number


@pytest.mark.parametrize("value, message", [("nan", "'nan' is not a finite number"), ("inf", "'inf' is not a finite number")])
def test_compress_must_be_a_number_of_times(tmp_path, value, message):
    result = invoke(train_mt, [*MT_ARGS, "--out", tmp_path / "run", "--compress", value])
    assert result.exit_code == 2 and message in result.output and not (tmp_path / "run").exists()
