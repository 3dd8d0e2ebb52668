"""The files the tools keep, by name: a folder's move log (label-log.csv), a run's lock, a training
run's checkpoints and metrics, and whatever lies in the folders the tools keep (the decode cache, a
step's work folder, a run's staging folder). No output of another command ever replaces one: the undo
history, a resumable run or a cache would be gone without a word.
"""
import os
from pathlib import Path

from .cache import CACHE_DIR_NAME
from .errors import UserError
from .label_files import LOG_NAME
from .runs import LOCK_NAME, STAGING
from .work import WORK_SUFFIX

# What each training stage writes into its --out (the scripts' outputs).
STAGE_OUTPUTS = dict(mt=("mt.pt", "mt_final.pt", "mt_metrics.jsonl", "mt_last.pt"),
                     lc=("lc.pt", "lc_metrics.jsonl", "lc_last.pt"))
KEPT_NAMES = {LOG_NAME: "label.py's log of moves (its undo history)", LOCK_NAME: "a run's lock",
              **{name: "a training run's checkpoint or metrics" for names in STAGE_OUTPUTS.values() for name in names}}


def kept_file(path):
    """What the tools keep at `path` (KEPT_NAMES, or a file in one of their folders), or None."""
    path = Path(os.path.abspath(path))
    if path.name in KEPT_NAMES:
        return KEPT_NAMES[path.name]
    cache_root = os.environ.get("MTLC_CACHE_DIR")
    for folder in path.parents:
        if (folder.name == CACHE_DIR_NAME or folder.name.endswith(WORK_SUFFIX) or folder.name.startswith(STAGING.format(""))
                or (cache_root and folder == Path(os.path.abspath(cache_root)))):
            return f"a file in {folder}, a folder the tools keep"
    return None


def check_not_kept(outputs):
    """Exit 2 where an output {option: path} would replace a file the tools keep."""
    for option, path in outputs.items():
        what = kept_file(path) if path else None
        if what:
            raise UserError(f"{option} {path} is {what}: writing it would replace it; give the output another name")
