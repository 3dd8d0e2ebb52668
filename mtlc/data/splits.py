"""Which training images are labeled, unlabeled or held out for validation (by seed alone), and,
for measurements only, the true classes of the unlabeled ones.
"""

import numpy as np
import torch

from ..disk.csv_text import read_mapping
from ..errors import UserError


def own_split(labels, n_val, seed, *, unlabeled_too=None, class_names=None, never_held=()):
    """A folder of your own images: every labeled image is labeled, every unlabeled one unlabeled, and
    so are the labeled ones unlabeled_too marks (bool per image: a model's predictions, by_model);
    n_val labeled images (stratified by class) are held out as a validation set, never trained on,
    none of them among never_held (indices: images with a copy in training)."""
    from sklearn.model_selection import train_test_split
    is_labeled = (labels >= 0) if unlabeled_too is None else (labels >= 0) & ~unlabeled_too
    pool, unlabeled = is_labeled.nonzero().flatten(), (~is_labeled).nonzero().flatten()
    if n_val == 0:
        return pool, unlabeled, torch.zeros(0, dtype=torch.long)
    kept_in = pool[torch.isin(pool, torch.as_tensor(np.asarray(never_held, dtype=np.int64)))]
    pool = pool[~torch.isin(pool, kept_in)]  # drawn from the rest; trained on in any case
    counts = torch.bincount(labels[pool])
    if n_val < len(counts) or len(pool) - n_val < len(counts) or counts.min() < 2:
        smallest = int(counts.argmin())
        raise UserError(f"--val {n_val}: a hold-out stratified by class needs at least one image per class in it and "
                        f"one left to train on ({len(pool)} labeled images, {counts.min().item()} in the smallest class"
                        + (f", {class_names[smallest]}" if class_names else "") + ")")
    train, val = train_test_split(pool.numpy(), test_size=n_val, random_state=seed, stratify=labels[pool].numpy())
    return torch.from_numpy(np.sort(np.concatenate([train, kept_in.numpy()]))), unlabeled, torch.from_numpy(np.sort(val))


def by_model(names, digests, accepted):
    """Which of the images `names` (relative to the folder) label.py --accepted labeled, as a bool
    tensor: `accepted` is {where such an image is now: the hash of its bytes when it was moved (None:
    not logged)} (label.log.label_history); `digests` the hash of each image's bytes now (the decode
    cache's, or None). A file whose bytes differ (replaced by hand since) is a person's."""
    marked = np.zeros(len(names), dtype=bool)
    for i, name in enumerate(names):
        if name in accepted:
            then = accepted[name]
            marked[i] = then is None or digests is None or digests[i] == then.encode()
    return torch.from_numpy(marked)


def balanced_split(labels, n_labeled, num_classes, seed, *, class_names=None):
    """Indices of n_labeled training images, n_labeled / num_classes per class, and of the rest.

    Drawn with its own generator, so the split depends on `seed` alone. class_names: how a refusal
    names a class (its index without them).
    """
    if n_labeled < num_classes or n_labeled % num_classes:
        raise UserError(f"--labels {n_labeled} must be a positive multiple of the {num_classes} classes")
    per_class = n_labeled // num_classes
    gen = torch.Generator().manual_seed(seed)
    chosen = []
    for c in range(num_classes):
        members = (labels == c).nonzero().flatten()
        if len(members) < per_class:
            name = class_names[c] if class_names else c
            raise UserError(f"--labels {n_labeled} needs {per_class} images of class {name}, "
                            f"the training set has {len(members)}")
        chosen.append(members[torch.randperm(len(members), generator=gen)[:per_class]])
    labeled = torch.cat(chosen).sort().values
    is_labeled = torch.zeros(len(labels), dtype=torch.bool)
    is_labeled[labeled] = True
    unlabeled = (~is_labeled).nonzero().flatten()
    if len(unlabeled) == 0:
        raise UserError(f"--labels {n_labeled} leaves no unlabeled training image")
    return labeled, unlabeled


def hold_out(unlabeled, n_val, seed):
    """Move n_val random images of the unlabeled set into a validation set that is never trained on."""
    if n_val < 0 or n_val >= len(unlabeled):
        raise UserError(f"--val {n_val} must be >= 0 and leave unlabeled images ({len(unlabeled)} available)")
    order = torch.randperm(len(unlabeled), generator=torch.Generator().manual_seed(seed + 1))
    return unlabeled[order[n_val:]].sort().values, unlabeled[order[:n_val]].sort().values


def measured_pool(data, unlabeled_idx):
    """The unlabeled training images (of unlabeled_idx) whose error --pool-error measures: all of them,
    but in an own-images folder unlabeled/'s only (label.py --accepted's images, trained unlabeled from
    labeled/, carry a model's label, not their true class), told by their names."""
    names = (data.files or {}).get("train") or []
    if not names or not names[0].startswith("labeled/"):  # not an own-images folder (labeled/ comes first)
        return unlabeled_idx
    return unlabeled_idx[torch.tensor([names[i].startswith("unlabeled/") for i in unlabeled_idx.tolist()], dtype=torch.bool)]


def true_classes(data, truth_csv=None, option="--truth"):
    """Every training image's true class: the dataset's labels and, for a folder's unlabeled images
    (label -1), those of a CSV with columns path,class (paths as the folder names them, e.g.
    unlabeled/u00001.jpg; examples/own_images.py writes one beside the folders it builds). For
    measurements only: training never reads them. Exit 2 where a class is missing or unknown."""
    y = data.train_y.clone()
    unknown = (y < 0).nonzero().flatten().tolist()
    if not unknown:
        return y
    if truth_csv is None:
        raise UserError(f"the {len(unknown)} unlabeled images of this folder have no known classes: give {option}, "
                        f"a CSV of path,class for them")
    rows = read_mapping(truth_csv, "path", "class", option)
    names = [data.files["train"][i] for i in unknown]
    missing = [n for n in names if rows.get(n) not in data.classes]
    if missing:
        raise UserError(f"{option} {truth_csv} has no known class for {len(missing)} unlabeled images "
                        f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    y[unknown] = torch.tensor([data.classes.index(rows[n]) for n in names])
    return y


def unleaked_test(config, names):
    """The positions of the test images (their names) that copy no training image, which
    config.leaked_test names (train_mt.py looks for them); None where none does."""
    leaked = set(config.leaked_test or ())
    if not leaked or names is None:
        return None
    return torch.tensor([i for i, name in enumerate(names) if name not in leaked], dtype=torch.long)
