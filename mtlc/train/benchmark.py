"""The training step timed: `--benchmark N` of both stages. Medians over N steps after warm-up, the
data path's share of a step (index, gather, augment both views; for the graphed step timed on its
own graph), throughput, and the model work's FLOPs as torch counts them, for the speed docs and the
GPU check.
"""
import json
import statistics
from pathlib import Path

import click
import torch
from torch.utils.flop_counter import FlopCounterMode

from ..disk.runs import atomic_write
from .devices import device_name


def step_flops(trainer, student_view, teacher_view):
    """FLOPs of one training step's model work (student forward + backward, teacher forward),
    counted by torch on the eager modules."""
    with FlopCounterMode(display=False) as counter:
        z, logits = trainer.student(student_view)
        (z.float().sum() + logits.float().sum()).backward()
        with torch.no_grad():
            trainer.teacher(teacher_view)
    trainer.optimizer.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def benchmark(trainer, steps, echo=click.echo):
    """Time `steps` training steps after the warm-up ones (the steps train for real; nothing is
    saved). Returns medians over the timed steps, throughput of all processes together, and the share
    of each step spent on the data path (index, gather, augment both views)."""
    first = trainer.stage.first_step
    warmup = trainer.steps.benchmark_warmup
    step_times, data_times = [], []
    for i in range(warmup + steps):
        seconds, data_seconds = trainer.steps.time_step(first + i)
        if i >= warmup:
            step_times.append(seconds)
            data_times.append(data_seconds)
        echo(f"benchmark {'warm-up' if i < warmup else 'step'} {i + 1 - warmup * (i >= warmup)}/"
             f"{warmup if i < warmup else steps}: {seconds:.4f} s (data {data_seconds:.4f} s)")
    sec = statistics.median(step_times)
    flops = step_flops(trainer, *trainer.batches.views(first)[:2]) * trainer.procs.world
    batch = trainer.config.labeled_batch + trainer.config.unlabeled_batch
    return dict(sec_per_step=sec, images_per_sec=batch / sec, gflops_per_sec=flops / 1e9 / sec,
                data_share=statistics.median(data_times) / sec, precision=trainer.precision,
                gflop_per_step=flops / 1e9, steps=steps, warmup=warmup, steps_per_epoch=trainer.steps_per_epoch, stage=trainer.stage.name,
                dataset=trainer.config.dataset, width=trainer.config.width, batch=batch,
                processes=trainer.procs.world, compile=bool(trainer.config.compile), step_mode=trainer.step_mode,
                captured=getattr(trainer.steps, "graph", None) is not None,
                device=device_name(trainer.device), threads=torch.get_num_threads())


def report_benchmark(trainer, steps, out=None):
    """Run the benchmark; the main process prints its result as one JSON line, the last it prints,
    and writes it to `out`/<stage>_benchmark.json when `out` is given."""
    result = benchmark(trainer, steps, echo=trainer.procs.echo)
    if trainer.procs.main:
        line = json.dumps(result)
        if out is not None:
            Path(out).mkdir(parents=True, exist_ok=True)
            atomic_write(Path(out) / f"{trainer.stage.name}_benchmark.json", lambda f: f.write(line.encode() + b"\n"))
        click.echo(line)
