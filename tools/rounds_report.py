"""The tables and the figure of docs/label-in-rounds.md from tools/bench_rounds.py's records (one JSON
a folder): per folder and order, the person's labels until the folder is finished (mean and standard
error over the draws of the starting labels), against labeling every image by hand; the labels' error
and what --max-error accepts after a given number of labels; how often the promise broke."""
import json
import math
from pathlib import Path

import numpy as np

CHECKPOINTS = (0, 50, 100, 200, 500, 1000)  # labels given, where the curves are read off
COLORS = {"least-confident": "tab:blue", "disagreement": "tab:orange", "typiclust": "tab:red",
          "typiclust-first": "tab:purple", "random": "tab:green"}  # one colour an order, in every panel


def mean_se(values):
    values = np.asarray(values, float)
    se = values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return float(values.mean()), se


def cell(values, digits=0, unit=""):
    mean, se = mean_se(values)
    return f"{mean:,.{digits}f}{unit}" + ("" if math.isnan(se) else f" ± {se:,.{digits}f}")


def finished_at(run, max_error):
    """The person's labels to a finished folder (bench_rounds.py): the least, over the rounds whose
    accepted images were at most max_error % wrong, of the labels given and the images left unaccepted."""
    return min(r["labels"] + r["unlabeled"] - r["accepted"] for r in run["rounds"] if r["accepted_error"] <= max_error)


def rest_within(run, max_error):
    """The labels given when the images still unlabeled were, all of them together, at most max_error %
    wrong for the first time (accepting every one would then have kept the promise), or None."""
    return next((r["labels"] for r in run["rounds"] if r["labels_error"] <= max_error), None)


