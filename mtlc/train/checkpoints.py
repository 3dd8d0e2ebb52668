"""A checkpoint described once: what the file holds (loaded without running code, checked for
every key the scripts read; its settings by settings.RunSettings), and what it gives back: the
models, the optimizer, a resumed run, and its data (checked to be the very files it trained on).

A checkpoint is a plain dict: the student's and teacher's weights, the optimizer, `model_args`
(model.ModelConfig: what builds the network), `config` (the run's settings, RunSettings.as_dict: the
class names, the normalization and, for an image folder, its files), the split, the RNG states, the
metrics, and the objective's state (`adaptive_threshold`). Loaded, `config` is a RunSettings.
"""
from pathlib import Path

import click
import torch
from torch.torch_version import TorchVersion

from ..data.datasets import load_dataset
from ..disk.runs import read_metrics, set_rng_state, write_metrics, writing_folder
from ..errors import UserError
from .model import MIN_IMAGE_SIZE, ModelConfig
from .networks import build_models
from .objectives import OBJECTIVES
from .embeddings import embed
from .pretrained import BACKBONE_NAMES, CONVLARGE, HEADS
from .settings import MAX_IMAGE_SIZE, MAX_WIDTH, METRIC_NUMBERS, RunSettings, is_int, is_number
from .trainer import make_optimizer

CHECKPOINT_KEYS = ("student", "teacher", "optimizer", "epoch", "step", "config", "labeled_idx", "unlabeled_idx",
                   "stage")
# The first torch whose torch.load(weights_only=True) a crafted file cannot get round (CVE-2025-32434).
SAFE_TORCH = "2.6"


def is_index(value):
    """A 1-d tensor of non-negative integer positions (a split)."""
    return (isinstance(value, torch.Tensor) and value.dim() == 1 and value.dtype in (torch.int64, torch.int32)
            and (value.numel() == 0 or int(value.min()) >= 0))


def finite_weights(weights):
    """Whether every floating-point tensor of a state dict is finite (weights of NaN predict NaN)."""
    return isinstance(weights, dict) and all(bool(torch.isfinite(t).all()) for t in weights.values()
                                             if isinstance(t, torch.Tensor) and t.is_floating_point())


# What the scripts read from a checkpoint besides its settings (settings.RunSettings checks those),
# each with the check of what this project writes there; a value that fails it ends the run in one
# line (exit 2), never in a traceback or a silently wrong run.
STATE_CHECKS = dict(
    stage=lambda v: v in ("mt", "lc"), epoch=lambda v: is_int(v, 0), step=lambda v: is_int(v, 0),
    labeled_idx=is_index, unlabeled_idx=is_index, val_idx=is_index,
    student=finite_weights, teacher=finite_weights, optimizer=lambda v: isinstance(v, dict),
    reference_spread=lambda v: v is None or is_number(v),
    train_digests=lambda v: v is None or (isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 2
                                          and v.shape[1] == 16),
    rng=lambda v: isinstance(v, dict), config=lambda v: isinstance(v, dict),
    model_args=lambda v: (isinstance(v, dict) and set(v) - {"backbone", "trunk", "image_size", "head"} == {
                              "num_classes", "width", "bn_momentum"} and v.get("head", "mlp") in HEADS
                          and (v.get("head", "mlp") == "mlp" or v.get("backbone", CONVLARGE) != CONVLARGE)
                          and is_int(v["num_classes"], 2) and is_number(v["width"]) and 0 < v["width"] <= MAX_WIDTH
                          and is_number(v["bn_momentum"]) and 0 < v["bn_momentum"] <= 1
                          and v.get("backbone", CONVLARGE) in BACKBONE_NAMES and trained_trunk_args(v)))


