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
import sys
from pathlib import Path

import click
import torch

from mtlc.checkpoints import checkpoint_split, load_checkpoint, restore_data, restore_models
from mtlc.console import robust_streams
from mtlc.splits import true_classes
from mtlc.devices import pick_device
from mtlc.errors import UserError
from mtlc.figures import checkpoint_title, plot_confusion, plot_curves, plot_distances, plot_tsne
from mtlc.neighbours import DISTANCE_IMAGES, checkpoint_distances
from mtlc.crossfit import DEFAULT_FOLDS, DEFAULT_STEPS
from mtlc.label_studio import config_path as studio_config_path
from mtlc.predicting import PredictOptions, export, predict, run_audit
from mtlc.report import (describe_means, describe_paired, describe_result, evaluate_checkpoint, paired_differences,
                         results_table, write_table)
from mtlc.review import DEFAULT_MOST, DEFAULT_PER_CLASS
from mtlc.kept_files import check_not_kept
from mtlc.runs import check_not_among, check_outputs


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("more_paths", nargs=-1, type=click.Path())
@click.option("--ckpt", "ckpts", type=click.Path(dir_okay=False), multiple=True,
              help="A checkpoint written by train_mt.py or finetune_lc.py. Several (one per seed): "
                   "--ckpt a.pt b.pt c.pt, or --ckpt repeated.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object per checkpoint instead of text: errors, per_class (each class's test "
                   "images and error) and, for an LC run, how LC went.")
