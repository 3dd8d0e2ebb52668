"""What evaluate.py reports, as data and as text: the names of runs (supervised, MT, MT+LC, LC's
control), a checkpoint's result (test errors, per class, calibration, how LC went), the paper's
Table 1 (mean +- std over runs) and the paired difference of MT+LC and its control, and the lines
that describe calibration and acceptance.
"""
import io
import statistics
from pathlib import Path

from ..data.views import normalization
from ..disk.console import csv_writer
from ..disk.runs import atomic_write
from ..train.inference import predict_classes, test_error
from ..train.objectives import OBJECTIVES
from .calibration import CONFIDENCE_LEVEL, images_needed
from .classifier import held_out_calibration
from .held_out import held_out

# How a stage-2 run with lambda2 0 is named after its stage-1 objective: LC's control.
CONTROL = ", continued (lambda2 0)"


def objective_name(config):
    """Stage 1's objective: supervised (lambda1 0), else as the objective names itself (MT, FixMatch
    with its threshold and, where not the teacher, the source of its pseudo-labels)."""
    if config.cons_weight == 0:
        return "supervised"
    return OBJECTIVES[config.consistency].describe(config)


def method_name(state):
    """Stage 1's objective (objective_name), then for stage 2 +LC with its eps scale (fixed, as in the
    paper, relative or normalized) and its pairs (all, or same-prediction), or, for a stage-2 run with
    lambda2 0, LC's control: stage 1's objective trained on for stage 2's schedule without LC."""
    base = objective_name(state["config"])
    if state["stage"] == "lc":
        lc = state["config"].lc
        if lc.lam == 0:
            return base + CONTROL
        pairs = ", same-prediction pairs" if lc.pairs == "same-prediction" else ""
        return f"{base}+LC ({lc.eps_scale} eps{pairs})"
    return base


def lc_diagnostics(state):
    """How LC went, from an LC checkpoint's config and metrics: eps, the largest neighbour fraction
    of an epoch after the ramp, how far each model's test error rose above its value at LC's start
    (the MT checkpoint's), and the ratio of median same- to different-class d2 and the mean d2 (the
    feature scale) at LC's start and end. Empty for an MT checkpoint."""
    if state["stage"] != "lc":
        return {}
    lc = state["config"].lc
    start, records = lc.start, state["metrics"]
    evaluated = [r for r in records if "d2_ratio" in r]
    if not evaluated or not {"d2_ratio", "d2_mean"} <= set(start):  # a resume checkpoint before LC's first evaluation
        return {}
    after_ramp = [r["neighbour_fraction"] for r in records if r["epoch"] > lc.lc_rampup]
    result = dict(eps=lc.eps, eps_scale=lc.eps_scale, eps_auto=lc.eps_auto,
                  max_neighbour_fraction_after_ramp=max(after_ramp, default=None),
                  d2_ratio_start=start["d2_ratio"], d2_ratio_end=evaluated[-1]["d2_ratio"],
                  d2_mean_start=start["d2_mean"], d2_mean_end=evaluated[-1]["d2_mean"])
    for model in ("student", "teacher"):
        if f"{model}_error" in start and all(f"{model}_error" in r for r in evaluated):
            result[f"{model}_error_at_lc_start"] = start[f"{model}_error"]
            result[f"{model}_max_rise_after_lc_start"] = (max(r[f"{model}_error"] for r in evaluated)
                                                         - start[f"{model}_error"])
    return result


def change(start, end):
    """'2.5x smaller' or '1.6x larger': how a positive quantity changed, said the way it went."""
    return f"{start / end:.1f}x smaller" if end <= start else f"{end / start:.1f}x larger"


def describe_lc(d):
    """One line of lc_diagnostics for people."""
    fraction = d["max_neighbour_fraction_after_ramp"]
    line = (f"  LC: eps {d['eps']:.4g} ({'auto, ' if d['eps_auto'] else ''}{d['eps_scale']}); neighbour fraction "
            + (f"after the ramp at most {fraction:.3f}" if fraction is not None else "not measured after the ramp "
               "(it lasted the whole run)") + "; median d2 same/different class "
            f"{d['d2_ratio_start']:.3f} -> {d['d2_ratio_end']:.3f}, mean d2 {d['d2_mean_start']:.3g} -> "
            f"{d['d2_mean_end']:.3g} ({change(d['d2_mean_start'], d['d2_mean_end'])})")
    if "teacher_error_at_lc_start" in d:
        line += (f"; test error at LC's start student {d['student_error_at_lc_start']:.2f}% teacher "
                 f"{d['teacher_error_at_lc_start']:.2f}%, highest after it {d['student_max_rise_after_lc_start']:+.2f} "
                 f"/ {d['teacher_max_rise_after_lc_start']:+.2f} points")
    return line


