"""--step-mode graphed on a CPU (the captured path runs uncaptured here; tools/gpu_check.py checks the
capture on a GPU): it computes the eager step given the same random draws, its guards stop a run at
the step the eager ones would, its SGD and EMA are torch's, and its runs resume exactly."""
import json

import pytest
import torch
from torch.overrides import TorchFunctionMode

import train_mt
from mtlc.data.datasets import load_digits
from mtlc.errors import TrainingFailed, UserError
from mtlc.train.graphed import DeviceGuards, GraphedSteps, resolve_step_mode
from mtlc.data.splits import balanced_split
from mtlc.train.settings import Stage
from mtlc.train.trainer import EagerSteps
from conftest import TINY_RUN, invoke, run
from fakedata import tiny_trainer
from tools.step_equivalence import compare_steps


@pytest.fixture(scope="module")
def digits():
    data = load_digits(image_size=16)
    labeled, unlabeled = balanced_split(data.train_y, 100, 10, seed=0)
    return data, labeled, unlabeled


def config(mode, **changes):
    return dict(dict(seed=3, labeled_batch=16, unlabeled_batch=64, dataset="digits", num_classes=10, width=0.0625,
                     bn_momentum=0.02, mean=[0.2] * 3, std=[0.3] * 3, precision="fp32", step_mode=mode), **changes)


MT = Stage(name="mt", epochs=2, decay_epochs=1, lr=0.05, ema=0.9, cons_weight=10.0, cons_rampup=1, eval_every=1,
           first_step=0)
# Stage 2 from step 40, LC ramping up, its lr decaying: every table column moves within the run.
LC = dict(name="lc", epochs=1, decay_epochs=1, lr=0.05, ema=0.9, cons_weight=10.0, cons_rampup=5, eval_every=1,
          first_step=40, lc_eps=1.0, lc_weight=2.0, lc_rampup=1)
SAME_PREDICTION = Stage(**LC, lc_eps_scale="relative", lc_eps_ratio=0.4, lc_loss_unit=2.0, lc_pairs="same-prediction")
# The pseudo-label objective: strong views, its threshold fixed or adaptive (a state the step updates).
FIXMATCH = dict(consistency="fixmatch", threshold=0.6, pseudo_labels="teacher", cons_weight=1.0)
ADAPTIVE = dict(FIXMATCH, threshold="adaptive", pseudo_labels="student")
# name: (stage, the run's objective)
STAGES = {"mt": (MT, {}),
          "lc fixed eps": (Stage(**LC), {}),
          "lc relative, same-prediction": (SAME_PREDICTION, {}),
          "lc true-class": (Stage(**LC, lc_pairs="true-class"), {}),
          "fixmatch, fixed threshold": (MT, FIXMATCH),
          "fixmatch, adaptive threshold, the student's pseudo-labels": (MT, ADAPTIVE),
          "fixmatch + lc relative, same-prediction, adaptive": (SAME_PREDICTION, dict(ADAPTIVE, pseudo_labels="teacher"))}


@pytest.mark.parametrize("name", list(STAGES))
def test_graphed_step_computes_the_eager_step(digits, name):
    """Every step from the same state, given the eager step's random draws (seeded as views() seeds
    them, every step): the graphed step gives the same losses, weights, teacher, BN running means and
    momentum, step after step and across an epoch's end (tools/step_equivalence.py, which the GPU
    check runs on replayed graphs). Tolerance 1e-5: the graphed step's lr is a float32 tensor (one
    rounding of the eager step's float), and this network amplifies a one-ulp change of one weight to
    1e-2 in the loss within 5 steps, so each step starts from the eager state."""
    data, labeled, unlabeled = digits
    stage, objective = STAGES[name]
    truth = dict(true_classes=data.train_y.clone()) if stage.lc_pairs == "true-class" else {}
    eager = tiny_trainer(data, labeled, unlabeled, config("eager", **objective), stage, **truth)
    graphed = tiny_trainer(data, labeled, unlabeled, config("graphed", **objective), stage, **truth)
    assert isinstance(eager.steps, EagerSteps) and isinstance(graphed.steps, GraphedSteps)
    worst = compare_steps(eager, graphed, graphed.steps_per_epoch + 3, rtol=1e-5, atol=1e-6)
    assert worst["losses"]["excess"] <= 0 and worst["state"]["excess"] <= 0, worst
    assert worst["state"]["max_abs_difference"] < 1e-5
    graphed.steps.end_epoch()
    if stage.name == "lc":
        assert graphed.reference_spread == pytest.approx(eager.reference_spread, rel=1e-5)


