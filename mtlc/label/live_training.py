"""The head trained again while people label: in a process of its own (spawned: it shares no lock
or thread with the server, and its steps never hold the server's interpreter, so /predict answers
as fast while it trains), which reads the checkpoint's folder and kept features once, then trains
a head for each set of labels it is sent, as the checkpoint's head was trained (use/unseen.py's
train_fold: the checkpoint's objective, stages and number of steps, on the kept features), with
the labels given as labeled images, and sends its teacher's weights back. Labels that arrive while
it trains are taken together by the next training: one at a time, the latest labels always.
"""
import dataclasses
import multiprocessing
import signal
import threading
import time

import torch

from ..errors import UserError
from ..train.checkpoints import load_checkpoint
from ..train.moved_images import restored_as_now
from ..train.progress import TimeEstimate
from ..use.unseen import flat, train_fold


def head_with_labels(state, data, labels, device):
    """The teacher (its flat weights) of a head trained as the checkpoint's was, the images of
    `labels` ({training row: class}) labeled with those classes and no longer unlabeled."""
    rows = torch.tensor(sorted(labels), dtype=torch.long)
    train_y = data.train_y.clone()
    train_y[rows] = torch.tensor([labels[r] for r in rows.tolist()], dtype=torch.long)
    relabeled = dataclasses.replace(data, train_y=train_y)
    unlabeled = state["unlabeled_idx"]
    split = dict(labeled_idx=torch.unique(torch.cat([state["labeled_idx"], rows])),
                 val_idx=torch.zeros(0, dtype=torch.long), unlabeled_idx=unlabeled[~torch.isin(unlabeled, rows)])
    _, teacher = train_fold(state, relabeled, split, device, "live head", TimeEstimate("", 0, device, print), bar=False)
    return flat(teacher)


def training_process(conn, checkpoint, root, device_name):
    """The process's loop (module docstring): ("ready", None) or ("failed", why) once, then for
    each {row: class} received, ("trained", (flat weights, seconds)) or ("not trained", why); ends
    on None or a closed pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which ends this process
    torch.set_num_threads(1)  # a head's step is too little work for two threads (train/forked.py)
    device = torch.device(device_name)
    try:
        state, data = restored_as_now(load_checkpoint(checkpoint), root, device=device, strong=True)
    except UserError as e:
        conn.send(("failed", e.message))
        return
    conn.send(("ready", None))
    while True:
        try:
            labels = conn.recv()
        except EOFError:
            return
        if labels is None:
            return
        start = time.perf_counter()
        try:
            conn.send(("trained", (head_with_labels(state, data, labels, device), time.perf_counter() - start)))
        except Exception as exc:  # this training failed (out of memory, say): said; the next labels try again
            conn.send(("not trained", f"{type(exc).__name__}: {exc}"))


class LiveTraining:
    """The training process and the thread that feeds it: `want(labels)` asks for a head on these
    labels; `trained(labels, weights, seconds)` is called with each head, in the thread."""

    def __init__(self, checkpoint, root, device, trained, echo):
        self.trained, self.echo = trained, echo
        self.status, self.wanted, self.changed = "starting", None, threading.Condition()
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=training_process, args=(child, str(checkpoint), str(root), str(device)),
                                       daemon=True, name="mtlc live head")
        self.process.start()
        child.close()
        threading.Thread(target=self.loop, daemon=True, name="mtlc live head feeder").start()

    def want(self, labels):
        with self.changed:
            self.wanted = dict(labels)
            self.changed.notify()

    def loop(self):
        try:
            kind, why = self.conn.recv()
        except (EOFError, OSError):
            kind, why = "failed", "the training process ended"
        if kind == "failed":
            self.status = f"does not learn live: {why}"
            self.echo(f"the head is not trained again live: {why}")
            return
        self.status = "ready"
        while True:
            with self.changed:
                while self.wanted is None:
                    self.changed.wait()
                labels, self.wanted = self.wanted, None
            self.status = f"training on {len(labels)} labels"
            try:
                self.conn.send(labels)
                kind, what = self.conn.recv()
            except Exception as exc:  # the process ended, or was killed in the middle of its answer
                self.status = f"does not learn live: the training process ended ({type(exc).__name__})"
                self.echo(f"the head is not trained again live: the training process ended ({type(exc).__name__})")
                return
            self.status = "ready"
            try:
                if kind != "trained":
                    raise RuntimeError(what)
                self.trained(labels, *what)
            except Exception as exc:  # said; the next labels train again
                self.echo(f"no head on {len(labels)} labels: {type(exc).__name__}: {exc}")

    def close(self):
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
