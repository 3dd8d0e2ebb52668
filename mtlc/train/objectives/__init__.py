"""The unlabeled images' objectives, one file each behind one interface (base.Objective): Mean
Teacher's (the paper's) and FixMatch's, trained by steps; and on a frozen pretrained trunk the fitted
linear heads, the probe and its self-training. A run names its objective by --consistency."""
from .base import Objective
from .fixmatch import FixMatch
from .mean_teacher import MeanTeacher
from .probe import Probe
from .self_training import SelfTraining

OBJECTIVES = {objective.name: objective for objective in (MeanTeacher, FixMatch, Probe, SelfTraining)}
CONSISTENCIES = tuple(OBJECTIVES)
# The settings some objective keeps of its own (the others refuse them on the command line).
OWN_SETTINGS = tuple(sorted({key for o in OBJECTIVES.values() for key in o.defaults
                             if any(key not in other.defaults for other in OBJECTIVES.values())}))


def objective_of(config, device, world=1, state=None):
    """The objective a run's config names, on the training device, its state (a checkpoint's) restored."""
    objective = OBJECTIVES[config.consistency](config, device, world)
    objective.load_state_dict(state)
    return objective


def consistency_help(defaults):
    """--consistency's help: each objective's, then the datasets' defaults {dataset: objective}."""
    return ("The unlabeled images' objective. " + " ".join(f"{name}: {o.help}" for name, o in OBJECTIVES.items())
            + " The EMA teacher is the model kept and evaluated either way, and stage 2 adds LC to the same "
            f"objective. [default: {', '.join(f'{k} {v}' for k, v in defaults.items())}]")


def objective_options(command):
    """The command with every objective's own options (Objective.options), in their order."""
    for option in reversed([option for o in OBJECTIVES.values() for option in o.options()]):
        command = option(command)
    return command


def objective_help(key):
    """'[default: mt 100, fixmatch 1]' for an option whose default depends on --consistency."""
    values = ", ".join(f"{name} {o.defaults[key]:g}" if isinstance(o.defaults[key], float) else f"{name} {o.defaults[key]}"
                       for name, o in OBJECTIVES.items() if key in o.defaults)
    return f"[default: {values}]"


__all__ = ["CONSISTENCIES", "OBJECTIVES", "OWN_SETTINGS", "Objective", "consistency_help", "objective_help",
           "objective_of", "objective_options"]
