"""--benchmark, --precision and --compile: what they print, write and change."""
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mtlc.train.model import Dropout, ModelConfig
from mtlc.train.networks import build_models
from mtlc.train.devices import resolve_precision
from mtlc.train.objectives.mean_teacher import consistency_loss
from mtlc.train.trainer import ema_update
import conftest
from conftest import ROOT, TINY_RUN

KEYS = {"sec_per_step", "images_per_sec", "gflops_per_sec", "data_share", "precision"}


def run(script, *args, cwd=ROOT):
    """python ROOT/SCRIPT ARGS started from cwd: a script finds the project wherever it is started."""
    return conftest.run(ROOT / script, *args, cwd=cwd)


def last_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_benchmark_writes_nothing_and_ends_with_json(tmp_path):
    res = run("train_mt.py", *TINY_RUN, "--benchmark", "2", "--precision", "fp32", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    result = last_json(res.stdout)
    assert KEYS <= set(result) and result["precision"] == "fp32" and result["steps"] == 2
    assert result["sec_per_step"] > 0 and 0 <= result["data_share"] < 1
    assert result["images_per_sec"] == pytest.approx(160 / result["sec_per_step"])
    # FLOPs counted by torch: a conv-large forward is 1.46 GFLOP per image at width 1 (docs/speed.md's
    # anchor: 935 GFLOP per step); at width 1/16 the 3x3 convs scale with width^2.
    assert 0 < result["gflops_per_sec"] * result["sec_per_step"] < 935 / 16 ** 2 * 2
    assert list(tmp_path.iterdir()) == []


def test_benchmark_full_width_flop_count():
    """The counted work of one step at the paper's width is 935 GFLOP (701 + 234), docs/speed.md's anchor."""
    student, _ = build_models(ModelConfig(num_classes=10, width=1.0), torch.device("meta"))
    with FlopCounterMode(display=False) as counter:
        student(torch.empty(160, 3, 32, 32, device="meta"))
    assert counter.get_total_flops() / 160 / 1e9 == pytest.approx(1.46, abs=0.01)


@pytest.mark.slow
def test_benchmark_with_out_writes_its_json(tmp_path):
    res = run("train_mt.py", *TINY_RUN, "--benchmark", "1", "--out", tmp_path / "b")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "b" / "mt_benchmark.json").read_text()) == last_json(res.stdout)
    res = run("train_mt.py", *TINY_RUN, "--benchmark", "1", "--out", tmp_path / "b")
    assert res.returncode == 2 and "--overwrite" in res.stderr  # no silent replacement


@pytest.mark.slow
def test_finetune_benchmark(tmp_path):
    res = run("train_mt.py", *TINY_RUN, "--unlabeled-batch", "256", "--epochs", "1", "--decay-epochs", "0",
              "--out", tmp_path)
    assert res.returncode == 0, res.stderr
    before = sorted(p.name for p in tmp_path.iterdir())
    res = run("finetune_lc.py", "--ckpt", tmp_path / "mt.pt", "--benchmark", "2", "--precision", "bf16",
              "--device", "cpu")
    assert res.returncode == 0, res.stderr
    result = last_json(res.stdout)
    assert result["stage"] == "lc" and result["precision"] == "bf16"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_auto_precision():
    assert resolve_precision("fp32", torch.device("cpu")) == "fp32"
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert resolve_precision("auto", torch.device("cpu")) == ("bf16" if native else "fp32")


def test_bf16_step_keeps_fp32_weights_and_losses():
    """Under bf16 the networks run in bf16, but weights, optimizer state and the EMA stay fp32."""
    student, teacher = build_models(ModelConfig(num_classes=10, width=0.0625, bn_momentum=0.02), torch.device("cpu"))
    x = torch.randn(8, 3, 32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z, logits = student(x)
    assert z.dtype == logits.dtype == torch.bfloat16  # no silent promotion back to fp32 between layers
    loss = consistency_loss(logits, logits.detach() * 0.5)
    assert loss.dtype == torch.float32
    loss.backward()
    ema_update(teacher, student, 0.9)
    assert all(p.dtype == torch.float32 for p in [*student.parameters(), *teacher.parameters()])
    assert all(p.grad.dtype == torch.float32 for p in student.parameters() if p.grad is not None)


@pytest.mark.slow
def test_compiled_model_matches_eager():
    """torch.compile gives the eager model's training-mode outputs and gradients. Dropout is off:
    compiled code draws its masks from its own generator, so masked runs differ by design."""
    torch.manual_seed(0)
    model, _ = build_models(ModelConfig(num_classes=10, width=0.0625, bn_momentum=0.02), torch.device("cpu"))
    x = torch.randn(16, 3, 32, 32)
    model.data_init(x)
    for m in model.modules():
        if isinstance(m, Dropout):
            m.p = 0.0
    results = []
    for forward in (model, torch.compile(model)):
        model.zero_grad()
        z, logits = forward(x)
        (z.sum() + logits.square().sum()).backward()
        results.append([z.detach(), logits.detach()] + [p.grad.clone() for p in model.parameters()])
    # Relative to each tensor's norm (2e-4 measured at worst): fused kernels reorder fp32 sums through 13
    # layers, and near-zero gradient entries differ by up to 4e-3 of themselves; a real mismatch is of order 1.
    for eager, compiled in zip(*results):
        assert (compiled - eager).norm() <= 1e-3 * eager.norm(), (compiled - eager).norm() / eager.norm()


@pytest.mark.slow
def test_compile_flag_trains(tmp_path):
    res = run("train_mt.py", *TINY_RUN, "--compile", "--benchmark", "1", "--precision", "fp32", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert last_json(res.stdout)["compile"] is True


def test_authors_pipeline_rebuilt_for_comparison():
    from tools import bench_pipeline
    result = bench_pipeline.authors_step_times(width=0.0625, workers=0, steps=2, warmup=1, labeled_batch=8, batch=24)
    assert result["pipeline"] == "authors" and result["sec_per_step"] > 0 and 0 < result["data_share"] < 1
