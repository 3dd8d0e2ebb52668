"""The audit's distance ratios in a pretrained trunk's kept features, for every image of a checkpoint's
folder: each image's mean distance to its nearest labeled images over the labeled images' largest
(mtlc/use/outliers.py). Prints the ordinary images' median, 99th percentile and largest, how many are
over the margin, and each marked image's ratio (docs/audit.md, "Junk among photos").

    python examples/distance_ratios.py runs/photos/mt_final.pt --marked unlabeled/junk/
"""
import sys
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc
from mtlc.data.nearest import Vectors  # noqa: E402
from mtlc.train.checkpoints import load_checkpoint, restore_data  # noqa: E402
from mtlc.use.outliers import TRUNK_OUTLIER_MARGIN, distance_ratios, trunk_vectors  # noqa: E402
from mtlc.use.selection import unit_rows  # noqa: E402


@click.command()
@click.argument("checkpoint", type=click.Path(exists=True, dir_okay=False))
@click.option("--marked", default="unlabeled/junk/", show_default=True,
              help="Images whose path in the folder starts with this are listed one by one, apart from the others.")
def main(checkpoint, marked):
    state = load_checkpoint(checkpoint)
    data = restore_data(state, echo=lambda line: None)
    if data.features is None:
        raise click.UsageError(f"{checkpoint} is no head on a frozen pretrained trunk (no kept features)")
    labeled = np.zeros(len(data.train_y) + len(data.test_y), bool)
    labeled[state["labeled_idx"].numpy()] = True
    kept = trunk_vectors(data)  # the audit's space: the trunk's features, L2-normalized
    unit = Vectors(kept.n, kept.dim, lambda: (unit_rows(b) for b in kept.batches()), lambda idx: unit_rows(kept.rows(idx)))
    ratios = distance_ratios(unit, labeled)
    files = np.array(data.files["train"] + data.files["test"])
    is_marked = np.char.startswith(files.astype(str), marked)
    ordinary = ratios[~is_marked & ~labeled]
    click.echo(f"{len(ordinary):,} ordinary images: median {np.median(ordinary):.3f}, 99th percentile "
               f"{np.percentile(ordinary, 99):.3f}, largest {ordinary.max():.3f}; "
               f"{int((ordinary > TRUNK_OUTLIER_MARGIN).sum())} over the margin {TRUNK_OUTLIER_MARGIN}")
    for name, ratio in sorted(zip(files[is_marked], ratios[is_marked]), key=lambda pair: pair[1]):
        click.echo(f"{ratio:.3f} {name}")


if __name__ == "__main__":
    main()
