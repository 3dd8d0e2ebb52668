"""How well `evaluate.py --audit` finds what examples/own_images.py planted in a folder (its
<folder>-faults.csv), against cleanlab on the same out-of-sample probabilities and features; one JSON
record, for docs/audit.md.

    python tools/bench_audit.py --ckpt runs/faulty-digits/mt_final.pt --faults data/faulty-digits-faults.csv \\
        --out docs/audit-digits.json

Doubtful labels: precision and recall among the top k of each ranking (k: the labels planted in
that part) for this project's (1 - p(label)), cleanlab.filter.find_label_issues (ranked by
self-confidence; also its own selection) and cleanlab's Datalab (the label issue type, on the teacher's
features and the same probabilities). Copies, leaks, outliers: precision and recall of the audit's
findings; near copies also by the teacher's features (cosine similarity), at as many findings.
Needs cleanlab with Datalab: pip install "cleanlab[datalab]".
"""
import csv
import json
import sys
import time
from pathlib import Path

import click
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root
from mtlc.use.audit import copy_findings, outlier_findings  # noqa: E402
from mtlc.use.outliers import outlier_scores  # noqa: E402
from mtlc.data.views import normalization  # noqa: E402
from mtlc.use.calibration import fitted_or_one  # noqa: E402
from mtlc.train.checkpoints import load_checkpoint, restore_data, restore_models  # noqa: E402
from mtlc.data.copies import thumbnails  # noqa: E402
from mtlc.use.crossfit import DEFAULT_FOLDS, DEFAULT_STEPS, crossfit_logits, out_of_sample_probabilities  # noqa: E402
from mtlc.train.inference import outputs  # noqa: E402


def at_k(ranked, positives, k):
    """(precision, recall) of the first k of ranked (indices) against the set positives."""
    top = set(list(ranked)[:k])
    hits = len(top & positives)
    return (hits / len(top) if top else None), (hits / len(positives) if positives else None)


def label_rankings(labels, probabilities, features):
    """{method: indices most doubtful first}."""
    from cleanlab.filter import find_label_issues
    from cleanlab import Datalab
    ours = np.argsort(-(1 - probabilities[np.arange(len(labels)), labels]), kind="stable")
    cleanlab_ranked = find_label_issues(labels, probabilities, return_indices_ranked_by="self_confidence")
    lab = Datalab(data={"label": labels}, label_name="label", verbosity=0)
    lab.find_issues(features=features, pred_probs=probabilities, issue_types={"label": {}})
    datalab_scores = lab.get_issues("label")["label_score"].to_numpy()
    return dict(ours=ours, cleanlab_find_label_issues=cleanlab_ranked,
                cleanlab_datalab=np.argsort(datalab_scores, kind="stable")), len(cleanlab_ranked)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--ckpt", type=click.Path(exists=True, dir_okay=False), required=True, help="A checkpoint trained on the faulty folder.")
@click.option("--faults", type=click.Path(exists=True, dir_okay=False), required=True, help="Its <folder>-faults.csv.")
@click.option("--folds", type=click.IntRange(min=2), default=DEFAULT_FOLDS, help="As evaluate.py --audit-folds.")
@click.option("--steps", type=click.IntRange(min=1), default=DEFAULT_STEPS, help="As evaluate.py --audit-steps.")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="The JSON record written.")
@click.option("--only", type=click.Choice(["labels", "copies", "outliers"]), multiple=True,
              help="Measure only this part (repeat for several), keeping the other parts of the record at --out. "
                   "[default: all]")
def main(ckpt, faults, folds, steps, out, only):
    """Measure the audit's findings against the planted faults."""
    parts = only or ("labels", "copies", "outliers")
    device = torch.device("cpu")
    state = load_checkpoint(ckpt)
    config = state["config"]
    data = restore_data(state, echo=lambda line: None)
    with open(faults, newline="") as f:
        planted = list(csv.DictReader(f))
    names = data.files["train"] + data.files["test"]
    where = {name: i for i, name in enumerate(names)}
    n_train = len(data.files["train"])
    record = json.loads(Path(out).read_text()) if only and Path(out).is_file() else {}
    record.update(checkpoint=str(ckpt), faults=str(faults), folds=folds, steps=steps)
    _, teacher = restore_models(state, device)
    mean_std = normalization(config, device)
    train_features, train_logits = outputs(teacher, data.train_x, *mean_std)
    test_features, test_logits = outputs(teacher, data.test_x, *mean_std)

    labeled = state["labeled_idx"].numpy()
    if "labels" in parts:
        measure_labels(record, state, data, device, folds, steps, planted, where, n_train, train_features, test_logits,
                       test_features)
    paths = names
    root = Path(config.data_dir)
    if "copies" in parts:
        measure_copies(record, data, planted, where, n_train, paths, root, test_logits, train_features, test_features)
    if "outliers" in parts:
        measure_outliers(record, data, planted, paths, root, labeled, train_features, test_features)
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


