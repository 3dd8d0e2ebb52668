"""The training step without host work (--step-mode graphed): the training images resident on the
device as uint8; every step's batch, schedule (lr, lambda1 r, lambda2 r2) and global step read from
tables the host fills once an epoch; both views gathered and augmented on the device; the guards and
the epoch's sums kept in device tensors and read every GUARD_EVERY steps; torch's SGD fused, its lr a
device tensor. On a CUDA GPU the whole step (both forwards, the losses with LC in its Triton kernel,
backward, SGD, the EMA) is recorded once as a CUDA graph and replayed; on a CPU the same step runs as
it is.

The step itself is the Trainer's (Trainer.step_on, which the eager step runs too); only what feeds it
and what it reports differ: the same images per step (BatchStream), the same losses and updates. Its
random numbers (augmentation, dropout) come from the device's generator seeded once an epoch from
(seed, epoch) instead of once a step, so a run is reproducible and resumes exactly at an epoch's end,
but its draws are not the eager step's.
"""
import math
import statistics
import time

import click
import torch

from ..data.batches import seed_step
from ..errors import UserError
from .devices import sync

# Steps between reads of the guards (one host sync each), and at every epoch's end.
GUARD_EVERY = 200
# Steps run uncaptured before the capture (on a side stream, as CUDA graphs need): cuDNN picks its
# algorithms, Triton compiles the LC kernels, the momentum buffers and the allocator settle. They
# train for real: the same step, not a rehearsal.
WARMUP_STEPS = 3
# The images stay on the GPU only if they take at most this share of its free memory (CIFAR-10: 150 MB).
RESIDENT_SHARE = 0.5
STEP_MODES = ("auto", "eager", "graphed")


def resolve_step_mode(mode, device, world, images_bytes):
    """'eager' or 'graphed' for a run: auto is graphed on one CUDA GPU whose free memory holds the
    training images (images_bytes: their uint8 pixels, or a frozen trunk's features kept of them),
    eager otherwise (a CPU, several processes, images too large)."""
    if mode == "eager":
        return mode
    reason = None
    if world > 1:
        reason = "several processes (DistributedDataParallel) train with the eager step"
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if images_bytes > RESIDENT_SHARE * free:
            reason = (f"the training images ({images_bytes / 2**30:.1f} GiB as uint8, or their features) take more "
                      f"than {RESIDENT_SHARE:.0%} of the GPU's free {free / 2**30:.1f} GiB")
    elif mode == "auto":
        return "eager"  # a CPU launches nothing: the eager step, bitwise as before, stays its default
    if reason and mode == "graphed":
        raise UserError(f"--step-mode graphed: {reason}; use --step-mode eager")
    return "eager" if reason else "graphed"


class EpochTables:
    """What each step of an epoch reads, filled by the host once an epoch: the training-set indices
    of its images (labeled first, Batches.indices), its (lr, lambda1 r, lambda2 r2) and its global
    step; and the position of the next step, which the step itself moves on."""

    def __init__(self, trainer):
        self.trainer, device = trainer, trainer.device
        spe, batch = trainer.steps_per_epoch, trainer.batches.n_lab + trainer.batches.n_unl
        self.indices = torch.zeros(spe, batch, dtype=torch.long, device=device)
        self.schedule = torch.zeros(spe, 3, dtype=torch.float32, device=device)
        self.steps = torch.zeros(spe, dtype=torch.long, device=device)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.first = None  # the global step of row 0

    def fill(self, first, position=0):
        """The rows of the epoch whose first step is `first`; the next step read is row `position`."""
        t, steps = self.trainer, range(first, first + self.trainer.steps_per_epoch)
        pinned = t.device.type == "cuda"
        for table, rows in ((self.indices, torch.stack([t.batches.indices(s) for s in steps])),
                            (self.schedule, torch.tensor([t.schedule(s) for s in steps], dtype=torch.float32)),
                            (self.steps, torch.tensor(steps, dtype=torch.long))):
            table.copy_(rows.pin_memory() if pinned else rows, non_blocking=pinned)
        self.position.fill_(position)
        self.first = first

    def next_row(self):
        """(image indices, lr, lambda1 r, lambda2 r2, global step) of this step, all device tensors."""
        row = self.position.view(1)
        indices = self.indices.index_select(0, row)[0]
        lr, cons_w, lc_w = self.schedule.index_select(0, row)[0].unbind()
        step = self.steps.index_select(0, row)[0]
        self.position.add_(1)
        return indices, lr, cons_w, lc_w, step