def mean_std(values):
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


# The training and test images of the datasets as published: a run on others is marked in the tables.
PUBLISHED_SIZES = dict(svhn=(73257, 26032), cifar10=(50000, 10000))


def setting_of(result):
    """'cifar10, 4000 labels', marked where the run saw other images than the published dataset's
    (a subset, or CIFAR-10 read from image files such as the JPEG copy)."""
    sizes, marks = PUBLISHED_SIZES.get(result["dataset"]), []
    if sizes and result.get("image_files"):
        marks.append("from image files")
    if sizes and "n_train" in result and (result["n_train"], result["n_test"]) != sizes:
        marks.append(f"{result['n_train']:,} training and {result['n_test']:,} test images")
    return f"{result['dataset']}, {result['labels']} labels" + (f" ({'; '.join(marks)})" if marks else "")


def cell_setting(result):
    """The column of a result in the table: its setting, with what sets it apart from unlike runs of
    its method where there are some (alike.mark_cells)."""
    return result.get("setting") or setting_of(result)


def results_table(results):
    """Rows: method; columns: dataset and labels; cells: mean +- std of the test error over seeds."""
    groups = {}
    for r in results:
        groups.setdefault((r["method"], cell_setting(r)), []).append(r)
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
    controls = {r["mt_checkpoint"]: r for r in results if r["method"].endswith(CONTROL)}
    groups = {}
    for r in results:
        control = controls.get(r.get("mt_checkpoint"))
        if r["stage"] == "lc" and not r["method"].endswith(CONTROL) and control is not None:
            groups.setdefault((r["method"], cell_setting(r)), []).append((r, control))
    rows = []
    for (method, setting), pairs in groups.items():
        row = dict(paired=f"{method} minus {pairs[0][1]['method']}", method=method, setting=setting, pairs=len(pairs))
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


def describe_means(row):
    """One line of a results_table row over several runs."""
    return (f"{row['method']}, {row['setting']}: mean +- std over {row['runs']} runs: "
            f"student {row['student_mean']:.2f} +- {row['student_std']:.2f}%, "
            f"teacher {row['teacher_mean']:.2f} +- {row['teacher_std']:.2f}%"
            + (f"; unlabeled training images: student {row['student_pool_mean']:.2f} +- "
               f"{row['student_pool_std']:.2f}%, teacher {row['teacher_pool_mean']:.2f} +- "
               f"{row['teacher_pool_std']:.2f}%" if "teacher_pool_mean" in row else ""))


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
        out = io.StringIO(newline="")
        csv_writer(out).writerows([keys] + [[r[k] for k in keys] for r in rows])
        text = out.getvalue()
    else:
        cell = {(r["method"], r["setting"]): r for r in rows}
        text = ""
        for model in ("teacher", "student"):
            text += f"Test error (%) of the {model}, mean +- std over runs (runs in brackets)\n\n"
            text += "| method | " + " | ".join(settings) + " |\n| --- |" + " --- |" * len(settings) + "\n"
            for m in methods:
                cells = [mean_cell(cell[m, s], model) if (m, s) in cell else "-" for s in settings]
                text += f"| {m} | " + " | ".join(cells) + " |\n"
            text += "\n"
        paired = paired_differences(results)
        if paired:
            text += ("Paired difference of the test error (points), each run with LC minus its control (lambda2 0) "
                     "from the same stage-1 checkpoint: mean +- std (standard error), pairs in brackets\n\n"
                     "| difference | setting | teacher | student |\n| --- | --- | --- | --- |\n")
            for r in paired:
                text += (f"| {r['paired']} | {r['setting']} | " + " | ".join(
                    difference_cell(r, m, "{mean:+.2f} +- {std:.2f} ({se:.2f})") for m in ("teacher", "student"))
                    + f" ({r['pairs']}) |\n")
            text += "\n"
    atomic_write(path, lambda f: f.write(text.encode()))
    return text


def mean_cell(row, model):
    """'3.52 +- 0.98 (3)', or '87.10 (1)' for one run, which has no spread to show."""
    spread = f" +- {row[model + '_std']:.2f}" if row["runs"] > 1 else ""
    return f"{row[model + '_mean']:.2f}{spread} ({row['runs']})"


def per_class_errors(y, predicted, classes):
    """{class: {"count": test images of the class, "error": % of them misclassified}}."""
    result = {}
    for c, name in enumerate(classes):
        mine = y == c
        n = int(mine.sum())
        result[name] = dict(count=n, error=100.0 * int((predicted[mine] != c).sum()) / n if n else None)
    return result


