"""A checkpoint described once: what the file holds (loaded without running code, checked for
every key the scripts read), the settings a run from before they existed gets (filled here and
nowhere else), and what it builds: the models, the optimizer, a stage's trainer, a resumed run, and
its data (checked to be the very files it trained on).

A checkpoint is a plain dict: the student's and teacher's weights, the optimizer, `model_args`
(model.ModelConfig: what builds the network), `config` (the run's settings, the class names, the
normalization and, for an image folder, its files), the split, the RNG states and the metrics.
"""
from dataclasses import asdict
from pathlib import Path

import click
import torch

from .batches import augment, max_shift, normalization
from .data import class_images, is_own_layout, listed, load_dataset, read_files
from .files import describe_bad
from .errors import UserError
from .model import ModelConfig, build_models
from .runs import set_rng_state, write_metrics
from .splits import unleaked_test
from .training import Stage, Trainer, make_optimizer

CHECKPOINT_KEYS = ("student", "teacher", "optimizer", "epoch", "step", "config", "labeled_idx", "unlabeled_idx")
# What the scripts read from a checkpoint's config, by type (an LC checkpoint's "lc" too).
CONFIG_TYPES = dict(dataset=str, data_dir=str, labels=int, labeled_batch=int, unlabeled_batch=int, width=(int, float),
                    num_classes=int, classes=list, mean=list, std=list, seed=int, lr=(int, float), ema=(int, float),
                    cons_weight=(int, float), cons_rampup=(int, float), epochs=int, decay_epochs=int, eval_every=int,
                    bn_momentum=(int, float))
LC_CONFIG_TYPES = dict(eps=(int, float), eps_auto=bool, eps_scale=str, start=dict, lam=(int, float),
                       lc_rampup=(int, float), epochs=int, decay_epochs=int, lr=(int, float), eval_every=int,
                       mt_step=int, mt_checkpoint=str)
# Settings that runs from before they existed did not write, as those runs behaved.
RUN_DEFAULTS = dict(image_size=32, skip_bad_images=False, files=None, contents=None, forward="joint",
                    precision="fp32", compile=False, leaked_test=[], step_mode="eager")
LC_DEFAULTS = dict(loss_unit=1.0, pairs="all", scope="local", truth=None, eps_ratio=None)


def unpickling_refusal(exc):
    """The line of torch's weights_only refusal that names what the file asked for, if it is one."""
    for line in str(exc).splitlines():
        if "GLOBAL" in line or "Unsupported" in line or "WeightsUnpickler" in line:
            return line.strip()
    return None


def config_problem(state):
    """What a checkpoint's config lacks or holds of the wrong type, or None."""
    config = state.get("config")
    if not isinstance(config, dict):
        return "it has no config"
    wrong = [k for k, kind in CONFIG_TYPES.items() if not isinstance(config.get(k), kind)]
    if state.get("stage") == "lc":
        lc = config.get("lc")
        if not isinstance(lc, dict):
            wrong.append("lc")
        else:
            wrong += [f"lc.{k}" for k, kind in LC_CONFIG_TYPES.items() if not isinstance(lc.get(k), kind)]
    if wrong:
        return f"its config lacks {', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''} (or holds another type)"
    if len(config["classes"]) != config["num_classes"] or len(config["mean"]) != 3 or len(config["std"]) != 3:
        return "its config's classes, mean or std do not fit its class count and 3 colour channels"
    return None


def with_defaults(state):
    """The checkpoint with what older runs did not write filled in: RUN_DEFAULTS, LC_DEFAULTS, mt.pt
    at the end of the constant-lr phase, no validation hold-out, model_args from the config."""
    config = dict(RUN_DEFAULTS, **state["config"])
    config.setdefault("lc_start_epoch", config["epochs"])
    if isinstance(config.get("lc"), dict):
        config["lc"] = dict(LC_DEFAULTS, **config["lc"])
    state = dict(state, config=config)
    state.setdefault("val_idx", torch.zeros(0, dtype=torch.long))
    state.setdefault("model_args", asdict(ModelConfig.of_run(config)))
    return state


