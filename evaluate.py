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
"""
import json
import statistics
import sys
from pathlib import Path

import click
import torch

from batches import Batches, image_batches, normalize
from data import held_out, restore_data, restore_held_out, true_classes
from runs import UserError, atomic_write, checkpoint_split, load_checkpoint, read_metrics, restore_models
from devices import pick_device
from images import describe_hidden
from neighbours import DISTANCE_IMAGES, PairDistances, auto_eps, lc_features
from calibration import CONFIDENCE_LEVEL, images_needed, plot_coverage
from console import path_text, robust_streams
from review import DEFAULT_PER_CLASS, write_review
from predictions import held_out_calibration, image_paths, is_accepted, predict_files, suggest_rows, write_rows
from training import predict_classes, test_error


CONTROL = "MT, continued (lambda2 0)"


def method_name(state):
    """supervised, MT, MT+LC with its eps scale (fixed, as in the paper, relative or normalized) and its
    pairs (all, or same-prediction), or, for a stage-2 run with lambda2 0, LC's control: MT trained on
    for stage 2's schedule without LC."""
    if state["stage"] == "lc":
        lc = state["config"]["lc"]
        if lc.get("lam") == 0:
            return CONTROL
        scale = lc.get("eps_scale")
        pairs = ", same-prediction pairs" if lc.get("pairs") == "same-prediction" else ""
        return f"MT+LC ({scale} eps{pairs})" if scale else "MT+LC"
    return "supervised" if state["config"]["cons_weight"] == 0 else "MT"


def lc_diagnostics(state):
    """How LC went, from an LC checkpoint's config and metrics: eps, the largest neighbour fraction
    of an epoch after the ramp, how far each model's test error rose above its value at LC's start
    (the MT checkpoint's), and the ratio of median same- to different-class d2 and the mean d2 (the
    feature scale) at LC's start and end. Empty for an MT checkpoint."""
    lc = state["config"].get("lc")
    if state["stage"] != "lc" or "start" not in lc:
        return {}
    start, records = lc["start"], state["metrics"]
    evaluated = [r for r in records if "d2_ratio" in r]
    if not evaluated:  # a resume checkpoint before LC's first evaluation
        return {}
    after_ramp = [r["neighbour_fraction"] for r in records if r["epoch"] > lc["lc_rampup"]]
    result = dict(eps=lc["eps"], eps_scale=lc["eps_scale"], eps_auto=lc["eps_auto"],
                  max_neighbour_fraction_after_ramp=max(after_ramp, default=None),
                  d2_ratio_start=start["d2_ratio"], d2_ratio_end=evaluated[-1]["d2_ratio"],
                  d2_mean_start=start["d2_mean"], d2_mean_end=evaluated[-1]["d2_mean"])
    for model in ("student", "teacher"):
        if f"{model}_error" in start and all(f"{model}_error" in r for r in evaluated):
            result[f"{model}_error_at_lc_start"] = start[f"{model}_error"]
            result[f"{model}_max_rise_after_lc_start"] = (max(r[f"{model}_error"] for r in evaluated)
                                                         - start[f"{model}_error"])
    return result


def describe_lc(d):
    """One line of lc_diagnostics for people."""
    line = (f"  LC: eps {d['eps']:.4g} ({'auto, ' if d['eps_auto'] else ''}{d['eps_scale']}); neighbour fraction "
            f"after the ramp at most {d['max_neighbour_fraction_after_ramp']:.3f}; median d2 same/different class "
            f"{d['d2_ratio_start']:.3f} -> {d['d2_ratio_end']:.3f}, mean d2 {d['d2_mean_start']:.3g} -> "
            f"{d['d2_mean_end']:.3g} ({d['d2_mean_start'] / d['d2_mean_end']:.1f}x smaller)")
    if "teacher_error_at_lc_start" in d:
        line += (f"; test error at LC's start student {d['student_error_at_lc_start']:.2f}% teacher "
                 f"{d['teacher_error_at_lc_start']:.2f}%, highest after it {d['student_max_rise_after_lc_start']:+.2f} "
                 f"/ {d['teacher_max_rise_after_lc_start']:+.2f} points")
    return line


