"""The labeled images a checkpoint never trained on, that its confidences are calibrated on: its test
images but those that copy a training image, else its --val hold-out; read from its folder (test/
alone where it can be: label.py's moves between unlabeled/ and labeled/ do not change it), those
label.py relabeled marked.
"""
import dataclasses
from pathlib import Path
from typing import NamedTuple

import click
import torch

from ..data.datasets import class_images, listed, read_files
from ..data.mapped import StackedRows
from ..data.layout import is_own_layout
from ..data.files import describe_bad
from ..data.splits import unleaked_test
from ..errors import UserError
from ..train.checkpoints import check_names_held, check_same_files, restore_data


class HeldOut(NamedTuple):
    """The labeled images a checkpoint never trained on."""
    x: torch.Tensor        # uint8 images
    y: torch.Tensor        # their classes, as the folder gives them now
    source: str            # "test" or "validation"
    relabeled: torch.Tensor  # bool per image: relabeled with label.py (config.relabeled) before the run
    rows: torch.Tensor     # their positions among the dataset's test images, or its training images (--val)


def held_out(state, data):
    """The labeled images a checkpoint never trained on (HeldOut): its test images but those that copy a
    training image (config.leaked_test), else its --val hold-out; none where it has neither. Those
    label.py relabeled before the run (from the audit's suggestion, say) are marked: their labels are
    no longer independent of the models that suggested them, and calibration counts them as errors."""
    config = state["config"]
    if len(data.test_y):
        return without_leaked(config, data.files and data.files["test"], data.test_x, data.test_y)
    val = state["val_idx"]
    names = [data.files["train"][i] for i in val.tolist()] if data.files else None
    return HeldOut(data.train_x[val], data.train_y[val], "validation", relabeled_mask(config, names, len(val)), val)


def with_held_out(data, held):
    """(the dataset whose training rows are followed by the held-out test images, with their labels and
    the trunk's kept features of them, the held-out images' rows in it): what a head trains on when
    some of the held-out images are its labeled images (use/unseen.py). A --val hold-out is training
    rows already. The training rows are read from the kept features where they lie (a memory map), never
    copied."""
    if held.source != "test":
        return data, held.rows
    n = len(data.train_y)
    features = dataclasses.replace(data.features, train=StackedRows(data.features.train, data.features.test[held.rows]))
    stacked = dataclasses.replace(data, train_y=torch.cat([data.train_y, held.y]), features=features)
    return stacked, n + torch.arange(len(held.y))


def relabeled_mask(config, names, n):
    """Which of n held-out images (their names, None where the dataset has none) label.py relabeled."""
    relabeled = set(config.relabeled)
    if not names:
        return torch.zeros(n, dtype=torch.bool)
    return torch.tensor([name in relabeled for name in names], dtype=torch.bool)


def without_leaked(config, names, x, y):
    """HeldOut of the test images whose names config.leaked_test does not list."""
    keep = unleaked_test(config, names)
    if keep is not None:
        x, y, names = x[keep], y[keep], [names[i] for i in keep.tolist()]
    return HeldOut(x, y, "test", relabeled_mask(config, names, len(y)), torch.arange(len(y)) if keep is None else keep)


def restore_held_out(state, data_dir=None, echo=click.echo):
    """held_out's images of a checkpoint, read from its folder (its own data_dir unless one is
    given). An own-images folder's test/ is read alone and checked against the checkpoint's test
    files, so that label.py's moves between unlabeled/ and labeled/ do not keep it from calibrating;
    a --val hold-out (indices into the training files) needs the training files as they were. Exit
    2 with the real reason where the held-out images cannot be had."""
    config = state["config"]
    where = Path(data_dir or config.data_dir)
    files = config.files
    if config.dataset != "folder" or not files or not files["test"] or not is_own_layout(where):
        return held_out(state, restore_data(state, data_dir, echo))
    groups, hidden = class_images(where / "test")
    foreign = sorted(set(groups) - set(config.classes))
    if foreign:
        raise UserError(f"{where / 'test'} has class folders the checkpoint does not know: {', '.join(foreign)}")
    test_files = listed([groups], config.classes)
    check_names_held(dict(files, train=[]), dict(train=[], test=[e[0] for e in test_files.entries]), where,
                     config.skipped)
    (x, y, names, content, _), bad, _ = read_files(where, test_files, "test", config.image_size, echo, config.framed)
    if bad and not config.skip_bad_images:
        raise UserError(describe_bad(bad, where))
    check_same_files(files, dict(test=names), where, config.contents, dict(test=content), parts=("test",))
    return without_leaked(config, names, x, y)
