"""The norm of the student's gradient at every step of a train_mt.py or finetune_lc.py run, before
the clip (settings.MAX_GRAD_NORM: stage 2 and a folder's stage 1) acts: how far normal runs stay
below it. The run itself is the
script's, unchanged but for the record (its clip still acts):

    OMP_NUM_THREADS=1 python tools/grad_norms.py --record runs/norms-digits.json -- train_mt.py --width 0.125 --out runs/n

Prints one line (steps, largest norm, 99th percentile, how many steps were over the clip: clipped
where the stage clips) and writes every norm to --record.
"""
import json
import math
import runpy
import sys
from pathlib import Path

import click
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the project's root: mtlc
from mtlc.train import trainer  # noqa: E402
from mtlc.train.settings import MAX_GRAD_NORM  # noqa: E402


def recording_backward(norms):
    """Trainer.backward, recording the gradient's norm that clip_grad_norm_ returns (before it clips,
    where the stage clips)."""
    def backward(self, loss):
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        limit = self.stage.max_grad_norm
        norms.append(float(torch.nn.utils.clip_grad_norm_(self.student.parameters(), math.inf if limit is None else limit)))
    return backward


def summary(norms):
    finite = sorted(n for n in norms if math.isfinite(n))
    return dict(steps=len(norms), largest=finite[-1] if finite else None,
                p99=finite[int(0.99 * (len(finite) - 1))] if finite else None,
                over_clip=sum(n > MAX_GRAD_NORM for n in norms), clip=MAX_GRAD_NORM)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--record", type=click.Path(dir_okay=False), required=True, help="JSON file of the summary and every norm.")
@click.argument("script", type=click.Choice(["train_mt.py", "finetune_lc.py"]))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def main(record, script, args):
    norms = []
    trainer.Trainer.backward = recording_backward(norms)
    sys.argv = [script, *args]
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    except SystemExit as exc:
        if exc.code:
            print(f"grad_norms: {script} exited with {exc.code}", file=sys.stderr)
    result = summary(norms)
    print(json.dumps(result))
    Path(record).write_text(json.dumps(dict(result, command=[script, *args], norms=norms)) + "\n")


if __name__ == "__main__":
    main()
