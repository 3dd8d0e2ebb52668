"""The pictures evaluate.py draws, each from data the report or the run already holds: error curves
(the paper's Fig. 2), t-SNE of the features (Figs. 5-6), the pairwise distances with eps, the
confusion matrix and the error-coverage curve of --max-error. Written as PNG through atomic_write.
"""
from pathlib import Path

import numpy as np
import torch

from ..data.views import normalization
from ..disk.runs import atomic_write, read_metrics
from ..errors import UserError
from ..train.inference import outputs
from .calibration import CONFIDENCE_LEVEL, error_upper_bound, ranked
from .report import method_name


def pyplot():
    """matplotlib's pyplot without a display (imported when a figure is drawn: it takes a second)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, out, dpi=120):
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=dpi))
    pyplot().close(fig)


def checkpoint_title(state, result, what):
    """A figure's title: the checkpoint's dataset, labels, method and epoch, then what it shows."""
    config = state["config"]
    return (f"{config.dataset}, {config.labels} labels, {result['method']} ({state['stage']} epoch "
            f"{state['epoch']}) {what}")


def stage_label(records):
    """MT, MT+LC, or for a stage-2 run whose lambda2 stayed 0 its control, from a metrics file."""
    if records[0]["stage"] != "lc":
        return "MT"
    return "MT, continued" if all(r.get("lc_weight", 0) == 0 for r in records) else "MT+LC"


def training_seconds(records, mt_records=None):
    """Cumulative training seconds at the end of each record's epoch (the steps' time_s, evaluations
    not counted); a stage-2 run starts at its MT run's seconds through the epoch LC started from."""
    start = 0.0
    if records and records[0]["stage"] == "lc" and mt_records:
        lc_start = records[0]["global_epoch"] - records[0]["epoch"]
        start = sum(r["time_s"] for r in mt_records if r.get("global_epoch", r["epoch"]) <= lc_start + 1e-9)
    return list(np.cumsum([start] + [r["time_s"] for r in records])[1:])


def plot_curves(paths, out, over="epoch"):
    """Test error of each metrics file (Fig. 2: MT, then MT+LC from the epoch LC starts), over the
    global epoch or over the training seconds (training_seconds; a stage-2 file is placed after the
    first MT file among `paths`)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    runs = [read_metrics(path) for path in paths]
    mt_records = next((records for records in runs if records and records[0]["stage"] == "mt"), None)
    for path, records in zip(paths, runs):
        if not any("teacher_error" in r for r in records):
            raise UserError(f"{path} holds no evaluated epochs (is it a *_metrics.jsonl?)")
        label = f"{stage_label(records)} ({Path(path).parent.name})"
        x = (training_seconds(records, mt_records) if over == "seconds" else
             [r.get("global_epoch", r["epoch"]) for r in records])
        evaluated = [(xi, r) for xi, r in zip(x, records) if "teacher_error" in r]
        x = [xi for xi, _ in evaluated]
        ax.plot(x, [r["student_error"] for _, r in evaluated], "--", label=f"{label} student")
        ax.plot(x, [r["teacher_error"] for _, r in evaluated], "-", label=f"{label} teacher")
    ax.set_xlabel("training seconds (evaluations not counted)" if over == "seconds" else "epoch")
    ax.set_ylabel("test error (%)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save(fig, out)


def plot_tsne(state, data, teacher, device, out, *, seed, max_points=2000):
    """t-SNE of the teacher's features z: training images coloured labeled / unlabeled, test images
    coloured by class (the paper's Figs. 5 and 6)."""
    plt = pyplot()
    from sklearn.manifold import TSNE
    config = state["config"]
    mean, std = normalization(config, device)
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
        z = outputs(teacher, x, mean, std)[0]
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
    fig.suptitle(f"t-SNE of the teacher's features: {config.dataset}, {config.labels} labels, "
                 f"{method_name(state)} ({state['stage']} epoch {state['epoch']})")
    fig.tight_layout()
    save(fig, out, dpi=110)


def plot_distances(distances, eps, eps_label, title, out):
    """Histograms of d2: labeled pairs of one class, of different classes, and the LC pairs
    (with an unlabeled image), on a log scale, with eps marked."""
    plt = pyplot()
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
    save(fig, out)


def plot_confusion(y, predicted, classes, title, out):
    """The confusion matrix: counts in the cells, shading by the share of the true class's images."""
    plt = pyplot()
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
    save(fig, out)


def plot_coverage(cal, max_error, threshold, out, title):
    """The error of the most confident images against their share of the held-out images (the
    error-coverage curve), with the error asked for and the threshold chosen for it."""
    plt = pyplot()
    conf, errors, counts = ranked(cal.confidence, cal.correct)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.plot(100.0 * counts / counts[-1], 100.0 * errors / counts, label="error of the most confident")
    ax.plot(100.0 * counts / counts[-1], error_upper_bound(errors, counts), lw=0.8, ls="--",
            label=f"its {CONFIDENCE_LEVEL:.0%} upper bound (tested from the most confident down)")
    if max_error is not None:
        ax.axhline(max_error, color="grey", lw=0.8, label=f"--max-error {max_error:g}%")
    if threshold is not None:
        ax.plot(100.0 * threshold.held_out / counts[-1], threshold.error, "o", color="k",
                label=f"threshold {threshold.confidence:.4f}")
    ax.set_xlabel(f"coverage: % of the {cal.n:,} held-out {cal.source} images, most confident first")
    ax.set_ylabel("error %")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, None)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out)
