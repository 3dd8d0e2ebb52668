"""`pip install .` gives a researcher the package and the LC loss for their own training loop (as
mtlc.kernels), and installs no name it does not own: built from pyproject.toml into a folder of its
own and used from elsewhere, where this checkout is not on the path; and into a fresh virtual
environment beside PyPI's package `kernels`, which keeps its own files."""
import os
import subprocess
import sys
import venv

import pytest

from conftest import ROOT

USE = """
import pathlib, sys, torch
import mtlc
from mtlc.kernels import lc_loss, lc_loss_reference
import mtlc.train.lc
assert mtlc.train.lc.lc_loss is lc_loss
for module in (mtlc, mtlc.kernels):
    assert pathlib.Path(sys.argv[1]) in pathlib.Path(module.__file__).parents, module.__file__
a, b = torch.randn(6, 16, requires_grad=True), torch.randn(24, 16, requires_grad=True)
loss = lc_loss(a, b, 2.0, impl="torch")
loss.backward()
torch.testing.assert_close(loss, lc_loss_reference(a.detach(), b.detach(), 2.0))
from mtlc.use.review import ASSETS
assert (ASSETS / "page.html").is_file() and callable(mtlc.load)
print("ok")
"""
# PyPI's `kernels` (compute kernels from a hub), the package whose name a top-level kernels/ would take.
PYPI_KERNELS = "kernels==0.17.2"


def pip(python, *args, cwd):
    """This environment's pip acting on `python`'s (pip --python): a fresh environment needs no pip of its own."""
    return subprocess.run([sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check",
                           *map(str, args)], capture_output=True, text=True, cwd=cwd)


@pytest.mark.slow
def test_pip_install_gives_the_package_and_the_loss_and_only_its_own_names(tmp_path):
    target = tmp_path / "site"
    res = pip(sys.executable, "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "--target",
              target, ROOT, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    top = sorted(p.name for p in target.iterdir() if not p.name.endswith((".dist-info", ".egg-info")))
    assert top == ["mtlc"], top  # no top-level kernels, tests or tools
    assert sorted(p.name for p in (target / "mtlc" / "kernels").glob("*.py")) == [
        "__init__.py", "lc_loss.py", "lc_loss_torch.py", "lc_loss_triton.py", "reference.py"]
    env = dict(os.environ, PYTHONPATH=str(target))
    res = subprocess.run([sys.executable, "-c", USE, target], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


@pytest.mark.slow
def test_installed_beside_pypis_kernels_in_a_fresh_environment(tmp_path):
    """A fresh virtual environment holding PyPI's `kernels`, then this project: PyPI's files stay
    (`import kernels` is still theirs), this project's loss is mtlc.kernels, and uninstalling this
    project leaves theirs. torch and the rest come from this environment's site-packages (a .pth read
    after the fresh environment's own, so that theirs comes first)."""
    env_dir = tmp_path / "fresh"
    venv.create(env_dir)
    python = str(env_dir / "bin" / "python")
    res = pip(python, "install", "--quiet", "--no-deps", PYPI_KERNELS, cwd=tmp_path)
    if res.returncode != 0:
        pytest.skip(f"PyPI cannot be reached for {PYPI_KERNELS}: {res.stderr.strip().splitlines()[-1:]}")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True).stdout.strip()
    ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True).stdout.strip()
    theirs = (os.path.join(site, "kernels", "__init__.py"))
    before = open(theirs, "rb").read()
    with open(os.path.join(site, "zz-the-tests-torch.pth"), "w") as f:
        f.write(ours + "\n")
    res = pip(python, "install", "--quiet", "--no-deps", ROOT, cwd=tmp_path)  # built as pip builds it: isolated
    assert res.returncode == 0, res.stderr
    assert open(theirs, "rb").read() == before  # PyPI's kernels untouched
    where = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('kernels').origin)"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert where.stdout.strip() == theirs, where.stderr
    res = subprocess.run([python, "-c", USE, site], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    assert pip(python, "uninstall", "--yes", "mtlc", cwd=tmp_path).returncode == 0
    assert open(theirs, "rb").read() == before and not os.path.exists(os.path.join(site, "mtlc"))
