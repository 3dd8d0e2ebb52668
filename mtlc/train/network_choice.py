"""What a stage 1 run trains, chosen from its options before any image is decoded: the network (a
folder's `--backbone auto` looks at its images), how a pretrained trunk sees them (`--framing auto`),
the image size, the unlabeled objective and its settings, and the schedule's compression. The main
process chooses alone under torchrun, so that a folder changing while the processes start cannot
split them."""
from ..errors import UserError
from .model import check_image_size
from .objectives import OBJECTIVES, OWN_SETTINGS
from .presets import BACKBONE, CONSISTENCY, FROZEN_HEAD_COMPRESS
from .pretrained import (AUTO, BACKBONE_NAMES, BACKBONES, CONVLARGE, auto_backbone, default_image_size, framing_of,
                         strong_views_of, weights_path)


def chosen_network(o, procs, device, options):
    """(the options with the network, framing, image size, strong views and compression chosen, the
    objective's settings); options: the command line's, for the objectives' own settings."""
    backbone = o.backbone or BACKBONE[o.dataset]
    if backbone == AUTO:
        if o.dataset != "folder":
            raise UserError(f"--backbone auto chooses for a folder's images; for --dataset {o.dataset} name one of "
                            f"{', '.join(BACKBONE_NAMES)}")
        backbone = procs.from_main(auto_backbone(o.data_dir, device, procs.echo, o.trunk) if procs.main else None)
    if backbone != CONVLARGE:
        # the packages there (a frozen trunk's engine too), before any work: its view is timm's
        weights_path(BACKBONES[backbone], device if o.trunk == "frozen" else None)
    framing = procs.from_main(framing_of(o.framing, backbone, o.data_dir if o.dataset == "folder" else None,
                                         procs.echo) if procs.main else None)
    o = o._replace(backbone=backbone, image_size=o.image_size or default_image_size(backbone, framing),
                   framing=framing)
    check_image_size(o.image_size)
    check_trunk(o)
    objective = OBJECTIVES[objective_name_of(o)]
    frozen = o.backbone != CONVLARGE and o.trunk == "frozen"
    o = o._replace(strong_views=strong_views_of(o.strong_views, o.backbone, o.trunk, objective),
                   compress=o.compress or (FROZEN_HEAD_COMPRESS if frozen and not objective.fitted
                                           and o.dataset == "folder" else 1.0))
    settings = objective_settings(objective.name, frozen, cons_weight=o.cons_weight, unlabeled_batch=o.unlabeled_batch,
                                  **{key: options[key] for key in OWN_SETTINGS})
    return o, settings


def objective_name_of(o):
    return o.consistency or CONSISTENCY[o.dataset]


def check_trunk(o):
    """--trunk trained: only with a pretrained backbone (--backbone auto may have chosen none); a
    fitted objective (a linear head fitted on kept features) only on a frozen one, without the options
    of a schedule of steps."""
    if o.trunk == "trained" and o.backbone == CONVLARGE:
        raise UserError(f"--trunk trained trains a pretrained backbone's trunk with its head; the network here is "
                        f"{CONVLARGE}, trained from scratch (name --backbone {' or '.join(BACKBONES)})")
    objective = OBJECTIVES[objective_name_of(o)]
    if objective.fitted and (o.backbone == CONVLARGE or o.trunk == "trained"):
        raise UserError(f"--consistency {objective.name} fits a linear head on a frozen pretrained trunk's features; "
                        f"this run trains {o.backbone if o.backbone == CONVLARGE else 'a trained trunk'}: choose "
                        f"{' or '.join(n for n, ob in OBJECTIVES.items() if not ob.fitted)}")
    stepped = [name for name in ("epochs", "decay_epochs", "cons_rampup", "cons_weight", "unlabeled_batch",
                                 "lc_start_epoch", "compress") if getattr(o, name) not in (None, 1.0)]
    if objective.fitted and stepped:
        raise UserError(f"--{stepped[0].replace('_', '-')}: --consistency {objective.name} fits its head once, "
                        f"without steps or a schedule; leave it out")


def objective_settings(consistency, frozen=False, **given):
    """The settings of the unlabeled objective: those given, else the objective's defaults (its file's;
    frozen: a head on a frozen pretrained trunk's, where they differ); the settings of another
    objective's own are refused."""
    defaults = {**OBJECTIVES[consistency].defaults, **(OBJECTIVES[consistency].frozen_defaults if frozen else {})}
    wrong = [key for key, value in given.items() if value is not None and key not in defaults]
    if wrong:
        owner = next(name for name, o in OBJECTIVES.items() if wrong[0] in o.defaults)
        raise UserError(f"--{wrong[0].replace('_', '-')} goes with --consistency {owner}, not {consistency}")
    # Every objective's own settings are kept in every config (their defaults where another objective runs).
    settings = {key: value for o in OBJECTIVES.values() for key, value in o.defaults.items() if key in OWN_SETTINGS}
    settings["consistency"] = consistency
    settings.update({key: given[key] if given[key] is not None else value for key, value in defaults.items()})
    return settings
