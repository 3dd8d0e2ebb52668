"""The steps of a fitted objective's stage (objectives/probe.py, self_training.py), driven by the epoch
loop as eager and graphed steps are (start_epoch, step, end_epoch): the stage's first step fits the
linear head in closed form on the trunk's kept features of the images as they are and loads it into
student and teacher alike (a fit has no EMA); the stage is one epoch of one step (train_mt.py sets its
schedule), so that checkpoints, metrics, evaluation, resume and the heads that never saw an image run
as for any other objective.
"""
import numpy as np
import torch

from ..data.batches import image_batches
from ..data.mapped import release_pages

# The unlabeled images a fit takes at most, drawn by the run's seed: a self-training round on 50,000
# images of 1,280 features takes about a minute on 2 cores, and its classes move little with more.
FIT_UNLABELED_MAX = 50_000


def first_view(features, idx):
    """float32 (n, D) of the kept features (N, views, D) of rows idx, as the images are (the first view),
    a batch at a time (a memory map's pages let go after each)."""
    rows = [batch[:, 0].float() for batch in image_batches(features, idx, 4096)]
    release_pages(features)
    return torch.cat(rows).numpy() if rows else np.zeros((0, features.shape[-1]), np.float32)


class FittedSteps:
    """The fit of a stage whose objective is fitted (objectives/base.py's fit)."""
    benchmark_warmup = 0

    def __init__(self, trainer):
        self.trainer = trainer

    def start_epoch(self, first_step):
        self.sums = torch.zeros(self.trainer.epoch_sums)

    def step(self, step):
        t = self.trainer
        if step != t.stage.first_step:
            return
        b = t.batches
        unlabeled_idx = b.unl_idx
        if len(unlabeled_idx) > FIT_UNLABELED_MAX:
            pick = torch.randperm(len(unlabeled_idx), generator=torch.Generator().manual_seed(t.config.seed))
            unlabeled_idx = unlabeled_idx[pick[:FIT_UNLABELED_MAX].sort().values]
        labeled, labels = first_view(b.train_x, b.lab_idx), b.train_y[b.lab_idx].numpy()
        head = t.objective.fit(labeled, labels, first_view(b.train_x, unlabeled_idx))
        w, bias = (torch.as_tensor(v, dtype=torch.float32) for v in head.weights())
        with torch.no_grad():
            for model in (t.student, t.teacher):
                model.classifier.weight.copy_(w)
                model.classifier.bias.copy_(bias)
        ce = torch.nn.functional.cross_entropy(torch.as_tensor(labeled) @ w.T + bias, torch.as_tensor(labels))
        self.sums[:2] = ce  # loss and ce: the fitted head's on its labeled images

    def end_epoch(self):
        return self.sums
