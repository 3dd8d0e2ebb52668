"""The loop after training at scale (tools/bench_scale.py --loop): on a synthetic folder of many small
JPEGs with CIFAR-10 photos and their exact and near copies planted, each step as its own process with
its time and peak memory: training a checkpoint, the model alone, evaluate.py --predict, --suggest,
--review and --audit, label.py --apply, the next training start and label.py --undo, each with the
code before too where a checkout of it is given. The numbers go into docs/scale.md; they are not a test.
"""
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from scale_folder import CLASSES, MODEL_ALONE, ROOT, last_json, make_folder, measure

LOOP_PARTS = ("loop_folder", "checkpoint", "model_alone", "predict", "suggest", "review", "audit", "audit_small",
              "apply", "retrain_start", "accepted_start", "undo")
SMALL_LOOP = 5000  # unlabeled images of the folder whose audit recall the million's is compared with


def cifar_photos(root):
    """CIFAR-10's 10,000 test photos as 32 px JPEGs (the copy in ../shared/data), extracted once."""
    photos = root / "cifar10-jpeg"
    if not (photos / "test").is_dir():
        photos.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-xJf", ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.xz", "-C", photos], check=True)
    return sorted((photos / "test").rglob("*.jpg"))


def plant_copies(folder, photos, count, seed=0):
    """`count` photos planted in folder/unlabeled/planted/, each with a copy of the same bytes and a near
    copy (resized to 80% and saved as a JPEG of quality 70, as examples/own_images.py faults makes
    them), each copy in unlabeled/planted/ or, one in four, in test/ (a leak). Returns the rows
    (copy, original, kind exact or near) written to <folder>-planted.csv."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    rows = []
    (folder / "unlabeled" / "planted").mkdir(parents=True, exist_ok=True)
    for k, photo in enumerate(rng.choice(photos, count, replace=False)):
        original = folder / "unlabeled" / "planted" / f"o{k:05d}.jpg"
        shutil.copyfile(photo, original)
        for kind in ("exact", "near"):
            part = folder / "test" / f"c{k % CLASSES}" if rng.random() < 0.25 else folder / "unlabeled" / "planted"
            copy = part / f"{kind[0]}{k:05d}.jpg"
            if kind == "exact":
                shutil.copyfile(photo, copy)
            else:
                with Image.open(photo) as image:
                    image.convert("RGB").resize((max(8, round(image.width * 0.8)), max(8, round(image.height * 0.8))),
                                                Image.BILINEAR).save(copy, format="JPEG", quality=70)
            rows.append((str(copy), str(original), kind))
    with open(f"{folder}-planted.csv", "w", newline="") as f:
        csv.writer(f).writerows([("copy", "original", "kind")] + rows)
    return rows


def make_loop_folder(root, n, image_size, photos, count):
    """root/loop-<n>-<size>px: the synthetic folder of n images (hard links: the original stays as it
    is) with `count` photos and their copies planted (once)."""
    base, folder = root / f"{n}-{image_size}px", root / f"loop-{n}-{image_size}px"
    make_folder(base, n, image_size)
    if not (folder / "complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["cp", "-al", base, folder], check=True)
        (folder / "complete").unlink()
        plant_copies(folder, photos, count)
        (folder / "complete").touch()
    return folder


def copy_recall(audit_csv, planted_csv):
    """The planted copies the audit found (a duplicate or leak row pairing the copy with its photo or
    the photo's other copy), by kind, and the precision of its duplicate and leak rows."""
    with open(planted_csv, newline="") as f:
        planted = list(csv.DictReader(f))
    group = {}
    for row in planted:
        group[row["copy"]] = group[row["original"]] = row["original"]
    with open(audit_csv, newline="") as f:
        found = [r for r in csv.DictReader(f) if r["kind"] in ("duplicate", "leak")]
    paired = {(r["path"], r["suggestion"]) for r in found}
    hits = {p for p in paired if p[0] in group and group[p[0]] == group.get(p[1])}
    named = {path for pair in hits for path in pair}
    recall = {kind: round(sum(r["copy"] in named for r in planted if r["kind"] == kind) /
                          max(1, sum(r["kind"] == kind for r in planted)), 4) for kind in ("exact", "near")}
    return dict(recall=recall, copies_planted=len(planted), rows=len(found),
                precision=round(len(hits) / max(1, len(paired)), 4))


def logged_as_accepted(folder):
    """The moves of the log's last batch relabeled `accept`, as label.py --accepted logs its moves (the
    next start then trains them as unlabeled images); the log rewritten a row at a time (this process
    stays small: the processes it starts begin as its copy) and replaced whole, atomically."""
    log = Path(folder) / "label-log.csv"
    with open(log, newline="") as f:
        last = str(max(int(r[0]) for r in csv.reader(f) if r[0].isdigit()))
    with open(log, newline="") as f, open(log.with_suffix(".tmp"), "w", newline="") as out:
        writer = csv.writer(out)
        for r in csv.reader(f):
            writer.writerow(r[:2] + ["accept"] + r[3:] if r[0] == last and r[2] == "move" else r)
    os.replace(log.with_suffix(".tmp"), log)


def labels_from(predictions_csv, labels_csv):
    """A labels file for label.py: nine in ten readable rows of a predictions CSV (training needs
    some images left in unlabeled/), each with its prediction as the label."""
    with open(predictions_csv, newline="") as f, open(labels_csv, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(("path", "label", "blake2b"))
        rows = 0
        for k, r in enumerate(csv.DictReader(f)):
            if r["prediction"] and k % 10:
                writer.writerow((r["path"], r["prediction"], r["blake2b"]))
                rows += 1
    return rows


class LoopRun:
    """One --loop measurement: its record (kept in --out after every step, the other code's values
    taken up), the folders and the codes it measures (after: this checkout; before: --before)."""

    def __init__(self, n, image_size, root, width, out, before, only, backbone):
        self.python, self.root, self.image_size, self.width, self.out = sys.executable, Path(root), image_size, width, out
        self.backbone = backbone
        codes = dict(after=ROOT, **({"before": Path(before).resolve()} if before else {}))
        self.codes = {code: where for code, where in codes.items() if only is None or code == only}
        self.folder = self.root / f"loop-{n}-{image_size}px"
        self.small = self.root / f"loop-{SMALL_LOOP}-{image_size}px"
        self.env = dict(MTLC_CACHE_DIR=str(self.root / "cache-loop"))
        self.record = json.loads(Path(out).read_text()) if Path(out).exists() else {}

    def part(self, name):
        """The part's measurements by code (the other code's kept from --out), a dict."""
        if not isinstance(self.record.get(name), dict):
            self.record[name] = {}
        return self.record[name]

    def save(self):
        Path(self.out).write_text(json.dumps(self.record, indent=1) + "\n")

    def checkpoint_of(self, where):
        return self.root / f"ckpt-{where.name}{'' if self.backbone == 'convlarge' else '-' + self.backbone}" / "mt_final.pt"

    def training(self, where, *args):
        """train_mt.py on a folder with the measurement's network, image size and width, then args."""
        return [self.python, "train_mt.py", "--dataset", "folder", "--backbone", self.backbone, "--data-dir", where,
                "--image-size", str(self.image_size), "--width", str(self.width), *args, "--device", "cpu"]

    def train(self, where, name):
        self.record[name] = measure(name, self.training(where, "--epochs", "1", "--decay-epochs", "0", "--out",
                                                        self.checkpoint_of(where).parent, "--overwrite"), self.env)
        self.save()

    def evaluate(self, where, name, *args, code="after", allowed=(0,)):
        """evaluate.py of the folder's checkpoint with args, measured whole: work an earlier, interrupted
        measurement kept beside its output (.<output>.mtlc-work, mtlc/disk/work.py) removed first."""
        for output in (a for a in args if isinstance(a, Path)):
            shutil.rmtree(output.parent / f".{output.name}.mtlc-work", ignore_errors=True)
        return measure(f"{name} ({code})", [self.python, "evaluate.py", "--ckpt", self.checkpoint_of(where), *args,
                                            "--device", "cpu"], self.env, self.codes[code], allowed)

    def predictions(self, parts, max_error, suggest):
        """predict, suggest and review of the folder's unlabeled images, each code in turn."""
        for part, args in (("predict", ["--max-error", str(max_error), "--csv"]),
                           ("suggest", ["--suggest", str(suggest), "--csv"]),
                           ("review", ["--max-error", str(max_error), "--review"])):
            if part not in parts:
                continue
            for code in self.codes:
                output = self.root / f"{part}-{code}.{'html' if part == 'review' else 'csv'}"
                got = self.part(part)[code] = self.evaluate(self.folder, part, "--predict", self.folder / "unlabeled",
                                                            *args, output, code=code)
                got["output_bytes"] = output.stat().st_size
                if part == "predict":
                    said = next(line for line in got["stderr_tail"] if line.startswith("predicted "))
                    images = int(said.split(" of ")[1].split(" ")[0].replace(",", ""))
                    got.update(images=images, images_per_s=round(images / got["wall_s"]))
                self.save()

    def audits(self, parts, folds, steps, audit_before):
        """The audit of the folder (this code alone unless audit_before) and of the small one (both)."""
        for part, where, which in (("audit", self.folder, [c for c in self.codes if c == "after" or audit_before]),
                                   ("audit_small", self.small, list(self.codes))):
            if part not in parts:
                continue
            if part == "audit_small":
                self.train(where, "checkpoint_small")
            for code in which:
                output = self.root / f"{part}-{code}.csv"
                self.part(part)[code] = self.evaluate(where, part, "--audit", output, "--audit-folds", str(folds),
                                                      "--audit-steps", str(steps), code=code)
                self.part(part)[code].update(copy_recall(output, f"{where}-planted.csv"))
                self.save()

    def labels(self, parts):
        """label.py --apply of nine predictions in ten, the next training start, the same with those moves
        logged as label.py --accepted's (accepted_start), label.py --undo."""
        labels = self.root / "labels-loop.csv"
        self.record["label_rows"] = labels_from(self.root / "predict-after.csv", labels)
        for code in self.codes:
            for part, command in (("apply", [self.python, "label.py", "--data-dir", self.folder, "--apply", labels]),
                                  ("retrain_start", self.training(self.folder, "--benchmark", "1")),
                                  ("accepted_start", self.training(self.folder, "--benchmark", "1")),
                                  ("undo", [self.python, "label.py", "--data-dir", self.folder, "--undo"])):
                if part in parts:
                    if part == "accepted_start":
                        logged_as_accepted(self.folder)
                    self.part(part)[code] = measure(f"{part} ({code})", command, self.env, self.codes[code])
                    self.save()


def run_loop(n, image_size, root, width, out, before, parts, planted, folds, steps, max_error, suggest, audit_before,
             only, backbone):
    """Measure the loop's steps (LOOP_PARTS) on root/loop-<n>-<size>px; see --loop."""
    run = LoopRun(n, image_size, root, width, out, before, only, backbone)
    record = run.record
    record.update(images=n, image_size=image_size, width=width, backbone=backbone, planted_photos=planted, audit_folds=folds,
                  audit_steps=steps, max_error=max_error, suggest_asked=suggest,
                  cpu=subprocess.run(["lscpu"], capture_output=True, text=True).stdout.split("Model name:")[-1]
                  .splitlines()[0].strip(), cores=os.cpu_count(),
                  memory_gb=round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1))
    record.setdefault("codes", {}).update({k: str(v) for k, v in run.codes.items()})
    commands = record.get("commands") if isinstance(record.get("commands"), list) else []
    record["commands"] = commands + [" ".join(sys.argv)]
    if "loop_folder" in parts:
        photos = cifar_photos(run.root)
        make_loop_folder(run.root, n, image_size, photos, planted)
        make_loop_folder(run.root, SMALL_LOOP, image_size, photos, planted)
    if "checkpoint" in parts:
        run.train(run.folder, "checkpoint")
    if "model_alone" in parts:
        record["model_alone"] = measure("model alone", [run.python, "-c", MODEL_ALONE, run.checkpoint_of(run.folder),
                                                        run.folder, str(image_size), "50000"], run.env)
        record["model_alone"]["images_per_s"] = round(last_json(record["model_alone"])["images_per_s"])
        run.save()
    run.predictions(parts, max_error, suggest)
    run.audits(parts, folds, steps, audit_before)
    if {"apply", "retrain_start", "accepted_start", "undo"} & set(parts):
        run.labels(parts)
    run.save()
    print(json.dumps(record, indent=1))
