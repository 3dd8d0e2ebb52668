"""Training curves for TensorBoard (`--tensorboard DIR`): every number of a stage's per-epoch record,
the very record <stage>_metrics.jsonl holds, as a scalar at the record's global step, so that MT and
stage 2 share one step axis: MT's curve and MT+LC's branching from it at LC's start are the paper's
Fig. 2. TensorBoard's own convention: one folder per run (runs/tb/mt, runs/tb/lc), `tensorboard
--logdir runs/tb` shows them together.
"""
import contextlib
import os
import threading
from pathlib import Path

from ..errors import UserError, WriteFailed
from .objectives import OBJECTIVES

# The record's keys that are no curve: its place on the axes and its text.
NOT_CURVES = ("stage", "epoch", "step", "warnings")
LOSSES = ("loss", "ce", "cons", "lc")
SCHEDULE = ("lr", "cons_weight", "lc_weight")


def tag(key):
    """The TensorBoard tag of a record's key: grouped (loss/, schedule/, error/, lc/, time/, and the
    objectives' own: FixMatch's pseudo_labels/), the key kept."""
    if key in LOSSES:
        return f"loss/{key}"
    if key in SCHEDULE:
        return f"schedule/{key}"
    if key.endswith("_error"):
        return f"error/{key}"
    if key == "time_s":
        return "time/epoch_seconds"
    if key == "global_epoch":
        return "epoch/global_epoch"
    for objective in OBJECTIVES.values():  # an objective's own metrics, in the group it names
        if key in objective.metrics:
            return f"{objective.metrics[key][1]}/{key}"
    return f"lc/{key}"  # LC's diagnostics: neighbour fraction, all-neighbour epochs, distances


def scalars(record):
    """{tag: value} of every number in a metrics record (booleans as 0 and 1); a number no float holds
    (a damaged checkpoint's) is left out."""
    values = {}
    for key, value in record.items():
        if key not in NOT_CURVES and isinstance(value, (int, float)):
            try:
                values[tag(key)] = float(value)
            except OverflowError:
                continue
    return values


def is_step(step):
    """Whether a record's step is one TensorBoard takes (an int64 that is no bool)."""
    return isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2 ** 63


@contextlib.contextmanager
def writer_failures(log_dir):
    """An OSError of TensorBoard's writer in the block (its own, or its thread's raised again there)
    ends the run as WriteFailed naming the folder; the thread's traceback is not printed
    (quiet_writer_threads)."""
    try:
        yield
    except OSError as exc:
        raise WriteFailed(log_dir, exc, after="the checkpoints and metrics of the epochs before are whole; the curves "
                                              "end there") from None


def quiet_writer_threads():
    """threading's hook with the OSError of a TensorBoard writer thread left unsaid: the run reports it
    in one line when it next writes (writer_failures)."""
    previous = threading.excepthook
    if getattr(previous, "quiet_writers", False):
        return

    def hook(args):
        if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
            return
        previous(args)
    hook.quiet_writers = True
    threading.excepthook = hook


def check_folder(log_dir):
    """--tensorboard's folder as given (a link in it is not resolved away), refused in one line, before
    any work, where it is a link, or something else than a folder."""
    log_dir = Path(log_dir)
    if log_dir.is_symlink() or (log_dir.exists() and not log_dir.is_dir()):
        raise UserError(f"--tensorboard {log_dir}: not a folder (a file, a link or a pipe is there)")
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(log_dir, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise UserError(f"--tensorboard {log_dir}: cannot write there ({exc.strerror or exc})") from None
    return log_dir


class TensorBoardCurves:
    """Writes the records of one stage's run into `log_dir`. A resumed run passes the last record
    its checkpoint marks done: the events of every later step (an epoch trained again) are purged
    and that record written again, so each step appears once whatever moment the run was killed."""

    def __init__(self, log_dir, resumed_record=None):
        log_dir = check_folder(log_dir)
        if resumed_record is not None and not is_step(resumed_record.get("step")):
            raise UserError(f"the checkpoint's last metrics record has no step a curve can take "
                            f"({resumed_record.get('step')!r}): it is damaged")
        try:  # imported only when asked for: it takes a second
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("--tensorboard needs the tensorboard package: pip install tensorboard") from None
        quiet_writer_threads()
        try:
            self.writer = SummaryWriter(str(log_dir), purge_step=resumed_record["step"] if resumed_record else None)
        except OSError as exc:
            raise UserError(f"--tensorboard {log_dir}: cannot write there ({exc.strerror or exc})") from None
        if resumed_record:
            self.add(resumed_record)

    def add(self, record):
        with self.guarded():
            for name, value in scalars(record).items():
                self.writer.add_scalar(name, value, record["step"])
            for warning in record.get("warnings") or ():
                self.writer.add_text("warnings", warning, record["step"])
            self.writer.flush()

    def close(self):
        with self.guarded():
            self.writer.close()

    def guarded(self):
        """Where the event file cannot be written (a full disk), in the writer's thread or here: one
        line naming the folder (WriteFailed), never the thread's traceback."""
        return writer_failures(self.writer.log_dir)
