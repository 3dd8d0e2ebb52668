"""Test errors of checkpoints, predictions for image files (calibrated, with which to accept and
which to label next), the paper's results table, error curves and t-SNE pictures.

    python evaluate.py --ckpt lc.pt                                   # student and teacher test error
    python evaluate.py --ckpt lc.pt --json                            # one JSON object, per-class errors too
    python evaluate.py --ckpt lc.pt --predict photos/ --csv preds.csv  # a class for every image under photos/
    python evaluate.py --ckpt lc.pt --predict unlabeled/ --max-error 5 --csv preds.csv  # ... and which to accept
    python evaluate.py --ckpt lc.pt --predict unlabeled/ --suggest 100 --csv next.csv   # which to label next
    python evaluate.py --ckpt lc.pt --predict unlabeled/ --max-error 5 --review review.html  # look, correct, save
    python evaluate.py --ckpt lc.pt --confusion confusion.png          # the test set's confusion matrix
    python evaluate.py --ckpt runs/mt*/mt_final.pt runs/lc*/lc.pt --table results.md    # Table 1
    python evaluate.py --curves mt_metrics.jsonl --curves lc_metrics.jsonl --plot curves.png  # Fig. 2
    python evaluate.py --ckpt lc.pt --tsne tsne.png                    # Figs. 5-6
    python evaluate.py --ckpt mt.pt --distances d2.png                 # where eps falls among the distances
    python evaluate.py --ckpt lc.pt --onnx model.onnx                  # the calibrated classifier for onnxruntime
    python evaluate.py --ckpt lc.pt --predict unlabeled/ --label-studio tasks.json   # pre-annotated Label Studio tasks
"""
import json
import os
import sys
from pathlib import Path

import click
import cloup
import torch

from mtlc.data.files import is_image_name
from mtlc.data.splits import measured_pool, true_classes
from mtlc.disk.command_line import OnceEach, given_options
from mtlc.disk.console import robust_streams
from mtlc.disk.outputs import check_outputs, written_at
from mtlc.errors import UserError
from mtlc.train.checkpoints import checkpoint_split, load_checkpoint, restore_data, restore_models
from mtlc.train.devices import pick_device
from mtlc.train.lc import DISTANCE_IMAGES, checkpoint_distances
from mtlc.train.options import Number
from mtlc.use.alike import alike_key, alike_settings, counted_once, mark_cells
from mtlc.use.audit import AUDIT_HEADER
from mtlc.use.crossfit import DEFAULT_FOLDS, DEFAULT_STEPS
from mtlc.use.figures import checkpoint_title, plot_confusion, plot_curves, plot_distances, plot_tsne
from mtlc.use.label_studio import config_path as studio_config_path
from mtlc.use.orders import DEFAULT_ORDER, SUGGEST_ORDERS
from mtlc.use.predict import PredictOptions, export, predict, run_audit
from mtlc.use.prediction_rows import CSV_HEADER
from mtlc.use.report import (describe_means, describe_paired, describe_result, evaluate_checkpoint, paired_differences,
                             results_table, write_table)
from mtlc.use.review import DEFAULT_MOST, DEFAULT_PER_CLASS


class EvaluateCommand(OnceEach, cloup.Command):
    """cloup's command (option groups), each option given once."""