def load_checkpoint(path):
    """A checkpoint as a dict (with_defaults), loaded with weights_only=True (a checkpoint from
    elsewhere cannot run code) and checked to hold what the scripts read; any problem ends the run
    with exit code 2 and a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist")
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
    problem = config_problem(state)
    if problem:
        raise UserError(f"{path} is not a checkpoint this project can use: {problem}")
    return with_defaults(state)


def checkpoint_split(state):
    """The labeled / unlabeled / validation indices of a checkpoint."""
    return {k: state[k] for k in ("labeled_idx", "unlabeled_idx", "val_idx")}


def restore_models(state, device):
    """Student and teacher of a checkpoint; one that does not fit this project's network exits 2."""
    try:
        student, teacher = build_models(ModelConfig(**state["model_args"]), device)
        student.load_state_dict(state["student"])
        teacher.load_state_dict(state["teacher"])
    except (KeyError, TypeError, RuntimeError) as exc:
        raise UserError(f"checkpoint does not fit this project's model: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200]}") from None
    return student, teacher


def restore_training(state, device):
    """Student, teacher and optimizer of a checkpoint, ready to continue training."""
    student, teacher = restore_models(state, device)
    optimizer = make_optimizer(student, state["config"]["lr"])
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"checkpoint's optimizer state does not fit: {type(exc).__name__}: {exc}") from None
    return student, teacher, optimizer


def resume_checkpoint(out, stage_name, write=True):
    """The `<stage>_last.pt` of an interrupted run in `out`, its RNG states restored, and (by the
    process that writes) the metrics file rewritten to the epochs that checkpoint has seen (it holds
    their records)."""
    path = Path(out) / f"{stage_name}_last.pt"
    if not path.exists():
        raise UserError(f"--resume: {path} does not exist (nothing to resume in {out}; a run stopped in its "
                        f"first epoch starts again without --resume)")
    state = load_checkpoint(path)
    if state.get("stage") != stage_name:
        raise UserError(f"--resume: {path} holds stage {state.get('stage')!r}, not {stage_name!r}")
    set_rng_state(state["rng"])
    if write:
        write_metrics(Path(out) / f"{stage_name}_metrics.jsonl", state["metrics"])
    return state


def stage_of(config, name):
    """Stage 1 ("mt") or stage 2 ("lc") of a run, as its config sets it."""
    common = dict(ema=config["ema"], cons_weight=config["cons_weight"], cons_rampup=config["cons_rampup"])
    if name == "mt":
        return Stage(name="mt", epochs=config["epochs"], decay_epochs=config["decay_epochs"], lr=config["lr"],
                     eval_every=config["eval_every"], first_step=0, **common)
    lc = config["lc"]
    return Stage(name="lc", epochs=lc["epochs"], decay_epochs=lc["decay_epochs"], lr=lc["lr"], eval_every=lc["eval_every"],
                 first_step=lc["mt_step"], lc_eps=lc["eps"], lc_weight=lc["lam"], lc_rampup=lc["lc_rampup"],
                 lc_eps_scale=lc["eps_scale"], lc_eps_ratio=lc["eps_ratio"], lc_loss_unit=lc["loss_unit"],
                 lc_pairs=lc["pairs"], **common)


def fresh_training(config, data, labeled_idx, device):
    """(student, teacher, optimizer) of a new run: the config's seed, the student data-initialized on
    the first labeled batch (augmented as training augments it), the teacher its copy."""
    torch.manual_seed(config["seed"])  # every process builds the same networks; DDP checks they agree
    student, teacher = build_models(ModelConfig.of_run(config), device)
    mean, std = normalization(config, device)
    first_labeled = data.train_x[labeled_idx[:config["labeled_batch"]]].to(device)
    student.data_init(augment(first_labeled, mean, std, config["dataset"] == "cifar10", max_shift(config["image_size"])))
    teacher.load_state_dict(student.state_dict())
    return student, teacher, make_optimizer(student, config["lr"])


def make_trainer(name, config, data, split, training, device, procs, *, reference_spread=None, true_classes=None):
    """The Trainer of stage `name` of a run: its config, data and split, and `training` (student,
    teacher, optimizer) fresh or restored from a checkpoint."""
    return Trainer(*training, data, split, config, stage_of(config, name), device, procs,
                   reference_spread=reference_spread, true_classes=true_classes)


