"""Predictions by heads that never saw the image. A head on a frozen trunk's features trains on its
unlabeled images (consistency, pseudo-labels, LC) and grows surer of them than of images it never
saw, so its held-out images' calibration says too little about them (digits, Lite2: `--max-error 5`
accepted 88% of the unlabeled images at 7.3% wrong; docs/pretrained.md). Here FOLDS heads train as
the checkpoint's head did (its objective, stages and number of steps, on the kept features), each
with one FOLDS-th of the unlabeled images left out. An image the checkpoint trained on without a
label is predicted by the head that left it out; any other (held-out, new, labeled) by the head its
file's hash picks. So every image is predicted by a head that never trained on it, the held-out
images as the rest, and the calibration fitted on them holds for the unlabeled images too: they are
exchangeable. The heads are kept (a sealed work folder beside the decode cache) for the next run.
"""
import hashlib
import sys

import numpy as np
import torch

from ..data.cache import cache_dir
from ..data.splits import true_classes
from ..disk.work import Work
from ..train.devices import Processes
from ..train.forked import cpu_workers, each_at_once
from ..train.inference import model_outputs
from ..train.model import ModelConfig
from ..train.networks import build_models
from ..train.progress import TimeEstimate, epoch_progress
from ..train.trainer import fresh_training, make_trainer
from .calibration import Calibration
from .held_out import held_out
from .kept_features import KeptFeatures
from .outliers import LabeledSpread

FOLDS = 4
NEVER = 10 ** 9  # an epoch count no fold reaches: a fold's head is never evaluated while it trains


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


def train_fold(state, data, split, device, name, estimate, bar=True):
    """(student, teacher) of a head trained as the checkpoint's was on `split`: stage 1, then the
    checkpoint's stage 2 where it had one, as many steps each (estimate: the heads' TimeEstimate;
    bar: a progress bar where stderr is a terminal)."""
    first, second = stage_steps(state)
    config = fold_settings(state["config"], len(state["unlabeled_idx"]), len(split["unlabeled_idx"]), first)
    trainer = make_trainer("mt", config, data, split, fresh_training(config, data, split["labeled_idx"], device),
                           device, Processes())
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

    def __init__(self, state, data, heads, model, device):
        self.state, self.data, self.heads, self.model, self.device = state, data, heads, model, device
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
        # the heads train on the training images alone: the test images' moves and bytes leave them as they are
        work = Work(folder, dict(step="unseen heads", checkpoint=checkpoint_key, folds=FOLDS,
                                 contents=data.contents and data.contents["train"]),
                    echo, wait=lambda: echo(f"waiting for another run that trains or reads the heads in {folder}"))
        try:
            done = work.state.setdefault("folds", [])
            todo = [k for k in range(FOLDS) if k not in done]
            workers = cpu_workers(device, len(todo))
            if todo:
                echo(f"training {len(todo)} heads as the checkpoint's was, each without a quarter of the unlabeled "
                     f"images, so that every image is predicted by one that never saw it (once: a later --predict of "
                     f"this checkpoint takes them up)" + (f"; {workers} at once" if workers > 1 else ""))
            with work.kept_if_interrupted("the heads trained so far"):
                train_folds(state, data, work, todo, workers, device, echo)
            heads = [kept_head(state, work, k, model_name, device, echo, k not in todo) for k in range(FOLDS)]
        finally:
            work.close()
        return cls(state, data, heads, model, device)

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

    def logits(self, features, folds):
        """(the checkpoint's pooled features, each row's head's logits) of trunk features (n, D)."""
        features = features.to(self.device)
        pooled, _ = model_outputs(self.model, features, None, None)
        logits = torch.empty(len(features), self.state["config"].num_classes)
        for k, head in enumerate(self.heads):
            mine = torch.from_numpy(folds == k)
            if mine.any():
                logits[mine] = model_outputs(head, features[mine.to(features.device)], None, None)[1].cpu()
        return pooled.cpu(), logits

    def calibration(self):
        """The Calibration of the heads on the checkpoint's held-out images, each predicted by the
        head its file's hash picks (by a fixed draw where the dataset has no files)."""
        held = held_out(self.state, self.data)
        part = "test" if held.source == "test" else "train"
        digests = self.data.digests[part]() if self.data.digests else None
        if digests is not None:
            folds = hashed_fold(np.asarray(digests)[held.rows.numpy()])
        else:
            folds = np.random.default_rng(self.state["config"].seed).permutation(len(held.rows)) % FOLDS
        features = getattr(self.data.features, part)[held.rows, 0].float()
        logits = self.logits(features, folds)[1]
        return Calibration.fit(logits.numpy(), held.y.numpy(), held.source, doubted=held.relabeled.numpy())


def unlabeled_folds(state):
    """The fold of each unlabeled training image (in unlabeled_idx's order): a fixed draw of the seed."""
    n = len(state["unlabeled_idx"])
    return np.random.default_rng(state["config"].seed).permutation(n) % FOLDS


def train_folds(state, data, work, todo, workers, device, echo):
    """Train the heads of the folds of todo, `workers` at once (train/forked.py), each kept in the
    work as it ends: trained on every labeled image and the unlabeled ones of the other folds."""
    steps = sum(stage_steps(state))
    rounds = -(-len(todo) // workers)
    estimate = TimeEstimate(f"{len(todo)} heads", rounds * steps, device, echo)

    def fold_row(k):  # one process's estimate speaks, for the others' steps as well; bars only alone
        unlabeled = state["unlabeled_idx"]
        split = dict(labeled_idx=state["labeled_idx"], val_idx=torch.zeros(0, dtype=torch.long),
                     unlabeled_idx=unlabeled[torch.from_numpy(unlabeled_folds(state) != k)])
        silent = TimeEstimate("", 0, device, lambda line: None)
        models = train_fold(state, data, split, device, f"head {k + 1} of {FOLDS}",
                            estimate if workers == 1 or k == todo[0] else silent, bar=workers == 1)
        return np.concatenate([flat(model) for model in models])
    for k, row in each_at_once(fold_row, todo, workers):
        work.appended(f"fold{k + 1}.f32").write(row.tobytes())
        work.state["folds"].append(k)
        work.commit(force=True)
        echo(f"head {k + 1} of {FOLDS} trained")


def kept_head(state, work, k, model_name, device, echo, kept_before):
    """Fold k's head (the teacher or the student) as the work keeps it."""
    student, teacher = build_models(ModelConfig(**state["model_args"]), device)
    if kept_before:
        echo(f"head {k + 1} of {FOLDS} that never saw an image: kept from before")
    width = len(flat(student))
    row = work.rows(f"fold{k + 1}.f32", np.float32, 2 * width)[0]
    model = student if model_name == "student" else teacher
    unflat(model, row[:width] if model_name == "student" else row[width:])
    model.eval()
    return model
