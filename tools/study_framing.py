"""How a frozen trunk should see a folder's photos, measured with linear probes (docs/pretrained.md,
"The trunk's own view"): each image of one or more own-images folders (examples/own_images.py,
one per draw of the labeled images) is framed (mtlc/data/framing.py: squashed, centre-cropped or
padded) at a side, embedded by the trunk as is and flipped, and the heads of mtlc/train/linear_heads.py
are fitted on the labeled images' features, or a head of the project's trained by its own Trainer
(--head fixmatch: stage 1 of a folder's default schedule, train_mt.py's settings; the teacher): their
test error and the error of their labels for the unlabeled images (the truth file's classes), per
folder, then mean and standard error.

    python tools/study_framing.py --data-dir data/own-food-1 --data-dir data/own-food-2 --data-dir data/own-food-3 \\
        --view squash:160 --view crop:260 --out runs/framing-food --record docs/framing-food.json

A view is MODE[:CROP]:SIDE[:INTERPOLATION] (crop: timm's crop_pct of the backbone where not given).
Features are kept in --out by the blake2b digest of each file's bytes and view, so that the three
draws of a dataset (the same files) and a rerun embed each image once. One thread per process
unless --threads.
"""
import csv
import functools
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mtlc.data.files import file_digest  # noqa: E402
from mtlc.data.framing import Framing  # noqa: E402
from mtlc.data.images import decode_batches  # noqa: E402
from mtlc.train.embeddings import trunk_input  # noqa: E402
from mtlc.train.pretrained import BACKBONES, TrunkEngine, trunk_view  # noqa: E402
from mtlc.train import linear_heads as probe  # noqa: E402

PARTS = ("labeled", "unlabeled", "test")
# heads trained by steps, as train_mt.py's stage 1 trains them: (objective, --compress, views of each image,
# settings other than the objective's defaults)
STEPPED = {"fixmatch": ("fixmatch", 1, 2, {}), "mt": ("mt", 1, 2, {}), "fixmatch-asis": ("fixmatch", 1, 1, {}),
           "fixmatch-half": ("fixmatch", 2, 2, {}), "fixmatch-quarter": ("fixmatch", 4, 2, {}),
           "fixmatch-half-095": ("fixmatch", 2, 2, dict(threshold=0.95)),
           "fixmatch-095": ("fixmatch", 1, 2, dict(threshold=0.95)),
           "fixmatch-global": ("fixmatch", 1, 2, dict(threshold="adaptive-global"))}


def parse_view(text, backbone):
    """(label, Framing, side) of 'crop:260', 'crop:1.0:260', 'squash:160:bicubic'."""
    parts = text.split(":")
    mode, rest = parts[0], parts[1:]
    own = trunk_view(backbone)[0]
    crop = float(rest.pop(0)) if mode == "crop" and len(rest) >= 2 and "." in rest[0] else own.crop
    side = int(rest.pop(0))
    interpolation = rest.pop(0) if rest else own.interpolation
    framing = Framing(mode, crop if mode == "crop" else 1.0, interpolation)
    return f"{framing.tag or 'squashbilinear'}-{side}", framing, side


def folder_files(data_dir, truth):
    """{part: [(path, class)]} of an own-images folder, the unlabeled images' classes from the truth file."""
    data_dir = Path(data_dir)
    with open(truth, newline="") as f:
        classes = {Path(r["path"]).name: r["class"] for r in csv.DictReader(f)}
    files = {}
    for part in PARTS:
        if part == "unlabeled":
            files[part] = [(p, classes[p.name]) for p in sorted((data_dir / part).rglob("*")) if p.is_file()]
        else:
            files[part] = [(p, c.name) for c in sorted((data_dir / part).iterdir()) for p in sorted(c.iterdir())]
    return files


def embedded(paths, framing, side, backbone, engine, kept):
    """Features (n, 2, D) of the files (as is, flipped), computed where `kept` ({digest: row}) lacks them."""
    digests = [file_digest(Path(p).read_bytes()) for p in paths]
    todo = sorted({d: p for d, p in zip(digests, paths) if d not in kept}.items())
    started = time.perf_counter()
    for chunk, images, failed, chunk_digests in decode_batches([p for _, p in todo], side, 64, framing=framing):
        if failed:
            raise click.ClickException(f"cannot read {[str(chunk[i]) for i in failed]}")
        x = trunk_input(images, side, backbone)
        rows = torch.stack([engine(x), engine(x.flip(3))], 1).numpy().astype(np.float16)
        kept.update(zip(chunk_digests, rows))
    if todo:
        click.echo(f"  embedded {len(todo)} images in {time.perf_counter() - started:.0f} s "
                   f"({len(todo) / (time.perf_counter() - started):.1f} images/s)")
    return np.stack([kept[d] for d in digests]).astype(np.float32)