class DeviceGuards:
    """The eager step's guards (Trainer.check) without a host sync a step: the first step with a
    non-finite loss and its parts, and in LC the first step whose feature spread fell under
    COLLAPSE_FRACTION of the spread when LC started, kept on the device; `read` stops the run as the
    eager step would, naming that step."""

    def __init__(self, trainer):
        self.trainer, device = trainer, trainer.device
        self.watch_collapse = trainer.stage.name == "lc"
        self.first_nonfinite = torch.full((), -1, dtype=torch.long, device=device)
        self.nonfinite_parts = torch.zeros(3, device=device)  # ce, cons, lc at that step
        reference = trainer.reference_spread
        self.reference = torch.tensor(math.nan if reference is None else reference, device=device)
        self.first_collapse = torch.full((), -1, dtype=torch.long, device=device)
        self.collapse_spread = torch.zeros((), device=device)

    def observe(self, step, loss, spread, parts):
        bad = ~torch.isfinite(loss)
        first = bad & (self.first_nonfinite < 0)
        self.first_nonfinite.copy_(torch.where(first, step, self.first_nonfinite))
        self.nonfinite_parts.copy_(torch.where(first, parts, self.nonfinite_parts))
        if not self.watch_collapse:
            return
        self.reference.copy_(torch.where(torch.isnan(self.reference), spread, self.reference))
        collapsed = self.trainer.collapsed(spread, self.reference) & (self.first_collapse < 0) & ~bad
        self.first_collapse.copy_(torch.where(collapsed, step, self.first_collapse))
        self.collapse_spread.copy_(torch.where(collapsed, spread, self.collapse_spread))

    def read(self):
        """One host sync: raise TrainingFailed for what was seen (the earlier of the two first), and
        hand the reference spread to the trainer (its checkpoints keep it)."""
        values = torch.cat([torch.stack([self.first_nonfinite.double(), self.first_collapse.double(),
                                         self.reference.double(), self.collapse_spread.double()]),
                            self.nonfinite_parts.double()]).tolist()
        nonfinite, collapse, reference, spread, *parts = values
        t = self.trainer
        if self.watch_collapse and not math.isnan(reference):
            t.reference_spread = reference
        if nonfinite >= 0 and (collapse < 0 or nonfinite <= collapse):
            t.fail_nonfinite(int(nonfinite), dict(zip(("ce", "cons", "lc"), parts)))
        if collapse >= 0:
            t.fail_collapse(int(collapse), spread)


