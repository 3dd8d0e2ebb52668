"""A checkpoint's training images found again where they were moved within its folder.

label.py moves an image from unlabeled/ to labeled/<class>/ (or from one class folder to another)
under its own name; a person may rename one. The checkpoint's own files are then gone by name, though
every byte of them is still in the folder, and the features of a frozen trunk are kept by bytes. Here
each training file of the checkpoint is matched to a file of the folder now: by its bytes where the
checkpoint keeps each file's digest (runs since it does: moves and renames alike), else by the same
name or a file new since whose name ends the same (as label.py moves them). The match holds only
where every matched file holds the bytes the checkpoint's content fingerprint says, so that a file
edited or replaced is never taken for the image that trained. The
checkpoint's split is then given in the folder's rows of now, and each matched image takes the label
it trained with (an image moved from unlabeled/ trained without one). New files are rows no split
names. Only the heads that never saw an image (use/unseen.py) need this: they train again as the
checkpoint did, on the same images with the same labels.
"""
import numpy as np
import torch

from ..data.cache import content_fingerprint
from ..data.datasets import load_dataset
from ..errors import UserError
from .embeddings import embed

SPLITS = ("labeled_idx", "unlabeled_idx", "val_idx")


def matched_rows(then, now, digests, digests_then=None):
    """The row of now (a list of names; digests: their rows' digests, hex) of each name of then: by its
    bytes where the checkpoint kept them (digests_then, raw (n, 16)), else by name, else by the end of
    its name among the names new since (as label.py moves them); None where one has no match."""
    at = {name: i for i, name in enumerate(now)}
    if digests_then is not None:
        return rows_by_bytes(then, at, np.asarray(digests, "S32"), digests_then)
    taken = set(then)
    waiting = {}
    for i, name in enumerate(now):
        if name not in taken:
            waiting.setdefault(name.rsplit("/", 1)[-1], []).append(i)
    rows = []
    for name in then:
        if name in at:
            rows.append(at[name])
        elif waiting.get(name.rsplit("/", 1)[-1]):
            rows.append(waiting[name.rsplit("/", 1)[-1]].pop())
        else:
            return None
    return np.array(rows, dtype=np.int64)


def rows_by_bytes(then, at, digests, digests_then):
    """matched_rows by the digests the checkpoint kept: each name of then takes its own name's row where
    that holds its bytes, else another row of those bytes no other name took (copies of one image are
    rows of their own); None where the names outnumber the rows of some bytes."""
    if len(digests_then) != len(then):
        return None
    wanted = [bytes(row).hex().encode() for row in digests_then.numpy()]
    rows = np.array([at.get(name, -1) for name in then], dtype=np.int64)
    rows[[r < 0 or digests[r] != d for r, d in zip(rows, wanted)]] = -1
    free = {}
    taken = set(rows[rows >= 0].tolist())
    for i in np.flatnonzero(np.isin(digests, [d for r, d in zip(rows, wanted) if r < 0])).tolist():
        if i not in taken:
            free.setdefault(digests[i], []).append(i)
    for k in np.flatnonzero(rows < 0).tolist():
        if not free.get(wanted[k]):
            return None
        rows[k] = free[wanted[k]].pop(0)
    return rows


def label_then(name, classes):
    """The label a training file trained with, from its name then: its class folder's, or -1 (unlabeled/)."""
    part, _, rest = name.partition("/")
    return classes.index(rest.split("/", 1)[0]) if part in ("labeled", "train") else -1


def restore_moved(state, data_dir=None, echo=lambda line: None, device="cpu", strong=False):
    """(the checkpoint's state with its split in the rows of the folder now, the folder's dataset with
    the labels they trained with and the frozen trunk's features) where its training images were moved
    or renamed within the folder (module docstring); UserError where they cannot be had: a file gone,
    or one whose bytes changed."""
    config = state["config"]
    where = data_dir or config.data_dir
    if config.files is None or not config.contents:
        raise UserError("the checkpoint holds no fingerprint of its images' bytes")
    data = load_dataset(config.dataset, where, config.decode_size, config.skip_bad_images, echo, download=False,
                        restored=True, framing=config.framed)
    if data.classes != config.classes:
        raise UserError(f"the class folders are {', '.join(data.classes)} now, {', '.join(config.classes)} then")
    then, digests = config.files["train"], np.asarray(data.digests["train"]())
    rows = matched_rows(then, data.files["train"], digests, state.get("train_digests"))
    if rows is None or content_fingerprint(zip(then, (d.decode() for d in digests[rows]))) != config.contents["train"]:
        raise UserError("some of its training images are gone or hold other bytes")
    rows = torch.from_numpy(rows)
    state = dict(state, **{key: rows[state[key]] for key in SPLITS})
    data.train_y = data.train_y.clone()
    data.train_y[rows] = torch.tensor([label_then(name, config.classes) for name in then], dtype=torch.long)
    data.contents = dict(data.contents, train=config.contents["train"])
    data.features = embed(data, where, config.backbone, config.image_size, torch.device(device), echo,
                          strong_views=config.strong_views if strong else 0, framing=config.framed)
    return state, data


def restored_as_now(state, data_dir=None, echo=lambda line: None, device="cpu", strong=False):
    """(the checkpoint's state, its dataset) from its folder as it is now: as it was trained
    (checkpoints.restore_data), else with its training images moved or renamed within it since
    (restore_moved: label.py's moves, the same bytes); UserError saying both reasons where neither holds."""
    from .checkpoints import restore_data
    try:
        return state, restore_data(state, data_dir, echo=echo, device=device, strong=strong)
    except UserError as e:
        try:
            return restore_moved(state, data_dir, echo=echo, device=device, strong=strong)
        except UserError as moved:
            raise UserError(f"its training images cannot be had as they were: {e.message} ({moved.message})") from None