class SteppedHead:
    """A head of the project (an MLP on the features, width 1/8 as the README runs it) trained by its
    own Trainer with `objective` for a folder's default stage 1 on features (n, 2, D) (as is, flipped):
    labeled, then unlabeled, the test images' too. Predicts with the teacher."""

    def __init__(self, objective, backbone, features, labels, test, test_labels, classes, side, seed=1, compress=1,
                 settings=None):
        from mtlc.data.datasets import ImageData
        from mtlc.train.devices import Processes
        from mtlc.train.embeddings import Features
        from mtlc.train.objectives import OBJECTIVES
        from mtlc.train.presets import MIN_EPOCH_STEPS, preset, ramp_epochs
        from mtlc.train.pretrained import normalization_of
        from mtlc.train.settings import RunSettings
        from mtlc.train.trainer import fresh_training, make_trainer
        n_lab = int((labels >= 0).sum())
        x = torch.from_numpy(features.astype(np.float16))
        data = ImageData(torch.zeros(0), torch.from_numpy(labels), torch.zeros(0), torch.from_numpy(test_labels),
                         classes, features=Features(x, torch.from_numpy(test.astype(np.float16))[:, :1]))
        split = dict(labeled_idx=torch.arange(n_lab), unlabeled_idx=torch.arange(n_lab, len(labels)),
                     val_idx=torch.zeros(0, dtype=torch.long))
        defaults = {**OBJECTIVES[objective].defaults, **(settings or {})}
        spe = max(1, (len(labels) - n_lab) // defaults["unlabeled_batch"])
        spe *= -(-MIN_EPOCH_STEPS // spe)
        schedule = preset("folder", n_lab, spe, compress)
        mean, std = normalization_of(backbone)
        config = RunSettings.of(dict(  # the fields left out as runs from before them were: no files, eager, fp32
            dataset="folder", data_dir=".", labels=n_lab, labeled_batch=32, width=0.125, num_classes=len(classes),
            classes=classes, mean=mean, std=std, image_size=side, backbone=backbone, seed=seed, lr=0.05,
            ema=schedule["ema"], consistency=objective, **{k: v for k, v in defaults.items()},
            epochs=schedule["epochs"], decay_epochs=schedule["decay_epochs"],
            cons_rampup=ramp_epochs("cons_rampup", schedule["epochs"] + schedule["decay_epochs"], spe),
            lc_start_epoch=schedule["epochs"], bn_momentum=schedule["bn_momentum"], eval_every=10 ** 9,
            min_epoch_steps=MIN_EPOCH_STEPS))
        trainer = make_trainer("mt", config, data, split, fresh_training(config, data, split["labeled_idx"], "cpu"),
                               torch.device("cpu"), Processes())
        trainer.steps.start_epoch(0)
        for step in range((config.epochs + config.decay_epochs) * trainer.steps_per_epoch):
            trainer.steps.step(step)
        trainer.recompute_bn_means()
        self.teacher = trainer.teacher.eval()

    def predict(self, x):
        with torch.no_grad():
            return self.teacher(torch.from_numpy(x).float())[1].argmax(1).numpy()


def drawn(data_dir, draw):
    """folder_files of a photos folder after its labeled images are drawn again (own_images.py redraw)."""
    truth = Path(data_dir).parent / f"{Path(data_dir).name}-truth.csv"
    subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "examples" / "own_images.py"), "redraw",
                    "--data-dir", str(data_dir), "--truth", str(truth), "--seed", str(draw)], check=True,
                   capture_output=True)
    return folder_files(data_dir, truth)


def errors(pred, truth):
    return 100 * float(np.mean(pred != truth))


def mean_se(values):
    return (statistics.mean(values), statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--data-dir", "data_dirs", multiple=True, required=True, type=click.Path(exists=True, file_okay=False),
              help="An own-images folder; its truth file is <folder>-truth.csv beside it. Repeat for the draws.")
