"""The training step both stages run, written once: the cross-entropy of the labeled images plus
lambda1 * r times the unlabeled objective's loss (objectives/: Mean Teacher's Eq. 1-2, or FixMatch's),
plus lambda2 * r2 * L_lc (Eq. 4-6) in stage 2, its guards, torch's SGD and the EMA teacher (Eq. 3);
the Trainer that holds what a step needs, how a run's Trainer is made, and its eager steps, which read
the schedule and the guards on the host (graphed.py runs the same step with that host work on the
device). The epoch loop is epochs.py's.
"""
import time

import click
import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ..data.batches import Batches
from ..data.splits import unleaked_test
from ..data.views import augment, max_shift, normalization, normalize
from ..disk.runs import rng_state
from ..errors import TrainingFailed
from .devices import Processes, average_buffers, sync
from .fitted import FittedSteps
from .graphed import GraphedSteps, resolve_step_mode
from .inference import chance_verdict, chance_words, test_error
from .lc import PairDistances, fused_kernel_checked, lc_features, lc_term
from .model import ModelConfig, SplitForward, recompute_bn_means
from .networks import build_models
from .objectives import objective_of
from .settings import learning_rate, sigmoid_rampup


@torch.no_grad()
def ema_update(teacher, student, alpha):
    """theta'' <- alpha theta'' + (1 - alpha) theta' (Eq. 3), one fused foreach operation; alpha is a
    stage's constant, so a captured step replays it as it is."""
    t_params, s_params = list(teacher.parameters()), list(student.parameters())
    torch._foreach_mul_(t_params, alpha)
    torch._foreach_add_(t_params, s_params, alpha=1.0 - alpha)


def make_optimizer(student, lr):
    """SGD with Nesterov momentum (the paper's). The graphed step runs it fused, its lr a device tensor."""
    return torch.optim.SGD(student.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-4)


# Training images the BN running means are recomputed on before every evaluation and milestone.
BN_IMAGES = 2560

# Collapse: the batch's feature spread (mean over features of the std over images) below this
# fraction of its value when LC started means LC has pulled every image onto one point.
COLLAPSE_FRACTION = 0.01


def feature_spread(z):
    return z.detach().float().std(0).mean()


