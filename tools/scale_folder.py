"""What tools/bench_scale.py and tools/bench_loop.py share: the synthetic folder of many small JPEGs
(noise plus a shape per class, made with PIL) and the measurement of one part as its own process
(wall time, peak memory, the end of its output)."""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import click
import numpy as np

ROOT = Path(__file__).resolve().parents[1]  # the project's root: the scripts run there
CLASSES = 10
LABELED_PER_CLASS, TEST_PER_CLASS, PER_FOLDER = 20, 10, 1000


def draw(args):
    """JPEGs of noise plus a shape whose kind and colour follow the class, one folder's worth."""
    from PIL import Image, ImageDraw
    folder, names, classes, size, seed = args
    rng = np.random.default_rng(seed)
    Path(folder).mkdir(parents=True, exist_ok=True)
    for name, c in zip(names, classes):
        img = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
        pen = ImageDraw.Draw(img)
        box = sorted(rng.integers(0, size, 2)) + sorted(rng.integers(0, size, 2))
        box = [box[0], box[2], max(box[1], box[0] + 2), max(box[3], box[2] + 2)]
        colour = tuple(int(v) for v in (40 + 20 * c, 255 - 20 * c, 128 + 12 * (c % 5)))
        (pen.ellipse if c % 2 else pen.rectangle)(box, fill=colour)
        img.save(Path(folder) / name, quality=90)


def make_folder(folder, n_unlabeled, size):
    """folder/labeled/c<k>/, folder/unlabeled/<shard of 1,000>/, folder/test/c<k>/ (skipped if there)."""
    done = folder / "complete"
    if done.exists():
        return
    jobs = []
    for part, per_class in (("labeled", LABELED_PER_CLASS), ("test", TEST_PER_CLASS)):
        for c in range(CLASSES):
            jobs.append((folder / part / f"c{c}", [f"{i:04d}.jpg" for i in range(per_class)], [c] * per_class, size,
                         hash((part, c)) % 2**32))
    for start in range(0, n_unlabeled, PER_FOLDER):
        count = min(PER_FOLDER, n_unlabeled - start)
        jobs.append((folder / "unlabeled" / f"{start // PER_FOLDER:04d}", [f"{start + i:07d}.jpg" for i in range(count)],
                     [(start + i) % CLASSES for i in range(count)], size, start))
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        for k, _ in enumerate(pool.map(draw, jobs)):
            if k % 50 == 0:
                print(f"  made {k}/{len(jobs)} folders of {folder}", file=sys.stderr, flush=True)
    done.touch()


def memory(pid):
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile") if k in fields}


def measure(name, args, env=None, cwd=ROOT, allowed=(0,)):
    """Run a command (in cwd: the code measured); its wall time, peak RSS (the kernel's ru_maxrss),
    peak RssAnon and RssFile (sampled every 0.1 s) and the end of its stdout and stderr. An exit code
    outside `allowed` ends the benchmark."""
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    with open(os.devnull, "rb") as stdin, tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(args, cwd=cwd, stdin=stdin, stdout=out, stderr=err, env=dict(os.environ, **(env or {})))
        peaks, running = {"RssAnon": 0, "RssFile": 0}, [True]

        def sample():
            while running[0]:
                try:
                    for k, v in memory(proc.pid).items():
                        peaks[k] = max(peaks[k], v)
                except (OSError, ValueError):
                    pass
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak, which Popen.wait would not report
        wall = time.perf_counter() - start
        running[0] = False
        sampler.join()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if os.waitstatus_to_exitcode(status) not in allowed:
        raise click.ClickException(f"{name} failed ({os.waitstatus_to_exitcode(status)}): {stderr[-2000:]}")
    record = dict(wall_s=round(wall, 2), peak_rss_mb=round(usage.ru_maxrss / 1024),
                  peak_rss_anon_mb=round(peaks["RssAnon"] / 2**20), peak_rss_file_mb=round(peaks["RssFile"] / 2**20),
                  stdout_tail=stdout.strip().splitlines()[-3:], stderr_tail=stderr.strip().splitlines()[-8:],
                  load_average=[round(load_before, 2), round(os.getloadavg()[0], 2)])  # another job on the cores shows here
    print(f"{name}: {json.dumps(record)}", file=sys.stderr, flush=True)
    return record


def last_json(record):
    return json.loads(record["stdout_tail"][-1])


MODEL_ALONE = """
import sys, time, json, torch
from mtlc.train.checkpoints import load_checkpoint, restore_models
from mtlc.data.datasets import load_dataset
from mtlc.data.views import normalization
from mtlc.train.inference import outputs
state = load_checkpoint(sys.argv[1])
_, teacher = restore_models(state, torch.device("cpu"))
data = load_dataset("folder", sys.argv[2], image_size=int(sys.argv[3]), echo=lambda line: None)
mean, std = normalization(state["config"])
t = time.perf_counter()
n = len(outputs(teacher, data.train_x[:int(sys.argv[4])], mean, std)[1])
print(json.dumps(dict(images=n, images_per_s=n / (time.perf_counter() - t))))
"""
