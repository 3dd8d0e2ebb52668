"""Command-line options that both training stages take, defined once."""
import math
import os
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from .devices import PRECISIONS
from .graphed import GUARD_EVERY, STEP_MODES


class Number(click.FloatRange):
    """A number option: click's FloatRange, which lets NaN through (every comparison with it is false),
    refusing NaN, the infinities and a number too small for a float to hold in full (1e-320
    underflows to a subnormal), in one line before any work; 0 itself is a number."""
    name = "float"

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if 0 < abs(number) < sys.float_info.min:
            self.fail(f"{value!r} is too small to compute with (under {sys.float_info.min:.3g}): give 0 or a larger "
                      f"number", param, ctx)
        return super().convert(number, param, ctx)


def decorated_by(options):
    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


def run_options(stage_name):
    """--overwrite and --resume, which both training stages take."""
    return decorated_by([
        click.option("--overwrite", is_flag=True,
                     help="Replace the outputs of an earlier run in --out" + (
                         " (a stage 2 there too: it continued the stage 1 replaced); with --resume, the stage 2 beside "
                         "the resumed run, once it ends." if stage_name == "mt" else ".")),
        click.option("--resume", is_flag=True,
                     help=f"Continue the interrupted run in --out from its {stage_name}_last.pt, with that run's "
                          "settings: --device and --tensorboard are read, and --data-dir (the folder, if it moved: its "
                          "images checked to be the run's)" + (" and --truth" if stage_name == "lc" else "")
                          + "; other options given are named as ignored where they differ from the run's. It ends "
                          "bitwise as an uninterrupted run would."),
    ])


# The setting each option of another name fills in a run's config (stage 2's under its own names).
SETTING_OF = {"compile_": "compile", "lc_pairs": "pairs", "lc_scope": "scope"}
# The options that name a file or folder: one names the run's own where both lead to the same place.
PATH_OPTIONS = ("data_dir", "truth", "ckpt", "tensorboard")


def same_as_the_runs(name, value, run_value):
    if name in PATH_OPTIONS and value is not None and run_value is not None:
        return os.path.realpath(value) == os.path.realpath(run_value)
    return value == run_value


def note_ignored_by_resume(settings, read, echo):
    """Names the options on the command line that --resume ignores, where they may differ from the
    run's own `settings` (by the setting's name; one equal to the run's goes unsaid, a relative path
    to the run's own place included), so that a changed --epochs is not believed applied; `read`
    names the options a resumed run reads."""
    context = click.get_current_context()
    ignored = []
    for param in context.command.params:
        if param.name in {"resume", *read} or context.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
            continue
        value, key = context.params[param.name], SETTING_OF.get(param.name, param.name)
        if key not in settings:
            ignored.append(param.opts[0])
        elif not same_as_the_runs(key, value, settings[key]):
            ignored.append(f"{param.opts[0]} {value} (the run's: {settings[key]})")
    if ignored:
        echo(f"--resume continues with the run's own settings; ignored: {', '.join(ignored)}")


def given_on_command_line(name):
    """Whether the option of that parameter name was given on the command line (not its default)."""
    return click.get_current_context().get_parameter_source(name) is ParameterSource.COMMANDLINE


def moved_inputs(config, data_dir, truth=None):
    """A resumed run's settings with the data folder (and stage 2's --truth file) where they are now,
    where the command line names them: a resume reads its inputs where they now are (their content
    checked as now, by restore_data and the truth file's reader), never where they were."""
    if data_dir is not None:
        config = config.replace(data_dir=str(Path(data_dir).resolve()))
    if truth is not None and config.lc is not None:
        config = config.replace(lc=config.lc.replace(truth=str(Path(truth).resolve())))
    return config


def tensorboard_option(stage_name):
    """--tensorboard, which both training stages take."""
    return click.option("--tensorboard", type=click.Path(file_okay=False), default=None, metavar="DIR",
                        help=f"Also write the per-epoch numbers of {stage_name}_metrics.jsonl (losses, lr, ramp weights, "
                             "errors, LC's diagnostics) as TensorBoard curves into DIR, at the global step, so that "
                             "both stages share one axis; give each run its own DIR (runs/tb/mt, runs/tb/lc) and "
                             "run `tensorboard --logdir runs/tb`. With --resume, give the run's DIR again to write on there "
                             "(each step once); a resumed run writes no curves without it.")


def resumed_curves(config, tensorboard, echo):
    """The --tensorboard folder of a resumed run: the one given again on its command line, never the
    one its checkpoint names (which says where it wrote, and is said)."""
    if tensorboard is None and config.tensorboard:
        echo(f"this run wrote TensorBoard curves to {config.tensorboard!r}; give --tensorboard with that "
             f"folder and --resume to go on writing them there")
    return tensorboard


def speed_options(stage_name):
    """The --precision, --compile, --step-mode and --benchmark options that both training stages take."""
    options = [
        click.option("--precision", type=click.Choice(PRECISIONS), default="auto",
                     help="bf16 runs the networks under autocast; the losses, the EMA and the weights stay fp32. "
                          "auto: bf16 where the device computes it natively (CUDA GPUs with bf16, CPUs "
                          "with AVX512-BF16 or AMX), else fp32."),
        click.option("--compile", "compile_", is_flag=True,
                     help="torch.compile the networks: faster steps after a slower start (about a minute at width 1 "
                          "on a CPU)."),
        click.option("--step-mode", type=click.Choice(STEP_MODES), default="auto",
                     help="graphed: the training images kept on the device, each step's batch, lr and ramp weights "
                          "read from tables filled once an epoch, both views augmented on the device, the guards "
                          f"(non-finite loss, collapse) read every {GUARD_EVERY} steps, and on a GPU the whole step "
                          "recorded once as a CUDA graph and replayed (on a CPU it runs uncaptured); its augmentation "
                          "and dropout draw from a generator seeded once an epoch, not once a step. eager: the "
                          "reference, every step gathered on the host and checked at once. auto: graphed on one "
                          "CUDA GPU whose free memory holds the images (as uint8), eager otherwise."),
        click.option("--benchmark", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Time N training steps after warm-up steps (3; 5 with the graphed step: 3 before its "
                          "capture, the capture, a replay) instead of training; the last line printed "
                          "is one JSON object (sec_per_step, images_per_sec, gflops_per_sec, data_share, precision, "
                          f"...). Writes nothing, unless --out is given: then {stage_name}_benchmark.json there."),
    ]
    return decorated_by(options)
