"""Out-of-sample class probabilities for a checkpoint's labeled images, by cross-fitting: the
labeled images are split into K folds (stratified by class); for each fold a network is trained as
the checkpoint's was (Mean Teacher, its width and settings, a schedule of `steps`) on the labels of
the other folds, the fold's own images joining the unlabeled ones with their labels unseen; its
teacher then gives the fold's probabilities. A network that trained on a label agrees with it, so
the checkpoint's own probabilities cannot say which labels are wrong; these can.
"""
import numpy as np
import torch
from sklearn.model_selection import StratifiedKFold

from ..data.views import normalization
from ..errors import UserError
from ..train.devices import Processes
from ..train.inference import outputs
from ..train.progress import TimeEstimate, epoch_progress
from ..train.trainer import fresh_training, make_trainer
from .calibration import fitted_or_one

DEFAULT_FOLDS = 4
# Steps of each fold's network, whatever the folder's size: an eighth of the folder schedule's first
# stage (4,000 + 1,000). Measured in docs/audit.md against the checkpoint's own schedule.
DEFAULT_STEPS = 600


def fold_config(config, n_unlabeled, steps):
    """The checkpoint's config with a schedule of exactly `steps` steps, however large the folder: 80%
    at constant lr, 20% decay, the consistency ramp over the first 20% (the schedule counts epochs of
    this fold's unlabeled set, here a fraction of one where the folder is large)."""
    per_epoch = config.steps_per_epoch(n_unlabeled)
    epochs, decay = 0.8 * steps / per_epoch, 0.2 * steps / per_epoch
    return config.replace(epochs=epochs, decay_epochs=decay, cons_rampup=0.2 * steps / per_epoch, lc_start_epoch=epochs,
                          eval_every=epochs + decay, compile=False, step_mode="eager")


def crossfit_logits(state, data, device, *, folds=DEFAULT_FOLDS, steps=DEFAULT_STEPS, seed=0, echo=lambda line: None,
                    work=None):
    """(out-of-sample logits (n_labeled, classes) in the order of state["labeled_idx"], the number of
    folds used): each labeled image's logits from the teacher of a network that never saw its label.
    With a Work (work.py), each fold's logits are kept as it ends, and a fold kept before is not
    trained again."""
    config, labeled, unlabeled = state["config"], state["labeled_idx"], state["unlabeled_idx"]
    y = data.train_y[labeled].numpy()
    smallest = int(np.bincount(y, minlength=config.num_classes).min())
    folds = min(folds, smallest)
    if folds < 2:
        raise UserError(f"the doubtful-label audit needs at least 2 labeled images of every class (cross-fitting); "
                        f"the smallest class has {smallest}")
    logits = torch.zeros(len(labeled), config.num_classes)
    kept = work.state.setdefault("folds", []) if work else []
    estimate = TimeEstimate("audit", (folds - len(kept)) * steps, device, echo)  # the folds are alike in size
    splitter = StratifiedKFold(folds, shuffle=True, random_state=seed)
    for k, (fit_pos, held_pos) in enumerate(splitter.split(np.zeros(len(y)), y), 1):
        name = f"fold{k}.f32"
        if k in kept:
            logits[held_pos] = torch.from_numpy(np.array(work.rows(name, np.float32, config.num_classes)))
            echo(f"audit: fold {k} of {folds}: kept from before")
            continue
        fit_pos, held_pos = torch.from_numpy(fit_pos), torch.from_numpy(held_pos)
        split = dict(labeled_idx=labeled[fit_pos], unlabeled_idx=torch.cat([unlabeled, labeled[held_pos]]).sort().values,
                     val_idx=torch.zeros(0, dtype=torch.long))
        fold = fold_config(config, len(split["unlabeled_idx"]), steps)
        trainer = make_trainer("mt", fold, data, split, fresh_training(fold, data, split["labeled_idx"], device),
                               device, Processes())
        echo(f"audit: fold {k} of {folds}: {len(fit_pos)} labels, {steps:,} steps")
        for step in epoch_progress(range(steps), f"audit fold {k} of {folds}", True, echo):
            trainer.train_step(step, *trainer.batches.views(step))
            estimate.tick()
        trainer.recompute_bn_means()
        logits[held_pos] = outputs(trainer.teacher, data.inputs("train"), *normalization(fold, device), labeled[held_pos])[1]
        if work:
            work.appended(name).write(logits[held_pos].numpy().astype(np.float32).tobytes())
            kept.append(k)
            work.commit(force=True)
    return logits, folds


def out_of_sample_probabilities(logits, labels):
    """Softmax of the cross-fitted logits with one temperature fitted on all of them (the folds'
    networks are alike; 1 where none can be fitted)."""
    temperature = fitted_or_one(logits.numpy(), np.asarray(labels))
    return torch.softmax(logits.double() / temperature, 1).numpy(), temperature
