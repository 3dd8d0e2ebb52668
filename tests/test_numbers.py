"""Every number option refuses NaN, the infinities and a number too small to compute with, in one
line and before any work (click's FloatRange lets NaN through: a run trained to the end on --ema nan
and every tool then refused its checkpoints)."""
import pytest

import evaluate
import finetune_lc
import train_mt
from conftest import invoke

OPTIONS = [(train_mt, option) for option in ("--width", "--lr", "--ema", "--cons-weight", "--cons-rampup",
                                             "--bn-momentum", "--compress")]
OPTIONS += [(finetune_lc, option) for option in ("--eps", "--lam", "--lc-rampup", "--lr")]
OPTIONS += [(evaluate, "--max-error"), (train_mt, "--threshold")]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e-320"])
@pytest.mark.parametrize("script, option", OPTIONS, ids=lambda v: getattr(v, "__name__", v))
def test_a_number_option_refuses_what_is_no_number_to_compute_with(script, option, value, tmp_path):
    args = [option, value, "--out", tmp_path / "out"]
    if script is finetune_lc:
        args += ["--ckpt", tmp_path / "mt.pt"]
    elif script is evaluate:
        args = [option, value, "--ckpt", tmp_path / "mt.pt", "--predict", tmp_path]
    result = invoke(script, args)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) <= 4 and "Traceback" not in result.output  # click's usage, one line
    assert f"Invalid value for '{option}'" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("size", ["10000", "1025", "15"])
def test_an_image_size_no_network_here_uses_is_refused_before_any_work(size, tmp_path):
    """--image-size 10000 wrote a 10.8 GB decode cache before the trunk failed at it: bounded at both ends."""
    result = invoke(train_mt, ["--dataset", "folder", "--data-dir", tmp_path, "--image-size", size, "--out", tmp_path / "out"])
    assert result.exit_code == 2 and "Invalid value for '--image-size'" in result.output and "16<=x<=1024" in result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "mtlc-cache").exists()


def test_zero_and_ordinary_numbers_still_pass():
    from mtlc.train.options import Number
    assert Number(min=0).convert("0", None, None) == 0.0 and Number().convert("1e-300", None, None) == 1e-300
