"""Every laptop: the requirements resolve for macOS and Windows (uv evaluates their markers here),
native Windows is refused in one line before any work, worker processes start as the platform
starts them, and the device a run computes on is said where a faster one is there."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from mtlc.train import devices, forked

# The platforms a practitioner's laptop has, and whether Triton (Linux only) is among their packages.
PLATFORMS = {"aarch64-apple-darwin": False, "x86_64-pc-windows-msvc": False, "x86_64-unknown-linux-gnu": True}
OFFLINE = ("dns error", "Failed to fetch", "Could not connect", "error sending request", "timed out")


def resolved(platform):
    """(exit code, output) of uv resolving requirements.txt for another platform, or a skip where the
    package index cannot be reached (a machine offline; .ci/run requires it)."""
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", MACOSX_DEPLOYMENT_TARGET="14.0")
    done = subprocess.run([uv, "pip", "compile", "--python-platform", platform, "--python-version", "3.11",
                           "--no-header", "--quiet", str(ROOT / "requirements.txt")], capture_output=True, text=True,
                          env=env, timeout=300)
    if done.returncode and any(s in done.stderr for s in OFFLINE) and not os.environ.get("MTLC_REQUIRE_RESOLVER"):
        pytest.skip(f"the package index cannot be reached: {done.stderr.strip()[-200:]}")
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_requirements_install_on_macs_windows_and_linux_with_triton_on_linux_only(platform):
    code, output = resolved(platform)
    assert code == 0, output
    assert ("\ntriton==" in "\n" + output) == PLATFORMS[platform]


def test_intel_macs_are_not_promised_torch_has_no_wheel_for_them():
    code, output = resolved("x86_64-apple-darwin")
    assert code != 0 and "torch" in output


@pytest.mark.parametrize("script", ["train_mt.py", "finetune_lc.py", "evaluate.py", "label.py", "serve.py",
                                    "model.py"])
def test_native_windows_is_refused_in_one_line_that_names_wsl2_before_any_work(script, tmp_path):
    """Every entry point imports mtlc first thing; on native Windows that import ends the run."""
    code = ("import sys, runpy, click, cloup, numpy, torch\n"  # what they import before mtlc works on any platform
            f"sys.path.insert(0, {str(ROOT)!r})\nsys.platform = 'win32'\nsys.argv = [{script!r}, '--help']\n"
            f"runpy.run_path({str(ROOT / script)!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().count("\n") == 0 and "WSL2" in done.stderr, done.stderr


def test_worker_processes_start_as_the_platform_starts_them_and_count_cores_without_affinity(monkeypatch):
    for default, method in (("fork", "fork"), ("spawn", "spawn"), ("forkserver", "spawn")):
        monkeypatch.setattr(forked.multiprocessing, "get_context",
                            lambda method=None, d=default: type("Context", (), {"get_start_method": lambda s: d})())
        assert forked.start_method() == method
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS has none
    assert forked.usable_cores() == os.cpu_count()


def test_the_device_is_said_where_a_faster_one_is_there_and_an_apple_gpu_falls_back_to_the_cpu(monkeypatch):
    lines = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "mps_available", lambda: False)
    assert devices.pick_device("auto", lines.append) == torch.device("cpu") and lines == []  # nothing faster here
    monkeypatch.setattr(devices, "mps_available", lambda: True)
    assert devices.pick_device("auto", lines.append) == torch.device("cpu")
    assert devices.pick_device("cpu", lines.append) == torch.device("cpu")
    assert len(lines) == 2 and all("CPU" in line and "mps" in line for line in lines)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a laptop GPU")
    lines.clear()
    assert devices.pick_device("auto", lines.append) == torch.device("cuda")
    assert lines == ["computing on the GPU (a laptop GPU); --device cpu for the CPU"]