@click.option("--view", "views", multiple=True, required=True, help="MODE[:CROP]:SIDE[:INTERPOLATION]; repeat.")
@click.option("--backbone", type=click.Choice(list(BACKBONES)), default="efficientnet-lite2")
@click.option("--head", "heads", multiple=True, default=("probe",), type=click.Choice([*probe.HEADS, *STEPPED]),
              help="The heads fitted on each view's features (mtlc/train/linear_heads.py), or trained by steps "
                   "(fixmatch, mt: the project's Trainer); repeat.")
@click.option("--features", type=click.Choice(["as-is", "flip-mean"]), multiple=True, default=("as-is",),
              help="The features a head takes: the image as is, or the mean of it and its mirror image.")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Where the features are kept.")
@click.option("--threads", type=int, default=1)
@click.option("--redraw", "draws", type=int, multiple=True,
              help="With a folder of examples/own_images.py photos: each of its draws of the labeled images in turn "
                   "(own_images.py redraw --seed, in place); repeat.")
@click.option("--record", type=click.Path(dir_okay=False), default=None, help="Write the results as JSON here.")
def main(data_dirs, views, backbone, heads, features, out, threads, draws, record):
    torch.set_num_threads(threads)
    backbone_spec = BACKBONES[backbone]
    engine = TrunkEngine(backbone, "cpu")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # (a name, its files when asked for: a draw moves the files of the one before)
    folders = [(d, functools.partial(folder_files, d, Path(d).parent / f"{Path(d).name}-truth.csv")) for d in data_dirs]
    if draws:
        folders = [(f"{d}@{draw}", functools.partial(drawn, d, draw)) for d in data_dirs for draw in draws]
    results = []
    for text in views:
        label, framing, side = parse_view(text, backbone)
        store = out / f"{backbone}-{label}.npz"
        kept = dict(np.load(store)) if store.exists() else {}
        kept = {k: v for k, v in kept.items()}
        click.echo(f"{label}: {framing.describe()}, {side} px")
        for data_dir, listing in folders:
            files = listing()
            classes = sorted({c for _, c in files["labeled"]})
            x = {part: embedded([p for p, _ in files[part]], framing, side, backbone_spec, engine, kept) for part in PARTS}
            y = {part: np.array([classes.index(c) for _, c in files[part]]) for part in PARTS}
            np.savez(store, **kept)
            for kind in features:
                take = (lambda f: f[:, 0]) if kind == "as-is" else (lambda f: f.mean(1))
                for head in heads:
                    started = time.perf_counter()
                    if head in STEPPED:
                        if kind != "as-is":
                            continue  # it takes both views itself
                        both = np.concatenate([x["labeled"], x["unlabeled"]])
                        labels = np.concatenate([y["labeled"], np.full(len(y["unlabeled"]), -1)])
                        objective, compress, views, settings = STEPPED[head]
                        fitted = SteppedHead(objective, backbone, both[:, :views], labels, x["test"], y["test"], classes,
                                             side, compress=compress, settings=settings)
                    else:
                        fitted = probe.HEADS[head](take(x["labeled"]), y["labeled"], take(x["unlabeled"]),
                                                   len(classes))
                    row = dict(view=label, framing=framing.as_dict(), side=side, features=kind, head=head,
                               folder=str(data_dir), test_error=errors(fitted.predict(take(x["test"])), y["test"]),
                               labels_error=errors(fitted.predict(take(x["unlabeled"])), y["unlabeled"]),
                               seconds=round(time.perf_counter() - started, 2))
                    results.append(row)
                    click.echo(f"  {Path(data_dir).name} {kind} {head}: test {row['test_error']:.2f}% "
                               f"labels {row['labels_error']:.2f}% ({row['seconds']} s)")
    click.echo("\n| view | features | head | test error | labels' error | draws |\n| --- | --- | --- | --- | --- | --- |")
    summary = []
    for key in dict.fromkeys((r["view"], r["features"], r["head"]) for r in results):
        rows = [r for r in results if (r["view"], r["features"], r["head"]) == key]
        (t, ts), (u, us) = mean_se([r["test_error"] for r in rows]), mean_se([r["labels_error"] for r in rows])
        summary.append(dict(view=key[0], features=key[1], head=key[2], test=[t, ts], labels=[u, us], draws=len(rows)))
        click.echo(f"| {key[0]} | {key[1]} | {key[2]} | {t:.2f} +- {ts:.2f} | {u:.2f} +- {us:.2f} | {len(rows)} |")
    if record:
        Path(record).write_text(json.dumps(dict(command=sys.argv, machine=platform.processor() or platform.machine(),
                                                backbone=backbone, runs=results, summary=summary), indent=1) + "\n")


if __name__ == "__main__":
    main()
