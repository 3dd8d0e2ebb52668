"""Train again after accepting: does a second run on a folder whose accepted predictions were moved
into labeled/ (`label.py --apply predictions.csv --accepted`) end better or worse on test/ than the
first, with them trained as unlabeled images (the default) and as labels (--accepted-as-labels)? For
each seed, on a copy of the folder (hard links, its own decode cache), the README's own-images
commands: train_mt.py and finetune_lc.py, evaluate.py --predict --max-error --csv, label.py --apply
--accepted, then train_mt.py and finetune_lc.py again, both ways; each run's teacher error on test/
and wall time.

    python tools/bench_accepted.py data/own-imagenette --seeds 1,2,3 --work /tmp/accepted --record docs/accepted-imagenette.json
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click

from bench_objectives import paired, summary

ROOT = Path(__file__).resolve().parents[1]


def timed(command, env):
    """Run a command in the project's root; its wall time (its output on failure, then stop)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *map(str, command)], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise click.ClickException(f"{' '.join(map(str, command))} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return time.perf_counter() - start, done


def trained(folder, out, seed, width, env, *extra):
    """Both stages on the folder: (the LC teacher's test error, wall time of the two)."""
    first, _ = timed(["train_mt.py", "--dataset", "folder", "--data-dir", folder, "--width", width, "--seed", seed,
                      "--out", out, *extra], env)
    second, _ = timed(["finetune_lc.py", "--ckpt", out / "mt.pt"], env)
    _, done = timed(["evaluate.py", "--ckpt", out / "lc.pt", "--json"], env)
    return json.loads(done.stdout.splitlines()[-1])["teacher_error"], first + second


def one_seed(folder, work, seed, width, max_error):
    work = work / f"seed{seed}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run(["cp", "-al", folder, work / "d"], check=True)
    shutil.rmtree(work / "d" / "mtlc-cache", ignore_errors=True)  # its own cache: never the original's files
    env = dict(os.environ, MTLC_CACHE_DIR=str(work / "cache"))
    first_error, first_s = trained(work / "d", work / "first", seed, width, env)
    predict_s, _ = timed(["evaluate.py", "--ckpt", work / "first" / "lc.pt", "--predict", work / "d" / "unlabeled",
                          "--max-error", max_error, "--csv", work / "p.csv"], env)
    _, done = timed(["label.py", "--data-dir", work / "d", "--apply", work / "p.csv", "--accepted"], env)
    left = sum(1 for p in (work / "d" / "unlabeled").rglob("*") if p.is_file())
    second_error, second_s = trained(work / "d", work / "second", seed, width, env)
    as_labels_error, as_labels_s = trained(work / "d", work / "as-labels", seed, width, env, "--accepted-as-labels")
    result = dict(seed=seed, first_error=first_error, second_error=second_error, as_labels_error=as_labels_error,
                  first_s=round(first_s, 1), predict_s=round(predict_s, 1), second_s=round(second_s, 1),
                  as_labels_s=round(as_labels_s, 1), unlabeled_left=left, label_py=done.stdout.strip().splitlines()[-2:])
    click.echo(json.dumps(result))
    return result


@click.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--seeds", default="1,2,3", show_default=True)
@click.option("--width", default="0.125", show_default=True, help="train_mt.py's --width (the README's).")
@click.option("--max-error", default="5", show_default=True)
@click.option("--work", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--record", type=click.Path(dir_okay=False), help="the results as JSON")
def main(folder, seeds, width, max_error, work, record):
    results = []
    for seed in seeds.split(","):  # the record written after each seed: a long run stopped keeps what it did
        results.append(one_seed(folder.resolve(), work, seed, width, max_error))
        errors = {run: [r[f"{run}_error"] for r in results] for run in ("first", "second", "as_labels")}
        out = dict(folder=str(folder), width=width, max_error=max_error, runs=results,
                   **{run: summary(e) for run, e in errors.items()},
                   second_minus_first=paired(errors["first"], errors["second"]),
                   as_labels_minus_first=paired(errors["first"], errors["as_labels"]),
                   as_labels_minus_second=paired(errors["second"], errors["as_labels"]), command=" ".join(sys.argv))
        if record:
            Path(record).write_text(json.dumps(out, indent=1) + "\n")
    click.echo(json.dumps({k: v for k, v in out.items() if k not in ("runs", "command")}))


if __name__ == "__main__":
    main()