@pytest.mark.slow
def test_step_equivalence_tool_in_miniature():
    """What the GPU check runs on the lent card, on a CPU: both stages within fp32's tolerance, fresh
    draws every step, one JSON line."""
    res = run("tools/step_equivalence.py", "--device", "cpu", "--width", "0.0625", "--precision", "fp32",
              "--steps", "3", "--labeled-batch", "8", "--unlabeled-batch", "32")
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["mt"]["fresh_draws"] and result["lc"]["losses"]["excess"] <= 0
    assert result["fixmatch"]["fresh_draws"] and result["fixmatch"]["state"]["excess"] <= 0
    assert result["mt"]["captured"] is False  # a CPU runs the graphed step uncaptured


def test_graphed_epoch_draws_from_its_own_seed_and_sums_its_steps(digits):
    """Without the per-step seeds the augmentation and dropout draws are the epoch's own (seeded from
    (seed, epoch)): the same epoch twice gives the same sums, another seed other draws; the epoch's
    sums are those of its steps, and the images are BatchStream's."""
    data, labeled, unlabeled = digits

    def epoch_sums(seed):
        trainer = tiny_trainer(data, labeled, unlabeled, config("graphed", seed=seed), MT)
        trainer.steps.start_epoch(0)
        for step in range(trainer.steps_per_epoch):
            assert torch.equal(trainer.steps.tables.indices[step], trainer.batches.indices(step))
            trainer.steps.step(step)
        return trainer.steps.end_epoch()
    first, again, other = epoch_sums(3), epoch_sums(3), epoch_sums(4)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first[0] > 0 and torch.isfinite(first).all()


def test_graphed_views_draw_fresh_augmentations_every_step(digits):
    """The draws move on from step to step (the same image is shifted and flipped anew), with the
    statistics of views.augment: shifts uniform over 0..4 px, both views independent."""
    data, labeled, unlabeled = digits
    trainer = tiny_trainer(data, labeled, unlabeled, config("graphed", dataset="cifar10"), MT)
    steps = trainer.steps
    steps.start_epoch(0)
    indices = torch.zeros(16 + 64, dtype=torch.long)  # one image, so that only the draws differ
    views = [steps.views(indices) for _ in range(50)]
    first_views = torch.stack([v[0][0] for v in views])
    assert len({tuple(v.flatten()[:64].tolist()) for v in first_views}) > 10
    student, teacher = (torch.stack([v[i] for v in views]) for i in (0, 1))
    assert not torch.equal(student, teacher)


def test_guards_stop_at_the_step_the_eager_guards_stop_at(digits, monkeypatch):
    """A non-finite loss at step 5: both step modes stop naming step 5 (the graphed one when it reads
    its guards, at the epoch's end here), and the graphed guards name the earlier of a non-finite loss
    and a collapse."""
    data, labeled, unlabeled = digits
    failures = {}
    for mode in ("eager", "graphed"):
        trainer = tiny_trainer(data, labeled, unlabeled, config(mode), MT)
        real_schedule = trainer.schedule
        monkeypatch.setattr(trainer, "schedule", lambda step, real=real_schedule: (
            (real(step)[0], float("nan"), 0.0) if step == 5 else real(step)))
        trainer.steps.start_epoch(0)
        with pytest.raises(TrainingFailed) as failed:
            for step in range(trainer.steps_per_epoch):
                trainer.steps.step(step)
            trainer.steps.end_epoch()
        failures[mode] = failed.value.message
    for message in failures.values():
        assert "non-finite loss at step 5 (epoch 1 of stage mt)" in message and "cons=" in message
        assert "try a smaller --lr, or another --seed" in message


