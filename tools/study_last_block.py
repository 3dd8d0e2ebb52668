"""The pretrained trunk's last block fine-tuned on kept intermediate features, against the trunk
frozen whole, in one loop at equal steps (docs/pretrained.md, "The last block fine-tuned"): the
trunk's maps before its last block (Lite2 at 160 px: 208 x 5 x 5) are computed once per image (as is
and flipped, in onnxruntime) and kept; each arm trains the folder default's head (PretrainedNet, MT's
EMA teacher, FixMatch's adaptive-threshold objective with its feature-space strong view, the same
lr, batches and ramp) for --steps steps, the "tail" arm with the last block and the 1x1 head
convolution trained too (their batch norms' statistics kept; --tail-lr times the head's lr), the
"frozen" arm on the pooled features of the untouched tail. Prints and records, per arm and seed, the
teacher's test error, the error of its labels for unlabeled/ (against --truth), the error of the
most confident half of the test images, and the seconds training took (maps_seconds: computing the
maps, or reading them back from --maps).

    OMP_NUM_THREADS=2 python tools/study_last_block.py --data-dir data/own-cifar --truth data/own-cifar-truth.csv \\
        --seeds 1 --seeds 2 --seeds 3 --record docs/last-block-cifar250.json
"""
import copy
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import click
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc
from bench_backbone import cpu_name  # noqa: E402
from mtlc.data.datasets import load_dataset  # noqa: E402
from mtlc.data.splits import true_classes  # noqa: E402
from mtlc.data.views import feature_views  # noqa: E402
from mtlc.train.embeddings import trunk_input  # noqa: E402
from mtlc.train.objectives import OBJECTIVES  # noqa: E402
from mtlc.train.pretrained import BACKBONES, PretrainedNet, onnx_session, trunk  # noqa: E402
from mtlc.train.settings import learning_rate, sigmoid_rampup  # noqa: E402

# The folder default's settings (a control run's mt.pt: FixMatch under the mean teacher on Lite2)
LR, EMA, LABELED_BATCH, UNLABELED_BATCH, RAMP_SHARE, DECAY_SHARE = 0.05, 0.99, 32, 128, 0.2, 0.2


class Stem(torch.nn.Module):
    """The trunk up to its last block: what is kept."""

    def __init__(self, model):
        super().__init__()
        self.conv_stem, self.bn1, self.blocks = model.conv_stem, model.bn1, model.blocks[:-1]

    def forward(self, x):
        return self.blocks(self.bn1(self.conv_stem(x)))


class Tail(torch.nn.Module):
    """The trunk's last block and 1x1 head convolution, globally pooled: the pooled features."""

    def __init__(self, model):
        super().__init__()
        self.block, self.conv_head, self.bn2 = model.blocks[-1], model.conv_head, model.bn2

    def forward(self, maps):
        return self.bn2(self.conv_head(self.block(maps))).mean((2, 3))


def kept_maps(images, stem, image_size, backbone, batch=64):
    """(N, 2, C, H, W) float16: the stem's maps of the images as is and flipped (onnxruntime)."""
    session, out = None, []
    for first in range(0, len(images), batch):
        x = trunk_input(images[first:first + batch], image_size, backbone)
        session = session or onnx_session(stem, image_size)
        views = [session.run(None, {"x": v.contiguous().numpy()})[0] for v in (x, x.flip(3))]
        out.append(torch.from_numpy(np.stack(views, 1)).half())
        print(f"\rkept maps: {first + len(x):,}/{len(images):,}", end="", file=sys.stderr)
    print(file=sys.stderr)
    return torch.cat(out)


class Student(torch.nn.Module):
    """The head on the tail's pooled features of maps (tail trained), or on pooled features (frozen)."""

    def __init__(self, head, tail=None):
        super().__init__()
        self.head, self.tail = head, tail

    def forward(self, x):
        return self.head(self.tail(x) if self.tail is not None else x)

    def train(self, mode=True):
        super().train(mode)
        if self.tail is not None:
            self.tail.eval()  # its batch norms keep ImageNet's statistics; their weights train
        return self