def mean_std(values):
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def results_table(results):
    """Rows: method; columns: dataset and labels; cells: mean +- std of the test error over seeds."""
    groups = {}
    for r in results:
        groups.setdefault((r["method"], f"{r['dataset']}, {r['labels']} labels"), []).append(r)
    methods = list(dict.fromkeys(m for m, _ in groups))
    settings = list(dict.fromkeys(s for _, s in groups))
    rows = []
    for (method, setting), runs in groups.items():
        row = dict(method=method, setting=setting, runs=len(runs))
        for model in ("student", "teacher"):
            row[f"{model}_mean"], row[f"{model}_std"] = mean_std([r[f"{model}_error"] for r in runs])
            if all("n_pool" in r for r in runs):
                row[f"{model}_pool_mean"], row[f"{model}_pool_std"] = mean_std([r[f"{model}_pool_error"] for r in runs])
        rows.append(row)
    return methods, settings, rows


def paired_differences(results):
    """MT+LC minus its control, run by run: each stage-2 run with lambda2 > 0 against the lambda2-0 run
    from the same MT checkpoint (same start, same schedule). Rows per LC method and setting: the
    number of pairs, and the mean, std and standard error of the differences in points (negative:
    LC helped)."""
    controls = {r["mt_checkpoint"]: r for r in results if r["method"] == CONTROL}
    groups = {}
    for r in results:
        control = controls.get(r.get("mt_checkpoint"))
        if r["stage"] == "lc" and r["method"] != CONTROL and control is not None:
            groups.setdefault((r["method"], f"{r['dataset']}, {r['labels']} labels"), []).append((r, control))
    rows = []
    for (method, setting), pairs in groups.items():
        row = dict(paired=f"{method} minus {CONTROL}", method=method, setting=setting, pairs=len(pairs))
        measures = [""] + (["pool_"] if all("n_pool" in r and "n_pool" in c for r, c in pairs) else [])
        for measure in measures:
            for model in ("student", "teacher"):
                key = f"{model}_{measure}"
                mean, std = mean_std([r[f"{key}error"] - c[f"{key}error"] for r, c in pairs])
                several = len(pairs) > 1  # one pair has no spread to speak of
                row.update({f"{key}difference_mean": mean, f"{key}difference_std": std if several else None,
                            f"{key}difference_se": std / len(pairs) ** 0.5 if several else None})
        rows.append(row)
    return rows


def difference_cell(row, model, template="{mean:+.2f} +- {std:.2f} (standard error {se:.2f})"):
    mean, std, se = (row[f"{model}_difference_{k}"] for k in ("mean", "std", "se"))
    return template.format(mean=mean, std=std, se=se) if se is not None else f"{mean:+.2f}"


def describe_paired(row):
    line = (f"{row['paired']}, {row['setting']}: error difference over {row['pairs']} pair"
            f"{'s' if row['pairs'] > 1 else ''} (same MT checkpoint), points: test images: "
            + ", ".join(f"{model} {difference_cell(row, model)}" for model in ("teacher", "student")))
    if "teacher_pool_difference_mean" in row:
        line += "; unlabeled training images: " + ", ".join(
            f"{model} {difference_cell(row, model + '_pool')}" for model in ("teacher", "student"))
    return line


def write_table(path, results):
    methods, settings, rows = results_table(results)
    path = Path(path)
    if path.suffix == ".csv":
        keys = ["method", "setting", "runs", "student_mean", "student_std", "teacher_mean", "teacher_std"]
        text = ",".join(keys) + "\n" + "".join(",".join(f'"{r[k]}"' if k == "setting" else str(r[k]) for k in keys)
                                               + "\n" for r in rows)
    else:
        cell = {(r["method"], r["setting"]): r for r in rows}
        text = ""
        for model in ("teacher", "student"):
            text += f"Test error (%) of the {model}, mean +- std over runs (runs in brackets)\n\n"
            text += "| method | " + " | ".join(settings) + " |\n| --- |" + " --- |" * len(settings) + "\n"
            for m in methods:
                cells = [f"{cell[m, s][model + '_mean']:.2f} +- {cell[m, s][model + '_std']:.2f} ({cell[m, s]['runs']})"
                         if (m, s) in cell else "-" for s in settings]
                text += f"| {m} | " + " | ".join(cells) + " |\n"
            text += "\n"
        paired = paired_differences(results)
        if paired:
            text += (f"Paired difference of the test error (points), each MT+LC run minus the {CONTROL} run from the "
                     f"same MT checkpoint: mean +- std (standard error), pairs in brackets\n\n"
                     "| difference | setting | teacher | student |\n| --- | --- | --- | --- |\n")
            for r in paired:
                text += (f"| {r['paired']} | {r['setting']} | " + " | ".join(
                    difference_cell(r, m, "{mean:+.2f} +- {std:.2f} ({se:.2f})") for m in ("teacher", "student"))
                    + f" ({r['pairs']}) |\n")
            text += "\n"
    atomic_write(path, lambda f: f.write(text.encode()))
    return text