def trained_trunk_args(model_args):
    """Whether a network's trunk keys are none (a frozen trunk's, or ConvLarge's) or a trained trunk's:
    both, on a pretrained backbone, with the side its trunk sees."""
    keys = {"trunk", "image_size"} & set(model_args)
    return not keys or (keys == {"trunk", "image_size"} and model_args["trunk"] == "trained"
                        and model_args.get("backbone", CONVLARGE) != CONVLARGE
                        and is_int(model_args["image_size"], MIN_IMAGE_SIZE) and model_args["image_size"] <= MAX_IMAGE_SIZE)


def metrics_problem(metrics, required):
    """Why a checkpoint's metrics (the records of its epochs) are not what this project writes, or None."""
    if metrics is None:
        return "it has no metrics (an LC checkpoint keeps the records of its epochs)" if required else None
    if not isinstance(metrics, list) or not all(isinstance(r, dict) and is_int(r.get("epoch"), 0) for r in metrics):
        return "its metrics are not a list of the records of its epochs"
    if any(not (r[k] is None or is_number(r[k])) for r in metrics for k in METRIC_NUMBERS if k in r):
        return "its metrics hold a measurement that is not a number"
    return None


def unpickling_refusal(exc):
    """The line of torch's weights_only refusal that names what the file asked for, if it is one."""
    for line in str(exc).splitlines():
        if "GLOBAL" in line or "Unsupported" in line or "WeightsUnpickler" in line:
            return line.strip()
    return None


def checked_state(state):
    """The checkpoint with its settings as a RunSettings and what older runs did not write filled in
    (no validation hold-out, model_args from the settings); ValueError naming what it lacks or holds
    of another type or value than this project writes: every key the scripts read."""
    state = dict(state)
    state.setdefault("val_idx", torch.zeros(0, dtype=torch.long))
    state.setdefault("reference_spread", None)
    state.setdefault("adaptive_threshold", None)
    state.setdefault("rng", {})
    wrong = [k for k, check in STATE_CHECKS.items() if k != "model_args" and not check(state.get(k))]
    try:
        config = RunSettings.from_checkpoint(state["config"], state.get("stage"))
    except ValueError as exc:
        config, wrong_config = None, str(exc)
    else:
        wrong_config = None
        state.setdefault("model_args", ModelConfig.of_run(config).as_dict())
        wrong += [] if STATE_CHECKS["model_args"](state["model_args"]) else ["model_args"]
    problems = ([f"it lacks {', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''} (or holds another type or value "
                 f"there)"] if wrong else []) + ([wrong_config] if wrong_config else [])
    if problems:
        raise ValueError("; ".join(problems))
    if state["model_args"]["num_classes"] != config.num_classes:  # a network of other outputs than the classes it names
        raise ValueError(f"its network's {state['model_args']['num_classes']!r} outputs do not fit its "
                         f"{config.num_classes} classes")
    # the network's settings build it, the run's feed it (kept features or images at a side): one network
    network, run = ModelConfig(**state["model_args"]), ModelConfig.of_run(config)
    if (network.backbone, network.trunk, network.image_size, network.head) != (run.backbone, run.trunk, run.image_size,
                                                                               run.head):
        raise ValueError("its network's backbone, trunk, image size or head (model_args) are not its run's")
    problem = (OBJECTIVES[config.consistency].state_problem(state["adaptive_threshold"], config.num_classes)
               or metrics_problem(state.get("metrics"), required=state["stage"] == "lc"))
    if problem:
        raise ValueError(problem)
    return dict(state, config=config)


