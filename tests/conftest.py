import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fakedata import write_own_folder

ROOT = Path(__file__).resolve().parents[1]

# Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors; the variable must be
# set before triton is first imported (the kernels module imports it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def run_script(*args):
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """Shared by the prediction and review-page tests: a tiny own-images folder (3 classes, 8 test
    images each) and an MT checkpoint trained on it."""
    root = tmp_path_factory.mktemp("predict")
    write_own_folder(root / "d", n_labeled=8, n_unlabeled=24, n_test=8)
    res = run_script("train_mt.py", "--dataset", "folder", "--data-dir", root / "d", "--width", "0.125",
                     "--labeled-batch", "12", "--unlabeled-batch", "12", "--lr", "0.02", "--cons-weight", "10",
                     "--epochs", "4", "--decay-epochs", "2", "--device", "cpu", "--out", root / "run")
    assert res.returncode == 0, res.stderr
    result = json.loads(run_script("evaluate.py", "--ckpt", root / "run" / "mt_final.pt", "--json").stdout.splitlines()[-1])
    assert result["student_error"] != result["teacher_error"]  # half trained: the two models differ
    assert len({r["teacher_error"] for r in result["per_class"].values()}) > 1  # and so do the classes
    return root / "d", root / "run" / "mt_final.pt"