def stage_label(records):
    """MT, MT+LC, or for a stage-2 run whose lambda2 stayed 0 its control, from a metrics file."""
    if records[0]["stage"] != "lc":
        return "MT"
    return "MT, continued" if all(r.get("lc_weight", 0) == 0 for r in records) else "MT+LC"


def plot_curves(paths, out):
    """Test error per epoch of each metrics file (Fig. 2: MT, then MT+LC from the epoch LC starts)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for path in paths:
        records = [r for r in read_metrics(path) if "teacher_error" in r]
        if not records:
            raise UserError(f"{path} holds no evaluated epochs (is it a *_metrics.jsonl?)")
        label = f"{stage_label(records)} ({Path(path).parent.name})"
        x = [r.get("global_epoch", r["epoch"]) for r in records]
        ax.plot(x, [r["student_error"] for r in records], "--", label=f"{label} student")
        ax.plot(x, [r["teacher_error"] for r in records], "-", label=f"{label} teacher")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test error (%)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


@torch.no_grad()
def features(model, x, mean, std, device):
    model.eval()
    return torch.cat([model(normalize(batch.to(device), mean, std))[0].float().cpu()
                      for batch in image_batches(x, batch_size=500)])


def plot_tsne(state, data, teacher, device, out, seed, max_points=2000):
    """t-SNE of the teacher's features z: training images coloured labeled / unlabeled, test images
    coloured by class (the paper's Figs. 5 and 6)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.manifold import TSNE
    config = state["config"]
    mean, std = (torch.tensor(config[k], device=device) for k in ("mean", "std"))
    gen = torch.Generator().manual_seed(seed)
    labeled = torch.zeros(len(data.train_y), dtype=torch.bool)
    labeled[state["labeled_idx"]] = True
    train_pick = torch.cat([state["labeled_idx"], state["unlabeled_idx"][torch.randperm(
        len(state["unlabeled_idx"]), generator=gen)[:max(0, max_points - len(state["labeled_idx"]))]]])
    test_pick = torch.randperm(len(data.test_y), generator=gen)[:max_points]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    for ax, x, colour, title in (
            (axes[0], data.train_x[train_pick], labeled[train_pick], "training data: labeled (blue), unlabeled (red)"),
            (axes[1], data.test_x[test_pick], data.test_y[test_pick], "test data, coloured by class")):
        z = features(teacher, x, mean, std, device)
        xy = TSNE(n_components=2, init="pca", random_state=seed, perplexity=min(30, len(z) - 1)).fit_transform(z.numpy())
        if title.startswith("training"):
            for flag, c, name in ((False, "tab:red", "unlabeled"), (True, "tab:blue", "labeled")):
                sel = (colour == flag).numpy()
                ax.scatter(xy[sel, 0], xy[sel, 1], s=4 if not flag else 10, c=c, label=name, alpha=0.6)
            ax.legend(markerscale=3)
        else:
            sc = ax.scatter(xy[:, 0], xy[:, 1], s=4, c=colour.numpy(), cmap="tab10", alpha=0.8)
            ax.legend(*sc.legend_elements(), title="class", fontsize=7, loc="best")
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"t-SNE of the teacher's features: {config['dataset']}, {config['labels']} labels, "
                 f"{method_name(state)} ({state['stage']} epoch {state['epoch']})")
    fig.tight_layout()
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def checkpoint_distances(state, data, student, device):
    """The pairwise d2 of the student's features as LC sees them (neighbours.PairDistances), and
    the eps that applies: the LC run's (a relative one at this feature scale) or, for an MT
    checkpoint, the one `finetune_lc.py --eps auto` would choose."""
    config = state["config"]
    batches = Batches(data, checkpoint_split(state), config, device)
    split = config.get("forward") == "split"
    distances = PairDistances.of_batches(lc_features(student, batches, split))
    lc = config.get("lc")
    if lc is None:
        return distances, auto_eps(distances), "eps auto"
    if lc.get("eps_ratio"):
        return distances, lc["eps_ratio"] * distances.mean_d2, f"eps ({lc['eps_ratio']:.3g} x mean d2)"
    return distances, lc["eps"], "eps"