@click.option("--predict", "predict_paths", type=click.Path(), multiple=True,
              help="Image files or folders (searched recursively for the image types PIL reads) to classify with "
                   "one checkpoint: --predict a/ b.jpg c/. Prints the CSV path,prediction,confidence,runner_up "
                   "(the class, its softmax probability, the second most likely class), or writes it to --csv. An "
                   "unreadable file gets an empty prediction, a message on stderr and exit code 1 at the end.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="With --predict: write the rows to this file instead of stdout.")
@click.option("--model", "model_name", type=click.Choice(["teacher", "student"]), default="teacher",
              help="The model that predicts (--predict), whose confidences are calibrated and whose confusion matrix is "
                   "drawn (--confusion).")
@click.option("--max-error", type=click.FloatRange(min=0, max=100, min_open=True, max_open=True), default=None,
              help="With --predict: add a column `accepted` (1/0): 1 where the calibrated confidence is at least the "
                   "lowest threshold at which the checkpoint's held-out images above it are at most this % wrong "
                   "(a one-sided 95% upper bound, so that a few lucky images cannot set it). Prints how many "
                   "were accepted. Needs held-out images (test/, or train_mt.py --val N).")
@click.option("--coverage", type=click.Path(dir_okay=False), default=None,
              help="With --predict: draw the held-out images' error against coverage (most confident first) to "
                   "this PNG, with the --max-error threshold.")
@click.option("--suggest", "suggest_n", type=click.IntRange(min=1), default=None,
              help="With --predict: instead of a row per image, the N images to label next, best first (TypiClust: "
                   "the most typical image of each feature cluster that holds no label yet; docs/label-the-rest.md), "
                   "with a column `cluster`.")
@click.option("--review", type=click.Path(dir_okay=False), default=None,
              help="With --predict: write a review page (one self-contained HTML file that opens in any browser): "
                   "thumbnails grouped by predicted class, least confident first, a class chooser for each and a "
                   "Save button that downloads labels.csv for label.py. Without --csv, no CSV is written. With "
                   "--audit: the doubtful labels (the suggested class one key away: y confirms the fix) and the "
                   "copies, leaks and outliers found.")
@click.option("--audit", type=click.Path(dir_okay=False), default=None,
              help="Look at the checkpoint's own-images folder and write what may be wrong with it to this CSV, one "
                   "row per finding: kind,path,score,suggestion (then given, detail). kind label: a labeled/ or test/ "
                   "image whose label is likely wrong (scored out of sample: labeled/ by networks cross-fitted "
                   "without its label), suggestion the class it more likely is; duplicate: the same image twice within "
                   "labeled/ and unlabeled/ or within test/ (the same bytes, or a near copy), suggestion its copy; leak: a test/ "
                   "image also in training; outlier: an image like no class. Rows of a kind by descending score; "
                   "one line per kind on stderr. docs/audit.md.")
@click.option("--audit-folds", type=click.IntRange(min=2), default=DEFAULT_FOLDS,
              help="With --audit: folds of the labeled images' cross-fitting (fewer where a class has fewer images).")
@click.option("--audit-steps", type=click.IntRange(min=1), default=DEFAULT_STEPS,
              help="With --audit: training steps of each fold's network, whatever the folder's size (80% at the full "
                   "learning rate, 20% of decay). An audit interrupted goes on from the parts it kept (beside the CSV).")
@click.option("--review-per-class", type=click.IntRange(min=1), default=DEFAULT_PER_CLASS,
              help="With --review: at most this many images per predicted class on the page, the least confident.")
@click.option("--review-max", type=click.IntRange(min=1), default=DEFAULT_MOST,
              help="With --review: at most this many images on the page in all, whatever the folder's size, so that it "
                   "opens at once: the least confident, taken from the classes in turn (with --audit: the most likely "
                   "problems, this many of each kind). The page says how many it leaves out; the CSV has every row.")
@click.option("--label-studio", type=click.Path(dir_okay=False), default=None,
              help="With --predict: write Label Studio import tasks to this JSON file, one per image (with --suggest, "
                   "per image to label next): the image served by Label Studio's local files storage, its path and "
                   "hash, and the prediction as a pre-annotation (its score the calibrated confidence); the labeling "
                   "config goes beside it (NAME.label-config.xml) and the steps to open them in Label Studio are "
                   "printed. label.py --apply reads the project's export back. Without --csv, no CSV is written. "
                   "docs/label-studio.md.")
@click.option("--label-studio-root", type=click.Path(file_okay=False), default=None,
              help="With --label-studio: Label Studio's LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT; the images must lie "
                   "in a folder under it. [default: the folder above the deepest one holding every image]")
@click.option("--onnx", type=click.Path(dir_okay=False), default=None,
              help="Export the checkpoint's --model (teacher by default) to this ONNX file: uint8 images (N, 3, H, W) "
                   "at the checkpoint's image size in, calibrated class probabilities out (the normalization and the "
                   "temperature fitted on its held-out images inside), any N; the class names in its metadata. "
                   "docs/onnx.md.")
@click.option("--skip-bad-images", is_flag=True,
              help="With --predict: files that cannot be read still get a row with an empty prediction and a message "
                   "on stderr, but the run exits 0 when they were its only trouble (without it: exit code 1).")
@click.option("--batch-size", type=click.IntRange(min=1), default=256,
              help="Images classified at a time by --predict, the next batch decoding meanwhile (its memory bound: two batches).")
@click.option("--confusion", type=click.Path(dir_okay=False), default=None,
              help="PNG of the first checkpoint's confusion matrix on the test set (counts; shading by the share "
                   "of the true class).")
@click.option("--table", type=click.Path(dir_okay=False), default=None,
              help="Write the results as the paper's Table 1 (methods x settings, mean +- std over the "
                   "checkpoints) to this .md or .csv file.")
@click.option("--curves", type=click.Path(dir_okay=False, exists=True), multiple=True,
              help="A *_metrics.jsonl file to draw with --plot (repeat: mt_metrics.jsonl and lc_metrics.jsonl).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="PNG of the test error per epoch of the --curves files (the paper's Fig. 2).")
@click.option("--tsne", type=click.Path(dir_okay=False), default=None,
              help="PNG of a t-SNE of the first checkpoint's features (the paper's Figs. 5-6).")
@click.option("--tsne-points", type=click.IntRange(min=10), default=2000,
              help="Training and test images in each t-SNE panel (at most; t-SNE's time grows faster than linearly).")
@click.option("--distances", type=click.Path(dir_okay=False), default=None,
              help="PNG of the pairwise d2 of the first checkpoint's student features as LC sees them (labeled "
                   "same-class, labeled different-class, LC pairs) with eps marked (an MT checkpoint: the eps that "
                   "--eps auto would choose); prints their medians, ratio, mean and the neighbour fraction as JSON.")
@click.option("--pool-error", is_flag=True,
              help="Also the error on the checkpoint's unlabeled training images, whose labels training never used "
                   "(more images than the test set: a steadier comparison of methods): their own labels for "
                   "svhn, cifar10 and digits, --truth's for a folder.")
@click.option("--truth", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --pool-error on a folder: a CSV with columns path,class for its unlabeled/ images "
                   "(paths as unlabeled/NAME; examples/own_images.py writes one beside the folders it builds).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Dataset folder. [default: the checkpoint's]")
@click.option("--seed", type=int, default=0,
              help="Seed of the t-SNE and its subsample, and of --suggest's k-means (the errors are deterministic).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", help="auto: CUDA when available.")
def main(more_paths, ckpts, as_json, predict_paths, csv_path, model_name, max_error, coverage, suggest_n, review,
         audit, audit_folds, audit_steps, review_per_class, review_max, label_studio, label_studio_root, onnx, skip_bad_images,
         batch_size, confusion, table, curves, plot, tsne, tsne_points, distances, pool_error, truth, data_dir, seed, device):
    """Test errors (%) of the student and teacher of checkpoints, predictions for image files, tables
    and figures. Paths after the options belong to --predict when it is given, else to --ckpt."""
    robust_streams()
    if predict_paths:
        predict_paths += more_paths
    else:
        ckpts += more_paths
    if bool(curves) != bool(plot):
        raise UserError("--curves and --plot go together")
    if table and Path(table).suffix not in (".md", ".csv"):
        raise UserError(f"--table must end in .md or .csv, got {table}")
    if csv_path and not predict_paths:
        raise UserError("--csv goes with --predict")
    if predict_paths and (len(ckpts) != 1 or table or curves or tsne or distances or confusion or pool_error):
        raise UserError("--predict takes exactly one --ckpt and no other output (--table, --curves, --tsne, "
                        "--distances, --confusion, --pool-error): run evaluate.py again for those")
    if predict_paths and as_json and not csv_path:
        raise UserError("--predict with --json needs --csv: the JSON summary goes to stdout, the rows to the file")
    if audit and (predict_paths or len(ckpts) != 1 or table or curves or tsne or distances or confusion or pool_error):
        raise UserError("--audit takes exactly one --ckpt and no other output: run evaluate.py again for those")
    if audit and (as_json or review_per_class != DEFAULT_PER_CLASS):
        raise UserError("--json and --review-per-class go with --predict, not --audit (the audit page shows every "
                        "doubtful label)")
    if (label_studio or label_studio_root) and not predict_paths:
        raise UserError("--label-studio and --label-studio-root go with --predict")
    if label_studio_root and not label_studio:
        raise UserError("--label-studio-root goes with --label-studio")
    if onnx and (predict_paths or audit or len(ckpts) != 1 or table or curves or tsne or distances or confusion
                 or pool_error or as_json):
        raise UserError("--onnx takes exactly one --ckpt and no other output: run evaluate.py again for those")
    outputs = dict(zip(("--csv", "--review", "--audit", "--coverage", "--confusion", "--table", "--plot", "--tsne",
                        "--distances", "--label-studio", "--label-studio's labeling config", "--onnx"),
                       (csv_path, review, audit, coverage, confusion, table, plot, tsne, distances, label_studio,
                        label_studio and str(studio_config_path(label_studio)), onnx)))
    check_outputs(outputs, {**{f"--ckpt {c}": c for c in ckpts}, **{f"--curves {c}": c for c in curves}, "--truth": truth,
                   **{f"--predict {p}": p for p in predict_paths if not Path(p).is_dir()}})
    check_not_kept(outputs)
    if review and not (predict_paths or audit):
        raise UserError("--review goes with --predict or --audit")
    if (max_error is not None or coverage or suggest_n or skip_bad_images) and not predict_paths:
        raise UserError("--max-error, --coverage, --suggest and --skip-bad-images go with --predict")
    if (table or tsne or distances or confusion) and not ckpts:
        raise UserError("--table, --tsne, --distances and --confusion need at least one --ckpt")
    if truth and not pool_error:
        raise UserError("--truth goes with --pool-error")
    if not ckpts and not curves:
        raise UserError("nothing to do: give --ckpt, or --curves with --plot")
    torch.manual_seed(seed)
    device = pick_device(device)
    states = [load_checkpoint(path) for path in ckpts]  # every file checked before any work
    for path, state in zip(ckpts, states):
        files = state["config"]["files"]
        if files:
            check_not_among(outputs, data_dir or state["config"]["data_dir"], files["train"] + files["test"],
                            f"the images of {path}'s folder")
    if predict_paths:
        options = PredictOptions(model_name=model_name, csv_path=csv_path, batch_size=batch_size, data_dir=data_dir,
                                 max_error=max_error, coverage=coverage, suggest_n=suggest_n, seed=seed,
                                 as_json=as_json, review=review, review_per_class=review_per_class, review_max=review_max,
                                 label_studio=label_studio, label_studio_root=label_studio_root)
        failed = predict(ckpts[0], states[0], predict_paths, device, options)
        sys.exit(1 if failed and not skip_bad_images else 0)
    if onnx:
        export(ckpts[0], states[0], onnx, model_name, device, data_dir)
        return
    if audit:
        run_audit(ckpts[0], states[0], audit, review, device, data_dir=data_dir, folds=audit_folds, steps=audit_steps,
                  seed=seed, most=review_max)
        return
    results = []
    for path, state in zip(ckpts, states):
        data = restore_data(state, data_dir, echo=lambda m: click.echo(m, err=as_json))  # --json: stdout is JSON only
        student, teacher = restore_models(state, device)
        pool_y = true_classes(data, truth)[state["unlabeled_idx"]] if pool_error else None
        result, predicted = evaluate_checkpoint(path, state, data, dict(student=student, teacher=teacher), device,
                                                pool_y=pool_y, model_name=model_name)
        results.append(result)
        click.echo(json.dumps(result) if as_json else "\n".join(describe_result(result, state)))
        if len(results) > 1:
            continue  # the figures are of the first checkpoint
        if (confusion or tsne) and not len(data.test_y):
            raise UserError("--confusion and --tsne need test images; the checkpoint's folder has no test/")
        if confusion:
            title = checkpoint_title(state, result, f"{model_name}: test error {result[model_name + '_error']:.2f}%")
            plot_confusion(data.test_y, predicted[model_name], data.classes, title, confusion)
            click.echo(f"wrote {confusion}")
        if tsne:
            plot_tsne(state, data, teacher, device, tsne, seed=seed, max_points=tsne_points)
            click.echo(f"wrote {tsne}")
        if distances:
            pairs, eps, eps_label = checkpoint_distances(state["config"], data, checkpoint_split(state), student, device)
            title = checkpoint_title(state, result, f"\nstudent features as LC sees them, the first batches of the batch "
                                                    f"stream (up to {DISTANCE_IMAGES:,} images)")
            plot_distances(pairs, eps, eps_label, title, distances)
            click.echo(json.dumps(dict(distances=str(distances), checkpoint=str(path), **pairs.summary(eps))))
    tested = [r for r in results if r["n_test"]]
    if len(tested) > 1:  # mean +- std per method and setting, the rows of the paper's Table 1
        _, _, rows = results_table(tested)
        for row in (r for r in rows if r["runs"] > 1):
            click.echo(json.dumps(row) if as_json else describe_means(row))
        for row in paired_differences(tested):
            click.echo(json.dumps(row) if as_json else describe_paired(row))
    if table:
        write_table(table, tested)
        click.echo(f"wrote {table}")
    if curves:
        plot_curves(curves, plot)
        click.echo(f"wrote {plot}")


if __name__ == "__main__":
    main()
