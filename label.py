"""Put corrected or confirmed labels back into an own-images folder, so that the next training run
learns from them.

    python label.py --data-dir mydata --apply labels.csv             # each listed image: unlabeled/ -> labeled/<label>/
    python label.py --data-dir mydata --apply preds.csv --accepted   # the rows --max-error accepted, as predicted
    python label.py --data-dir mydata --undo                         # put the last applied batch back

labels.csv has the columns path,label (the review page's Save button writes it; any CSV with those
columns will do, UTF-8 or UTF-16). A row for a labeled/ or test/ image (a label the audit page
corrects, evaluate.py --audit) moves it to the class folder of its own part; --accepted takes
unlabeled/ rows only. Every row is checked before anything moves: an unknown class (unless
--new-classes; a test/ image only takes a class labeled/ has), a missing file, a path outside
unlabeled/, labeled/ and test/ (or through a link leading out of the folder), a row listed twice, a class name the file system refuses, a file on another file
system or a folder that cannot be written exits 2 naming the rows, with nothing moved. Files are
never overwritten (a name already taken in labeled/<label>/ gets a suffix: photo-1.jpg), each moves
with one atomic rename, and every move is logged in mydata/label-log.csv first, so a rerun skips
rows already applied and a run killed midway leaves each file in its old place or its new one; a
move the OS refuses midway (a full disk) puts the batch's earlier moves back. One label.py at a
time per folder. The decode cache notices the moved files by itself.
"""
import collections
from pathlib import Path

import click

from mtlc.console import robust_streams
from mtlc.errors import UserError
from mtlc.label_files import LOG_NAME, read_labels
from mtlc.labeling import SOURCES, apply, locked, plan, undo


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--data-dir", type=click.Path(file_okay=False), required=True,
              help="The own-images folder (labeled/<class>/, unlabeled/).")
@click.option("--apply", "labels_csv", type=click.Path(dir_okay=False), default=None,
              help="A CSV with the columns path,label: move each image from unlabeled/ into labeled/<label>/ (a labeled/ "
                   "or test/ image, relabeled: into <its part>/<label>/).")
@click.option("--accepted", is_flag=True,
              help="With --apply: the CSV is evaluate.py's predictions written with --max-error; apply the rows it "
                   "accepted (accepted = 1), each with its prediction as the label; unlabeled/ images only.")
@click.option("--undo", "undo_last", is_flag=True, help="Put the images of the last applied batch back where they were.")
@click.option("--new-classes", is_flag=True,
              help="With --apply: a label that is not yet a folder under labeled/ creates that class.")
@click.option("--dry-run", is_flag=True, help="With --apply: check every row and list the moves it would make, move nothing.")
def main(data_dir, labels_csv, accepted, undo_last, new_classes, dry_run):
    """Move labeled images from unlabeled/ into labeled/<class>/, relabel labeled/ and test/ images (or put
    the last batch back)."""
    robust_streams()
    data_dir = Path(data_dir)
    if bool(labels_csv) == undo_last:
        raise UserError("give either --apply labels.csv or --undo")
    if (new_classes or dry_run or accepted) and not labels_csv:
        raise UserError("--new-classes, --accepted and --dry-run go with --apply")
    if not (data_dir / "unlabeled").is_dir():
        raise UserError(f"{data_dir} has no unlabeled/ folder: is it an own-images folder?")
    with locked(data_dir):
        if undo_last:
            result = undo(data_dir)
            if result is None:
                click.echo(f"nothing to undo in {data_dir / LOG_NAME}")
            else:
                click.echo(f"put back the {result[1]:,} images of batch {result[0]} where they were")
            return
        if not Path(labels_csv).is_file():
            raise UserError(f"--apply: {labels_csv} does not exist")
        rows = read_labels(labels_csv, accepted)
        # --accepted turns predictions into labels: only for unlabeled/ images, never over a person's label.
        moves, skipped = plan(data_dir, rows, new_classes, sources=("unlabeled",) if accepted else SOURCES)
        done = f" ({skipped:,} applied before, skipped)" if skipped else ""
        if not moves:
            click.echo(f"nothing to move: all {len(rows):,} rows of {labels_csv} were applied before" if rows else
                       f"nothing to move: {labels_csv} has no " + ("accepted rows" if accepted else "rows"))
            return
        per_class = ", ".join(f"{label} {n}" for label, n in sorted(collections.Counter(m.label for m in moves).items()))
        if dry_run:
            for move in moves:
                click.echo(f"{move.source} -> {move.target}")
            click.echo(f"would move {len(moves):,} images into labeled/ ({per_class}){done}; nothing moved")
            return
        batch = apply(data_dir, moves)
        click.echo(f"moved {len(moves):,} images into labeled/ ({per_class}){done}; logged as batch {batch} in "
                   f"{data_dir / LOG_NAME}; python label.py --data-dir {data_dir} --undo puts them back")


if __name__ == "__main__":
    main()