def load_checkpoint(path):
    """A checkpoint as a dict (checked_state: its settings a RunSettings), loaded with weights_only=True (a checkpoint from
    elsewhere cannot run code) and checked to hold what the scripts read; any problem ends the run
    with exit code 2 and a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist")
    if TorchVersion(torch.__version__) < SAFE_TORCH:
        raise UserError(f"torch {torch.__version__} loads checkpoints with a weights_only that a crafted file can get "
                        f"round (CVE-2025-32434): install torch {SAFE_TORCH} or later (pip install -r requirements.txt)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        refused = unpickling_refusal(exc)
        if refused:
            raise UserError(f"cannot load checkpoint {path}: it holds Python objects other than tensors and plain "
                            f"data ({refused}); refused, as loading them could run code (this project's "
                            f"checkpoints never hold any)") from None
        raise UserError(f"cannot load checkpoint {path}: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200] if str(exc) else 'unreadable'}") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise UserError(f"{path} is not a checkpoint of this project (missing {', '.join(missing)})")
    if not isinstance(state["config"], dict) or not all(isinstance(k, str) for k in state["config"]):
        raise UserError(f"{path} is not a checkpoint this project can use: its config is not a dict of settings")
    try:
        return checked_state(state)
    except ValueError as exc:
        raise UserError(f"{path} is not a checkpoint this project can use: {exc}") from None


def checkpoint_split(state):
    """The labeled / unlabeled / validation indices of a checkpoint."""
    return {k: state[k] for k in ("labeled_idx", "unlabeled_idx", "val_idx")}


def restore_models(state, device):
    """Student and teacher of a checkpoint; one that does not fit this project's network exits 2."""
    try:
        student, teacher = build_models(ModelConfig(**state["model_args"]), device, package_weights=False)
        student.load_state_dict(state["student"])
        teacher.load_state_dict(state["teacher"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise UserError(f"checkpoint does not fit this project's model: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200]}") from None
    return student, teacher


def restore_training(state, device):
    """Student, teacher and optimizer of a checkpoint, ready to continue training."""
    student, teacher = restore_models(state, device)
    optimizer = make_optimizer(student, state["config"].lr)
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"checkpoint's optimizer state does not fit: {type(exc).__name__}: {exc}") from None
    return student, teacher, optimizer


def resume_checkpoint(out, stage_name, write=True):
    """(the state, the path) of the `<stage>_last.pt` of an interrupted run in `out` (or in the folder
    a run with --overwrite writes into until it ends: runs.writing_folder), its RNG states restored,
    and (by the process that writes) the metrics file rewritten to the epochs that checkpoint has seen
    (it holds their records)."""
    folder = writing_folder(out, stage_name)
    path = folder / f"{stage_name}_last.pt"
    if not path.exists():
        raise UserError(f"--resume: {path} does not exist (nothing to resume in {out}; a run stopped in its "
                        f"first epoch starts again without --resume)")
    state = load_checkpoint(path)
    if state.get("stage") != stage_name:
        raise UserError(f"--resume: {path} holds stage {state.get('stage')!r}, not {stage_name!r}")
    stage = state["config"].stage(stage_name)
    if state["epoch"] >= stage.epochs + stage.decay_epochs and published(out, folder, stage_name, state):
        raise UserError(f"--resume: {path} is a finished run (epoch {state['epoch']} of "
                        f"{stage.epochs + stage.decay_epochs}): nothing to resume; a new run replaces it "
                        f"with --overwrite")
    try:
        set_rng_state(state["rng"])
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
        raise UserError(f"--resume: {path} holds no random states this project writes ({type(exc).__name__}): "
                        f"start the run again without --resume") from None
    if write:
        write_metrics(folder / f"{stage_name}_metrics.jsonl", state["metrics"])
    return state, path


def published(out, folder, stage_name, state):
    """Whether a run whose checkpoint names its last epoch wrote everything: its metrics file holds
    that epoch's line, where the outputs go (a run killed before or while it wrote them ends them on
    --resume)."""
    metrics = Path(out) / f"{stage_name}_metrics.jsonl"
    if Path(folder) != Path(out) or metrics.is_symlink() or not metrics.is_file():
        return False
    try:
        return len(read_metrics(metrics)) >= len(state["metrics"])
    except (OSError, ValueError, TypeError):
        return False


def restore_data(state, data_dir=None, echo=click.echo, device="cpu", strong=False):
    """The checkpoint's dataset (from its own data_dir unless one is given), checked against it (with
    strong, a frozen trunk's strong views too where it trained on them, for training as it did): an
    image folder must hold the very files it was trained on, by name before anything is decoded (so
    a checkpoint naming someone else's folder gets no cache written there), then by content. Nothing
    is downloaded: a checkpoint never makes a tool fetch data or make a folder for it."""
    config = state["config"]
    where = data_dir or config.data_dir
    listing = None if config.files is None else (lambda now: check_names_held(config.files, now, where, config.skipped))
    data = load_dataset(config.dataset, where, config.decode_size, config.skip_bad_images, echo,
                        download=False, check_listing=listing, restored=True, framing=config.framed)
    if config.files is not None:
        check_same_files(config.files, data.files, where, config.contents, data.contents)
    n_train = len(data.train_y)
    split = torch.cat(list(checkpoint_split(state).values()))
    if (data.num_classes != config.num_classes or len(split) != n_train or split.max() >= n_train
            or len(torch.unique(split)) != n_train):
        raise UserError(f"the {config.dataset} data in {data_dir or config.data_dir} does not match the "
                        f"checkpoint ({data.num_classes} classes and {n_train} training images here, "
                        f"{config.num_classes} and {len(split)} in the checkpoint)")
    if ModelConfig.of_run(config).keeps_features:  # the trunk's features of them, kept or computed (on device)
        data.features = embed(data, where, config.backbone, config.image_size, torch.device(device), echo,
                              strong_views=config.strong_views if strong else 0, framing=config.framed)
    return data


def check_names_held(then, now, where, skipped=()):
    """Exit 2 (check_same_files' line) where a folder, listed but not yet decoded, lacks a file the
    checkpoint was trained on (it may hold more: the unreadable ones --skip-bad-images left out, skipped)."""
    if any(set(then[part]) - set(now[part]) for part in ("train", "test")):
        check_same_files(then, now, where, skipped=skipped)


def check_same_files(then, now, where, contents_then=None, contents_now=None, parts=("train", "test"),
                     skipped=()):
    """Exit 2 if the image files of a folder differ from those a checkpoint was trained on: their
    names or, where the checkpoint holds their content fingerprint (runs since the decode cache
    hashed each file's bytes), their bytes. skipped: names now listed that it left out as unreadable
    (not new)."""
    for part in parts:
        if then[part] == now[part]:
            if contents_then and contents_now and contents_then[part] != contents_now[part]:
                raise UserError(f"the images in {where} changed since the checkpoint was trained: the same "
                                f"{len(now[part]):,} {'test' if part == 'test' else 'training'} file names, but some "
                                f"hold other bytes (an image edited or replaced); restore them, or train again from "
                                f"stage 1")
            continue
        gone, new = sorted(set(then[part]) - set(now[part])), sorted(set(now[part]) - set(then[part]) - set(skipped))
        moved, gone, new = moved_files(gone, new)
        listing = "; ".join(f"{len(names)} {what} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                            for what, names in (("moved to another folder under their names", moved),
                                                ("missing", gone), ("new", new)) if names)
        raise UserError(f"the images in {where} changed since the checkpoint was trained: {listing or 'another order'}; "
                        + ("train again from stage 1 to learn from the labels given since (where label.py moved "
                           "them, label.py --undo puts them back)" if moved else "restore them, or train again from stage 1"))


def moved_files(gone, new):
    """(the new names of the files that seem to have moved, under the same name, to another folder, as
    label.py moves them (by name only); the other names gone; the other new ones). Names are '/'-separated."""
    waiting = {}
    for name in new:
        waiting.setdefault(name.rsplit("/", 1)[-1], []).append(name)
    moved, left_gone = [], []
    for name in gone:
        candidates = waiting.get(name.rsplit("/", 1)[-1])
        if candidates:
            moved.append(candidates.pop())
        else:
            left_gone.append(name)
    taken = set(moved)
    return sorted(moved), left_gone, [name for name in new if name not in taken]
