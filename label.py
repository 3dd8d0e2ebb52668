"""Put corrected or confirmed labels back into an own-images folder, so that the next training run
learns from them, or set aside what the audit found.

    python label.py --data-dir mydata --apply labels.csv             # each listed image: unlabeled/ -> labeled/<label>/
    python label.py --data-dir mydata --apply preds.csv --accepted   # the rows --max-error accepted, as predicted
    python label.py --data-dir mydata --apply audit.csv --set-aside duplicate,leak   # the audit's copies -> set-aside/
    python label.py --data-dir mydata --undo                         # put the last applied batch back

labels.csv has the columns path,label (the review page's Save button writes it; any CSV with those
columns will do, UTF-8 or UTF-16), and optionally blake2b (the hash of the bytes of the image each row
was written for: every CSV this project writes has it, and a row whose file holds another image now
is refused) and action (label, or set-aside: the image goes to set-aside/<its path>, where training
never looks). A row for a labeled/ or test/ image (a label the audit page corrects, evaluate.py
--audit) moves it to the class folder of its own part; --accepted takes unlabeled/ rows only, logged
as a model's predictions (train_mt.py trains on them as unlabeled images unless --accepted-as-labels;
a person's later row for one makes the label theirs: a new class moves it, the same class confirms
it, logged, nothing moved). Every
row is checked before anything moves: an unknown class (unless --new-classes; a test/ image only
takes a class labeled/ has), a class differing from another only in case, a missing file, a file two
rows name, an image replaced since its row was written, a path outside unlabeled/, labeled/ and test/
(or through a link leading out of the folder), a hidden file or one that is no image (training would
never see it), a row listed twice, a class name the file system refuses, a file on another file
system or a folder that cannot be written exits 2 naming the rows, with nothing moved. Files are
never replaced (a name already taken in the folder, in any case, gets a suffix: photo-1.jpg; each
moves with one rename that the OS refuses to make over a file), and every move is logged in
mydata/label-log.csv first, so a rerun skips rows already applied (also where the image was
relabeled since) and a run killed midway leaves each file in its old place or its new one; a move
the OS refuses midway (a full disk) puts the batch's earlier moves back. The log is never followed
through a link. One label.py at a time per folder. The decode cache notices the moved files by itself.
"""
import collections
import sys
from pathlib import Path

import click
from tqdm import tqdm

from mtlc.disk.command_line import Command
from mtlc.disk.console import robust_streams, shown
from mtlc.disk.outputs import LOG_NAME
from mtlc.errors import UserError
from mtlc.label.apply import apply, locked, undo
from mtlc.label.inputs import ASIDE, ASIDE_KINDS, SOURCES, read_labels
from mtlc.label.plan import plan
from mtlc.label.leaks import copies_of_test_images, describe_test_copies


def aside_kinds(ctx, param, value):
    """--set-aside's comma-separated kinds, checked."""
    if value is None:
        return ()
    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    unknown = [k for k in kinds if k not in ASIDE_KINDS]
    if unknown or not kinds:
        raise click.BadParameter(f"{value!r}: give one or more of {','.join(ASIDE_KINDS)}, comma-separated")
    return kinds


def describe_moves(moves):
    """'into labeled/ (cat 2, dog 1), into other classes of test/ (cat 1), into set-aside/ (3; 1 of them
    from test/, ...)': where a batch's images go (a test/ image set aside leaves the test error one image fewer)."""
    groups, from_test = {}, 0
    for move in moves:
        part = move.source.split("/")[0]
        what = (f"into {ASIDE}/" if move.aside else "into labeled/" if part == "unlabeled"
                else f"into other classes of {part}/")
        groups.setdefault(what, collections.Counter())[shown(move.label)] += 1
        from_test += move.aside and part == "test"
    said = {what: ", ".join(f"{label} {n}" if label else str(n) for label, n in sorted(counts.items()))
            for what, counts in groups.items()}
    if from_test:
        said[f"into {ASIDE}/"] += (f"; {from_test:,} of them from test/, whose error then counts {from_test:,} "
                                   f"image{'s' * (from_test != 1)} fewer")
    return ", ".join(f"{what} ({counts})" for what, counts in said.items())


def describe_batch(moves, would=False):
    """'moved 3 images into labeled/ (cat 2, dog 1); confirmed 2 labels ...': what a batch does."""
    moved = len(moves) - moves.confirmed
    said = [f"{'would move' if would else 'moved'} {moved:,} image{'s' * (moved != 1)} "
            f"{describe_moves(m for m in moves if not m.confirms)}"] if moved else []
    if moves.confirmed:
        said.append(f"{'would confirm' if would else 'confirmed'} {moves.confirmed:,} label{'s' * (moves.confirmed != 1)} "
                    f"label.py --accepted gave (yours from then on: training takes them as labels)")
    return "; ".join(said)


def describe_export(path, export, labeled):
    """'export.json: a Label Studio JSON export, 12 tasks labeled; 3 without annotation and 1 cancelled
    move nothing'."""
    idle = [f"{n:,} {what}" for n, what in ((export.no_annotation, "without annotation"),
                                             (export.cancelled, "cancelled")) if n]
    return (f"{shown(path)}: a {export.format} export, {labeled:,} tasks labeled"
            + (f"; {' and '.join(idle)} move nothing" if idle else ""))


def lines_in(path):
    """The lines of a file (its rows, but for a field holding a line break), counted a block at a
    time: the total of the progress bar."""
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(2 ** 20), b""))


def progress_bar(total, what):
    """The update function of a progress bar on stderr with the time left (on a terminal; none in a log)."""
    return tqdm(total=total, desc=what, unit="file", disable=None, leave=False, file=sys.stderr).update


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--data-dir", type=click.Path(file_okay=False), required=True,
              help="The own-images folder (labeled/<class>/, unlabeled/).")