def test_device_guards_read_a_collapse_and_keep_the_reference_spread(digits):
    data, labeled, unlabeled = digits
    trainer = tiny_trainer(data, labeled, unlabeled, config("graphed"), STAGES["lc fixed eps"][0])
    guards = DeviceGuards(trainer)
    finite, parts = torch.tensor(1.0), torch.zeros(3)
    for step, spread in ((40, 2.0), (41, 0.021)):
        guards.observe(torch.tensor(step), finite, torch.tensor(spread), parts)
    guards.read()  # just above 1% of the first step's spread
    assert trainer.reference_spread == 2.0
    for step, spread in ((42, 0.019), (43, 0.001)):
        guards.observe(torch.tensor(step), finite, torch.tensor(spread), parts)
    with pytest.raises(TrainingFailed, match=r"collapse at step 42 \(epoch 1 of stage lc\).* fell to 0.019"):
        guards.read()
    guards = DeviceGuards(trainer)  # a reference restored from a checkpoint; a NaN loss first
    guards.observe(torch.tensor(44), torch.tensor(float("nan")), torch.tensor(0.5), torch.tensor([1.0, 2.0, 3.0]))
    guards.observe(torch.tensor(45), finite, torch.tensor(0.001), parts)
    with pytest.raises(TrainingFailed, match=r"non-finite loss at step 44 .*ce=1 cons=2 lc=3"):
        guards.read()


def test_both_steps_run_torchs_sgd_and_keep_the_same_checkpoint(digits):
    """The graphed step runs the trainer's own torch.optim.SGD, fused, its lr a device tensor filled each
    step; a checkpoint of either keeps the optimizer as the eager step leaves it (the last step's lr, a
    float, no fused kernel asked for), so that any step mode resumes it."""
    data, labeled, unlabeled = digits
    eager = tiny_trainer(data, labeled, unlabeled, config("eager"), MT)
    graphed = tiny_trainer(data, labeled, unlabeled, config("graphed"), MT)
    group = graphed.optimizer.param_groups[0]
    assert type(graphed.optimizer) is torch.optim.SGD and group["fused"] and group["lr"] is graphed.steps.lr
    for trainer in (eager, graphed):
        trainer.steps.start_epoch(0)
        for step in range(trainer.steps_per_epoch):
            trainer.steps.step(step)
        trainer.steps.end_epoch()
    assert float(graphed.steps.lr) == pytest.approx(eager.optimizer.param_groups[0]["lr"], rel=1e-7)
    kept = [t.state(1, t.steps_per_epoch, [])["optimizer"]["param_groups"] for t in (eager, graphed)]
    assert [{k: v for k, v in g.items() if k != "params"} for g in kept[0]] == \
        [{k: v for k, v in g.items() if k != "params"} for g in kept[1]]
    assert kept[0][0]["lr"] == eager.optimizer.param_groups[0]["lr"] and kept[0][0]["fused"] is None


def test_step_mode_resolution():
    cpu = torch.device("cpu")
    assert resolve_step_mode("auto", cpu, 1, 10) == "eager"  # a CPU keeps the eager step, bitwise as before
    assert resolve_step_mode("graphed", cpu, 1, 10) == "graphed"
    assert resolve_step_mode("auto", cpu, 2, 10) == "eager"
    with pytest.raises(UserError, match="several processes"):
        resolve_step_mode("graphed", cpu, 2, 10)


