"""Predictions by heads that never saw the image. A head on a frozen trunk's features trains on its
unlabeled images (consistency, pseudo-labels, LC) and grows surer of them than of images it never
saw, so its held-out images' calibration says too little about them (digits, Lite2: `--max-error 5`
accepted 88% of the unlabeled images at 7.3% wrong; docs/pretrained.md). Here FOLDS heads train as
the checkpoint's head did (its objective, stages and number of steps, on the kept features), each
with one FOLDS-th of the unlabeled images left out, and one FOLDS-th of the held-out images: the
other held-out images are labeled images of that head (cross-fitting), so that the labels the
held-out images cost train the heads too (food photos, 10 labels a class and 1,000 held-out images:
the unlabeled images' labels 30% wrong without them, 21% with them; docs/label-in-rounds.md). An
image the checkpoint trained on without a label is predicted by the head that left it out; a
held-out image by the head that left it out, the fold its file's hash picks; any other (new,
labeled) by the head its hash picks. So every image is predicted by a head that never trained on
it, and the held-out images of a fold and its unlabeled ones are alike to that head: the
calibration fitted on the held-out images holds for the unlabeled images too. The heads are kept (a
sealed work folder beside the decode cache) for the next run.
"""
import copy
import dataclasses
import hashlib
import sys

import numpy as np
import torch

from ..data.cache import cache_dir
from ..data.splits import true_classes
from ..disk.work import Work
from ..train.devices import Processes
from ..train.forked import cpu_workers, each_at_once, start_method
from ..train.inference import model_outputs
from ..train.model import ModelConfig
from ..train.moved_images import restored_as_now
from ..train.networks import build_models
from ..train.progress import TimeEstimate, epoch_progress
from ..train.trainer import fresh_training, make_optimizer, make_trainer
from .calibration import Calibration
from .held_out import held_out, with_held_out
from .kept_features import KeptFeatures
from .outliers import LabeledSpread

FOLDS = 4
NEVER = 10 ** 9  # an epoch count no fold reaches: a fold's head is never evaluated while it trains
# The share of the checkpoint's steps a round's heads train for, each from its head of the round before
# (a person's labels added): on food photos an eighth was level with training them anew (docs/label-in-rounds.md)
ROUND_SHARE = 0.125


def stage_steps(state):
    """(stage 1's steps, stage 2's) of the training that made a checkpoint."""
    first = state["config"].lc.mt_step if state["stage"] == "lc" else state["step"]
    return first, state["step"] - first


def fold_settings(config, n_checkpoint, n_fold, first_steps):
    """The checkpoint's settings for a fold's head: its schedules in epochs of the fold's (fewer)
    unlabeled images, so that the head takes as many steps as the checkpoint's, on one process, eager."""
    per_epoch = config.steps_per_epoch(n_checkpoint) / config.steps_per_epoch(n_fold)
    fold = config.replace(epochs=config.epochs * per_epoch, decay_epochs=config.decay_epochs * per_epoch,
                          cons_rampup=config.cons_rampup * per_epoch, lc_start_epoch=config.lc_start_epoch * per_epoch,
                          eval_every=NEVER, compile=False, step_mode="eager", processes=1, precision="fp32")
    if config.lc is None:
        return fold
    lc = config.lc
    return fold.replace(lc=lc.replace(epochs=lc.epochs * per_epoch, decay_epochs=lc.decay_epochs * per_epoch,
                                      lc_rampup=lc.lc_rampup * per_epoch, eval_every=NEVER, mt_step=first_steps))


def shortened(state, share):
    """The state of a checkpoint whose training took `share` of its steps, each stage's schedule and
    ramps shortened alike: what a head trained again for a round of labels takes (RoundHeads)."""
    if share == 1:
        return state
    config = state["config"]
    short = config.replace(epochs=config.epochs * share, decay_epochs=config.decay_epochs * share,
                           cons_rampup=config.cons_rampup * share, lc_start_epoch=config.lc_start_epoch * share)
    if config.lc is not None:
        lc = config.lc
        short = short.replace(lc=lc.replace(epochs=lc.epochs * share, decay_epochs=lc.decay_epochs * share,
                                            lc_rampup=lc.lc_rampup * share, mt_step=round(lc.mt_step * share)))
    return dict(state, config=short, step=round(state["step"] * share))