class Trainer:
    """What one process needs for the training step of both stages, on its device: the MT objective
    (Eq. 2) and, in stage 2, lambda2 * r2 * L_lc on top (Eq. 6). With several processes each one
    takes its 1/world share of the configured (global) labeled and unlabeled batches."""

    def __init__(self, student, teacher, optimizer, data, split, config, stage, device, procs=None, *,
                 reference_spread=None, true_classes=None, objective_state=None):
        procs = procs or Processes()
        # lc_pairs true-class: every training image's true class (data.true_classes), a measurement of
        # what perfect neighbours would give; nothing else reads it.
        self.true_classes = true_classes
        self.student, self.teacher, self.optimizer = student, teacher, optimizer
        self.split, self.config, self.stage, self.device, self.procs = split, config, stage, device, procs
        self.reference_spread = reference_spread  # feature spread when LC started (collapse guard)
        self.objective = objective_of(config, device, procs.world, objective_state)
        self.batches = Batches(data, split, config, device, procs.rank, procs.world,
                               strong_view=self.objective.strong_view)
        self.steps_per_epoch = self.batches.stream.steps_per_epoch
        self.test_x, self.test_y = data.inputs("test"), data.test_y  # read a batch at a time when evaluated
        self.train_digests = digest_rows(data)
        self.clean_test = unleaked_test(config, data.files and data.files["test"])  # the test images that are no copy of a training one
        self.precision = config.precision
        self.all_neighbours_reported = False
        self.lc_global = stage.name == "lc" and stage.lc_scope == "global" and procs.world > 1
        if stage.name == "lc":
            fused_kernel_checked(device)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # shapes never change: pick the fastest conv algorithms once
        student.train()
        teacher.train()  # dropout on and batch means, as in both reference implementations
        student.to(memory_format=torch.channels_last)  # faster convolutions on CPU and GPU alike
        teacher.to(memory_format=torch.channels_last)
        self.split_forward = config.forward == "split"
        if self.split_forward:
            student, teacher = (SplitForward(m, self.batches.n_lab) for m in (student, teacher))
        # The BN running means are averaged over the processes after every step (average_buffers),
        # not broadcast from rank 0.
        model = student if procs.world == 1 else DDP(student, forward_sync_buffers=False)
        compile_ = torch.compile if config.compile else (lambda m: m)
        self.student_forward, self.teacher_forward = compile_(model), compile_(teacher)
        # The targets of the unlabeled objective: the teacher's outputs on its view, or the student's own
        # on that view (no gradient, no DDP).
        self.targets_forward = (compile_(student) if self.objective.targets_from() == "student"
                                else self.teacher_forward)
        self.step_mode = resolve_step_mode(config.step_mode, device, procs.world, self.batches.resident_bytes)
        if self.objective.fitted:
            self.steps = FittedSteps(self)
        else:
            self.steps = GraphedSteps(self) if self.step_mode == "graphed" else EagerSteps(self)

    def schedule(self, step):
        """(lr, lambda1 * r, lambda2 * r2) at a global step: r counts epochs from the start of MT,
        r2 and the lr schedule from the start of this stage."""
        stage, spe = self.stage, self.steps_per_epoch
        progress = (step - stage.first_step) / spe
        lr = learning_rate(progress, stage.lr, stage.epochs, stage.decay_epochs)
        cons_w = stage.cons_weight * sigmoid_rampup(step / spe, stage.cons_rampup)
        lc_w = stage.lc_weight * sigmoid_rampup(progress, stage.lc_rampup) if stage.name == "lc" else 0.0
        return lr, cons_w, lc_w

    def autocast(self, cache=True):
        """bf16 autocast where the run asks for it; a captured step needs it without its weight cache."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16",
                              cache_enabled=cache)

    def losses(self, student_view, teacher_view, labels, cons_w, lc_w, true_classes=None, autocast_cache=True):
        """(loss, ce, cons, lc, neighbour fraction, feature spread, the objective's metrics) of one step:
        ce + lambda1 r * the unlabeled objective's loss (Eq. 2), in stage 2 + lambda2 r2 * L_lc (Eq. 6);
        the weights may be floats or 0-dim tensors. true_classes: the step's images' true classes, for
        lc_pairs true-class."""
        n_lab = self.batches.n_lab
        with self.autocast(autocast_cache):  # the convolutions; every loss below is computed in fp32
            z, logits = self.student_forward(student_view)
            with torch.no_grad():
                _, target_logits = self.targets_forward(teacher_view)
        ce = F.cross_entropy(logits[:n_lab].float(), labels)
        cons, predicted, metrics = self.objective.unlabeled_loss(logits, target_logits, n_lab)
        loss = ce + cons_w * cons
        if self.stage.name == "lc":
            z = z.float()
            lc, fraction = self.lc_loss(z, labels, predicted, true_classes)
            loss = loss + lc_w * lc
            spread = feature_spread(z)
        else:
            lc = fraction = spread = torch.zeros((), device=self.device)
        return loss, ce, cons, lc, fraction, spread, metrics

    def step_on(self, step, student_view, teacher_view, labels, cons_w, lc_w, true_classes, guard, autocast_cache=True):
        """One training step, the eager and the graphed step's alike: the losses, the guard (the eager
        one on the host, the graphed one on the device), backward, torch's SGD, the EMA (Eq. 3). Returns
        what an epoch sums: loss, ce, cons, lc, neighbour fraction, 1 if every LC pair was a neighbour,
        then the objective's metrics."""
        loss, ce, cons, lc, fraction, spread, metrics = self.losses(student_view, teacher_view, labels, cons_w, lc_w,
                                                                    true_classes, autocast_cache)
        guard(step, loss, spread, torch.stack([ce, cons, lc]).detach())
        self.backward(loss)
        self.optimizer.step()
        ema_update(self.teacher, self.student, self.stage.ema)
        if self.procs.world > 1:
            average_buffers([self.student, self.teacher], self.procs.world)
        fraction = fraction.float()
        return torch.cat([torch.stack([loss.detach(), ce.detach(), cons.detach(), lc.detach(), fraction,
                                       (fraction >= 1).float()]), metrics.float()])

    def backward(self, loss):
        """The student's gradients of `loss`, their norm clipped where the stage says (Stage.max_grad_norm)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.stage.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.student.parameters(), self.stage.max_grad_norm)

    def train_step(self, step, student_view, teacher_view, labels):
        """One eager step (step_on): the schedule set and the guards read on the host."""
        lr, cons_w, lc_w = self.schedule(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        true_classes = (self.true_classes[self.batches.indices(step)].to(self.device)
                        if self.stage.lc_pairs == "true-class" and self.stage.name == "lc" else None)
        return self.step_on(step, student_view, teacher_view, labels, cons_w, lc_w, true_classes, self.check)

    @property
    def epoch_sums(self):
        """The length of step_on's vector."""
        return 6 + len(self.objective.metrics)

    def lc_loss(self, z, labels, predicted, true_classes=None):
        """(L_lc, neighbour fraction) of the step's student features z (labeled images first), in the
        stage's form (neighbours.lc_term) and over the pairs it keeps; predicted: the unlabeled images'
        classes by the teacher (or the pseudo-labels' source) on this step's view."""
        stage, n_lab = self.stage, self.batches.n_lab
        z_lab, z_unl = z[:n_lab], z[n_lab:]
        # same-prediction: a labeled image's class is its label, an unlabeled image's the teacher's
        # prediction on this step's view, so LC never pulls together images the teacher tells apart.
        classes = None
        if stage.lc_pairs == "same-prediction":
            classes = torch.cat([labels, predicted])
        elif stage.lc_pairs == "true-class":
            classes = true_classes
        if self.lc_global:  # neighbours across the whole global batch; gradients flow back to every rank
            z_lab, z_unl = (torch.cat(dist_nn.all_gather(t)) for t in (z_lab, z_unl))
            if classes is not None:  # in z's order: every rank's labeled images, then every rank's unlabeled
                n = len(labels)
                classes = torch.cat([torch.cat(dist_nn.all_gather(t)) for t in (classes[:n], classes[n:])])
        return lc_term(z_lab, z_unl, stage.lc_eps, stage.lc_eps_scale, stage.lc_eps_ratio, stage.lc_loss_unit, classes)

    def collapsed(self, spread, reference):
        """Whether the features' spread fell under COLLAPSE_FRACTION of its value when LC started."""
        return spread < COLLAPSE_FRACTION * reference

    def check(self, step, loss, spread, parts):
        """Stop on a non-finite loss or, in LC, on collapsed features: one host sync per step, and
        with several processes one all_reduce, so that every process decides alike. parts: ce, cons, lc."""
        status = torch.stack([(~torch.isfinite(loss)).float(), spread])
        if self.procs.world > 1:
            dist.all_reduce(status)
        nonfinite, spread = status.tolist()
        spread /= self.procs.world
        if nonfinite:
            self.fail_nonfinite(step, dict(zip(("ce", "cons", "lc"), parts.tolist())))
        if self.stage.name != "lc":
            return
        if self.reference_spread is None:
            self.reference_spread = spread
        if self.collapsed(spread, self.reference_spread):
            self.fail_collapse(step, spread)

    def where(self, step):
        epoch = (step - self.stage.first_step) // self.steps_per_epoch + 1
        return f"at step {step} (epoch {epoch} of stage {self.stage.name})"

    def fail_nonfinite(self, step, parts):
        """Stop the run: the loss of `step` was not finite (parts: its terms' values)."""
        values = " ".join(f"{k}={v:.4g}" for k, v in parts.items())
        hint = (f"; LC with eps={self.stage.lc_eps:g} and lambda2={self.stage.lc_weight:g} (try a smaller lambda2 "
                f"or eps, or a smaller --lr)" if self.stage.name == "lc" else
                f"; the steps overshot at lr {self.stage.lr:g} (try a smaller --lr, or another --seed)")
        raise TrainingFailed(f"non-finite loss {self.where(step)}: {values}{hint}; the checkpoints of the finished "
                             f"epochs are kept")

    def fail_collapse(self, step, spread):
        """Stop the run: the features' spread at `step` says LC pulled every image onto one point."""
        raise TrainingFailed(f"distribution collapse {self.where(step)}: the features' spread fell to {spread:.3g}, "
                             f"under {COLLAPSE_FRACTION:g} of its {self.reference_spread:.3g} when LC started; "
                             f"eps={self.stage.lc_eps:g} and lambda2={self.stage.lc_weight:g} pull every image "
                             f"onto one point (the paper saw this for eps > 500 or lambda2 > 50); the "
                             f"checkpoints of the finished epochs are kept")

    def recompute_bn_means(self):
        """Eval-mode statistics of student and teacher that match their weights now (model.recompute_bn_means)."""
        for model in (self.student, self.teacher):
            recompute_bn_means(model, self.batches.training_images(BN_IMAGES))

    def report_all_neighbours(self, epoch, all_neighbours):
        """Warn, once a run, of an epoch in which every LC pair was a neighbour in every step (not in
        LC's control, where lambda2 0 leaves the neighbours unused)."""
        if all_neighbours and self.stage.lc_weight > 0 and not self.all_neighbours_reported:
            self.all_neighbours_reported = True
            click.echo(f"warning: every LC pair was a neighbour in every step of epoch {epoch}: eps is too large "
                       f"for these features, LC acts on all pairs", err=True)

    def state(self, epoch, step, metrics):
        """The checkpoint of this trainer after `epoch`, whose last step was step - 1 (checkpoints.py
        describes its keys). Its optimizer as the eager step leaves it, however the steps ran: the lr of
        that last step, no fused kernel asked for."""
        optimizer = self.optimizer.state_dict()
        for group in optimizer["param_groups"]:
            group.update(lr=self.schedule(step - 1)[0], fused=None)
        return dict(student=self.student.state_dict(), teacher=self.teacher.state_dict(),
                    optimizer=optimizer, stage=self.stage.name, epoch=epoch, step=step,
                    model_args=ModelConfig.of_run(self.config).as_dict(), config=self.config.as_dict(), **self.split,
                    rng=rng_state(), reference_spread=self.reference_spread, metrics=metrics,
                    adaptive_threshold=self.objective.state_dict(),
                    **({} if self.train_digests is None else dict(train_digests=self.train_digests)))

    def errors(self):
        """Errors (%) of student and teacher on the test set if there is one, on their own labeled
        images and on the validation hold-out if there is one."""
        b = self.batches
        sets = dict(labeled_error=(b.train_x, b.lab_idx, b.train_y[b.lab_idx]))
        if len(self.test_y):
            sets["error"] = (self.test_x, None, self.test_y)
        if self.clean_test is not None and len(self.clean_test):  # none left when every test image is a copy
            sets["clean_error"] = (self.test_x, self.clean_test, self.test_y[self.clean_test])
        if len(b.val_idx):
            sets["val_error"] = (b.train_x, b.val_idx, b.train_y[b.val_idx])
        return {f"{name}_{key}": test_error(model, x, y, b.mean, b.std, idx)
                for key, (x, idx, y) in sets.items() for name, model in (("student", self.student), ("teacher", self.teacher))}

    def distance_summary(self):
        """Pairwise-distance statistics of the student's features in the first batches of the stream
        (neighbours.PairDistances.summary) at the current eps."""
        distances = PairDistances.of_batches(lc_features(self.student, self.batches, self.split_forward))
        ratio = self.stage.lc_eps_ratio
        return distances.summary(self.stage.lc_eps if ratio is None else ratio * distances.mean_d2)

    def chance_warnings(self, record):
        """A warning for each model whose error on its labeled images or validation hold-out is no
        better than always answering the most frequent class (within two standard errors)."""
        warnings = []
        b = self.batches
        for key, what, idx in (("labeled_error", "labeled images", b.lab_idx), ("val_error", "validation hold-out", b.val_idx)):
            if not len(idx):
                continue
            labels = b.train_y[idx].cpu().numpy()
            for name in ("student", "teacher"):
                error = record[f"{name}_{key}"]
                verdict = chance_verdict(error, labels)
                if verdict is None:
                    continue
                warnings.append(f"the {name}'s error on its {what} ends at {chance_words(verdict, error, labels)}: "
                                + ("it learned nothing usable" if verdict == "no better" else
                                   "too few images to tell whether it learned anything")
                                + (f"; unless it was there when LC started, LC's eps={self.stage.lc_eps:g} or "
                                   f"lambda2={self.stage.lc_weight:g} may be too large" if self.stage.name == "lc"
                                   and verdict == "no better" else ""))
        return warnings