def plot_distances(distances, eps, eps_label, title, out):
    """Histograms of d2: labeled pairs of one class, of different classes, and the LC pairs
    (with an unlabeled image), on a log scale, with eps marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    groups = (("labeled, same class", distances.same), ("labeled, different classes", distances.different),
              ("LC pairs (with an unlabeled image)", distances.lc_pairs))
    values = torch.cat([g for _, g in groups])
    bins = np.logspace(np.log10(values.min().item()), np.log10(values.max().item()), 80)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, d2 in groups:
        ax.hist(d2.numpy(), bins=bins, weights=np.full(len(d2), 1 / len(d2)), histtype="step", linewidth=1.5,
                label=f"{label}: median {d2.median().item():.3g}")
    ax.axvline(eps, color="k", linestyle="--", label=f"{eps_label} = {eps:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("d2 (mean squared feature distance)")
    ax.set_ylabel("share of the pairs per bin")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def per_class_errors(y, predicted, classes):
    """{class: {"count": test images of the class, "error": % of them misclassified}}."""
    result = {}
    for c, name in enumerate(classes):
        mine = y == c
        n = int(mine.sum())
        result[name] = dict(count=n, error=100.0 * int((predicted[mine] != c).sum()) / n if n else None)
    return result


def plot_confusion(y, predicted, classes, title, out):
    """The confusion matrix: counts in the cells, shading by the share of the true class's images."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import confusion_matrix
    counts = confusion_matrix(y.cpu().numpy(), predicted.cpu().numpy(), labels=list(range(len(classes))))
    shares = counts / counts.sum(1, keepdims=True).clip(min=1)
    size = max(5.0, 0.55 * len(classes) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    if len(classes) <= 30:
        for i in range(len(classes)):
            for j in range(len(classes)):
                ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=8,
                        color="white" if shares[i, j] > 0.5 else "black")
    ax.set_xticks(range(len(classes)), classes, rotation=90 if len(classes) > 6 else 0)
    ax.set_yticks(range(len(classes)), classes)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def evaluate_checkpoint(path, state, data, student, teacher, device, pool_y=None, model_name="teacher"):
    """The result of one checkpoint: test errors of both models, per class, the calibration of one
    model's confidences, how LC went and, given the true classes of its unlabeled images (pool_y),
    the error on them."""
    config = state["config"]
    mean, std = (torch.tensor(config[k], device=device) for k in ("mean", "std"))
    x, y = data.test_x, data.test_y
    result = dict(checkpoint=str(path), dataset=config["dataset"], labels=config["labels"], method=method_name(state),
                  stage=state["stage"], epoch=state["epoch"], n_test=len(y))
    if state["stage"] == "lc":
        result["mt_checkpoint"] = config["lc"]["mt_checkpoint"]  # what pairs a run with its control
    per_class = {}
    for name, model in (("student", student), ("teacher", teacher)):
        predicted = predict_classes(model, x, mean, std)
        result[f"{name}_error"] = 100.0 * (predicted != y).sum().item() / len(y) if len(y) else None
        for cls, r in per_class_errors(y, predicted, data.classes).items():
            per_class.setdefault(cls, dict(count=r["count"]))[f"{name}_error"] = r["error"]
    result["per_class"] = per_class
    x_held, y_held, source = held_out(state, data)
    if len(y_held):
        cal = held_out_calibration(state, x_held, y_held, source, teacher if model_name == "teacher" else student, device)
        result["calibration"] = dict(model=model_name, **cal.summary())
    if pool_y is not None:
        result["n_pool"] = len(pool_y)
        for name, model in (("student", student), ("teacher", teacher)):
            result[f"{name}_pool_error"] = test_error(model, data.train_x, pool_y, mean, std, state["unlabeled_idx"])
    return dict(result, **lc_diagnostics(state))