def train_fold(state, data, split, device, name, estimate, bar=True, start=None):
    """(student, teacher) of a head trained as the checkpoint's was on `split`: stage 1, then the
    checkpoint's stage 2 where it had one, as many steps each (estimate: the heads' TimeEstimate;
    bar: a progress bar where stderr is a terminal). start: (student, teacher) to go on from, their
    ramps already behind them (a fresh optimizer), instead of new networks."""
    first, second = stage_steps(state)
    config = fold_settings(state["config"], len(state["unlabeled_idx"]), len(split["unlabeled_idx"]), first)
    if start is None:
        training = fresh_training(config, data, split["labeled_idx"], device)
    else:
        config = config.replace(cons_rampup=0.0) if config.lc is None else config.replace(
            cons_rampup=0.0, lc=config.lc.replace(lc_rampup=0.0))
        student, teacher = (copy.deepcopy(model).train() for model in start)
        training = student, teacher, make_optimizer(student, config.lr)
    trainer = make_trainer("mt", config, data, split, training, device, Processes())
    train_steps(trainer, range(first), name, estimate, bar)
    if second:
        pairs = true_classes(data, config.lc.truth) if config.lc.pairs == "true-class" else None
        trainer = make_trainer("lc", config, data, split, (trainer.student, trainer.teacher, trainer.optimizer), device,
                               Processes(), true_classes=pairs, objective_state=trainer.objective.state_dict())
        train_steps(trainer, range(first, first + second), name, estimate, bar)
    return trainer.student, trainer.teacher


def train_steps(trainer, steps, name, estimate, bar):
    """The steps (a fitted head's: its fit), a bar on a terminal where `bar`; in a log, the
    estimate's line and each head's end only."""
    trainer.steps.start_epoch(steps.start)
    for step in epoch_progress(steps, f"{name}, stage {trainer.stage.name}", bar and sys.stderr.isatty(), estimate.echo):
        trainer.steps.step(step)
        estimate.tick()
    trainer.recompute_bn_means()


def flat(model):
    return torch.cat([t.detach().float().cpu().flatten() for t in model.state_dict().values()]).numpy()


def unflat(model, row):
    """Load a flat row of float32 values (flat's) into the model's state dict, in its order."""
    state, start = {}, 0
    for key, t in model.state_dict().items():
        state[key] = torch.from_numpy(np.array(row[start:start + t.numel()])).view(t.shape).to(t.dtype)
        start += t.numel()
    model.load_state_dict(state)


def hashed_fold(digests):
    """The fold each file's digest (hex, str or bytes) picks: independent of the image's class."""
    return np.array([int(d[:8], 16) % FOLDS for d in digests], dtype=np.int64)


class UnseenHeads:
    """FOLDS heads of a checkpoint and which one predicts an image (module docstring)."""

    def __init__(self, state, data, rows, model_name, model, device):
        self.state, self.data, self.model, self.device = state, data, model, device
        self.rows = rows  # each fold's head as FoldHeads.train gives it: its student's then teacher's flat weights
        self.heads = [models_of_row(state, row, device)[model_name == "teacher"] for row in rows]
        self.spread = LabeledSpread.of_checkpoint(state, data)  # how far an image lies from every labeled one
        self.unlabeled_fold = unlabeled_folds(state)
        n_train = len(data.train_y)
        # the fold of each training image that trained without a label (-1: labeled, or held out)
        self.fold_of_row = np.full(n_train, -1)
        self.fold_of_row[state["unlabeled_idx"].numpy()] = self.unlabeled_fold
        self.known = KeptFeatures(data, model, state["config"], device)

    @classmethod
    def trained(cls, state, data, root, checkpoint_key, model_name, model, device, echo):
        """The heads of the checkpoint (identified by checkpoint_key) whose images are in the folder
        root, trained or taken up from where this machine kept them; `model_name` the teacher or the
        student of each; `model` the checkpoint's own (what the pooled features are of)."""
        folder = cache_dir(root) / f"unseen-{hashlib.sha256(repr(checkpoint_key).encode()).hexdigest()[:16]}"
        held = held_out(state, data)
        # the heads train on the training images and the held-out ones (their bytes and labels), wherever they lie
        work = Work(folder, dict(step="unseen heads", checkpoint=checkpoint_key, folds=FOLDS,
                                 contents=data.contents and data.contents["train"], held_out=held_key(data, held)),
                    echo, wait=lambda: echo(f"waiting for another run that trains or reads the heads in {folder}"))
        try:
            done = work.state.setdefault("folds", [])
            todo = [k for k in range(FOLDS) if k not in done]
            workers = cpu_workers(device, len(todo))
            if todo:
                echo(f"training {len(todo)} heads as the checkpoint's was, each without a quarter of the unlabeled "
                     f"images and labeled by the other three quarters of the {len(held.y)} held-out ones, so that "
                     f"every image is predicted by one that never saw it (once: a later --predict of this checkpoint "
                     f"takes them up)" + (f"; {workers} at once" if workers > 1 else ""))
            with work.kept_if_interrupted("the heads trained so far"):
                train_folds(state, data, root, work, todo, workers, device, echo)
            rows = [kept_row(state, work, k, device, echo, k not in todo) for k in range(FOLDS)]
        finally:
            work.close()
        return cls(state, data, rows, model_name, model, device)

    def folds_of(self, digests):
        """(the head of each image, its position among the checkpoint's training then test images or
        -1) by its file's digest: the fold that left it out where it trained without a label, else
        the fold its hash picks."""
        folds, rows = hashed_fold(digests), self.known.rows(digests)
        n_train = len(self.fold_of_row)
        left_out = (rows >= 0) & (rows < n_train)
        left_out[left_out] = self.fold_of_row[rows[left_out]] >= 0
        folds[left_out] = self.fold_of_row[rows[left_out]]
        return folds, rows

    def outputs(self, x, digests):
        """(the checkpoint's pooled features, the logits of each image's head, how far each lies from
        the labeled images in the trunk's features (outliers.LabeledSpread; None where it has fewer than 2))
        of uint8 images x whose files have these digests: the trunk's features of the checkpoint's own
        images (training and test) taken from the kept ones, any other image's computed."""
        folds, rows = self.folds_of(digests)
        features = self.known.features(x, rows)
        return *self.logits(features, folds), None if self.spread is None else self.spread.ratios(features.numpy())

    def logits(self, features, folds, heads=None):
        """(the checkpoint's pooled features, each row's head's logits) of trunk features (n, D); heads:
        others than these to answer with, one a fold (a round's, live_model.py)."""
        features = features.to(self.device)
        pooled, _ = model_outputs(self.model, features, None, None)
        logits = torch.empty(len(features), self.state["config"].num_classes)
        for k, head in enumerate(self.heads if heads is None else heads):
            mine = torch.from_numpy(folds == k)
            if mine.any():
                logits[mine] = model_outputs(head, features[mine.to(features.device)], None, None)[1].cpu()
        return pooled.cpu(), logits

    def calibration(self, heads=None):
        """The Calibration of the heads (or of others, one a fold) on the checkpoint's held-out images,
        each predicted by the head its file's hash picks (by a fixed draw where the dataset has no files)."""
        held = held_out(self.state, self.data)
        part = "test" if held.source == "test" else "train"
        features = getattr(self.data.features, part)[held.rows, 0].float()
        logits = self.logits(features, held_out_folds(self.state, self.data, held), heads)[1]
        return Calibration.fit(logits.numpy(), held.y.numpy(), held.source, doubted=held.relabeled.numpy())