class JobOption(cloup.Option):
    """An option that belongs to a job: `needs`, the parameters of which one must be given with it, and
    `not_with`, those of the jobs it does nothing for (its declaration says so, and check_request
    refuses it in one line otherwise)."""

    def __init__(self, *args, needs=(), not_with=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.needs, self.not_with = tuple(needs), tuple(not_with)


def job_option(*args, needs, not_with=(), **kwargs):
    return cloup.option(*args, cls=JobOption, needs=needs, not_with=not_with, **kwargs)


# What a one-checkpoint job (--predict, --audit, --onnx) does not take beside it.
OTHER_OUTPUTS = ("table", "curves", "tsne", "distances", "confusion", "pool_error")
# The files evaluate.py writes, by field of its options: each where its link leads (outputs.written_at).
OUTPUT_OPTIONS = dict(csv_path="--csv", review="--review", audit="--audit", coverage="--coverage",
                      confusion="--confusion", table="--table", plot="--plot", tsne="--tsne", distances="--distances",
                      label_studio="--label-studio", onnx="--onnx")
# The outputs that replace a file only where it is what they write (earlier predictions, an earlier audit):
# the start of their first line.
OWN_KINDS = {"--csv": ",".join(CSV_HEADER), "--audit": ",".join(AUDIT_HEADER[:2])}


def given(ctx, name):
    return ctx.get_parameter_source(name) in (click.core.ParameterSource.COMMANDLINE,
                                               click.core.ParameterSource.ENVIRONMENT)


def check_request(ctx, o):
    """Exit 2 in one line for options without their job, and for jobs that do not go together."""
    flags = {param.name: param.opts[0] for param in ctx.command.params}
    for param in ctx.command.params:
        jobs = getattr(param, "needs", ())
        if jobs and given(ctx, param.name) and not any(getattr(o, job) for job in jobs):
            raise UserError(f"{flags[param.name]} goes with {' or '.join(flags[job] for job in jobs)}")
        useless = [job for job in getattr(param, "not_with", ()) if getattr(o, job)]
        if useless and given(ctx, param.name):
            raise UserError(f"{flags[param.name]} does nothing with {flags[useless[0]]}: leave it out")
    if o.table and Path(o.table).suffix not in (".md", ".csv"):
        raise UserError(f"--table must end in .md or .csv, got {o.table}")
    jobs = ("onnx", "audit", "predict_paths")
    for job in jobs:
        others = [n for n in jobs if n != job and getattr(o, n)]
        if getattr(o, job) and (len(o.ckpts) != 1 or others or any(getattr(o, n) for n in OTHER_OUTPUTS)):
            raise UserError(f"{flags[job]} takes exactly one --ckpt and no other output (--table, "
                            f"--curves, --tsne, --distances, --confusion, --pool-error, --predict, --audit, --onnx): "
                            f"run evaluate.py again for those")
    if o.as_json and (o.audit or o.onnx or (o.predict_paths and not o.csv_path)):
        raise UserError("--json goes with the checkpoints' errors, or with --predict and --csv (the JSON summary "
                        "to stdout, the rows to the file); not with --audit or --onnx")
    if (o.table or o.tsne or o.distances or o.confusion) and not o.ckpts:
        raise UserError("--table, --tsne, --distances and --confusion need at least one --ckpt")
    if not o.ckpts and not o.curves:
        raise UserError("nothing to do: give --ckpt, or --curves with --plot")


def check_outputs_of(o, states):
    """Exit 2 where an output would replace an input, another output, a file the tools keep or (the
    checkpoints loaded: states) an image of a checkpoint's folder or a file of another kind than it writes."""
    outputs = {option: getattr(o, field) for field, option in OUTPUT_OPTIONS.items()}
    config = "--label-studio's labeling config"
    outputs[config] = o.label_studio and written_at(config, str(studio_config_path(o.label_studio)))
    inputs = {**{f"--ckpt {c}": c for c in o.ckpts}, **{f"--curves {c}": c for c in o.curves}, "--truth": o.truth,
              **{f"--predict {p}": p for p in o.predict_paths if not Path(p).is_dir()}}
    images = [(o.data_dir or state["config"].data_dir, files["train"] + files["test"], f"the images of {path}'s folder")
              for path, state in zip(o.ckpts, states) for files in [state["config"].files] if files]
    # Once the checkpoints are read: after their images, so that an image under an output's name is refused as one.
    check_outputs(outputs, inputs=inputs, read_from=images, kinds=OWN_KINDS if states else None)
    folders = [(folder, what) for folder, _, what in images] + [(p, f"--predict {p}") for p in o.predict_paths
                                                                  if Path(p).is_dir()]
    check_images_outside(outputs, folders)


def check_images_outside(outputs, folders):
    """Exit 2 where an output that is an image (a figure) would lie in a folder whose images are read
    [(folder, what it is)]: the next run would take the figure for one of them."""
    for option, out in ((option, out) for option, out in outputs.items() if out and is_image_name(Path(out).name)):
        for folder, what in folders:
            if Path(os.path.realpath(out)).is_relative_to(os.path.realpath(folder)):
                raise UserError(f"{option} {out} lies in {what}: a figure written there would be read as one of its "
                                f"images next time; write it elsewhere")


@cloup.command(cls=EvaluateCommand, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@cloup.argument("more_paths", nargs=-1, type=click.Path())
@cloup.option_group(
    "Evaluate checkpoints", "test errors of student and teacher, per class, calibration, how LC went",
    cloup.option("--ckpt", "ckpts", type=click.Path(dir_okay=False), multiple=True,
                  help="A checkpoint written by train_mt.py or finetune_lc.py. Several (one per seed): --ckpt a.pt "
                       "b.pt c.pt, or --ckpt repeated."),
    job_option("--json", "as_json", needs=["ckpts"], is_flag=True,
                  help="Print one JSON object per checkpoint instead of text: errors, per_class (each class's test "
                       "images and error) and, for an LC run, how LC went."),
    job_option("--model", "model_name", needs=["ckpts"], not_with=["audit"], type=click.Choice(["teacher", "student"]),
               default="teacher",
                  help="The model that predicts (--predict), whose confidences are calibrated and whose confusion "
                       "matrix is drawn (--confusion)."),
    cloup.option("--pool-error", is_flag=True,
                  help="Also the error on the checkpoint's unlabeled training images, whose labels training never "
                       "used (more images than the test set: a steadier comparison of methods): their own labels for "
                       "svhn, cifar10 and digits, --truth's for a folder."),
    job_option("--truth", needs=["pool_error"], type=click.Path(exists=True, dir_okay=False), default=None,
                  help="With --pool-error on a folder: a CSV with columns path,class for its unlabeled/ images (paths"
                       " as unlabeled/NAME; examples/own_images.py writes one beside the folders it builds)."),
    job_option("--data-dir", needs=["ckpts"], type=click.Path(file_okay=False), default=None,
               help="Dataset folder. [default: the checkpoint's]"),
    job_option("--seed", needs=["tsne", "suggest_n", "audit"], type=int, default=0,
               help="Seed of the t-SNE and its subsample, of --suggest's k-means and of the audit's folds (the "
                    "errors are deterministic)."),
    job_option("--device", needs=["ckpts"], type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
               help="auto: CUDA when available."),
)
@cloup.option_group(
    "Predict and accept (--predict)", "a calibrated class for every image, and which to accept",
    cloup.option("--predict", "predict_paths", type=click.Path(), multiple=True,
                  help="Image files or folders (searched recursively for the image types PIL reads) to classify with "
                       "one checkpoint: --predict a/ b.jpg c/. Prints the CSV path,prediction,confidence,runner_up "
                       "(the class, its softmax probability, the second most likely class), or writes it to --csv. An"
                       " unreadable file gets an empty prediction, a message on stderr and exit code 1 at the end."),
    job_option("--csv", "csv_path", needs=["predict_paths"], type=click.Path(dir_okay=False), default=None,
                  help="With --predict: write the rows to this file instead of stdout (it replaces an earlier "
                       "predictions CSV, never a file of another kind: a labels file corrected by hand is refused)."),
    job_option("--max-error", needs=["predict_paths"], type=Number(min=0, max=100, min_open=True, max_open=True), default=None,
                  help="With --predict: add a column `accepted` (1/0): 1 where the calibrated confidence is at least "
                       "the lowest threshold at which the checkpoint's held-out images above it are at most this % "
                       "wrong (a one-sided 95% upper bound, so that a few lucky images cannot set it). Prints how "
                       "many were accepted. Needs held-out images (test/, or train_mt.py --val N)."),
    job_option("--coverage", needs=["predict_paths"], type=click.Path(dir_okay=False), default=None,
                  help="With --predict: draw the held-out images' error against coverage (most confident first) to "
                       "this PNG, with the --max-error threshold."),
    job_option("--skip-bad-images", needs=["predict_paths"], is_flag=True,
                  help="With --predict: files that cannot be read still get a row with an empty prediction and a "
                       "message on stderr, but the run exits 0 when they were its only trouble (without it: exit code"
                       " 1)."),
    job_option("--batch-size", needs=["predict_paths"], type=click.IntRange(min=1), default=256,
                  help="Images classified at a time by --predict, the next batch decoding meanwhile (its memory "
                       "bound: two batches)."),
)
@cloup.option_group(
    "What to label next", "with --predict",
    job_option("--suggest", "suggest_n", needs=["predict_paths"], type=click.IntRange(min=1), default=None,
                  help="With --predict: instead of a row per image, the N images to label next, best first, by "
                       "--order, with a column `cluster` (TypiClust's; empty for the other orders)."),
    job_option("--order", needs=["suggest_n"], type=click.Choice(SUGGEST_ORDERS), default=DEFAULT_ORDER,
                  help="--suggest's order. least-confident: the lowest calibrated confidence first, the images a "
                       "finished folder needs a person for (each image a head's that never saw it: the fewest "
                       "labels to a finished folder, docs/label-in-rounds.md); typiclust: the most typical image of "
                       "each feature cluster that holds no label yet (TypiClust, docs/label-the-rest.md); "
                       "typiclust-first: TypiClust, then least-confident once labels were given; random."),
)
@cloup.option_group(
    "Review and audit", "pages to look at and correct; is the folder right?",
    job_option("--review", needs=["predict_paths", "audit"], type=click.Path(dir_okay=False), default=None,
                  help="With --predict: write a review page (one self-contained HTML file that opens in any browser):"
                       " thumbnails grouped by predicted class, least confident first, a class chooser for each and a"
                       " Save button that downloads labels.csv for label.py. Without --csv, no CSV is written. With "
                       "--audit: the doubtful labels (the suggested class one key away: y confirms the fix) and the "
                       "copies, leaks and outliers found."),
    job_option("--review-per-class", needs=["predict_paths"], type=click.IntRange(min=1), default=DEFAULT_PER_CLASS,
                  help="With --review: at most this many images per predicted class on the page, the least confident."),
    job_option("--review-max", needs=["review"], type=click.IntRange(min=1), default=DEFAULT_MOST,
                  help="With --review: at most this many images on the page in all, whatever the folder's size, so "
                       "that it opens at once: the least confident, taken from the classes in turn (with --audit: the"
                       " most likely problems, this many of each kind). The page says how many it leaves out; the CSV"
                       " has every row."),
    cloup.option("--audit", type=click.Path(dir_okay=False), default=None,
                  help="Look at the checkpoint's own-images folder and write what may be wrong with it to this CSV, "
                       "one row per finding: kind,path,score,suggestion (then given, detail). kind label: a labeled/ "
                       "or test/ image whose label is likely wrong (scored out of sample: labeled/ by networks "
                       "cross-fitted without its label), suggestion the class it more likely is; duplicate: the same "
                       "image twice within labeled/ and unlabeled/ or within test/ (the same bytes, or a near copy), "
                       "suggestion its copy; leak: a test/ image also in training; outlier: an image like no class. "
                       "Rows of a kind by descending score; one line per kind on stderr. It replaces an earlier audit, "
                       "never a file of another kind. docs/audit.md."),
    job_option("--audit-folds", needs=["audit"], type=click.IntRange(min=2), default=DEFAULT_FOLDS,
                  help="With --audit: folds of the labeled images' cross-fitting (fewer where a class has fewer "
                       "images)."),
    job_option("--audit-steps", needs=["audit"], type=click.IntRange(min=1), default=DEFAULT_STEPS,
                  help="With --audit: training steps of each fold's network, whatever the folder's size (80% at the "
                       "full learning rate, 20% of decay). An audit interrupted goes on from the parts it kept "
                       "(beside the CSV)."),
)
@cloup.option_group(
    "Export", "for onnxruntime and Label Studio",
    cloup.option("--onnx", type=click.Path(dir_okay=False), default=None,
                  help="Export the checkpoint's --model (teacher by default) to this ONNX file: uint8 images (N, 3, "
                       "H, W) at the checkpoint's image size in, calibrated class probabilities out (the "
                       "normalization and the temperature fitted on its held-out images inside), any N; the class "
                       "names in its metadata. docs/onnx.md."),
    job_option("--label-studio", needs=["predict_paths"], type=click.Path(dir_okay=False), default=None,
                  help="With --predict: write Label Studio import tasks to this JSON file, one per image (with "
                       "--suggest, per image to label next): the image served by Label Studio's local files storage, "
                       "its path and hash, and the prediction as a pre-annotation (its score the calibrated "
                       "confidence); the labeling config goes beside it (NAME.label-config.xml) and the steps to open"
                       " them in Label Studio are printed. label.py --apply reads the project's export back. Without "
                       "--csv, no CSV is written. docs/label-studio.md."),
    job_option("--label-studio-root", needs=["label_studio"], type=click.Path(file_okay=False), default=None,
                  help="With --label-studio: Label Studio's LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT; the images must "
                       "lie in a folder under it. [default: the folder above the deepest one holding every image]"),
)
@cloup.option_group(
    "Figures and tables", "of the first checkpoint, or of several",
    cloup.option("--confusion", type=click.Path(dir_okay=False), default=None,
                  help="PNG of the first checkpoint's confusion matrix on the test set (counts; shading by the share "
                       "of the true class)."),
    cloup.option("--table", type=click.Path(dir_okay=False), default=None,
                  help="Write the results as the paper's Table 1 (methods x settings, mean +- std over the "
                       "checkpoints) to this .md or .csv file. A setting run on other images than the published "
                       "SVHN or CIFAR-10 (a subset, or image files such as the JPEG copy) says so."),
    job_option("--curves", needs=["plot"], type=click.Path(dir_okay=False, exists=True), multiple=True,
                  help="A *_metrics.jsonl file to draw with --plot (repeat: mt_metrics.jsonl and lc_metrics.jsonl)."),
    job_option("--plot", needs=["curves"], type=click.Path(dir_okay=False), default=None,
                  help="PNG of the test error per epoch of the --curves files (the paper's Fig. 2)."),
    cloup.option("--tsne", type=click.Path(dir_okay=False), default=None,
                  help="PNG of a t-SNE of the first checkpoint's features (the paper's Figs. 5-6)."),
    job_option("--tsne-points", needs=["tsne"], type=click.IntRange(min=10), default=2000,
                  help="Training and test images in each t-SNE panel (at most; t-SNE's time grows faster than "
                       "linearly)."),
    cloup.option("--distances", type=click.Path(dir_okay=False), default=None,
                  help="PNG of the pairwise d2 of the first checkpoint's student features as LC sees them (labeled "
                       "same-class, labeled different-class, LC pairs) with eps marked (an MT checkpoint: the eps "
                       "that --eps auto would choose); prints their medians, ratio, mean and the neighbour fraction "
                       "as JSON."),
)
def main(more_paths, **options):
    """Test errors (%) of the student and teacher of checkpoints, predictions for image files, tables
    and figures. Paths after the options belong to --predict when it is given, else to --ckpt. Each
    option belongs to a job (the groups below) and is refused without it."""
    robust_streams()
    o = given_options(options)
    o = o._replace(**({"predict_paths": o.predict_paths + more_paths} if o.predict_paths
                      else {"ckpts": o.ckpts + more_paths}))
    o = o._replace(**{field: written_at(option, getattr(o, field)) for field, option in OUTPUT_OPTIONS.items()})
    check_request(click.get_current_context(), o)  # --table's format from the name of the file it writes
    check_outputs_of(o, [])  # before any checkpoint is read
    torch.manual_seed(o.seed)
    device = pick_device(o.device)
    states = [load_checkpoint(path) for path in o.ckpts]  # every file checked before any work
    check_outputs_of(o, states)
    if o.predict_paths:
        options = PredictOptions(model_name=o.model_name, csv_path=o.csv_path, batch_size=o.batch_size,
                                 data_dir=o.data_dir, max_error=o.max_error, coverage=o.coverage, suggest_n=o.suggest_n,
                                 order=o.order,
                                 seed=o.seed, as_json=o.as_json, review=o.review, review_per_class=o.review_per_class,
                                 review_max=o.review_max, label_studio=o.label_studio,
                                 label_studio_root=o.label_studio_root)
        failed = predict(o.ckpts[0], states[0], o.predict_paths, device, options)
        sys.exit(1 if failed and not o.skip_bad_images else 0)
    if o.onnx:
        export(o.ckpts[0], states[0], o.onnx, o.model_name, device, o.data_dir)
    elif o.audit:
        run_audit(o.ckpts[0], states[0], o.audit, o.review, device, data_dir=o.data_dir, folds=o.audit_folds,
                  steps=o.audit_steps, seed=o.seed, most=o.review_max)
    else:
        evaluate(o, states, device)


def evaluate(o, states, device):
    """The errors of every checkpoint (and the first one's figures), then the means over them, LC's
    paired differences, the table and the curves."""
    def note(line):
        click.echo(line, err=o.as_json)  # --json: stdout is JSON only
    paths, states = counted_once(o.ckpts, states, note)
    results = [evaluate_one(o, path, state, device, figures=k == 0)
               for k, (path, state) in enumerate(zip(paths, states))]
    tested = [(r, s) for r, s in zip(results, states) if r["n_test"]]
    tested = mark_cells([r for r, _ in tested], [s for _, s in tested], note)
    if len(tested) > 1:  # mean +- std per method and setting, the rows of the paper's Table 1
        _, _, rows = results_table(tested)
        for row in (r for r in rows if r["runs"] > 1):
            click.echo(json.dumps(row) if o.as_json else describe_means(row))
        for row in paired_differences(tested):
            click.echo(json.dumps(row) if o.as_json else describe_paired(row))
    if o.table:
        write_table(o.table, tested)
        click.echo(f"wrote {o.table}")
    if o.curves:
        plot_curves(o.curves, o.plot)
        click.echo(f"wrote {o.plot}")


def evaluate_one(o, path, state, device, figures):
    """The result of one checkpoint, said; with figures, its confusion matrix, t-SNE and distances."""
    data = restore_data(state, o.data_dir, echo=lambda m: click.echo(m, err=o.as_json))  # --json: stdout is JSON only
    student, teacher = restore_models(state, device)
    pool = measured_pool(data, state["unlabeled_idx"]) if o.pool_error else None
    result, predicted = evaluate_checkpoint(path, state, data, dict(student=student, teacher=teacher), device,
                                            pool=None if pool is None else (pool, true_classes(data, o.truth)[pool]),
                                            model_name=o.model_name)
    result["alike"] = alike_key(alike_settings(state))  # runs of one key differ in their seeds only
    click.echo(json.dumps(result) if o.as_json else "\n".join(describe_result(result, state)))
    if not figures:
        return result
    if (o.confusion or o.tsne) and not len(data.test_y):
        raise UserError("--confusion and --tsne need test images; the checkpoint's folder has no test/")
    if o.confusion:
        title = checkpoint_title(state, result, f"{o.model_name}: test error {result[o.model_name + '_error']:.2f}%")
        plot_confusion(data.test_y, predicted[o.model_name], data.classes, title, o.confusion)
        click.echo(f"wrote {o.confusion}")
    if o.tsne:
        plot_tsne(state, data, teacher, device, o.tsne, seed=o.seed, max_points=o.tsne_points)
        click.echo(f"wrote {o.tsne}")
    if o.distances:
        pairs, eps, eps_label = checkpoint_distances(state["config"], data, checkpoint_split(state), student, device)
        title = checkpoint_title(state, result, f"\nstudent features as LC sees them, the first batches of the batch "
                                                f"stream (up to {DISTANCE_IMAGES:,} images)")
        plot_distances(pairs, eps, eps_label, title, o.distances)
        click.echo(json.dumps(dict(distances=str(o.distances), checkpoint=str(path), **pairs.summary(eps))))
    return result


if __name__ == "__main__":
    main()