def describe_result(result, state):
    """The text lines of one checkpoint's result."""
    config = state["config"]
    head = (f"{result['checkpoint']}: {config['dataset']}, {config['labels']} labels, {result['method']} "
            f"({state['stage']} epoch {state['epoch']}): ")
    if not result["n_test"]:
        lines = [head + "no test images (the folder has no test/)"]
    else:
        lines = [head + f"test error student {result['student_error']:.2f}% teacher {result['teacher_error']:.2f}% "
                        f"({result['n_test']} test images)"]
        cells = [f"{cls} {r['teacher_error']:.1f}% ({r['count']})" for cls, r in result["per_class"].items() if r["count"]]
        lines.append("  teacher's error per class (test images): " + ", ".join(cells))
    if "n_pool" in result:
        lines.append(f"  error on the {result['n_pool']} unlabeled training images (labels never used): student "
                     f"{result['student_pool_error']:.2f}% teacher {result['teacher_pool_error']:.2f}%")
    if "calibration" in result:
        lines.append("  " + describe_calibration(result["calibration"]))
    if "d2_ratio_start" in result:
        lines.append(describe_lc(result))
    return lines


def describe_calibration(summary):
    errors = summary["error_at_coverage"]
    coverage = (f"error of the most confident 10% / 50% / all: {errors['10']:.1f}% / {errors['50']:.1f}% / "
                f"{errors['100']:.1f}%")
    if summary["uncalibrated"]:
        return (f"confidences of the {summary['model']} are uncalibrated (the raw softmax): {summary['uncalibrated']}; "
                f"on the {summary['n_held_out']:,} held-out {summary['held_out']} images the {coverage}")
    return (f"confidences of the {summary['model']} calibrated on {summary['n_held_out']:,} held-out "
            f"{summary['held_out']} images: temperature {summary['temperature']:.3f}, expected calibration error "
            f"{summary['ece_before']:.2f}% -> {summary['ece_after']:.2f}% (cross-fitted); {coverage}")


def calibrate(path, state, data_dir, model, model_name, device, echo):
    """(the Calibration of the model on the checkpoint's held-out images, None) or, said once, (None,
    why there is none: no held-out images, or they cannot be read as they were trained)."""
    try:
        x, y, source = restore_held_out(state, data_dir, echo=echo)
    except UserError as e:
        why = f"the checkpoint's held-out images cannot be read: {e.message}"
    else:
        if len(y):
            cal = held_out_calibration(state, x, y, source, model, device)
            echo(describe_calibration(dict(model=model_name, **cal.summary())))
            return cal, None
        why = f"{path} has no held-out images (a test/ folder, or train_mt.py --val N)"
    echo(f"confidences are uncalibrated (the raw softmax): {why}")
    return None, why


class Tally:
    """The predictions that pass through it, counted once on a progress bar: rows, unreadable files
    (each reported as it passes) and, with a threshold, accepted ones."""

    def __init__(self, threshold, bar):
        self.threshold, self.bar = threshold, bar
        self.rows = self.failed = self.accepted = 0

    def count(self, predictions):
        for p in predictions:
            self.rows += 1
            self.bar.update()
            if p.label is None:
                self.failed += 1
                self.bar.write(f"cannot read {p.path}: {p.confidence}", file=sys.stderr)
            elif self.threshold is not None:
                self.accepted += is_accepted(p, self.threshold)
            yield p


