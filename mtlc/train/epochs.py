"""The epoch loop both stages run (fit): a stage's epochs of training steps, each epoch's record
(its metrics line, and test errors at evaluations), the checkpoints and metrics file written after
every epoch so that a killed run resumes exactly, TensorBoard's curves; and run_stage around it,
which writes into a staging folder while an earlier run's outputs are to be replaced.
"""
import gc
import time
from pathlib import Path

import click
import torch.distributed as dist

from ..disk.runs import (prepare_staging, publish, read_metrics, remove_stale_staging, save_checkpoint, staging_folder,
                         stop_on_signals, write_metrics, writing_folder)
from .curves import TensorBoardCurves
from .progress import TimeEstimate, epoch_progress


def describe_errors(record):
    """'test error student x% teacher y% | val error ...' of an evaluated record, for people."""
    parts = [f"{name} error student {record[f'student{key}_error']:.2f}% teacher {record[f'teacher{key}_error']:.2f}%"
             for name, key in (("test", ""), ("test without its copies of training images", "_clean"), ("val", "_val"))
             if f"student{key}_error" in record]
    return " | ".join(parts) or "no test set, no validation hold-out"


def fit(trainer, out, milestones, start_epoch=0, echo=click.echo, tensorboard=None):
    """Train the stage's epochs after `start_epoch` (epochs already done). After every epoch the main
    process writes the state to each name in milestones[epoch], then to the resume checkpoint
    <stage>_last.pt (with the metrics so far), then adds the epoch's line to <stage>_metrics.jsonl.
    A kill at any of these writes leaves files that --resume continues from exactly: until
    <stage>_last.pt names the epoch done, a resumed run trains it again and rewrites its milestones.
    tensorboard: a folder that gets each record as TensorBoard curves too (curves.TensorBoardCurves).
    Returns the last record."""
    stage, spe, procs = trainer.stage, trainer.steps_per_epoch, trainer.procs
    total_epochs = stage.epochs + stage.decay_epochs
    out = Path(out)
    metrics = read_metrics(out / f"{stage.name}_metrics.jsonl")
    record = metrics[-1] if metrics else None
    curves = (TensorBoardCurves(tensorboard, record if start_epoch else None)
              if tensorboard is not None and procs.main else None)
    estimate = TimeEstimate(stage.name, (total_epochs - start_epoch) * spe, trainer.device, echo if procs.main else
                            (lambda line: None))
    for epoch in range(start_epoch + 1, total_epochs + 1):
        start = time.perf_counter()
        first = stage.first_step + (epoch - 1) * spe
        trainer.steps.start_epoch(first)
        for step in epoch_progress(range(first, first + spe), f"{stage.name} epoch {epoch}/{total_epochs}",
                                   procs.main, echo):
            trainer.steps.step(step)
            estimate.tick()
        sums = trainer.steps.end_epoch()  # loss, ce, cons, lc, neighbour fraction, all-neighbour steps, the objective's
        if procs.world > 1:
            dist.all_reduce(sums)
        means = (sums / (spe * procs.world)).tolist()
        lr, cons_w, lc_w = trainer.schedule(step)
        # global_epoch counts from the start of MT, so MT and LC curves share an axis (Fig. 2).
        record = dict(stage=stage.name, epoch=epoch, global_epoch=stage.first_step / spe + epoch,
                      step=stage.first_step + epoch * spe, lr=lr,
                      cons_weight=cons_w, lc_weight=lc_w, loss=means[0], ce=means[1], cons=means[2],
                      time_s=round(time.perf_counter() - start, 3))
        if stage.name == "lc":
            record.update(lc=means[3], neighbour_fraction=means[4], all_neighbours=means[5] == 1.0)
        objective = dict(zip(trainer.objective.metrics, means[6:]))
        record.update(objective)
        evaluate = epoch % stage.eval_every == 0 or epoch == total_epochs or epoch in milestones
        if evaluate:
            trainer.recompute_bn_means()  # on every process, so that their running means stay identical
        if not procs.main:
            continue  # the other processes go on with the next epoch; rank 0 meets them at its first step
        lc_parts = stage.name == "lc"
        line = (f"{stage.name} epoch {epoch}/{total_epochs} | loss {means[0]:.4f} ce {means[1]:.4f} "
                f"cons {means[2]:.5f}" + (f" lc {means[3]:.4f} nbr {means[4]:.3f}" if lc_parts else "")
                + "".join(f" {label} {objective[key]:.3f}" for key, (label, _) in trainer.objective.metrics.items())
                + f" | lr {lr:.4f} w_cons {cons_w:.2f}"
                + (f" w_lc {lc_w:.2f}" if lc_parts else "") + f" | {record['time_s']:.1f}s")
        if evaluate:
            record.update(trainer.errors())
            line += f" | {describe_errors(record)}"
            if stage.name == "lc":
                distances = trainer.distance_summary()
                # The sample's fraction over every LC pair at eps, beside (never over) the epoch's own
                # neighbour_fraction: the mean over its steps of the pairs LC kept.
                distances["d2_neighbour_fraction"] = distances.pop("neighbour_fraction")
                record.update(distances)
                line += f" | d2 same/different {record['d2_ratio']:.3f} mean {record['d2_mean']:.3g}"
        echo(line)
        trainer.report_all_neighbours(epoch, record.get("all_neighbours"))
        if epoch == total_epochs:
            record["warnings"] = trainer.chance_warnings(record)
            for warning in record["warnings"]:
                click.echo(f"warning: {warning}", err=True)
        metrics.append(record)
        state = trainer.state(epoch, record["step"], metrics)
        for name in milestones.get(epoch, ()):
            save_checkpoint(out / name, state)
        save_checkpoint(out / f"{stage.name}_last.pt", state)  # after the milestones: it marks the epoch done
        write_metrics(out / f"{stage.name}_metrics.jsonl", metrics)
        if curves:
            curves.add(record)
    if curves:
        curves.close()
    return record


def run_stage(trainer, out, milestones, start_epoch, replacing=(), tensorboard=None):
    """fit the trainer's stage from start_epoch, stopping at once on SIGINT or SIGTERM, and say what
    it wrote (the main process). replacing: an earlier run's outputs in out (--overwrite): the run
    writes into a staging folder in out, and its outputs replace those only once they all exist
    (runs.publish); a run killed before leaves them as they were, and --resume continues it where its
    checkpoint is (runs.writing_folder).
    tensorboard: the folder of --tensorboard, given on this command line (a resumed run never writes
    where its checkpoint says: the checkpoint may come from someone else)"""
    name = trainer.stage.name
    if trainer.procs.main:
        out.mkdir(parents=True, exist_ok=True)
    if replacing:
        folder = prepare_staging(out, name) if trainer.procs.main else staging_folder(out, name)
    else:
        folder = writing_folder(out, name) if start_epoch else out
        if not start_epoch and trainer.procs.main:
            remove_stale_staging(out, name)
    with stop_on_signals():
        last = fit(trainer, folder, milestones, start_epoch=start_epoch, echo=trainer.procs.echo,
                   tensorboard=tensorboard)
    # DDP's reducer let go while the process group lives: torn down after it (at exit), its gloo work
    # aborted the process now and then ("terminate called without an active exception").
    trainer.student_forward = None
    gc.collect()
    if trainer.procs.main:
        if folder != out:
            publish(folder, out, replacing)
        written = [out / name for names in milestones.values() for name in names]
        click.echo(f"done: {describe_errors(last)}; wrote {', '.join(map(str, written))}, "
                   f"{out / f'{trainer.stage.name}_metrics.jsonl'}")