def evaluate_checkpoint(path, state, data, models, device, *, pool=None, model_name="teacher"):
    """The result of one checkpoint (models: {"student": ..., "teacher": ...}): test errors of both
    models, per class, the calibration of one model's confidences, how LC went and, given the true
    classes of unlabeled images (pool: their indices, their classes), the error on them. Returns
    (result, {model name: its predicted class per test image}), the latter for the confusion matrix."""
    config = state["config"]
    mean, std = normalization(config, device)
    x, y = data.test_x, data.test_y
    result = dict(checkpoint=str(path), dataset=config.dataset, labels=config.labels, method=method_name(state),
                  stage=state["stage"], epoch=state["epoch"], n_test=len(y), n_train=len(data.train_y),
                  image_files=data.files is not None)
    if state["stage"] == "lc":
        result["mt_checkpoint"] = config.lc.mt_checkpoint  # what pairs a run with its control
    per_class, predictions = {}, {}
    for name, model in models.items():
        predictions[name] = predicted = predict_classes(model, x, mean, std)
        result[f"{name}_error"] = 100.0 * (predicted != y).sum().item() / len(y) if len(y) else None
        for cls, r in per_class_errors(y, predicted, data.classes).items():
            per_class.setdefault(cls, dict(count=r["count"]))[f"{name}_error"] = r["error"]
    result["per_class"] = per_class
    held = held_out(state, data)
    if len(held.y):
        cal = held_out_calibration(state, held, models[model_name], device)
        result["calibration"] = dict(model=model_name, **cal.summary())
    if pool is not None:
        pool_idx, pool_y = pool
        result["n_pool"] = len(pool_y)
        for name, model in models.items():
            result[f"{name}_pool_error"] = test_error(model, data.train_x, pool_y, mean, std, pool_idx)
    return dict(result, **lc_diagnostics(state)), predictions


def describe_result(result, state):
    """The text lines of one checkpoint's result."""
    head = (f"{result['checkpoint']}: {setting_of(result)}, {result['method']} "
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
    if summary.get("relabeled_counted_wrong"):
        coverage += (f" ({summary['relabeled_counted_wrong']:,} of them relabeled with label.py before training, "
                     f"counted as errors: their labels came from a model's suggestion)")
    if summary["uncalibrated"]:
        return (f"confidences of the {summary['model']} are uncalibrated (the raw softmax): {summary['uncalibrated']}; "
                f"on the {summary['n_held_out']:,} held-out {summary['held_out']} images the {coverage}")
    ece = (f"{summary['ece_before']:.2f}% -> {summary['ece_after']:.2f}% (cross-fitted"
           + ("; no lower: the raw confidences were as well calibrated" if summary["ece_after"] >= summary["ece_before"]
              else "") + ")" if summary["ece_after"] is not None
           else f"{summary['ece_before']:.2f}% before it (after it not measured: {summary['n_held_out']:,} images are too "
                f"few to fit on one half and score the other)")
    return (f"confidences of the {summary['model']} calibrated on {summary['n_held_out']:,} held-out "
            f"{summary['held_out']} images: temperature {summary['temperature']:.3f}, expected calibration error "
            f"{ece}; {coverage}")


def describe_acceptance(n_accepted, n, max_error, found, cal, unseen=False):
    """The line --max-error ends with; unseen: the images were predicted by heads that never saw them."""
    alike = ("images in these images' class proportions, each class like its held-out images" if found and found.standardized
             else "images like the held-out ones")
    promise = (f"the promise holds at {CONFIDENCE_LEVEL:.0%} for {alike} (the search for the "
               "threshold included)" + ("; each image was predicted by a head that never saw it, so the unlabeled "
                                        "ones the checkpoint trained on are such images" if unseen else
                                        "; the unlabeled images were trained on, so the network is more confident on "
                                        "them and their error at the same threshold can be higher"))
    if found is None:
        return (f"0 of {n:,} accepted: no confidence threshold keeps the error of the held-out images above it at "
                f"most {max_error:g}% with {CONFIDENCE_LEVEL:.0%} confidence (from {cal.n:,} held-out {cal.source} "
                f"images; fewer than about {images_needed(max_error):,} held-out images at or above a threshold "
                f"can never show it)")
    return (f"{n_accepted:,} of {n:,} accepted at an expected error of at most {max_error:g}% (threshold "
            f"{found.confidence:.4f}, from {cal.n:,} held-out images): {found.held_out:,} of the held-out "
            f"{cal.source} images are at or above it, {found.error:.1f}% of them wrong; "
            + ("the images' error in their own class proportions (next line) " if found.standardized else "")
            + f"at most {found.bound:.1f}% at {CONFIDENCE_LEVEL:.0%} confidence; {promise}")