def predict(path, state, targets, *, model_name, csv_path, batch_size, device, data_dir, max_error, coverage,
            suggest_n, seed, as_json, review, review_per_class):
    """--predict: one CSV row per image file under targets (or, with --suggest, one per image to label
    next), to csv_path or stdout. Returns the number of files that could not be read."""
    from tqdm import tqdm
    config = state["config"]
    student, teacher = restore_models(state, device)
    model = teacher if model_name == "teacher" else student
    mean, std = (torch.tensor(config[k], device=device) for k in ("mean", "std"))
    paths, others, hidden = image_paths(targets)
    if hidden:
        click.echo(describe_hidden(hidden, ", ".join(map(str, targets))), err=True)
    if not paths:
        raise UserError(f"--predict: no image files in {', '.join(map(str, targets))}"
                        + (f" ({others} other files)" if others else ""))
    cal, why = calibrate(path, state, data_dir, model, model_name, device, lambda m: click.echo(m, err=True))
    if cal is None and (max_error is not None or coverage):
        raise UserError(f"--max-error and --coverage need the checkpoint's held-out labeled images: {why}")
    found = cal.threshold(max_error) if max_error is not None else None
    threshold = None if max_error is None else (found.confidence if found else float("inf"))
    summary = dict(checkpoint=str(path), model=model_name, **(cal.summary() if cal else dict(temperature=None)))
    if coverage:
        plot_coverage(cal, max_error, found, coverage,
                      f"{config['dataset']}, {method_name(state)} {model_name}: held-out {cal.source} images")
        click.echo(f"wrote {coverage}", err=True)
    bar = tqdm(total=len(paths), desc="predicting", unit="img", disable=None, file=sys.stderr)
    tally = Tally(threshold, bar)
    predictions = tally.count(predict_files(model, paths, config["classes"], config.get("image_size", 32), mean, std,
                                            device, batch_size, cal.temperature if cal else 1.0))
    rows, extra = predictions, None
    if suggest_n or review:  # every prediction first: the choice and the page need them all
        predicted = [p if suggest_n else p._replace(features=None) for p in predictions]
        rows = predicted
    if suggest_n:
        data = restore_data(state, data_dir, echo=lambda m: click.echo(m, err=True))
        rows, clusters = suggest_rows(predicted, state, data, model, device, suggest_n, seed)
        extra = [("cluster", clusters)]

    def write_csv(binary_file):  # streams into atomic_write's temp file: a killed run leaves no partial CSV
        text = path_text(binary_file)
        write_rows(text, rows, threshold, extra)
        text.flush()
        text.detach()  # leave the file to atomic_write

    if csv_path:
        atomic_write(csv_path, write_csv)
    elif not review:  # with --review and no --csv, the page is the output
        write_rows(sys.stdout, rows, threshold, extra)
    else:
        for _ in rows:  # every prediction counted
            pass
    bar.close()
    n, failed = tally.rows, tally.failed
    click.echo(f"predicted {n - failed:,} of {n:,} images with the {model_name} of {path}"
               + (f" ({others} files that are not images ignored)" if others else "")
               + (f"; {failed} could not be read (empty prediction)" if failed else "")
               + (f"; the {len(rows):,} to label next, best first" if suggest_n else "")
               + (f"; wrote {csv_path}" if csv_path else ""), err=True)
    if review:
        shown, _ = write_review(review, predicted, config["classes"], review_per_class,
                                found.confidence if found else None, max_error,
                                title=f"Review: {', '.join(map(str, targets))}",
                                summary=f"{n - failed:,} images predicted by the {model_name} of {path}"
                                        + (f"; {cal.source} images calibrated its confidences (temperature "
                                           f"{cal.temperature:.2f})" if cal and not cal.uncalibrated
                                           else "; confidences uncalibrated"))
        click.echo(f"wrote {review}: {shown:,} images shown", err=True)
    if max_error is not None:
        click.echo(describe_acceptance(tally.accepted, n - failed, max_error, found, cal), err=True)
        summary.update(max_error=max_error, accepted=tally.accepted, predicted=n - failed,
                       threshold=found.confidence if found else None)
    if as_json:
        click.echo(json.dumps(summary))
    return failed


def describe_acceptance(n_accepted, n, max_error, found, cal):
    promise = (f"the promise holds at {CONFIDENCE_LEVEL:.0%} for images like the held-out ones (the search for the "
               "threshold included); the unlabeled images were trained on, so the network is more confident on them "
               "and their error at the same threshold can be higher")
    if found is None:
        return (f"0 of {n:,} accepted: no confidence threshold keeps the error of the held-out images above it at "
                f"most {max_error:g}% with {CONFIDENCE_LEVEL:.0%} confidence (from {cal.n:,} held-out {cal.source} "
                f"images; fewer than about {images_needed(max_error, cal.n):,} held-out images at or above a threshold "
                f"can never show it)")
    return (f"{n_accepted:,} of {n:,} accepted at an expected error of at most {max_error:g}% (threshold "
            f"{found.confidence:.4f}, from {cal.n:,} held-out images): {found.held_out:,} of the held-out "
            f"{cal.source} images are at or above it, {found.error:.1f}% of them wrong, at most {found.bound:.1f}% "
            f"at the level of one test ({found.test_level:.2%}); {promise}")


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
                   "Save button that downloads labels.csv for label.py. Without --csv, no CSV is written.")