def restore_data(state, data_dir=None, echo=click.echo):
    """The checkpoint's dataset (from its own data_dir unless one is given), checked against it: an
    image folder must hold the very files it was trained on."""
    config = state["config"]
    where = data_dir or config["data_dir"]
    data = load_dataset(config["dataset"], where, config["image_size"], config["skip_bad_images"], echo)
    if config["files"] is not None:
        check_same_files(config["files"], data.files, where, config["contents"], data.contents)
    n_train = len(data.train_y)
    split = torch.cat(list(checkpoint_split(state).values()))
    if data.num_classes != config["num_classes"] or len(split) != n_train or split.max() >= n_train:
        raise UserError(f"the {config['dataset']} data in {data_dir or config['data_dir']} does not match the "
                        f"checkpoint ({data.num_classes} classes and {n_train} training images here, "
                        f"{config['num_classes']} and {len(split)} in the checkpoint)")
    return data


def held_out(state, data):
    """The labeled images a checkpoint never trained on: (uint8 images, classes, which): its test
    images ("test") but those that copy a training image (config["leaked_test"]), else its --val
    hold-out ("validation"); none where it has neither."""
    if len(data.test_y):
        return without_leaked(state["config"], data.files and data.files["test"], data.test_x, data.test_y)
    return data.train_x[state["val_idx"]], data.train_y[state["val_idx"]], "validation"


def without_leaked(config, names, x, y):
    """(x, y, "test") of the test images whose names config["leaked_test"] does not list."""
    keep = unleaked_test(config, names)
    return (x, y, "test") if keep is None else (x[keep], y[keep], "test")


def restore_held_out(state, data_dir=None, echo=click.echo):
    """held_out's images of a checkpoint, read from its folder (its own data_dir unless one is
    given). An own-images folder's test/ is read alone and checked against the checkpoint's test
    files, so that label.py's moves between unlabeled/ and labeled/ do not keep it from calibrating;
    a --val hold-out (indices into the training files) needs the training files as they were. Exit
    2 with the real reason where the held-out images cannot be had."""
    config = state["config"]
    where = Path(data_dir or config["data_dir"])
    files = config["files"]
    if config["dataset"] != "folder" or not files or not files["test"] or not is_own_layout(where):
        return held_out(state, restore_data(state, data_dir, echo))
    groups, hidden = class_images(where / "test")
    foreign = sorted(set(groups) - set(config["classes"]))
    if foreign:
        raise UserError(f"{where / 'test'} has class folders the checkpoint does not know: {', '.join(foreign)}")
    (x, y, names, content), bad, _ = read_files(where, listed([groups], config["classes"]), "test",
                                               config["image_size"], echo)
    if bad and not config["skip_bad_images"]:
        raise UserError(describe_bad(bad, where))
    check_same_files(files, dict(test=names), where, config["contents"], dict(test=content), parts=("test",))
    return without_leaked(config, names, x, y)


def check_same_files(then, now, where, contents_then=None, contents_now=None, parts=("train", "test")):
    """Exit 2 if the image files of a folder differ from those a checkpoint was trained on: their
    names or, where the checkpoint holds their content fingerprint (runs since the decode cache
    hashed each file's bytes), their bytes."""
    for part in parts:
        if then[part] == now[part]:
            if contents_then and contents_now and contents_then[part] != contents_now[part]:
                raise UserError(f"the images in {where} changed since the checkpoint was trained: the same "
                                f"{len(now[part]):,} {'test' if part == 'test' else 'training'} file names, but some "
                                f"hold other bytes (an image edited or replaced); restore them, or train again from "
                                f"stage 1")
            continue
        gone, new = sorted(set(then[part]) - set(now[part])), sorted(set(now[part]) - set(then[part]))
        listing = "; ".join(f"{len(names)} {what} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                            for what, names in (("missing", gone), ("new", new)) if names)
        raise UserError(f"the images in {where} changed since the checkpoint was trained: {listing or 'another order'}; "
                        f"restore them, or train again from stage 1")
