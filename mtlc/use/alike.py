"""Which runs a mean may hold: a checkpoint file once, and runs that differ in their seeds only.

A mean +- std over runs (the paper's Table 1) says how much a method's error varies with the random
draws; averaging runs on different folders, widths, image sizes or schedules says nothing. Runs are
alike where every setting of their checkpoints but the seeds (the labeled split's and the
training's), how the run computed (compiled, graphed, processes) and where it wrote is equal, their
images equal by content (a folder moved is the same folder) and their epoch the same.
"""
import hashlib
import json
import os
from pathlib import Path

from .report import setting_of

# Settings in which two alike runs may differ: their draws, how they computed, where they read and
# wrote (the images' content is compared instead), and what follows from the images.
UNLIKE_ANYWAY = {"seed", "split_seed", "compile", "step_mode", "processes", "tensorboard", "data_dir", "files",
                 "leaked_test", "relabeled", "mean", "std", "precision"}
# Stage 2's: where it started and what it measured there (eps itself where chosen from the features).
LC_UNLIKE_ANYWAY = {"mt_checkpoint", "mt_epoch", "mt_step", "start", "loss_unit", "eps_ratio", "truth"}


def alike_settings(state):
    """The settings of a checkpoint that alike runs share (a dict of plain values)."""
    values = state["config"].as_dict()
    settings = {k: v for k, v in values.items() if k not in UNLIKE_ANYWAY and k != "lc"}
    if "lc" in values:
        lc = values["lc"]
        settings["lc"] = {k: v for k, v in lc.items() if k not in LC_UNLIKE_ANYWAY and not (k == "eps" and lc["eps_auto"])}
    settings["stage"], settings["epoch"] = state["stage"], state["epoch"]
    return settings


def alike_key(settings):
    """A short name of the settings: equal for alike runs."""
    return hashlib.blake2b(json.dumps(settings, sort_keys=True, default=str).encode(), digest_size=6).hexdigest()


def file_identity(path):
    """The file a path names (device and inode: a link or a second spelling is the same file)."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def counted_once(paths, states, echo):
    """(paths, states) with each file once: a checkpoint given twice (or through a link) counts once, said."""
    kept, seen = [], {}
    for path, state in zip(paths, states):
        identity = file_identity(path)
        if identity in seen:
            echo(f"note: --ckpt {path} is {seen[identity]} again: counted once")
            continue
        seen[identity] = path
        kept.append((path, state))
    return [p for p, _ in kept], [s for _, s in kept]


def differences(settings_a, settings_b):
    """The names of the settings (stage 2's as lc.<name>) in which two settings dicts differ."""
    names = []
    for key in sorted(set(settings_a) | set(settings_b)):
        a, b = settings_a.get(key), settings_b.get(key)
        if key == "lc" and isinstance(a, dict) and isinstance(b, dict):
            names += [f"lc.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            names.append(key)
    return names


def shown_value(settings, name, state):
    """A setting as a cell's label shows it: the images by their folder's name, a list by its length."""
    if name == "contents":
        return f"images of {Path(state['config'].data_dir).name}"
    value = settings["lc"][name[3:]] if name.startswith("lc.") else settings.get(name)
    if isinstance(value, (list, dict)):
        value = f"{len(value)} entries"
    return f"{name} {value}"


def mark_cells(results, states, echo):
    """The results to average, each with its `alike` key and, where runs of one method and setting are
    not alike, a `setting` naming what sets its cell apart (the table says what each cell holds); two
    checkpoints of one run (alike, with the same seeds: a copy, or the same run again) count once, said."""
    groups, runs, kept = {}, {}, []
    for result, state in zip(results, states):
        setting = alike_settings(state)
        result.setdefault("alike", alike_key(setting))  # evaluate.py printed it with the result
        draw = (result["alike"], state["config"].seed, state["config"].split_seed)
        if draw in runs:
            echo(f"note: {result['checkpoint']} is the run of {runs[draw]} again (the same settings and seeds): "
                 f"counted once")
            continue
        runs[draw] = result["checkpoint"]
        kept.append(result)
        groups.setdefault((result["method"], setting_of(result)), {}).setdefault(result["alike"], (setting, state))
    for result in kept:
        label = setting_of(result)
        kinds = groups[(result["method"], label)]
        if len(kinds) > 1:
            mine, state = kinds[result["alike"]]
            names = sorted({n for other, _ in kinds.values() for n in differences(mine, other)})
            result["setting"] = f"{label} [{', '.join(shown_value(mine, n, state) for n in names)}]"
    return kept
