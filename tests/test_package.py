"""`pip install .` gives a researcher the package and the LC loss for their own training loop: built
from pyproject.toml into a folder of its own and used from elsewhere, where this checkout is not on
the path."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

USE = """
import pathlib, sys, torch
import kernels, mtlc
from kernels import lc_loss, lc_loss_reference
for module in (kernels, mtlc):
    assert pathlib.Path(sys.argv[1]) in pathlib.Path(module.__file__).parents, module.__file__
a, b = torch.randn(6, 16, requires_grad=True), torch.randn(24, 16, requires_grad=True)
loss = lc_loss(a, b, 2.0, impl="torch")
loss.backward()
torch.testing.assert_close(loss, lc_loss_reference(a.detach(), b.detach(), 2.0))
from mtlc.review import ASSETS
assert (ASSETS / "page.html").is_file() and callable(mtlc.load)
print("ok")
"""


@pytest.mark.slow
def test_pip_install_gives_the_package_and_the_loss(tmp_path):
    target = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", target, ROOT], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert not list(target.glob("tests")) and not list(target.glob("tools"))  # only the library goes
    env = dict(os.environ, PYTHONPATH=str(target))
    res = subprocess.run([sys.executable, "-c", USE, target], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
