"""Labeling in rounds until a folder is finished, played from a truth file (docs/label-in-rounds.md).

A checkpoint of a head on a frozen trunk and its folder: the person starts from 10 labels a class
(draw 1: the folder's own labeled/; draw d > 1: another 10 a class drawn from the training images
with the seed d), and each round labels K more images chosen by an order (mtlc/use/orders.py),
answered from the truth file. After each round the FOLDS heads that never saw an image
(mtlc/use/unseen.py: cross-fitted on the held-out images) train again on the labels so far, as a
round does in serve.py: the first anew as the checkpoint's head trained, each later one from the
heads before it for ROUND_SHARE of the steps. Recorded after every round: the labels given, the
images still unlabeled, their labels' error, what --max-error accepts of them (the threshold on the
held-out images as evaluate.py --predict finds it; an image like no class never accepted) and how
wrong that actually is, and the seconds the round took. After any round the person can finish the
folder by labeling what that round left unaccepted (the accepted images' promise was made without
those labels): the labels to a finished folder are the least, over the rounds whose promise held
(checked against the truth), of the labels given and the images left. A run stops once no later
round can need fewer (the labels given reach that least), or every image is accepted, or the person
has labeled --max-share of the images. Each finished run goes into the --record JSON as it ends; a run already
there is not run again, so the command goes on where it stopped.

    python tools/bench_rounds.py --ckpt runs/rounds-food/mt_final.pt --truth data/photo-food-truth.csv \\
        --order least-confident --order random --per-round 50 --draws 3 --record docs/rounds/food.json
    python tools/bench_rounds.py --report docs/rounds --figure docs/rounds.png
"""
import csv
import json
import math
import sys
import time
from pathlib import Path

import click
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc
from mtlc.data.nearest import in_memory  # noqa: E402
from mtlc.disk.runs import atomic_write  # noqa: E402
from mtlc.train.checkpoints import load_checkpoint  # noqa: E402
from mtlc.train.forked import cpu_workers  # noqa: E402
from mtlc.train.inference import model_outputs  # noqa: E402
from mtlc.train.moved_images import restored_as_now  # noqa: E402
from mtlc.train.progress import TimeEstimate  # noqa: E402
from mtlc.train.networks import build_models  # noqa: E402
from mtlc.train.model import ModelConfig  # noqa: E402
from mtlc.use.calibration import Calibration, confidences  # noqa: E402
from mtlc.use.label_shift import standardized_bound  # noqa: E402
from mtlc.use.orders import ORDERS, next_images  # noqa: E402
from mtlc.use.outliers import TRUNK_OUTLIER_MARGIN, LabeledSpread  # noqa: E402
from mtlc.use.selection import unit_rows  # noqa: E402
from mtlc.use.unseen import FOLDS, ROUND_SHARE, FoldHeads, models_of_row  # noqa: E402
from bench_acceptance import binary_search, fixed_sequence  # noqa: E402

MAX_ERROR = 5.0
CPU = torch.device("cpu")


class Folder:
    """A checkpoint's folder as the benchmark sees it: each training image's true class, the kept
    features, the heads' split (FoldHeads) and the held-out images."""

    def __init__(self, checkpoint, truth):
        state = load_checkpoint(checkpoint)
        self.state, self.data = restored_as_now(state, state["config"].data_dir, device=CPU)
        with open(truth, newline="") as f:
            classes = {r["path"]: r["class"] for r in csv.DictReader(f)}
        names, self.classes = self.data.files["train"], self.data.classes
        self.truth = np.array([self.classes.index(classes[n]) if n in classes else int(self.data.train_y[i])
                               for i, n in enumerate(names)])
        self.heads = FoldHeads(self.state, self.data)
        self.features = self.data.features.train[:, 0].float()
        held = self.heads.held
        part = self.data.features.test if held.source == "test" else self.data.features.train
        self.held_features = part[held.rows, 0].float()
        _, teacher = build_models(ModelConfig(**self.state["model_args"]), CPU)
        teacher.load_state_dict(self.state["teacher"])
        with torch.no_grad():  # the checkpoint's pooled features, what --suggest's TypiClust clusters
            self.pooled = model_outputs(teacher, self.features, None, None)[0].numpy()

    def starting_labels(self, draw):
        """{training row: class}: the checkpoint's labeled images (draw 1), else as many a class drawn
        from its training images (labeled or not) with the seed `draw`."""
        labeled = self.state["labeled_idx"].numpy()
        if draw == 1:
            return {int(r): int(self.truth[r]) for r in labeled}
        rng = np.random.default_rng(draw)
        candidates = self.heads.candidates.numpy()
        per_class = np.bincount(self.truth[labeled], minlength=len(self.classes))
        rows = [rng.choice(candidates[self.truth[candidates] == c], n, replace=False) for c, n in enumerate(per_class)]
        return {int(r): int(self.truth[r]) for r in np.concatenate(rows)}