def train_arm(arm, inputs, y, labeled, unlabeled, seed, steps, tail_lr, tail):
    """The teacher (EMA) after `steps` FixMatch steps on inputs (N, 2, ...): maps (tail) or features;
    y: the labels (the unlabeled images' unused)."""
    torch.manual_seed(seed)
    num_classes = int(y[labeled].max()) + 1
    head = PretrainedNet("efficientnet-lite2", num_classes, width=1.0)
    student = Student(head, copy.deepcopy(tail) if arm == "tail" else None)
    pick = torch.randperm(len(labeled))[:LABELED_BATCH]
    first = inputs[labeled[pick], 0].float()
    head.data_init(student.tail(first) if student.tail is not None else first)
    teacher = copy.deepcopy(student).requires_grad_(False)
    groups = [dict(params=head.parameters(), scale=1.0)]
    if student.tail is not None:
        groups.append(dict(params=student.tail.parameters(), scale=tail_lr))
    optimizer = torch.optim.SGD(groups, lr=LR, momentum=0.9, nesterov=True, weight_decay=1e-4)
    config = SimpleNamespace(threshold="adaptive", num_classes=num_classes, pseudo_labels="teacher")
    objective = OBJECTIVES["fixmatch"](config, torch.device("cpu"))
    constant = round(steps * (1 - DECAY_SHARE))
    student.train()
    teacher.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, LR, constant, steps - constant) * group["scale"]
        idx = torch.cat([labeled[torch.randint(len(labeled), (LABELED_BATCH,))],
                         unlabeled[torch.randint(len(unlabeled), (UNLABELED_BATCH,))]])
        x = inputs[idx]
        flat = x.flatten(2)  # feature_views' (B, views, D), maps flattened
        student_view, teacher_view = (v.view(len(x), *x.shape[2:]) for v in feature_views(flat, LABELED_BATCH, True))
        logits = student(student_view)[1]
        with torch.no_grad():
            target_logits = teacher(teacher_view)[1]
        pseudo, _, _ = objective.unlabeled_loss(logits, target_logits, LABELED_BATCH)
        weight = sigmoid_rampup(step, RAMP_SHARE * steps)
        loss = F.cross_entropy(logits[:LABELED_BATCH], y[idx[:LABELED_BATCH]]) + weight * pseudo
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for t, s in zip(teacher.parameters(), student.parameters()):
                t.lerp_(s, 1 - EMA)
            for t, s in zip(teacher.buffers(), student.buffers()):
                t.copy_(s)
    return teacher.eval()


@torch.no_grad()
def classes_of(model, inputs, batch=500):
    probs = torch.cat([F.softmax(model(inputs[i:i + batch, 0].float())[1], 1) for i in range(0, len(inputs), batch)])
    return probs.max(1)


def measured(teacher, train_inputs, test_inputs, truth, unlabeled, test_y):
    confidence, predicted = classes_of(teacher, test_inputs)
    wrong = (predicted != test_y).float()
    surest = wrong[confidence.argsort(descending=True)[:len(wrong) // 2]]
    _, labels = classes_of(teacher, train_inputs[unlabeled])
    return dict(test_error=100 * wrong.mean().item(), surest_half_error=100 * surest.mean().item(),
                labels_error=100 * (labels != truth[unlabeled]).float().mean().item())


@click.command()
@click.option("--data-dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--truth", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--image-size", default=160, show_default=True)
@click.option("--seeds", multiple=True, type=int, default=(1, 2, 3), show_default=True)
@click.option("--steps", default=600, show_default=True, help="Training steps of each arm and seed.")
@click.option("--tail-lr", default=0.1, show_default=True, help="The tail's lr, as a share of the head's.")
@click.option("--record", type=click.Path(dir_okay=False), default=None, help="Also write the JSON here.")
@click.option("--maps", type=click.Path(dir_okay=False), default=None,
              help="Keep the maps in this .pt file, and read them from it where it holds this folder's (its images' "
                   "names and bytes).")
def main(data_dir, truth, image_size, seeds, steps, tail_lr, record, maps):
    backbone = BACKBONES["efficientnet-lite2"]
    data = load_dataset("folder", data_dir, image_size, echo=lambda line: print(line, file=sys.stderr))
    model = trunk(backbone.name)
    start = time.perf_counter()
    key = dict(files=data.files, contents=data.contents, image_size=image_size)
    kept = torch.load(maps, weights_only=True) if maps and Path(maps).is_file() else None
    if kept is not None and kept["key"] == key:
        train_maps, test_maps = kept["train"], kept["test"]
    else:
        train_maps, test_maps = (kept_maps(x, Stem(model), image_size, backbone) for x in (data.train_x, data.test_x))
        if maps:
            torch.save(dict(key=key, train=train_maps, test=test_maps), maps)
    result = dict(cpu=cpu_name(), threads=torch.get_num_threads(), steps=steps, tail_lr=tail_lr,
                  maps_seconds=round(time.perf_counter() - start, 1), runs=[])
    tail = Tail(model)
    with torch.no_grad():  # the frozen arm: the untouched tail's pooled features, computed once
        pooled = [torch.stack([torch.cat([tail(m[i:i + 500, v].float()) for i in range(0, len(m), 500)])
                               for v in range(2)], 1) for m in (train_maps, test_maps)]
    y = data.train_y
    labeled, unlabeled = (y >= 0).nonzero().flatten(), (y < 0).nonzero().flatten()
    classes = true_classes(data, truth)
    for seed in seeds:
        for arm, (train_inputs, test_inputs) in (("frozen", pooled), ("tail", (train_maps, test_maps))):
            began = time.perf_counter()
            teacher = train_arm(arm, train_inputs, y, labeled, unlabeled, seed, steps, tail_lr, tail)
            seconds = time.perf_counter() - began
            run = dict(arm=arm, seed=seed, seconds=round(seconds, 1),
                       **measured(teacher, train_inputs, test_inputs, classes, unlabeled, data.test_y))
            print(json.dumps(run), flush=True)
            result["runs"].append(run)
    if record:
        Path(record).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
