"""Time a training step of the authors' pipeline and of ours, in one run on one machine.

    python tools/bench_pipeline.py --steps 5 --workers 0 --workers 2
    python tools/bench_pipeline.py --device cuda --steps 50 --workers 8

The authors' pipeline, rebuilt from the Mean Teacher PyTorch code the paper's code extends: images
kept as PNG files' bytes and decoded by PIL on every access; torchvision transforms (2 px
reflect-padded translation, ToTensor, Normalize) applied twice per image for the two views, in
DataLoader workers; the 13-layer network in fp32, NCHW, nn.Dropout; teacher forward, student
forward, CE + softmax-MSE, backward, SGD step and a per-parameter EMA loop. Ours is
`train_mt.py --benchmark` at the same batch and width. Then the device's rate on conv-large's
3x3 convolutions (128 -> 128 channels, 32 x 32, channels_last, forward and backward) in fp32 and
bf16, and the FLOP floor of a step it implies. Prints one JSON line per measurement.
"""
import io
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision.transforms as T
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc, kernels, the scripts
from mtlc.data.batches import channel_stats  # noqa: E402
from mtlc.data.datasets import load_digits  # noqa: E402
from mtlc.train.devices import conv_rate, device_name, pick_device, sync  # noqa: E402
from mtlc.train.model import Dropout, ModelConfig  # noqa: E402
from mtlc.train.networks import build_models  # noqa: E402
from mtlc.train.trainer import make_optimizer  # noqa: E402


class PNGImages(torch.utils.data.Dataset):
    """Labeled and unlabeled images as PNG bytes, decoded per access, each returned as two views."""

    def __init__(self, x, y, mean, std):
        self.png = []
        for img in x.permute(0, 2, 3, 1).numpy():
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="PNG")
            self.png.append(buf.getvalue())
        self.y = y
        self.transform = T.Compose([T.RandomCrop(32, padding=2, padding_mode="reflect"), T.ToTensor(),
                                    T.Normalize(mean, std)])

    def __len__(self):
        return len(self.png)

    def __getitem__(self, i):
        img = Image.open(io.BytesIO(self.png[i])).convert("RGB")
        return self.transform(img), self.transform(img), self.y[i]


def two_stream_batches(n_labeled, n, labeled_batch, batch, steps, seed):
    """Index lists of `batch` images, the first `labeled_batch` from the labeled ones (0..n_labeled-1)."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        lab = torch.randint(0, n_labeled, (labeled_batch,), generator=gen)
        unl = torch.randint(n_labeled, n, (batch - labeled_batch,), generator=gen)
        yield torch.cat([lab, unl]).tolist()


def authors_step_times(width, workers, steps, warmup, labeled_batch, batch, device=torch.device("cpu")):
    data = load_digits()
    x, y = data.train_x, data.train_y
    mean, std = (t.tolist() for t in channel_stats(x))
    dataset = PNGImages(x, y, mean, std)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=list(two_stream_batches(
        100, len(dataset), labeled_batch, batch, warmup + steps, seed=0)), num_workers=workers,
        pin_memory=device.type == "cuda")
    torch.manual_seed(0)
    student, teacher = build_models(ModelConfig(num_classes=10, width=width), device)
    for model in (student, teacher):
        for i, m in enumerate(model.features):
            if isinstance(m, Dropout):
                model.features[i] = nn.Dropout(0.5)
    optimizer = make_optimizer(student, 0.05)
    times, data_times = [], []
    t0 = time.perf_counter()
    for i, batch_tensors in enumerate(loader):
        view, teacher_view, labels = (t.to(device, non_blocking=True) for t in batch_tensors)
        sync(device)
        t1 = time.perf_counter()
        _, teacher_logits = teacher(teacher_view)
        _, logits = student(view)
        loss = F.cross_entropy(logits[:labeled_batch], labels[:labeled_batch]) + \
            100 * F.mse_loss(F.softmax(logits, 1), F.softmax(teacher_logits.detach(), 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for t_param, s_param in zip(teacher.parameters(), student.parameters()):
                t_param.mul_(0.99).add_(s_param, alpha=0.01)
        sync(device)
        t2 = time.perf_counter()
        if i >= warmup:
            times.append(t2 - t0)
            data_times.append(t1 - t0)
        t0 = t2
    sec = statistics.median(times)
    return dict(pipeline="authors", workers=workers, sec_per_step=sec, images_per_sec=batch / sec,
                data_share=statistics.median(data_times) / sec, precision="fp32", width=width, steps=steps)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--width", type=click.FloatRange(min=0, min_open=True), default=1.0, help="Channel multiplier.")
@click.option("--steps", type=click.IntRange(min=1), default=5, help="Timed steps after 3 warm-up steps.")
@click.option("--workers", type=click.IntRange(min=0), multiple=True, default=[0],
              help="DataLoader workers of the authors' pipeline; repeat to time several.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", help="auto: CUDA when available.")
def main(width, steps, workers, device):
    """Time the authors' pipeline and ours (train_mt.py --benchmark) on digits, one after the other,
    then the device's conv rate and the step's FLOP floor."""
    device = pick_device(device)
    for n in workers:
        click.echo(json.dumps(authors_step_times(width, n, steps, 3, 32, 160, device)))
    gflop_per_step = None
    for precision in ("fp32", "bf16"):
        res = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "train_mt.py"), "--width", str(width),
                              "--benchmark", str(steps), "--precision", precision, "--device", device.type],
                             capture_output=True, text=True, check=True)
        ours = json.loads(res.stdout.strip().splitlines()[-1])
        gflop_per_step = ours["gflop_per_step"]
        click.echo(json.dumps(dict(pipeline="ours", **{k: ours[k] for k in (
            "sec_per_step", "images_per_sec", "data_share", "precision", "width", "steps")})))
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rate = conv_rate(device, dtype, repeats=5 if device.type == "cpu" else 50)
        click.echo(json.dumps(dict(measure="conv3x3", precision=precision, gflops_per_sec=rate,
                                   floor_sec_per_step=gflop_per_step / rate, device=device_name(device))))


if __name__ == "__main__":
    main()
