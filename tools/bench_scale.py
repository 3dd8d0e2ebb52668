"""Scale benchmark: a synthetic folder of many small JPEGs (noise plus shapes, made with PIL) through
the decode cache, a training step and prediction, each in its own process, with its time and peak
memory. The numbers go into docs/scale.md; they are not a test.

    python tools/bench_scale.py --images 1000000 --image-size 32 --root /data/scale --out docs/scale-1m-32px.json

Measured, in order (each a fresh `python` process; peak RSS from the kernel's accounting of that
process, peak private memory (RssAnon) sampled every 0.1 s):
  imports        python -c "import mtlc.data.datasets, mtlc.data.batches, mtlc.train.trainer, mtlc.train.model"
  first decode   load_dataset on an empty cache (MTLC_CACHE_DIR points at a fresh folder)
  second start   the same with the cache in place (start-up, imports excluded, printed by the child)
  training       train_mt.py --benchmark N on the folder (stats over every image, then N steps)
  decode alone   find and decode every unlabeled file, batch after batch, nothing else
  hash alone     find, read and hash (BLAKE2b, as the cache names its rows) every unlabeled file
  rebuild        after 1,000 unlabeled files moved into labeled/ (renames, as label.py makes them), the
                 cache rebuilt: load_dataset again; then moved back and rebuilt once more
  model alone    the checkpoint's teacher over every image of the cache, nothing decoded
  predict        evaluate.py --predict <folder>/unlabeled --csv (a checkpoint trained for one epoch on
                 a small companion folder of the same classes and size)
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click

from bench_loop import LOOP_PARTS, run_loop
from scale_folder import (CLASSES, LABELED_PER_CLASS, MODEL_ALONE, PER_FOLDER, TEST_PER_CLASS, last_json, make_folder,
                          measure)

LOAD = """
import sys, time, json, resource
t = time.perf_counter()
from mtlc.data.datasets import load_dataset
import mtlc.data.batches, mtlc.train.trainer, mtlc.train.model
imported = time.perf_counter()
data = load_dataset("folder", sys.argv[1], image_size=int(sys.argv[2]), echo=lambda line: None)
loaded = time.perf_counter()
print(json.dumps(dict(imports_s=imported - t, load_s=loaded - imported, images=len(data.train_x) + len(data.test_x),
                      peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""

DECODE_ALONE = """
import sys, time, json, resource
from mtlc.data.files import find_images
from mtlc.data.images import decode_batches
t = time.perf_counter()
paths = find_images(sys.argv[1])[0]
n = sum(len(chunk) for chunk, *_ in decode_batches(paths, int(sys.argv[2]), int(sys.argv[3])))
print(json.dumps(dict(images=n, seconds=time.perf_counter() - t, images_per_s=n / (time.perf_counter() - t),
                      peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""


HASH_ALONE = """
import sys, time, json
from mtlc.data.files import find_images
from mtlc.data.images import file_digest, pooled, read_file
t = time.perf_counter()
paths = find_images(sys.argv[1])[0]
n = sum(len(chunk) for chunk, _ in pooled(lambda path: file_digest(read_file(path)), paths, 1024))
print(json.dumps(dict(images=n, seconds=time.perf_counter() - t, images_per_s=n / (time.perf_counter() - t))))
"""

MOVED = 1000  # files the rebuild part moves, as one round of label.py might


def move_shard(folder, back=False):
    """Rename the first unlabeled folder's MOVED files (0000000.jpg ...) into labeled/c0/, one rename a
    file as label.py makes them, or back."""
    shard, labeled = folder / "unlabeled" / "0000", folder / "labeled" / "c0"
    for k in range(MOVED):
        source, target = shard / f"{k:07d}.jpg", labeled / f"{k:07d}.jpg"
        os.rename(*((target, source) if back else (source, target)))


PARTS = ("imports", "first_decode", "second_start", "training", "decode_alone", "hash_alone", "model_alone", "predict",
         "rebuild")


# The loop at scale (--loop): every step a user takes after training, on a copy of the folder with
# copies of real photos planted, each measured as its own process with the code after and, given
# --before, the code before (a checkout of it) in the same run.

@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--images", "n", type=click.IntRange(min=1000), default=200_000, help="Unlabeled images in the folder.")
@click.option("--image-size", type=click.IntRange(min=16), default=64, help="Pixels square of the JPEGs and of training.")
@click.option("--root", type=click.Path(file_okay=False), required=True,
              help="Where the synthetic folders go (kept, and reused when there: making them takes minutes).")
@click.option("--width", type=float, default=0.125, help="The network's width for the training step and predict.")
@click.option("--steps", type=click.IntRange(min=1), default=20, help="Training steps timed (--benchmark).")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="The JSON record written.")
@click.option("--predict-images", type=click.IntRange(min=1000), default=None,
              help="Predict the first this many unlabeled images (whole folders of 1,000) instead of all: at 96 px the "
                   "network runs at a few hundred images/s on a CPU. [default: all]")
@click.option("--model-images", type=click.IntRange(min=1000), default=50_000,
              help="Images the model-alone rate is measured on (the first of the cache).")
@click.option("--parts", default=None,
              help="The measurements to run, comma-separated; those left out keep their values from --out if it exists. "
                   f"[default: all of them: {','.join(PARTS)}; with --loop: every part of tools/bench_loop.py's "
                   f"LOOP_PARTS]")
@click.option("--loop", is_flag=True,
              help="Measure the loop after training instead (LOOP_PARTS): on root/loop-<images>-<size>px, a hard-linked "
                   "copy of the folder with --planted CIFAR-10 test photos and their exact and near copies planted, "
                   "train a checkpoint one epoch (--width), then evaluate.py --predict --max-error --csv, --suggest, "
                   "--review, --audit (and on a folder of 5,000 with the same photos planted, for the copies' "
                   "recall), label.py --apply of nine predictions in ten, the next training start (--benchmark 1), the "
                   "same with those moves logged as label.py --accepted logs them (accepted_start) and label.py --undo, "
                   "each with the code before too where --before is given.")
@click.option("--before", type=click.Path(file_okay=False, exists=True), default=None,
              help="With --loop: a checkout of the code before (git worktree add DIR COMMIT) measured beside this one.")
@click.option("--planted", type=click.IntRange(min=1), default=250, help="With --loop: photos planted, each with 2 copies.")
@click.option("--audit-folds", "folds", type=click.IntRange(min=2), default=2, help="With --loop: --audit-folds.")
@click.option("--audit-steps", "audit_steps", type=click.IntRange(min=1), default=100, help="With --loop: --audit-steps.")
@click.option("--max-error", type=float, default=5.0, help="With --loop: --max-error of predict and review.")
@click.option("--suggest", type=click.IntRange(min=1), default=1000, help="With --loop: --suggest N.")
@click.option("--only", type=click.Choice(["after", "before"]), default=None,
              help="With --loop: measure this code alone; the other's measurements stay in --out as they were (a "
                   "long run in two sittings). [default: both]")
@click.option("--backbone", type=click.Choice(["convlarge", "efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2"]),
              default="convlarge", help="With --loop: train_mt.py's --backbone (a pretrained trunk sees --image-size).")
@click.option("--audit-before", is_flag=True,
              help="With --loop and --before: audit the big folder with the code before too (hours, and its memory "
                   "grows with the folder: 3 GB of images at a million, on top of the rest).")
def main(n, image_size, root, width, steps, out, predict_images, model_images, parts, loop, before, planted, folds,
         audit_steps, max_error, suggest, audit_before, only, backbone):
    """Make the folder, then time and weigh decoding, start-up, training and prediction on it (or,
    with --loop, every step of the loop after training)."""
    if loop:
        parts = (parts or ",".join(LOOP_PARTS)).split(",")
        unknown = sorted(set(parts) - set(LOOP_PARTS))
        if unknown:
            raise click.BadParameter(f"unknown parts {', '.join(unknown)}; choose from {', '.join(LOOP_PARTS)}",
                                     param_hint="--parts")
        return run_loop(n, image_size, root, width, out, before, parts, planted, folds, audit_steps, max_error, suggest,
                        audit_before, only, backbone)
    parts = (parts or ",".join(PARTS)).split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise click.BadParameter(f"unknown parts {', '.join(unknown)}; choose from {', '.join(PARTS)}", param_hint="--parts")
    measure_scale(n, image_size, Path(root), width, steps, out, predict_images, model_images, parts)


def measure_scale(n, image_size, root, width, steps, out, predict_images, model_images, parts):
    """Make the folder, then time and weigh each part (PARTS) on it into the record at out."""
    folder, small = root / f"{n}-{image_size}px", root / f"small-{image_size}px"
    python = sys.executable
    print(f"making {folder} (once)", file=sys.stderr)
    make_folder(folder, n, image_size)
    make_folder(small, 1000, image_size)
    cache = root / f"cache-{n}-{image_size}px"
    if "first_decode" in parts:
        shutil.rmtree(cache, ignore_errors=True)
    env = dict(MTLC_CACHE_DIR=str(cache))
    record = json.loads(Path(out).read_text()) if Path(out).exists() and len(parts) < len(PARTS) else {}
    record.update(images=n + CLASSES * (LABELED_PER_CLASS + TEST_PER_CLASS), unlabeled=n, image_size=image_size,
                  decoded_gb=round((n + CLASSES * (LABELED_PER_CLASS + TEST_PER_CLASS)) * 3 * image_size ** 2 / 1e9, 2),
                  width=width, cpu=subprocess.run(["lscpu"], capture_output=True, text=True).stdout.split("Model name:")[-1]
                  .splitlines()[0].strip(), cores=os.cpu_count(),
                  memory_gb=round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                  command=" ".join(sys.argv))
    ckpt = root / f"ckpt-{image_size}px"
    n_predicted = min(n, predict_images or n)
    predicted = ([folder / "unlabeled"] if n_predicted == n else
                 [folder / "unlabeled" / f"{k:04d}" for k in range(-(-n_predicted // PER_FOLDER))])
    commands = dict(
        imports=[python, "-c", "import mtlc.data.datasets, mtlc.data.batches, mtlc.train.trainer, mtlc.train.model"],
        first_decode=[python, "-c", LOAD, folder, str(image_size)],
        second_start=[python, "-c", LOAD, folder, str(image_size)],
        training=[python, "train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", folder, "--image-size", str(image_size),
                  "--width", str(width), "--benchmark", str(steps), "--device", "cpu"],
        decode_alone=[python, "-c", DECODE_ALONE, folder / "unlabeled", str(image_size), "256"],
        hash_alone=[python, "-c", HASH_ALONE, folder / "unlabeled"],
        rebuild=[python, "-c", LOAD, folder, str(image_size)],
        model_alone=[python, "-c", MODEL_ALONE, ckpt / "mt_final.pt", folder, str(image_size), str(model_images)],
        predict=[python, "evaluate.py", "--ckpt", ckpt / "mt_final.pt", "--predict", *predicted, "--csv",
                 root / f"predictions-{n}-{image_size}px.csv", "--device", "cpu"])
    for part in PARTS:
        if part not in parts:
            continue
        if part in ("model_alone", "predict") and not (ckpt / "mt_final.pt").exists():
            measure("checkpoint", [python, "train_mt.py", "--dataset", "folder", "--backbone", "convlarge", "--data-dir", small, "--image-size",
                                   str(image_size), "--width", str(width), "--epochs", "1", "--decay-epochs", "0",
                                   "--device", "cpu", "--out", ckpt], env)
        if part == "rebuild":
            move_shard(folder)
            record[part] = dict(moved=MOVED, into_labeled=measure("rebuild", commands[part], env))
            move_shard(folder, back=True)
            record[part]["back"] = measure("rebuild back", commands[part], env)
            continue
        record[part] = measure(part.replace("_", " "), commands[part], env)
        if part in ("decode_alone", "hash_alone"):
            record[part]["images_per_s"] = round(n / record[part]["wall_s"])
        if part == "predict":
            record[part].update(images=n_predicted, images_per_s=round(n_predicted / record[part]["wall_s"]))
        if part == "model_alone":
            record[part]["images_per_s"] = round(last_json(record[part])["images_per_s"])
        if part == "decode_alone":
            assert last_json(record[part])["images"] == n
    if "decode_alone" in record and "predict" in record:
        record["predict_vs_decode"] = round(record["predict"]["images_per_s"] / record["decode_alone"]["images_per_s"], 3)
    if "decode_alone" in record and "model_alone" in record:
        # On shared cores decoding and the network take turns: the best predict can do is the rate of both in series.
        both = 1 / (1 / record["decode_alone"]["images_per_s"] + 1 / record["model_alone"]["images_per_s"])
        record["decode_and_model_in_series_per_s"] = round(both)
    record["cache_mb"] = round(sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20)
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
