"""Tiny datasets in the real on-disk formats, for tests: SVHN's .mat, CIFAR-10's pickled batches,
an ImageFolder tree; and what several test files share: a folder's small run, the lines and rows the
scripts write, and watching or refusing the decoding of images."""
import json
import pickle
from pathlib import Path

import numpy as np


def write_svhn(root, n_train=200, n_test=50, seed=0):
    """train_32x32.mat / test_32x32.mat: X is (32, 32, 3, N) uint8, y is (N, 1) with digit 0 stored as 10."""
    import scipy.io
    rng = np.random.default_rng(seed)
    Path(root).mkdir(parents=True, exist_ok=True)
    out = {}
    for name, n in (("train", n_train), ("test", n_test)):
        digits = np.arange(n) % 10
        x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
        y = np.where(digits == 0, 10, digits).astype(np.uint8).reshape(-1, 1)
        scipy.io.savemat(str(Path(root) / f"{name}_32x32.mat"), {"X": x, "y": y})
        out[name] = (x, digits)
    return out


def write_cifar10(root, per_batch=40, n_test=50, seed=0):
    """cifar-10-batches-py/data_batch_1..5 and test_batch: dicts with b'data' (N, 3072) uint8 and b'labels'."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.permutation(np.arange(n) % 10)]
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"data": data, b"labels": labels,
                         b"filenames": [b"x.png"] * n}, f, protocol=2)
        out[name] = (data, labels)
    return out


def write_folder(root, classes=("cat", "dog", "owl"), n_train=8, n_test=3, seed=0):
    """root/train/<class>/*.png and root/test/<class>/*.png of assorted sizes and modes."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("test", n_test)):
        for c in classes:
            folder = Path(root) / split / c
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                size = (int(rng.integers(20, 60)), int(rng.integers(20, 60)))
                mode = ("RGB", "L", "RGBA")[i % 3]
                pixels = rng.integers(0, 256, (size[1], size[0], len(mode)), dtype=np.uint8)
                Image.fromarray(pixels.squeeze(-1) if mode == "L" else pixels, mode).save(folder / f"{i}.png")


# A run's settings where a test's leaves them out: digits' shapes, a narrow network, a short schedule.
SETTINGS = dict(dataset="digits", data_dir=".", labels=100, labeled_batch=16, unlabeled_batch=64, width=0.0625,
                num_classes=10, mean=[0.5] * 3, std=[0.25] * 3, seed=0, lr=0.05, ema=0.99, cons_weight=10.0, epochs=2,
                decay_epochs=1, cons_rampup=1, lc_start_epoch=2, bn_momentum=0.02, eval_every=1)


def run_settings(**values):
    """A RunSettings of `values`, SETTINGS where they leave one out (and what runs from before a
    setting had it), its classes named after their number."""
    from mtlc.train.settings import RunSettings
    values = dict(SETTINGS, **values)
    values.setdefault("classes", [str(c) for c in range(values["num_classes"])])
    return RunSettings.of(values)


def tiny_trainer(data, labeled, unlabeled, config, stage, procs=None, val=None, **trainer_options):
    """A Trainer on CPU for the settings `config` gives (run_settings; the images' side as the data's;
    seed 0 weights, data-initialized on the first labeled images); trainer_options go to Trainer."""
    import torch

    from mtlc.data.views import augment
    from mtlc.train.model import ModelConfig
    from mtlc.train.networks import build_models
    from mtlc.train.trainer import Trainer, make_optimizer
    config = run_settings(**{"image_size": data.train_x.shape[-1], **config})
    torch.manual_seed(0)
    student, teacher = build_models(ModelConfig.of_run(config), torch.device("cpu"))
    student.data_init(augment(data.train_x[labeled[:16]], torch.tensor(config.mean), torch.tensor(config.std), False))
    teacher.load_state_dict(student.state_dict())
    optimizer = make_optimizer(student, 0.05)
    split = dict(labeled_idx=labeled, unlabeled_idx=unlabeled,
                 val_idx=val if val is not None else torch.zeros(0, dtype=torch.long))
    return Trainer(student, teacher, optimizer, data, split, config, stage, torch.device("cpu"), procs,
                   **trainer_options)


def write_own_folder(root, classes=("cat", "dog", "owl"), n_labeled=6, n_unlabeled=30, n_test=3, size=(40, 30),
                     unlabeled_dirs=("", "a", "a/b"), seed=0):
    """Your own images: root/labeled/<class>/*.png, root/unlabeled/** (spread over nested folders)
    and, if n_test, root/test/<class>/*.png. Each class has its own mean colour, so it is learnable."""
    from PIL import Image
    rng = np.random.default_rng(seed)

    def image(c):
        base = np.array([60 + 70 * (c % 3), 60 + 50 * (c // 3 % 3), 200 - 60 * (c % 2)])
        return Image.fromarray(np.clip(base + rng.normal(0, 30, (size[1], size[0], 3)), 0, 255).astype(np.uint8))
    for part, n in (("labeled", n_labeled), ("test", n_test)):
        for k, c in enumerate(classes):
            folder = Path(root) / part / c
            for i in range(n):
                folder.mkdir(parents=True, exist_ok=True)
                image(k).save(folder / f"{i}.png")
    for i in range(n_unlabeled):
        folder = Path(root) / "unlabeled" / unlabeled_dirs[i % len(unlabeled_dirs)]
        folder.mkdir(parents=True, exist_ok=True)
        image(i % len(classes)).save(folder / f"u{i:04d}.png")


# A small run on your own images (write_own_folder's): a narrow network, small batches, two epochs.
SMALL = ["--width", "0.0625", "--labeled-batch", "6", "--unlabeled-batch", "12", "--epochs", "2", "--decay-epochs",
         "1", "--seed", "1", "--device", "cpu"]


def rows(csv_text):
    lines = csv_text.strip().splitlines()
    assert lines[0] == "path,prediction,confidence,runner_up,blake2b"  # the image each row is for, last
    return [line.split(",") for line in lines[1:]]


def lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def quiet(line):
    pass


def no_decoding(monkeypatch):
    from mtlc.data import images

    def refuse(data, size, framing=None):
        raise AssertionError("decoded an image")
    monkeypatch.setattr(images, "decode_bytes", refuse)


def counting(monkeypatch, name):
    """Record the calls of images.<name> (read_file: every file read; decode_bytes: every decode)."""
    from mtlc.data import images
    calls, original = [], getattr(images, name)
    monkeypatch.setattr(images, name, lambda *args, **kw: calls.append(args[0]) or original(*args, **kw))
    return calls
