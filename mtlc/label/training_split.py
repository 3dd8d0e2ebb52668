"""How the images of a folder of your own train, from what label.py's log says of them: a person's
labels train as labels, label.py --accepted's (a model's predictions) as unlabeled images unless
asked otherwise; the validation hold-out is drawn from a person's labels only; classes too thin to
learn or to check are said."""
from pathlib import Path

import numpy as np
import torch

from ..data.copies import copied_images
from ..data.splits import by_model, own_split
from ..disk.outputs import LOG_NAME
from ..errors import UserError
from .log import label_history

# Labeled images a class needs for the audit to check labeled/'s labels (two folds of cross-fitting).
AUDITED_CLASS = 2


def own_images_split(data, data_dir, *, val, split_seed, accepted_as_labels, echo):
    """(labeled, unlabeled and validation indices, the images label.py relabeled) of an own-images
    folder. label.py --accepted's images (label_history: about 300 bytes each, let go on return)
    train as unlabeled ones, or as labels with accepted_as_labels; --val never holds them out
    (their labels are a model's)."""
    history, model_labeled = label_history(Path(data_dir)), None
    if history.accepted:
        model_labeled = by_model(data.files["train"], data.digests["train"]() if data.digests else None, history.accepted)
        say_accepted(data_dir, int(model_labeled.sum()), accepted_as_labels, echo)
        taught = torch.bincount(data.train_y[(data.train_y >= 0) & ~model_labeled], minlength=data.num_classes)
        if not accepted_as_labels and (taught == 0).any():  # every image of a class is a model's prediction
            raise UserError(f"{Path(data_dir) / 'labeled' / data.classes[int((taught == 0).nonzero()[0])]} holds only "
                            f"images label.py --accepted labeled (a model's predictions): label one of them yourself, "
                            f"or train on them as labels with --accepted-as-labels")
    labeled_idx, unlabeled_idx, val_idx = held_out_without_copies(data, val, split_seed, model_labeled, echo)
    if accepted_as_labels and model_labeled is not None:  # trained as labels, never held out
        labeled_idx = torch.cat([labeled_idx, model_labeled.nonzero().flatten()]).sort().values
        unlabeled_idx = unlabeled_idx[~model_labeled[unlabeled_idx]]
    warn_thin_classes(data, data_dir, labeled_idx, echo)
    return labeled_idx, unlabeled_idx, val_idx, history.relabeled


def held_out_without_copies(data, val, split_seed, model_labeled, echo):
    """own_split's, drawn again while the --val hold-out holds a copy (or near copy) of a training
    image: its error would count images trained on, and calibration would trust them."""
    copied = np.zeros(0, dtype=np.int64)
    while True:
        split = own_split(data.train_y, val, split_seed, unlabeled_too=model_labeled, class_names=data.classes,
                          never_held=copied)
        found = copied_images(data.train_x, split[2]) if len(split[2]) and data.files else []
        if not len(found):
            if len(copied):
                echo(f"train_mt: --val was drawn again without the {len(copied):,} labeled images it had drawn that "
                     f"copy a training image (the same image or a near copy: evaluate.py --audit lists them); they train")
            return split
        copied = np.union1d(copied, found)


def say_accepted(data_dir, n, accepted_as_labels, echo):
    """How the n images label.py --accepted labeled train, said."""
    if not n:
        return
    where = f"{Path(data_dir) / 'labeled'}"
    if accepted_as_labels:
        echo(f"train_mt: --accepted-as-labels: {n:,} images in {where} are a model's predictions that label.py "
             f"--accepted moved there ({LOG_NAME}); they train as labels")
        return
    echo(f"train_mt: {n:,} images in {where} are a model's predictions that label.py --accepted moved there "
         f"({LOG_NAME}): they train as unlabeled images (--accepted-as-labels takes their labels)")


def warn_thin_classes(data, data_dir, labeled_idx, echo):
    """The classes trained on fewer than AUDITED_CLASS labels, said: a network seldom predicts them,
    and the audit cannot check labeled/'s labels while one is that thin."""
    counts = torch.bincount(data.train_y[labeled_idx], minlength=data.num_classes)
    thin = [f"{Path(data_dir) / 'labeled' / data.classes[c]} ({int(counts[c])})"
            for c in (counts < AUDITED_CLASS).nonzero().flatten().tolist()]
    if thin:
        echo(f"train_mt: warning: {'; '.join(thin)}: a class with fewer than {AUDITED_CLASS} labeled images to train "
             f"on is seldom predicted, and evaluate.py --audit cannot check the labels of labeled/ until each has "
             f"{AUDITED_CLASS}: label a few more of it")