def trained(folder, labels, previous, workers):
    """[(student, teacher)] of the FOLDS heads on these labels: anew where previous is None, else each from
    its previous one for ROUND_SHARE of the steps."""
    estimate = TimeEstimate("", 0, CPU, lambda line: None)
    share = 1.0 if previous is None else ROUND_SHARE
    rows = dict(folder.heads.train(labels, list(range(FOLDS)), workers, CPU, estimate, start=previous, share=share))
    return [models_of_row(folder.state, rows[k], CPU) for k in range(FOLDS)]


def outcome(folder, heads, labels, pool, calibrating):
    """(the Calibration on the held-out images still calibrating (a mask), each pool image's class and
    confidence by the head that never saw it, the threshold or None, which pool images are like no
    class, every head's logits of the pool, each held-out image's confidence, whether the threshold is for
    the pool's own class proportions: label_shift.py)."""
    fold = folder.heads.fold_of_row[pool]
    with torch.no_grad():
        every = torch.stack([model_outputs(teacher, folder.features[pool], None, None)[1] for _, teacher in heads])
        held = torch.stack([model_outputs(teacher, folder.held_features, None, None)[1] for _, teacher in heads])
    own = every[torch.from_numpy(fold), torch.arange(len(pool))].numpy()
    held_own = held[torch.from_numpy(folder.heads.held_folds), torch.arange(held.shape[1])].numpy()
    h = folder.heads.held
    cal = Calibration.fit(held_own[calibrating], h.y.numpy()[calibrating], h.source,
                          doubted=h.relabeled.numpy()[calibrating])
    predicted, confidence = confidences(own, cal.temperature, cal.ceiling)
    rows = np.array(list(labels))
    spread = LabeledSpread(in_memory(unit_rows(folder.features[rows].numpy())))
    strays = (spread.ratios(folder.features[pool].numpy()) > TRUNK_OUTLIER_MARGIN) if spread.largest else np.zeros(
        len(pool), bool)
    # the images' class proportions, as --predict weighs them: the images never accepted left out
    standardized = standardized_bound(cal, confidence[~strays], predicted[~strays], folder.classes)
    return cal, predicted, confidence, cal.threshold(MAX_ERROR, standardized), strays, every.numpy(), confidences(
        held_own, cal.temperature, cal.ceiling)[1], standardized is not None


def searched_before(cal, confidence, wrong, strays):
    """{search: (images accepted, their actual error %)} of the searches the one now replaced, on the same
    held-out images and pool: the fallback procedure in the held-out images' proportions (label_shift.py)
    and the two searches that replaced (bench_acceptance.py)."""
    before = {}
    for name, search in (("held-out proportions", lambda *args: getattr(cal.threshold(MAX_ERROR), "confidence", None)),
                         ("fixed sequence", fixed_sequence), ("binary search", binary_search)):
        t = search(cal.confidence, cal.correct, MAX_ERROR)
        accepted = (confidence >= t) & ~strays if t is not None else np.zeros(len(confidence), bool)
        before[name] = (int(accepted.sum()), round(100 * wrong[accepted].mean(), 3) if accepted.any() else 0.0)
    return before