@pytest.mark.slow
def test_graphed_run_resumes_to_the_same_files(tmp_path, monkeypatch):
    """train_mt.py --step-mode graphed killed after its first epoch, then --resume: the files of an
    uninterrupted graphed run, bitwise."""
    from test_resume import MT_ARGS, MT_FILES, assert_same_run, interrupt_write
    args = [*MT_ARGS, "--step-mode", "graphed"]
    assert invoke(train_mt, [*args, "--out", tmp_path / "straight"]).exit_code == 0
    interrupt_write(monkeypatch, "mt_last.pt", 2)
    assert invoke(train_mt, [*args, "--out", tmp_path / "resumed"]).exit_code != 0
    monkeypatch.undo()
    result = invoke(train_mt, ["--resume", "--out", tmp_path / "resumed"])
    assert result.exit_code == 0, result.output
    assert_same_run(tmp_path / "straight", tmp_path / "resumed", MT_FILES)
    state = torch.load(tmp_path / "straight" / "mt.pt", weights_only=True)
    assert state["config"]["step_mode"] == "graphed"


@pytest.mark.slow
def test_graphed_benchmark_reports_its_mode_and_data_share(tmp_path):
    from test_perf import last_json, run
    res = run("train_mt.py", *TINY_RUN, "--benchmark", "2", "--step-mode", "graphed", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    result = last_json(res.stdout)
    assert result["step_mode"] == "graphed" and result["warmup"] == 5 and result["steps"] == 2
    assert result["sec_per_step"] > 0 and 0 < result["data_share"] < 1
    assert list(tmp_path.iterdir()) == []


class ReadsBack(TorchFunctionMode):
    """Raises on every torch call that brings a tensor's value to the host (a host sync on a GPU, and
    what a CUDA graph cannot capture) or that has a shape depending on values."""
    SYNCS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero",
             "masked_select", "unique", "unique_consecutive", "bincount", "argwhere"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.SYNCS or (name == "__getitem__" and any(
                isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in _flat(args[1:]))):
            raise AssertionError(f"the graphed step calls {name}: a host sync")
        return func(*args, **(kwargs or {}))


def _flat(items):
    for item in items:
        yield from (_flat(item) if isinstance(item, (tuple, list)) else (item,))


@pytest.mark.parametrize("name", list(STAGES))
def test_graphed_step_reads_nothing_back(digits, name):
    """The step the graph records never brings a value to the host: no .item(), no truth value of a
    tensor, no data-dependent shape (on a GPU each would be a sync, and fail the capture). The host
    reads the device only when the guards are read."""
    data, labeled, unlabeled = digits
    stage, objective = STAGES[name]
    truth = dict(true_classes=data.train_y.clone()) if stage.lc_pairs == "true-class" else {}
    trainer = tiny_trainer(data, labeled, unlabeled, config("graphed", **objective), stage, **truth)
    trainer.steps.start_epoch(stage.first_step)
    trainer.steps.step(stage.first_step)  # momentum buffers made, as the steps before a capture make them
    with ReadsBack():
        trainer.steps.body()
    with pytest.raises(AssertionError, match="tolist"), ReadsBack():  # the mode sees what it should
        trainer.steps.guards.read()


def test_a_failed_capture_warns_once_and_trains_on_uncaptured(digits, monkeypatch, capsys):
    """Where the GPU cannot record the step (a call that cannot be captured), the run says so once
    and goes on with the same step, uncaptured."""
    from mtlc.train import graphed
    data, labeled, unlabeled = digits
    trainer = tiny_trainer(data, labeled, unlabeled, config("graphed"), MT)
    attempts = []
    monkeypatch.setattr(GraphedSteps, "captures", property(lambda self: True))
    monkeypatch.setattr(graphed, "on_side_stream", lambda work: work())
    monkeypatch.setattr(graphed, "capture", lambda work: attempts.append(1) or (_ for _ in ()).throw(
        RuntimeError("operation not permitted when stream is capturing")))
    trainer.steps.start_epoch(0)
    for step in range(8):
        trainer.steps.step(step)
    sums = trainer.steps.end_epoch()
    assert attempts == [1] and trainer.steps.graph is None and trainer.steps.uncaptured == 8
    assert "could not be captured as a CUDA graph (RuntimeError: operation not permitted" in capsys.readouterr().err
    assert torch.isfinite(sums).all() and sums[0] > 0
