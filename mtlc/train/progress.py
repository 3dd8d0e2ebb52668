"""What a training run shows while it runs: progress inside an epoch (a bar on a terminal, a line
every so many steps in a log) and, after the first steps, how long the rest will take."""
import sys
import time

from tqdm import tqdm

from .devices import sync

# Steps between progress lines inside an epoch when no terminal shows a bar.
PROGRESS_EVERY = 100


def epoch_progress(steps, label, show, echo):
    """An epoch's steps, with progress shown inside it where `show`: a tqdm bar on a terminal, else
    (a log file, a job scheduler) a plain line every PROGRESS_EVERY steps."""
    if not show:
        yield from steps
    elif sys.stderr.isatty():
        yield from tqdm(steps, desc=label, leave=False, unit="step")
    else:
        start = time.perf_counter()
        for done, step in enumerate(steps, 1):
            yield step
            if done % PROGRESS_EVERY == 0 and done < len(steps):
                echo(f"{label}: step {done}/{len(steps)}, {(time.perf_counter() - start) / done:.3f} s/step")


class TimeEstimate:
    """Says once, after the first steps of a run, how many steps are left and how long they will take
    on this device at the speed of steps WARMUP+1 .. WARMUP+TIMED (the first ones pay for setup)."""
    WARMUP, TIMED = 2, 10

    def __init__(self, name, steps, device, echo):
        self.name, self.steps, self.device, self.echo = name, steps, device, echo
        self.done, self.start = 0, None

    def tick(self):
        self.done += 1
        if self.done == self.WARMUP:
            sync(self.device)
            self.start = time.perf_counter()
        elif self.done == self.WARMUP + self.TIMED and self.steps > self.done:
            sync(self.device)
            per_step = (time.perf_counter() - self.start) / self.TIMED
            self.echo(f"{self.name}: {self.steps:,} steps at {per_step:.3f} s/step on this device: about "
                      f"{format_duration(per_step * self.steps)} for the steps (what came before them, such as "
                      f"embedding or decoding, and the evaluations not counted)")


def format_duration(seconds):
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
