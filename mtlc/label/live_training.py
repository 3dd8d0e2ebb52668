"""The heads trained again while people label: in a process of its own (spawned: it shares no lock
or thread with the server, and its steps never hold the server's interpreter, so /predict answers
as fast while it trains), which reads the checkpoint's folder, kept features and the heads that never
saw an image of evaluate.py --predict (use/unseen.py, kept in the folder's cache) once, then for each
set of labels it is sent trains a round of them (FoldHeads.train: the given labels as labeled images,
each fold's head going on from its head of the round before for ROUND_SHARE of the checkpoint's
steps) and sends their weights back. Labels that arrive while it trains are taken together by the
next round: one at a time, the latest labels always.
"""
import multiprocessing
import signal
import threading
import time

import torch

from ..errors import UserError
from ..train.checkpoints import load_checkpoint
from ..train.progress import TimeEstimate
from ..use.classifier import Classifier, checkpoint_identity
from ..use.unseen import FOLDS, ROUND_SHARE, FoldHeads, models_of_row

RESTARTS = 3  # a training process that ends mid-round is started again this many times at most


class Rounds:
    """The heads of the rounds so far: each round's from the round before's, the first's from the
    kept heads of --predict."""

    def __init__(self, checkpoint, root, device):
        classifier = Classifier(load_checkpoint(checkpoint), device=device)
        why = classifier.calibrate_unseen(checkpoint_identity(checkpoint), root)
        if why:
            raise UserError(f"no heads that never saw an image: {why}")
        unseen, self.device = classifier.unseen, device
        self.state, self.folds = unseen.state, FoldHeads(unseen.state, unseen.data, root)
        self.heads = [models_of_row(self.state, row, device) for row in unseen.rows]
        train_y = unseen.data.train_y
        self.checkpoint_labels = {int(r): int(train_y[r]) for r in self.state["labeled_idx"].tolist()}

    def trained(self, given):
        """Each fold's flat weights (FoldHeads.train's rows, in fold order) after a round on the labels
        given ({training row: class}, a label given to a labeled image replacing its own)."""
        labels = {**self.checkpoint_labels, **given}
        estimate = TimeEstimate("", 0, self.device, lambda line: None)
        rows = dict(self.folds.train(labels, list(range(FOLDS)), 1, self.device, estimate, start=self.heads,
                                     share=ROUND_SHARE))
        rows = [rows[k] for k in range(FOLDS)]
        self.heads = [models_of_row(self.state, row, self.device) for row in rows]
        return rows


def training_process(conn, checkpoint, root, device_name):
    """The process's loop (module docstring): ("ready", None) or ("failed", why) once, then for
    each {row: class} received, ("trained", (the heads' flat weights, seconds)) or ("not trained",
    why); ends on None or a closed pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which ends this process
    torch.set_num_threads(1)  # a head's step is too little work for two threads (train/forked.py)
    try:
        rounds = Rounds(checkpoint, root, torch.device(device_name))
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
            try:
                rows = rounds.trained(labels)
            except OSError:  # another run replaced the folder's caches under it: read them again, once
                rounds = Rounds(checkpoint, root, torch.device(device_name))
                rows = rounds.trained(labels)
            conn.send(("trained", (rows, time.perf_counter() - start)))
        except Exception as exc:  # this training failed (out of memory, say): said; the next labels try again
            why = exc.message if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
            conn.send(("not trained", why))


class LiveTraining:
    """The training process and the thread that feeds it: `want(labels)` asks for a head on these
    labels; `trained(labels, weights, seconds)` is called with each head, in the thread. A process
    that ends in the middle of a round (killed, out of memory) is started again, at most RESTARTS
    times, and the round's labels train in the new one."""

    def __init__(self, checkpoint, root, device, trained, echo):
        self.trained, self.echo = trained, echo
        self.arguments = (str(checkpoint), str(root), str(device))
        self.status, self.wanted, self.changed = "starting", None, threading.Condition()
        self.start_process()
        threading.Thread(target=self.loop, daemon=True, name="mtlc live head feeder").start()

    def start_process(self):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=training_process, args=(child, *self.arguments), daemon=True,
                                       name="mtlc live head")
        self.process.start()
        child.close()

    def want(self, labels):
        with self.changed:
            self.wanted = dict(labels)
            self.changed.notify()

    def started(self):
        """Whether the training process says it is ready; else the status says why not."""
        try:
            kind, why = self.conn.recv()
        except (EOFError, OSError):
            kind, why = "failed", "the training process ended"
        if kind == "failed":
            self.status = f"does not learn live: {why}"
            self.echo(f"the head is not trained again live: {why}")
            return False
        self.status = "ready"
        return True

    def loop(self):
        restarts = 0
        if not self.started():
            return
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
                ended = f"the training process ended ({type(exc).__name__})"
                if restarts == RESTARTS:
                    self.status = f"does not learn live: {ended}, {RESTARTS} times"
                    self.echo(f"the head is not trained again live: {ended}, {RESTARTS} times")
                    return
                restarts += 1
                self.echo(f"{ended}: started again, the {len(labels)} labels train there")
                self.process.join(timeout=5)
                self.start_process()
                if not self.started():
                    return
                self.want(self.wanted or labels)  # newer labels, where any came meanwhile
                continue
            self.status = "ready"
            try:
                if kind != "trained":
                    raise RuntimeError(what)
                self.trained(labels, *what)
            except Exception as exc:  # said here and in /health; the next labels train again
                why = what if kind != "trained" else f"{type(exc).__name__}: {exc}"
                self.status = f"ready, but the head on {len(labels)} labels failed: {why}"
                self.echo(f"no head on {len(labels)} labels: {why}")

    def close(self):
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