@click.option("--review-per-class", type=click.IntRange(min=1), default=DEFAULT_PER_CLASS,
              help="With --review: at most this many images per predicted class on the page, the least confident.")
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
         review_per_class, skip_bad_images, batch_size, confusion, table, curves, plot, tsne, tsne_points, distances, pool_error, truth,
         data_dir, seed, device):
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
    if (max_error is not None or coverage or suggest_n or review or skip_bad_images) and not predict_paths:
        raise UserError("--max-error, --coverage, --suggest, --review and --skip-bad-images go with --predict")
    if (table or tsne or distances or confusion) and not ckpts:
        raise UserError("--table, --tsne, --distances and --confusion need at least one --ckpt")
    if truth and not pool_error:
        raise UserError("--truth goes with --pool-error")
    if not ckpts and not curves:
        raise UserError("nothing to do: give --ckpt, or --curves with --plot")
    torch.manual_seed(seed)
    device = pick_device(device)
    states = [load_checkpoint(path) for path in ckpts]  # every file checked before any work
    if predict_paths:
        failed = predict(ckpts[0], states[0], predict_paths, model_name=model_name, csv_path=csv_path,
                         batch_size=batch_size, device=device, data_dir=data_dir, max_error=max_error,
                         coverage=coverage, suggest_n=suggest_n, seed=seed, as_json=as_json, review=review,
                         review_per_class=review_per_class)
        sys.exit(1 if failed and not skip_bad_images else 0)
    results = []
    for path, state in zip(ckpts, states):
        config = state["config"]
        data = restore_data(state, data_dir, echo=lambda m: click.echo(m, err=as_json))  # --json: stdout is JSON only
        student, teacher = restore_models(state, device)
        pool_y = true_classes(data, truth)[state["unlabeled_idx"]] if pool_error else None
        result = evaluate_checkpoint(path, state, data, student, teacher, device, pool_y, model_name)
        results.append(result)
        click.echo(json.dumps(result) if as_json else "\n".join(describe_result(result, state)))
        first = len(results) == 1
        if confusion and first:
            if not len(data.test_y):
                raise UserError("--confusion needs test images; the checkpoint's folder has no test/")
            model = teacher if model_name == "teacher" else student
            mean, std = (torch.tensor(config[k], device=device) for k in ("mean", "std"))
            predicted = predict_classes(model, data.test_x, mean, std)
            title = (f"{config['dataset']}, {config['labels']} labels, {result['method']} {model_name} "
                     f"({state['stage']} epoch {state['epoch']}): test error {result[model_name + '_error']:.2f}%")
            plot_confusion(data.test_y, predicted, data.classes, title, confusion)
            click.echo(f"wrote {confusion}")
        if tsne and first:
            if not len(data.test_y):
                raise UserError("--tsne needs test images; the checkpoint's folder has no test/")
            plot_tsne(state, data, teacher, device, tsne, seed, tsne_points)
            click.echo(f"wrote {tsne}")
        if distances and first:
            pairs, eps, eps_label = checkpoint_distances(state, data, student, device)
            title = (f"{config['dataset']}, {config['labels']} labels, {result['method']} ({state['stage']} epoch "
                     f"{state['epoch']})\nstudent features as LC sees them, the first batches of the batch stream (up to {DISTANCE_IMAGES:,} images)")
            plot_distances(pairs, eps, eps_label, title, distances)
            click.echo(json.dumps(dict(distances=str(distances), checkpoint=str(path), **pairs.summary(eps))))
    tested = [r for r in results if r["n_test"]]
    if len(tested) > 1:  # mean +- std per method and setting, the rows of the paper's Table 1
        _, _, rows = results_table(tested)
        for row in (r for r in rows if r["runs"] > 1):
            if as_json:
                click.echo(json.dumps(row))
            else:
                click.echo(f"{row['method']}, {row['setting']}: mean +- std over {row['runs']} runs: "
                           f"student {row['student_mean']:.2f} +- {row['student_std']:.2f}%, "
                           f"teacher {row['teacher_mean']:.2f} +- {row['teacher_std']:.2f}%"
                           + (f"; unlabeled training images: student {row['student_pool_mean']:.2f} +- "
                              f"{row['student_pool_std']:.2f}%, teacher {row['teacher_pool_mean']:.2f} +- "
                              f"{row['teacher_pool_std']:.2f}%" if "teacher_pool_mean" in row else ""))
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