def play(folder, order, per_round, draw, max_share, workers, echo, first_heads, follow=False):
    """The rounds of one run (module docstring): a list of one record a round. first_heads: {draw: the
    heads of its first round}, which every order of the draw shares (filled here). follow: the held-out
    images follow the pool: after each round, those less confident than every image the round left
    unlabeled stop calibrating, as the pool has none of those left."""
    labels = folder.starting_labels(draw)
    start_labels = len(labels)
    pool = np.array([r for r in folder.heads.candidates.tolist() if r not in labels])
    n_pool, heads, rounds, fewest = len(pool), None, [], math.inf
    calibrating = np.ones(len(folder.heads.held.y), bool)
    while True:
        began = time.perf_counter()
        if heads is None and draw in first_heads:
            heads = first_heads[draw]
        else:
            heads = trained(folder, labels, heads, workers)
            first_heads.setdefault(draw, heads)
        cal, predicted, confidence, found, strays, every, held_confidence, shifted = outcome(folder, heads, labels,
                                                                                            pool, calibrating)
        accepted = (confidence >= found.confidence) & ~strays if found else np.zeros(len(pool), bool)
        wrong = predicted != folder.truth[pool]
        given = len(labels) - start_labels
        unsure = np.where(strays, 0.0, confidence)  # an image never accepted is as unsure as can be
        picks = next_images(order, per_round, confidence=unsure, head_logits=every, features=folder.pooled[pool],
                            labeled_features=folder.pooled[list(labels)], given=given, seed=draw * 1000 + given)
        rounds.append(dict(labels=given, unlabeled=len(pool), labels_error=round(100 * wrong.mean(), 3),
                           accepted=int(accepted.sum()), accepted_error=round(100 * wrong[accepted].mean(), 3)
                           if accepted.any() else 0.0, threshold=found.confidence if found else None,
                           held_out_above=found.held_out if found else 0, calibrating=int(calibrating.sum()),
                           shift_seen=shifted,
                           before=searched_before(cal, confidence, wrong, strays), like_no_class=int(strays.sum()),
                           seconds=round(time.perf_counter() - began, 2)))
        echo(f"{order} K={per_round} draw {draw}: " + json.dumps(rounds[-1]))
        if rounds[-1]["accepted_error"] <= MAX_ERROR:
            fewest = min(fewest, given + len(pool) - int(accepted.sum()))
        if accepted.all() or given + per_round >= fewest or given + per_round > max_share * n_pool:
            return rounds
        for row in pool[picks].tolist():
            labels[row] = int(folder.truth[row])
        if follow and len(picks) < len(pool):
            calibrating &= held_confidence >= np.delete(unsure, picks).min()
        pool = np.delete(pool, picks)


def read_record(path):
    return json.loads(Path(path).read_text()) if Path(path).exists() else dict(runs=[])


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--ckpt", type=click.Path(exists=True, dir_okay=False), help="The checkpoint (a head on a frozen trunk).")
@click.option("--truth", type=click.Path(exists=True, dir_okay=False), help="Its folder's truth file.")
@click.option("--order", "orders", multiple=True, type=click.Choice(ORDERS), help="Orders to play (repeat).")
@click.option("--per-round", "per_rounds", multiple=True, type=int, default=(50,), show_default=True,
              help="Labels a round (repeat).")
@click.option("--draws", default=3, show_default=True, help="Draws of the starting labels: 1..N.")
@click.option("--max-share", default=0.8, show_default=True, help="A run stops once the person labeled this share.")
@click.option("--max-rounds", default=None, type=int, help="A run stops after this many rounds (the curves).")
@click.option("--follow", is_flag=True, help="The held-out images follow the pool (play's docstring).")
@click.option("--record", type=click.Path(dir_okay=False), help="The JSON the runs go into.")
@click.option("--report", type=click.Path(exists=True, file_okay=False), help="Print the tables of the records here.")
@click.option("--figure", type=click.Path(dir_okay=False), help="With --report: draw the curves into this PNG.")
def main(ckpt, truth, orders, per_rounds, draws, max_share, max_rounds, follow, record, report, figure):
    """Play the rounds (module docstring), or --report the records."""
    if report:
        from rounds_report import print_report
        return print_report(Path(report), figure)
    torch.set_num_threads(1)
    folder = Folder(ckpt, truth)
    workers = cpu_workers(CPU, FOLDS)
    done, first_heads = read_record(record), {}
    unlabeled = len(folder.heads.candidates) - len(folder.state["labeled_idx"])
    done.update(folder=str(folder.state["config"].data_dir), checkpoint=str(ckpt), unlabeled=unlabeled,
                held_out=len(folder.heads.held.y), classes=folder.classes,
                max_error=MAX_ERROR, round_share=ROUND_SHARE, follow=follow)
    for per_round in per_rounds:
        for order in orders:
            for draw in range(1, draws + 1):
                if any(r["order"] == order and r["per_round"] == per_round and r["draw"] == draw for r in done["runs"]):
                    continue
                share = max_share if max_rounds is None else min(max_share, max_rounds * per_round / done["unlabeled"])
                rounds = play(folder, order, per_round, draw, share, workers, click.echo, first_heads, follow)
                done["runs"].append(dict(order=order, per_round=per_round, draw=draw, max_share=share, rounds=rounds))
                atomic_write(record, lambda f: f.write(json.dumps(done, indent=1).encode()))


if __name__ == "__main__":
    main()
