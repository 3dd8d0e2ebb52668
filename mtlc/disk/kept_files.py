"""The files the tools keep, by name: a folder's move log (label-log.csv), a run's lock, a training
run's checkpoints and metrics, and whatever lies in the folders the tools keep (the decode cache, a
step's work folder, a run's staging folder). No output of another command ever replaces one, and no
run writes into one of those folders: the undo history, a resumable run or a cache would be gone
without a word. Paths are compared as the OS resolves them (links followed) and names whatever their
case (one name on a case-insensitive disk).
"""
import os
from pathlib import Path

from ..data.cache import CACHE_DIR_NAME
from ..errors import UserError
from ..label.log import LOG_NAME
from .runs import LOCK_NAME, STAGING
from .work import WORK_SUFFIX

# What each training stage writes into its --out (the scripts' outputs).
STAGE_OUTPUTS = dict(mt=("mt.pt", "mt_final.pt", "mt_metrics.jsonl", "mt_last.pt"),
                     lc=("lc.pt", "lc_metrics.jsonl", "lc_last.pt"))
KEPT_NAMES = {LOG_NAME: "label.py's log of moves (its undo history)", LOCK_NAME: "a run's lock",
              **{name: "a training run's checkpoint or metrics" for names in STAGE_OUTPUTS.values() for name in names}}
KEPT_NAMES = {name.casefold(): what for name, what in KEPT_NAMES.items()}


def cache_roots():
    """The folders that hold decode caches outside image folders ($MTLC_CACHE_DIR, ~/.cache/mtlc), resolved."""
    roots = [os.environ.get("MTLC_CACHE_DIR"), os.path.join(os.path.expanduser("~"), ".cache", "mtlc")]
    return [os.path.realpath(r) for r in roots if r]


def kept_folder(path):
    """The folder the tools keep that `path` is (or lies in), resolved, or None."""
    real = Path(os.path.realpath(path))
    roots = cache_roots()
    for folder in (real, *real.parents):
        name = folder.name.casefold()
        if (name == CACHE_DIR_NAME or name.endswith(WORK_SUFFIX) or name.startswith(STAGING.format(""))
                or str(folder) in roots):
            return folder
    return None


def kept_file(path):
    """What the tools keep at `path` (KEPT_NAMES, or a file in one of their folders), or None."""
    name = Path(os.path.realpath(path)).name.casefold()
    if name in KEPT_NAMES or Path(path).name.casefold() in KEPT_NAMES:
        return KEPT_NAMES.get(name) or KEPT_NAMES[Path(path).name.casefold()]
    folder = kept_folder(Path(path).parent)
    return f"a file in {folder}, a folder the tools keep" if folder else None


def check_not_kept(outputs):
    """Exit 2 where an output {option: path} would replace a file the tools keep."""
    for option, path in outputs.items():
        what = kept_file(path) if path else None
        if what:
            raise UserError(f"{option} {path} is {what}: writing it would replace it; give the output another name")


def check_not_kept_folder(option, path):
    """Exit 2 where a run's output folder ({option} path) is, or lies in, a folder the tools keep."""
    folder = kept_folder(path) if path else None
    if folder:
        raise UserError(f"{option} {path} lies in {folder}, a folder the tools keep (a cache, a run's work or staging "
                        f"folder): choose another folder")
