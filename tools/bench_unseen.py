"""What `--max-error` accepts of the unlabeled images a checkpoint trained on, and how wrong they
are, predicted by the checkpoint itself against by heads that never saw them (mtlc/use/unseen.py,
what `evaluate.py --predict` does with a head on a frozen trunk), for checkpoints of own-images
folders whose unlabeled images' classes a truth file gives:

    python tools/bench_unseen.py runs/auto-bench-cifar/lite2-*/lc/lc.pt --truth data/own-cifar-truth.csv \\
        --record docs/unseen-cifar.json

The heads are kept beside the folder's decode cache, as --predict keeps them: a later --predict of the
same checkpoint takes them up.
"""
import json
import sys
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc
from bench_objectives import measure, scored  # noqa: E402
from mtlc.data.splits import true_classes  # noqa: E402
from mtlc.train.checkpoints import load_checkpoint  # noqa: E402
from mtlc.use.calibration import confidences  # noqa: E402
from mtlc.use.classifier import Classifier  # noqa: E402
from mtlc.use.classifier import checkpoint_identity  # noqa: E402
from mtlc.use.unseen import hashed_fold  # noqa: E402


def measure_unseen(path, truth, max_error):
    """measure's numbers (bench_objectives.py) with every image predicted by the head that never saw it."""
    state = load_checkpoint(path)
    classifier = Classifier(state, device="cpu")
    why_not = classifier.calibrate_unseen(checkpoint_identity(path), echo=lambda line: None)
    if why_not:
        raise click.ClickException(f"{path}: {why_not}")
    heads, cal = classifier.unseen, classifier.calibration
    data, unlabeled = heads.data, state["unlabeled_idx"]
    y = true_classes(data, truth)[unlabeled].numpy()
    predicted, confidence = confidences(heads.logits(data.features.train[unlabeled, 0].float(), heads.unlabeled_fold)[1],
                                        classifier.temperature)
    test_logits = heads.logits(data.features.test[:, 0].float(), hashed_fold(data.digests["test"]()))[1]
    return scored(predicted, confidence, y, test_logits, data.test_y, cal.threshold(max_error))


@click.command()
@click.argument("checkpoints", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--truth", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--max-error", "max_errors", multiple=True, type=float, default=(5.0, 2.0), show_default=True)
@click.option("--record", type=click.Path(dir_okay=False), help="the results as JSON")
def main(checkpoints, truth, max_errors, record):
    results = {}
    for path in checkpoints:
        results[path] = {f"max_error {e:g}": dict(checkpoint=measure(path, truth, e), unseen=measure_unseen(path, truth, e))
                         for e in max_errors}
        for key, both in results[path].items():
            for who, r in both.items():
                click.echo(f"{path} {key} {who:10s}: test {r['test_error']:.2f}% labels {r['unlabeled_error']:.2f}% "
                           f"accepts {r['accepted_share']:.1f}%"
                           + (f" at {r['accepted_error']:.2f}% wrong" if r["accepted_error"] is not None else ""))
    for key in results[checkpoints[0]]:
        for who in ("checkpoint", "unseen"):
            rows = [results[p][key][who] for p in checkpoints]
            wrong = sum(round(r["accepted_error"] * r["accepted"] / 100) for r in rows if r["accepted"])
            taken = sum(r["accepted"] for r in rows)
            click.echo(f"all, {key}, {who}: labels {np.mean([r['unlabeled_error'] for r in rows]):.2f}%, accepts "
                       f"{np.mean([r['accepted_share'] for r in rows]):.1f}% on average, "
                       + (f"{wrong} of {taken} wrong ({100 * wrong / taken:.2f}%)" if taken else "nothing"))
    if record:
        Path(record).write_text(json.dumps(dict(truth=truth, results=results), indent=1))


if __name__ == "__main__":
    main()