def finish_table(records):
    lines = ["| folder (unlabeled images) | order | labels a round | the person's labels to a finished folder "
             "| share of the unlabeled images | against random order, paired by draw "
             "| labels until the rest was at most 5% wrong as a whole (draws that got there) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, record in records.items():
        n, finished, within = record["unlabeled"], {}, {}
        for run in record["runs"]:
            finished.setdefault(run["per_round"], {}).setdefault(run["order"], {})[run["draw"]] = finished_at(
                run, record["max_error"])
            within.setdefault((run["per_round"], run["order"]), []).append(rest_within(run, record["max_error"]))
        for per_round, by_order in sorted(finished.items()):
            # where random order was not played at this K, against it at the nearest K played, said so
            random_k = min((k for k in finished if "random" in finished[k]), key=lambda k: abs(k - per_round),
                           default=None)
            random = finished[random_k]["random"] if random_k is not None else {}
            for order, draws in by_order.items():
                paired = [100 * (draws[d] / random[d] - 1) for d in draws if d in random]
                versus = "-" if order == "random" or not paired else cell(paired, 0, "%") + (
                    "" if random_k == per_round else f" (random at {random_k} a round)")
                reached = [v for v in within[per_round, order] if v is not None]
                lines.append(f"| {name} ({n:,}) | {order} | {per_round} | {cell(list(draws.values()))} | "
                             f"{cell([100 * v / n for v in draws.values()], 1, '%')} | {versus} | "
                             f"{cell(reached) if reached else '-'} ({len(reached)} of {len(draws)}) |")
    return "\n".join(lines)


def at_labels(run, given):
    """The round of the run after `given` labels (the last one before, where the run stopped earlier)."""
    rounds = [r for r in run["rounds"] if r["labels"] <= given]
    return rounds[-1] if rounds and rounds[-1]["labels"] == given else None


def curve_table(records, per_round):
    lines = ["| folder | order | labels given | labels' error on the rest | accepted at --max-error 5 | "
             "their actual error |", "| --- | --- | --- | --- | --- | --- |"]
    for name, record in records.items():
        runs = [r for r in record["runs"] if r["per_round"] == per_round]
        for order in sorted({r["order"] for r in runs}):
            for given in CHECKPOINTS:
                rounds = [at_labels(r, given) for r in runs if r["order"] == order]
                rounds = [r for r in rounds if r is not None]
                if len(rounds) < 2:
                    continue
                accepted = [r for r in rounds if r["accepted"]]
                lines.append(f"| {name} | {order} | {given:,} | {cell([r['labels_error'] for r in rounds], 1, '%')} | "
                             f"{cell([100 * r['accepted'] / r['unlabeled'] for r in rounds], 1, '%')} | "
                             + (cell([r["accepted_error"] for r in accepted], 1, "%") if accepted else "-") + " |")
    return "\n".join(lines)


def promise_table(records):
    lines = ["| folder | rounds measured | rounds with images accepted | promise broken (accepted more than 5% wrong) "
             "| worst accepted error |", "| --- | --- | --- | --- | --- |"]
    for name, record in records.items():
        rounds = [r for run in record["runs"] for r in run["rounds"]]
        accepted = [r for r in rounds if r["accepted"]]
        broken = [r for r in accepted if r["accepted_error"] > record["max_error"]]
        worst = max((r["accepted_error"] for r in accepted), default=0.0)
        lines.append(f"| {name} | {len(rounds):,} | {len(accepted):,} | {len(broken):,} "
                     f"({100 * len(broken) / max(1, len(accepted)):.1f}%) | {worst:.2f}% |")
    return "\n".join(lines)


def searches_table(records):
    """The fallback procedure against the two searches it replaced, on the same rounds: the share of the
    images still unlabeled each accepted (mean over the rounds), their actual error, and the rounds where
    it accepted fewer than one that held its promise there."""
    lines = ["| folder | rounds | accepted: fallback procedure (now) | fixed sequence | binary search "
             "| actual error: now / fixed / binary | rounds it accepted fewer than binary where that kept its promise "
             "(most images short) | the same against fixed |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, record in records.items():
        rounds = [r for run in record["runs"] for r in run["rounds"] if "before" in r]
        if not rounds:
            continue
        now = [(r["accepted"], r["accepted_error"]) for r in rounds]
        fixed = [tuple(r["before"]["fixed sequence"]) for r in rounds]
        binary = [tuple(r["before"]["binary search"]) for r in rounds]

        def share(results):
            return f"{100 * np.mean([a / r['unlabeled'] for (a, _), r in zip(results, rounds)]):.1f}%"

        def pooled(results):
            accepted = sum(a for a, _ in results)
            return f"{sum(a * e for a, e in results) / accepted:.2f}%" if accepted else "-"

        def short(before):
            gaps = [b - a for (a, _), (b, e) in zip(now, before) if e <= record["max_error"] and b > a]
            return f"{len(gaps):,} ({max(gaps, default=0):,})"
        lines.append(f"| {name} | {len(rounds):,} | {share(now)} | {share(fixed)} | {share(binary)} | "
                     f"{pooled(now)} / {pooled(fixed)} / {pooled(binary)} | {short(binary)} | {short(fixed)} |")
    return "\n".join(lines)


def shift_table(records):
    """On the rounds where the pool's classes were seen apart from the held-out images' (label_shift.py):
    the search in the pool's own proportions (now) against the same search in the held-out proportions,
    the share each accepted, their actual error, and the rounds now accepted fewer where that one held."""
    lines = ["| folder | rounds with the shift seen (of all) | accepted: the images' proportions (now) "
             "| the held-out images' proportions | actual error: now / held-out proportions "
             "| rounds now accepted fewer where the other kept its promise (most images short) "
             "| promise broken: now / held-out proportions |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, record in records.items():
        every = [r for run in record["runs"] for r in run["rounds"] if "shift_seen" in r]
        rounds = [r for r in every if r["shift_seen"]]
        if not rounds:
            continue
        limit = record["max_error"]
        now = [(r["accepted"], r["accepted_error"]) for r in rounds]
        held = [tuple(r["before"]["held-out proportions"]) for r in rounds]
        share = [f"{100 * np.mean([a / r['unlabeled'] for (a, _), r in zip(results, rounds)]):.1f}%" for results in (now, held)]
        error = [f"{sum(a * e for a, e in results) / max(1, sum(a for a, _ in results)):.2f}%" for results in (now, held)]
        gaps = [b - a for (a, _), (b, e) in zip(now, held) if e <= limit and b > a]
        broken = [sum(a > 0 and e > limit for a, e in results) for results in (now, held)]
        lines.append(f"| {name} | {len(rounds):,} ({len(every):,}) | {share[0]} | {share[1]} | {error[0]} / {error[1]} "
                     f"| {len(gaps):,} ({max(gaps, default=0):,}) | {broken[0]} / {broken[1]} |")
    return "\n".join(lines)


def plot(records, path, per_round):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(records), figsize=(3.2 * len(records), 5.6), squeeze=False)
    for column, (name, record) in enumerate(records.items()):
        runs = [r for r in record["runs"] if r["per_round"] == per_round]
        for order in sorted({r["order"] for r in runs}):
            mine = [r for r in runs if r["order"] == order]
            longest = max(len(r["rounds"]) for r in mine)
            for row, value in enumerate((lambda r: r["labels_error"], to_finish)):
                # round k follows k * per_round labels; a run that ended earlier stays at its last round
                ys = [np.mean([value(r["rounds"][min(k, len(r["rounds"]) - 1)]) for r in mine]) for k in range(longest)]
                axes[row, column].plot(np.arange(longest) * per_round, ys, label=order, color=COLORS[order])
        axes[0, column].set_title(f"{name} ({record['unlabeled']:,} unlabeled)", fontsize=9)
        axes[1, column].set_xlabel("the person's labels")
    axes[0, 0].set_ylabel("labels' error on the rest (%)")
    axes[1, 0].set_ylabel("labels to a finished folder from here")
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def to_finish(round_):
    """The person's labels to a finished folder where the rounds stop after this one: those given and
    the images it leaves unaccepted."""
    return round_["labels"] + round_["unlabeled"] - round_["accepted"]


def print_report(folder, figure=None):
    records = {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}
    print(finish_table(records))
    for per_round in sorted({r["per_round"] for record in records.values() for r in record["runs"]}):
        print(f"\nAfter a number of labels, {per_round} a round (mean ± standard error over the draws):\n")
        print(curve_table(records, per_round))
    print("\n" + promise_table(records))
    print("\n" + searches_table(records))
    print("\n" + shift_table(records))
    if figure:
        plot(records, figure, max(r["per_round"] for record in records.values() for r in record["runs"]))