@click.option("--apply", "labels_csv", type=click.Path(dir_okay=False), default=None,
              help="A CSV with the columns path,label: move each image from unlabeled/ into labeled/<label>/ (a labeled/ "
                   "or test/ image, relabeled: into <its part>/<label>/). Or a Label Studio export (JSON, JSON-MIN or "
                   "CSV) of the tasks evaluate.py --label-studio wrote: each task's latest annotation that is not "
                   "cancelled is its label; tasks without one move nothing and are counted.")
@click.option("--accepted", is_flag=True,
              help="With --apply: the CSV is evaluate.py's predictions written with --max-error; apply the rows it "
                   "accepted (accepted = 1), each with its prediction as the label; unlabeled/ images only, logged "
                   "as predictions: train_mt.py trains on them as unlabeled images unless --accepted-as-labels.")
@click.option("--undo", "undo_last", is_flag=True, help="Put the images of the last applied batch back where they were.")
@click.option("--set-aside", "set_aside", callback=aside_kinds, default=None, metavar="KINDS",
              help=f"With --apply: the CSV is evaluate.py --audit's; move the images of its findings of these kinds "
                   f"(comma-separated: {','.join(ASIDE_KINDS)}) into {ASIDE}/<their path> (a duplicate: the second "
                   f"copy; a leak: the test/ image; an outlier: the image), where training never looks; logged and "
                   f"undone as every move.")
@click.option("--new-classes", is_flag=True,
              help="With --apply: a label that is not yet a folder under labeled/ creates that class.")
@click.option("--dry-run", is_flag=True, help="With --apply: check every row and list the moves it would make, move nothing.")
def main(data_dir, labels_csv, accepted, undo_last, set_aside, new_classes, dry_run):
    """Move labeled images from unlabeled/ into labeled/<class>/, relabel labeled/ and test/ images, set
    aside the audit's copies, leaks and strays (or put the last batch back)."""
    robust_streams()
    data_dir = Path(data_dir)
    if bool(labels_csv) == undo_last:
        raise UserError("give either --apply labels.csv or --undo")
    if (new_classes or dry_run or accepted or set_aside) and not labels_csv:
        raise UserError("--new-classes, --accepted, --set-aside and --dry-run go with --apply")
    if accepted and set_aside:
        raise UserError("--accepted takes a predictions CSV, --set-aside an audit CSV: one at a time")
    if not (data_dir / "unlabeled").is_dir():
        raise UserError(f"{data_dir} has no unlabeled/ folder: is it an own-images folder?")
    with locked(data_dir):
        if undo_last:
            result = undo(data_dir, bar=progress_bar)
            if result is None:
                click.echo(f"nothing to undo in {shown(data_dir / LOG_NAME)}")
            else:
                batch, put_back, confirmations = result
                click.echo("; ".join(
                    [f"put back the {put_back:,} images of batch {batch} where they were"] * bool(put_back or not confirmations)
                    + [f"took back the {confirmations:,} confirmations of batch {batch} (label.py --accepted's labels "
                       f"again)"] * bool(confirmations)))
            return
        rows, export = read_labels(labels_csv, accepted, set_aside)
        if export:
            click.echo(describe_export(labels_csv, export, len(rows)))
        # --accepted turns predictions into labels: only for unlabeled/ images, never over a person's label.
        moves = plan(data_dir, rows, new_classes, sources=("unlabeled",) if accepted else SOURCES, bar=progress_bar,
                     expected=len(rows) if export else lines_in(labels_csv) - 1, persons=not accepted)
        done = (f" ({moves.skipped:,} applied before, skipped)" * bool(moves.skipped)
                + f" ({moves.overruled:,} labeled otherwise or set aside by you before, skipped: yours stand)"
                * bool(moves.overruled))
        if not moves:
            what = "accepted rows" if accepted else "findings of those kinds" if set_aside else "rows"
            click.echo(nothing_to_move(moves, labels_csv, what))
            return
        warning = describe_test_copies(copies_of_test_images(data_dir, moves))
        if warning:
            click.echo(warning, err=True)
        if dry_run:
            for move in moves:
                click.echo(f"{shown(move.source)}: confirm {shown(move.label)}" if move.confirms
                           else f"{shown(move.source)} -> {shown(move.target)}")
            click.echo(f"{describe_batch(moves, would=True)}{done}; nothing moved")
            return
        batch = apply(data_dir, moves, bar=progress_bar, accepted=accepted)
        click.echo(f"{describe_batch(moves)}{done}; logged as batch {batch} in {shown(data_dir / LOG_NAME)}; "
                   f"python label.py --data-dir {shown(data_dir)} --undo "
                   + ("puts them back" if len(moves) > moves.confirmed else "takes it back"))
        if accepted:
            click.echo("their labels are the model's: train_mt.py trains on them as unlabeled images (a person's "
                       "labels teach better), and as labels with --accepted-as-labels")


def nothing_to_move(moves, labels_csv, what):
    """The line of a labels file whose rows move nothing (what: the kind of rows it has none of)."""
    if not moves.rows:
        return f"nothing to move: {shown(labels_csv)} has no {what}"
    if moves.overruled:
        return (f"nothing to move: of the {moves.rows:,} rows of {shown(labels_csv)}, {moves.skipped:,} were applied "
                f"before and {moves.overruled:,} name images you labeled otherwise or set aside before (yours stand)")
    return f"nothing to move: all {moves.rows:,} rows of {shown(labels_csv)} were applied before"


if __name__ == "__main__":
    main()