def measure_labels(record, state, data, device, folds, steps, planted, where, n_train, train_features, test_logits,
                   test_features):
    """Doubtful labels: ours against cleanlab's two, at the planted count and at each one's own selection."""
    start = time.perf_counter()
    logits, used = crossfit_logits(state, data, device, folds=folds, steps=steps, echo=print)
    record["crossfit_s"] = round(time.perf_counter() - start, 1)
    labeled = state["labeled_idx"].numpy()
    for part, idx, labels, probabilities, features in (
            ("labeled", labeled, data.train_y[labeled].numpy(),
             out_of_sample_probabilities(logits, data.train_y[labeled].numpy())[0], train_features[labeled].numpy()),
            ("test", np.arange(len(data.test_y)), data.test_y.numpy(),
             torch.softmax(test_logits.double() / fitted_or_one(test_logits.numpy(), data.test_y.numpy()), 1).numpy(),
             test_features.numpy())):
        offset = 0 if part == "labeled" else n_train
        position = {int(i): k for k, i in enumerate(idx)}
        flipped = {position[where[r["path"]] - offset] for r in planted if r["kind"] == "label" and r["path"].startswith(part)}
        rankings, cleanlab_selected = label_rankings(labels, probabilities, features)
        k = len(flipped)
        ours_selected = int((probabilities.argmax(1) != labels).sum())
        record[f"labels_{part}"] = dict(
            images=len(labels), planted=k, ours_findings=ours_selected, cleanlab_selected=cleanlab_selected,
            at_k={m: dict(zip(("precision", "recall"), at_k(r, flipped, k))) for m, r in rankings.items()},
            at_own_count=dict(ours=dict(zip(("precision", "recall"), at_k(rankings["ours"], flipped, ours_selected))),
                              cleanlab_find_label_issues=dict(zip(("precision", "recall"), at_k(
                                  rankings["cleanlab_find_label_issues"], flipped, cleanlab_selected)))))


def measure_copies(record, data, planted, where, n_train, paths, root, test_logits, train_features, test_features):
    """Copies and leaks found against those planted; the test error with and without the leaks found;
    near copies by the teacher's features at as many pairs."""
    images = torch.cat([data.train_x, data.test_x])
    is_test = np.arange(len(paths)) >= n_train
    start = time.perf_counter()
    # By the pixels alone (no digests), and every image as unlabeled: the planted copies are measured as
    # copies, never as label conflicts.
    found = copy_findings([str(root / p) for p in paths], images, is_test, [b""] * len(paths),
                          np.full(len(paths), -1), data.classes)
    record["copies_s"] = round(time.perf_counter() - start, 1)
    def pair(a, b):
        return frozenset((a, b))
    any_copy = {pair(r["path"], r["truth"]) for r in planted if r["kind"] in ("duplicate", "leak")}
    for kind in ("duplicate", "leak"):
        truth = {pair(r["path"], r["truth"]) for r in planted if r["kind"] == kind}
        mine = {pair(str(Path(f.path).relative_to(root)), str(Path(f.suggestion).relative_to(root)))
                for f in found if f.kind == kind}
        record[kind] = dict(planted=len(truth), findings=len(mine), recall=len(mine & truth) / max(1, len(truth)),
                            precision=len(mine & any_copy) / max(1, len(mine)))
    leaked = {where[str(Path(f.path).relative_to(root))] - n_train for f in found if f.kind == "leak"}
    clean = [i for i in range(len(data.test_y)) if i not in leaked]
    wrong = (test_logits.argmax(1) != data.test_y).numpy()
    record["test_error"] = dict(all=100 * float(wrong.mean()), without_leaked=100 * float(wrong[clean].mean()),
                                leaked_found=len(leaked), test_images=len(data.test_y))
    features = torch.nn.functional.normalize(torch.cat([train_features, test_features]), dim=1)
    near_truth = {(where[r["path"]], where[r["truth"]]) for r in planted if r["kind"] in ("duplicate", "leak")}
    near_truth = {(min(a, b), max(a, b)) for a, b in near_truth}
    m = sum(f.kind in ("duplicate", "leak") for f in found)
    similarity = features @ features.T
    similarity.fill_diagonal_(-2)
    upper = torch.triu(similarity, 1)
    top = torch.topk(upper.flatten(), max(1, m)).indices
    pairs = {(int(i) // len(paths), int(i) % len(paths)) for i in top}
    record["copies_by_features_at_as_many"] = dict(pairs=m, recall=len(pairs & near_truth) / max(1, len(near_truth)),
                                                   precision=len(pairs & near_truth) / max(1, len(pairs)))


def measure_outliers(record, data, planted, paths, root, labeled, train_features, test_features):
    """The outliers found against the images planted from another dataset, and the ranking of every
    image that is not labeled by its outlier score: precision at the planted count, ROC AUC."""
    from sklearn.metrics import roc_auc_score
    images, features = torch.cat([data.train_x, data.test_x]), torch.cat([train_features, test_features])
    labeled_mask = np.zeros(len(paths), bool)
    labeled_mask[labeled] = True
    start = time.perf_counter()
    outliers = outlier_findings([str(root / p) for p in paths], features, images, labeled_mask)
    record["outliers_s"] = round(time.perf_counter() - start, 1)
    truth = {r["path"] for r in planted if r["kind"] == "outlier"}
    mine = {str(Path(f.path).relative_to(root)) for f in outliers}
    score = outlier_scores(features, thumbnails(images).numpy(), labeled_mask)[~labeled_mask]
    is_planted = np.array([p in truth for p in paths])[~labeled_mask]
    top = np.argsort(-score, kind="stable")[:len(truth)]
    record["outlier"] = dict(planted=len(truth), findings=len(mine), recall=len(mine & truth) / max(1, len(truth)),
                             precision=len(mine & truth) / max(1, len(mine)),
                             precision_at_planted=float(is_planted[top].mean()) if len(truth) else None,
                             roc_auc=float(roc_auc_score(is_planted, score)) if 0 < len(truth) < len(score) else None)


if __name__ == "__main__":
    main()