def held_out_folds(state, data, held):
    """The fold of each held-out image (HeldOut): the one its file's hash picks, by a fixed draw of the
    seed where the dataset has no files."""
    part = "test" if held.source == "test" else "train"
    if data.digests:
        return hashed_fold(np.asarray(data.digests[part]())[held.rows.numpy()])
    return np.random.default_rng(state["config"].seed).permutation(len(held.rows)) % FOLDS


def held_key(data, held):
    """What the heads' held-out labeled images are: their source, the digest of each file (or its row)
    and their labels, hashed."""
    part = "test" if held.source == "test" else "train"
    names = np.asarray(data.digests[part]())[held.rows.numpy()] if data.digests else held.rows.numpy()
    return f"{held.source}:" + hashlib.sha256(np.asarray(names).tobytes() + held.y.numpy().tobytes()).hexdigest()


def unlabeled_folds(state):
    """The fold of each unlabeled training image (in unlabeled_idx's order): a fixed draw of the seed."""
    n = len(state["unlabeled_idx"])
    return np.random.default_rng(state["config"].seed).permutation(n) % FOLDS


def train_folds(state, data, root, work, todo, workers, device, echo):
    """Train the heads of the folds of todo, `workers` at once (train/forked.py), each kept in the
    work as it ends: trained on every labeled image, the held-out images and the unlabeled ones of the
    other folds (FoldHeads)."""
    steps = sum(stage_steps(state))
    rounds = -(-len(todo) // workers)
    estimate = TimeEstimate(f"{len(todo)} heads", rounds * steps, device, echo)
    heads = FoldHeads(state, data, root)
    labels = {int(r): int(data.train_y[r]) for r in state["labeled_idx"].tolist()}
    for k, row in heads.train(labels, todo, workers, device, estimate):
        work.appended(f"fold{k + 1}.f32").write(row.tobytes())
        work.state["folds"].append(k)
        work.commit(force=True)
        echo(f"head {k + 1} of {FOLDS} trained")


class FoldHeads:
    """What the FOLDS heads of a checkpoint train on (module docstring): its schedule, the fold of each
    of its training images and of its held-out images, these as labeled images of the other folds'
    heads; `train` trains them on a set of labels, anew or from the heads of the round before. root:
    the folder the data is read from again by a spawned process (train/forked.py), None where none
    can read it (the heads then train in this process)."""

    def __init__(self, state, data, root=None):
        self.state, self.data, self.root = state, data, root
        self.held = held_out(state, data)
        self.held_folds = held_out_folds(state, data, self.held)
        self.training, self.held_rows = with_held_out(data, self.held)
        # the images a head may train on without a label: the checkpoint's unlabeled ones, then its labeled
        # ones (a round whose labels are another draw); never a --val hold-out
        self.candidates = torch.cat([state["unlabeled_idx"], state["labeled_idx"]])
        self.fold_of_row = np.full(len(data.train_y), -1)
        self.fold_of_row[state["unlabeled_idx"].numpy()] = unlabeled_folds(state)
        labeled = state["labeled_idx"].numpy()
        self.fold_of_row[labeled] = (hashed_fold(np.asarray(data.digests["train"]())[labeled]) if data.digests
                                     else labeled % FOLDS)

    def split(self, k, labels):
        """The split of fold k's head under labels ({training row: class}): every label and the held-out
        images of the other folds labeled, the other images of the other folds unlabeled."""
        rows = torch.tensor(list(labels), dtype=torch.long)
        free = self.candidates[~torch.isin(self.candidates, rows)]
        unlabeled = free[torch.from_numpy(self.fold_of_row[free.numpy()] != k)]
        if not len(unlabeled):  # every image labeled (a labeling round's end): the labeled ones stand in
            unlabeled = rows[torch.from_numpy(self.fold_of_row[rows.numpy()] != k)]
            unlabeled = unlabeled if len(unlabeled) else rows
        return dict(labeled_idx=torch.cat([rows, self.held_rows[torch.from_numpy(self.held_folds != k)]]),
                    val_idx=torch.zeros(0, dtype=torch.long), unlabeled_idx=unlabeled)

    def labeled(self, labels):
        """The training data with these labels ({training row: class}) on its images."""
        rows = torch.tensor(list(labels), dtype=torch.long)
        classes = torch.tensor(list(labels.values()), dtype=torch.long)
        if torch.equal(self.training.train_y[rows], classes):
            return self.training
        train_y = self.training.train_y.clone()
        train_y[rows] = classes
        return dataclasses.replace(self.training, train_y=train_y)

    def train(self, labels, folds, workers, device, estimate, start=None, share=1.0):
        """(fold, its student's then teacher's flat weights) of each fold's head as it ends, `workers` at once:
        trained on `labels` as the checkpoint's head was, or from start[fold] ((student, teacher)) for
        `share` of the checkpoint's steps."""
        if self.root is None and start_method() == "spawn":
            workers = 1
        job = FoldJob(self, labels, device, estimate, folds[0] if workers > 1 else None, start, share)
        return each_at_once(job, folds, workers)


class FoldJob:
    """A round's training of one fold's head (FoldHeads.train), a job of train/forked.py: a spawned
    process is sent it without its data or its estimate, and reads the data from the folder once."""

    def __init__(self, heads, labels, device, estimate, speaker, start, share):
        self.heads, self.labels, self.device, self.estimate = heads, labels, device, estimate
        self.speaker, self.start, self.share = speaker, start, share  # speaker: the fold whose estimate speaks
        self.state, self.root = heads.state, heads.root

    def __getstate__(self):
        return {**self.__dict__, "heads": None, "estimate": None}

    def __call__(self, k):
        if self.heads is None:
            self.heads = FoldHeads(*restored_as_now(self.state, self.root, device=self.device, strong=True), self.root)
        heads = self.heads
        # one process's estimate speaks, for the others' steps as well; bars only alone
        speaks = self.estimate is not None and self.speaker in (None, k)
        estimate = self.estimate if speaks else TimeEstimate("", 0, self.device, lambda line: None)
        models = train_fold(shortened(heads.state, self.share), heads.labeled(self.labels), heads.split(k, self.labels),
                            self.device, f"head {k + 1} of {FOLDS}", estimate, bar=self.speaker is None,
                            start=None if self.start is None else self.start[k])
        return np.concatenate([flat(model) for model in models])


def kept_row(state, work, k, device, echo, kept_before):
    """Fold k's head as the work keeps it: its student's then teacher's flat weights."""
    if kept_before:
        echo(f"head {k + 1} of {FOLDS} that never saw an image: kept from before")
    width = 2 * len(flat(build_models(ModelConfig(**state["model_args"]), device)[0]))
    return np.array(work.rows(f"fold{k + 1}.f32", np.float32, width)[0])


def models_of_row(state, row, device):
    """(student, teacher) of a head from its flat row (FoldHeads.train's), in eval mode."""
    student, teacher = build_models(ModelConfig(**state["model_args"]), device)
    width = len(flat(student))
    for model, part in ((student, row[:width]), (teacher, row[width:])):
        unflat(model, part)
        model.eval()
    return student, teacher