class EagerSteps:
    """The eager steps of a Trainer (Trainer.train_step): every step's batch gathered on the host and
    moved to the device, the schedule and the guards read on the host. fit drives it as it drives
    graphed.GraphedSteps: start_epoch, step, end_epoch (the epoch's sums)."""
    benchmark_warmup = 3

    def __init__(self, trainer):
        self.trainer = trainer

    def start_epoch(self, first_step):
        self.sums = torch.zeros(self.trainer.epoch_sums, device=self.trainer.device)

    def step(self, step):
        self.sums += self.trainer.train_step(step, *self.trainer.batches.views(step))

    def end_epoch(self):
        return self.sums

    def time_step(self, step):
        """(seconds of one step, seconds of its data path: index, gather, augment both views)."""
        t = self.trainer
        sync(t.device)
        start = time.perf_counter()
        views = t.batches.views(step)
        sync(t.device)
        data = time.perf_counter() - start
        t.train_step(step, *views)
        sync(t.device)
        return time.perf_counter() - start, data


def fresh_training(config, data, labeled_idx, device):
    """(student, teacher, optimizer) of a new run: the config's seed, the student data-initialized on
    the first labeled batch (augmented as training augments it), the teacher its copy."""
    torch.manual_seed(config.seed)  # every process builds the same networks; DDP checks they agree
    student, teacher = build_models(ModelConfig.of_run(config), device)
    mean, std = normalization(config, device)
    first_labeled = data.inputs("train")[labeled_idx[:config.labeled_batch]].to(device)
    student.data_init(augment(first_labeled, mean, std, config.dataset == "cifar10", max_shift(config.decode_size))
                      if first_labeled.dtype == torch.uint8 else normalize(first_labeled, mean, std))
    teacher.load_state_dict(student.state_dict())
    return student, teacher, make_optimizer(student, config.lr)


def digest_rows(data):
    """The digest of each training image's file as raw bytes (n, 16), uint8, or None without files: kept in
    the checkpoint, so that its images are found again by their bytes wherever they are moved to
    (moved_images.py)."""
    if not data.digests:
        return None
    hexes = np.asarray(data.digests["train"](), "S32")
    return torch.from_numpy(np.frombuffer(bytes.fromhex(b"".join(hexes).decode()), np.uint8).reshape(-1, 16).copy())


def make_trainer(name, config, data, split, training, device, procs, *, reference_spread=None, true_classes=None,
                 objective_state=None):
    """The Trainer of stage `name` of a run: its config, data and split, and `training` (student,
    teacher, optimizer) fresh or restored from a checkpoint (with its objective's state)."""
    return Trainer(*training, data, split, config, config.stage(name), device, procs,
                   reference_spread=reference_spread, true_classes=true_classes, objective_state=objective_state)
