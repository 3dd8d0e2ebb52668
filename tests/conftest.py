"""What the tests share: the project's root, running a script as a user would (in this process as a
fresh Python runs it, or as a process of its own where a test needs one) or by click's runner, the CSV
rows evaluate.py writes, a folder's files as bytes, the tiny trained run that the prediction and review
tests use, and a headless browser for the review pages."""
import csv
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Under pytest-xdist each worker takes a core: torch's OpenMP threads (one per core by default) would
# then be twice the cores, and they spin while they wait for each other (the suite took 1.4x as long).
# Set before torch is first imported here and in the scripts the tests start; a value given is kept.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")  # as the tools set for their one-thread children
import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402

import in_process  # noqa: E402
from fakedata import write_own_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# A head on a pretrained trunk trained in seconds on a small own-images folder (with --data-dir, --out);
# squashed as these tests' numbers were set (test_framing.py tests the trunk's own view).
BACKBONE_RUN = ["--dataset", "folder", "--backbone", "efficientnet-lite0", "--image-size", "32", "--framing", "squash",
                "--width", "0.25", "--labeled-batch", "6", "--epochs", "2", "--decay-epochs", "1", "--device", "cpu"]


def train_backbone_run(root, *options, **folder):
    """BACKBONE_RUN with `options` on an own-images folder root/d of 40 x 30 images (write_own_folder's
    `folder` counts) into root/run; its output."""
    import train_mt
    write_own_folder(root / "d", size=(40, 30), **folder)
    result = invoke(train_mt, [*BACKBONE_RUN, *options, "--data-dir", root / "d", "--out", root / "run"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def backbone_folder(tmp_path_factory):
    """A module's own-images folder (root/d) of 40 x 30 images, small enough to embed in seconds."""
    root = tmp_path_factory.mktemp("backbone")
    write_own_folder(root / "d", n_labeled=6, n_unlabeled=12, n_test=4, size=(40, 30))
    return root


def needs_backbone(name="efficientnet-lite0"):
    """Skip a test (or a module: pytestmark) where timm or a backbone's weights package is missing."""
    from mtlc.train.pretrained import BACKBONES
    return pytest.mark.skipif(importlib.util.find_spec("timm") is None
                              or importlib.util.find_spec(BACKBONES[name].package) is None,
                              reason="the backbone's packages are not installed (pip install -r requirements.txt)")
# The smallest training a test that checks files, lines and exit codes needs: digits at 16 x 16 pixels
# (a quarter of 32's compute), a network of width 1/16, on the CPU.
TINY_RUN = ["--image-size", "16", "--width", "0.0625", "--device", "cpu"]

# Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors; the variable must be
# set before triton is first imported (the kernels module imports it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def triton_importable():
    """Whether Triton imports here (it installs on Linux only; .ci/run also runs the tests without it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


needs_triton = pytest.mark.skipif(not triton_importable(), reason="Triton cannot be imported here (pip install triton)")


# The longest files first (longest-processing-time order): each xdist worker takes a file at a time in
# collection order, and a four-minute file taken last runs alone while the other worker idles (docs/suite.md).
LONGEST_FIRST = ("test_learning.py", "test_kernel_compile.py", "test_gpu_check.py", "test_pseudo_label_runs.py",
                 "test_distributed.py")


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker more than the cores. A worker often waits (on a script it started, a run it
    will interrupt, a file to appear) and the third keeps the cores busy meanwhile (docs/suite.md)."""
    return (os.cpu_count() or 1) + 1


def pytest_collection_modifyitems(items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def run(*args, env=None, timeout=None, limit_kb=None, cwd=ROOT):
    """python ARGS in cwd (the project's root), as a user runs it: (returncode, stdout, stderr), text with
    undecodable bytes kept as surrogate escapes. env: variables added; limit_kb: the largest file it may
    write (ulimit -f, KiB). One of the project's four scripts (train_mt.py, finetune_lc.py, evaluate.py,
    label.py) runs in this process as a fresh Python would run it (tests/in_process.py), with env for
    the run and a timeout where the test runs in the main thread; anything else (another script, -c), a
    limit, or an env that holds what a Python reads at its start (PYTHONIOENCODING, TRITON_INTERPRET, ...;
    in_process.RUN_TIME_VARIABLES lists what a run in this process may be given) is a process of its own."""
    if limit_kb is None and in_process.can_run(args, env, cwd):
        return in_process.run(args, env, timeout, cwd)
    command = [sys.executable, *map(str, args)]
    if limit_kb is not None:
        command = ["bash", "-c", f'ulimit -f {limit_kb} && exec "$@"', "limited", *command]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, errors="surrogateescape",
                          env=dict(os.environ, **(env or {})), timeout=timeout)


def overriding(base, *args):
    """base's options (each followed by its value, or a flag) but those args give again, then args: a
    test's own settings over a shared list, each option once (the scripts refuse one given twice)."""
    again = {a for a in args if isinstance(a, str) and a.startswith("--")}
    kept, k = [], 0
    while k < len(base):
        takes_value = k + 1 < len(base) and not str(base[k + 1]).startswith("--")
        if base[k] not in again:
            kept += base[k:k + 1 + takes_value]
        k += 1 + takes_value
    return [*kept, *args]


def invoke(command, args):
    """A script's click command run in this process by click's runner, as `python <script> ARGS` would
    (its output and exit code in click's Result); the worker's own state back after it (tests/in_process.py)."""
    with in_process.worker_state_kept():
        return CliRunner().invoke(command.main, [str(a) for a in args])


def read_rows(text, more=()):
    """The rows of evaluate.py --predict's CSV, checked to have its columns (`more` after them, then
    the hash of each row's image)."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    assert reader.fieldnames == ["path", "prediction", "confidence", "runner_up", *more, "blake2b"]
    return list(reader)


def resident_bytes(path):
    """The bytes of the file `path` that this process's memory maps hold resident (/proc/self/smaps)."""
    total, mine = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line: address range, ..., its path
                mine = len(head) >= 6 and head[5] == str(path)
            elif mine and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


def snapshot(folder, leave_out=("label-log.csv",)):
    """Every file's bytes (hashed) and every folder under folder, the label log left out."""
    files = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in folder.rglob("*") if p.is_file() and p.name not in leave_out}
    return files, {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_dir()}


def write_labels(path, rows, header=("path", "label")):
    """A labels CSV for label.py."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """Shared by the prediction and review-page tests: a tiny own-images folder (3 classes, 8 test
    images each) and an MT checkpoint trained on it."""
    root = tmp_path_factory.mktemp("predict")
    write_own_folder(root / "d", n_labeled=8, n_unlabeled=24, n_test=8)
    res = run("train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", root / "d", "--width", "0.125",
                     "--labeled-batch", "12", "--unlabeled-batch", "12", "--lr", "0.02", "--cons-weight", "10",
                     "--epochs", "4", "--decay-epochs", "2", "--device", "cpu", "--out", root / "run")
    assert res.returncode == 0, res.stderr
    result = json.loads(run("evaluate.py", "--ckpt", root / "run" / "mt_final.pt", "--json").stdout.splitlines()[-1])
    assert result["student_error"] != result["teacher_error"]  # half trained: the two models differ
    assert len({r["teacher_error"] for r in result["per_class"].values()}) > 1  # and so do the classes
    return root / "d", root / "run" / "mt_final.pt"


CHROMIUM, CHROMEDRIVER = shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver") or "/usr/bin/chromedriver"


def browser_missing():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if importlib.util.find_spec("selenium") is None:
        missing.append("the selenium package")
    return missing


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium driven by selenium, and the folder its downloads go to; skipped where there is
    none, except under MTLC_REQUIRE_BROWSER (CI), where it must run."""
    missing = browser_missing()
    if missing:
        if os.environ.get("MTLC_REQUIRE_BROWSER"):  # CI installs the browser: there it must run
            pytest.fail(f"MTLC_REQUIRE_BROWSER is set but {', '.join(missing)} is missing")
        pytest.skip(f"no browser to test the page in: {', '.join(missing)} missing (apt-get install chromium "
                    "chromium-driver; pip install selenium)")
    os.environ["SE_AVOID_STATS"] = "true"  # or Selenium Manager tries the internet
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver, downloads
    driver.quit()


def save_labels(driver, downloads):
    """Click a review page's Save and wait for its download: (the labels.csv path, its rows)."""
    from selenium.webdriver.common.by import By
    driver.find_element(By.ID, "save").click()
    saved = downloads / "labels.csv"
    for _ in range(100):
        if saved.exists() and saved.stat().st_size:
            break
        time.sleep(0.1)
    return saved, list(csv.DictReader(io.StringIO(saved.read_text())))