class GraphedSteps:
    """The steps of a Trainer as described above; `fit` drives it as it drives EagerSteps:
    start_epoch, step (in order), end_epoch (the epoch's sums, Trainer.step_on's)."""
    benchmark_warmup = WARMUP_STEPS + 2  # the steps before the capture, the capture, one replay

    def __init__(self, trainer):
        self.trainer = t = trainer
        device, b = t.device, t.batches
        # On a CPU the images already are where the step runs (memory-mapped for a folder): no copy.
        self.images = b.train_x.to(device) if device.type == "cuda" else b.train_x
        self.strong_images = b.strong_x  # FixMatch's strong views kept (Batches.strong_x), or None
        if self.strong_images is not None and device.type == "cuda":
            self.strong_images = self.strong_images.to(device)
        self.labels = b.train_y.to(device)
        self.true_classes = None if t.true_classes is None else t.true_classes.to(device)
        self.tables = EpochTables(t)
        self.guards = DeviceGuards(t)
        self.sums = torch.zeros(t.epoch_sums, device=device)
        # torch's SGD, fused (one kernel, CPU and GPU), reading the lr of the moment from a device tensor
        # that each step fills from its table row; Trainer.state keeps the plain float in checkpoints.
        self.lr = torch.zeros((), device=device)
        t.optimizer.param_groups[0].update(lr=self.lr, fused=True)
        self.graph = self.data_graph = None
        self.capture_failed = None  # why the capture failed, if it did
        self.uncaptured = 0  # steps run before the capture
        self.next_step = None
        self.since_read = 0

    @property
    def captures(self):
        return self.trainer.device.type == "cuda"

    def views(self, indices):
        """The student's and the teacher's views of the images `indices` (labeled first), augmented
        independently on the device with no host read (Batches.augmented)."""
        b = self.trainer.batches
        strong = (None if self.strong_images is None
                  else self.strong_images.index_select(0, indices[b.n_lab:]))
        return b.augmented(self.images.index_select(0, indices), sync_free=True, strong=strong)

    def body(self):
        """One training step (Trainer.step_on), every value on the device (what the graph records)."""
        t = self.trainer
        indices, lr, cons_w, lc_w, step = self.tables.next_row()
        self.lr.copy_(lr)
        student_view, teacher_view = self.views(indices)
        labels = self.labels.index_select(0, indices[:t.batches.n_lab])
        true_classes = None if self.true_classes is None else self.true_classes.index_select(0, indices)
        self.sums.add_(t.step_on(step, student_view, teacher_view, labels, cons_w, lc_w, true_classes,
                                 self.guards.observe, autocast_cache=False))

    def start_epoch(self, first_step):
        """Seed the epoch's random numbers from (seed, first_step) and fill its tables."""
        seed_step(self.trainer.batches.seed, first_step)
        self.tables.fill(first_step)
        self.sums.zero_()
        self.next_step = first_step

    def step(self, step):
        """Run global step `step`: the next one of the epoch (or, out of order, its row found first)."""
        spe, first = self.trainer.steps_per_epoch, self.tables.first
        if step != self.next_step:
            if first is None or not first <= step < first + spe:
                first = self.trainer.stage.first_step + (step - self.trainer.stage.first_step) // spe * spe
            self.tables.fill(first, step - first)
        elif step == first + spe:  # past the epoch's last row (the benchmark runs on across epochs)
            self.tables.fill(step)
        if self.graph is None and self.captures and self.uncaptured >= WARMUP_STEPS and not self.capture_failed:
            self.try_capture()
        if self.graph is not None:
            self.graph.replay()
        else:
            on_side_stream(self.body) if self.captures else self.body()
            self.uncaptured += 1
        self.next_step = step + 1
        self.since_read += 1
        if self.since_read >= GUARD_EVERY:
            self.read_guards()

    def try_capture(self):
        """Record the step as a CUDA graph; where the capture fails (a kernel or a library call that
        cannot be captured), say so once and go on with the same step uncaptured: still on the device,
        still without host syncs, only with its launches."""
        try:
            self.graph = capture(self.body)
        except RuntimeError as exc:
            self.capture_failed = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or ['?'])[0][:300]}"
            click.echo(f"warning: the training step could not be captured as a CUDA graph ({self.capture_failed}); "
                       f"it runs uncaptured", err=True)

    def read_guards(self):
        self.since_read = 0
        self.guards.read()

    def end_epoch(self):
        """The epoch's sums, after the guards are read."""
        self.read_guards()
        return self.sums.clone()

    def time_step(self, step):
        """(seconds of one step, seconds of its data path): the data path timed on its own graph (NaN
        while the step's capture is not tried yet)."""
        sync(self.trainer.device)
        start = time.perf_counter()
        self.step(step)
        sync(self.trainer.device)
        seconds = time.perf_counter() - start
        settled = not self.captures or self.graph is not None or self.capture_failed  # captured as the step is
        return seconds, self.data_path_seconds() if settled else float("nan")

    def data_path_seconds(self, repeats=20):
        """Median seconds of the data path (the step's row, gather, both views augmented) alone,
        captured as its own graph on a GPU where the step was (a strong view that cannot be captured
        fails the same way); measured once, after the step's capture was tried (before it: NaN)."""
        if getattr(self, "_data_seconds", None) is None:
            def data_path():
                indices = self.tables.indices.index_select(0, self.tables.position.view(1))[0]
                return self.views(indices)
            run = data_path
            if self.captures and self.graph is not None:
                on_side_stream(data_path)
                self.data_graph = capture(data_path)
                run = self.data_graph.replay
            times = []
            for _ in range(repeats):
                sync(self.trainer.device)
                start = time.perf_counter()
                run()
                sync(self.trainer.device)
                times.append(time.perf_counter() - start)
            self._data_seconds = statistics.median(times)
        return self._data_seconds


def on_side_stream(work):
    """work() on a side stream that waits for, and is then waited for by, the current one (what CUDA
    graphs ask of the steps before a capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        work()
    torch.cuda.current_stream().wait_stream(stream)


def capture(work):
    """work() recorded as a CUDA graph (its random numbers drawn inside, from the device's generator)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    return graph
