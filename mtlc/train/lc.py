"""Who is whose neighbour in feature space: the LC loss with a fixed or a relative eps (Eq. 4-5),
eps chosen from the features (`--eps auto`), and the pairwise-distance statistics that show whether
LC tightens clusters or only shrinks the space.

Distances are d2, the mean over the D features of the squared difference: the LC loss's units.
The LC pairs of a batch are every row of [z_L; z_U] with every unlabeled point (Eq. 5).
"""
import copy
from dataclasses import dataclass

import torch

try:  # installed: pip puts the kernels/ folder into the package (pyproject.toml)
    from ..kernels import lc_loss
    from ..kernels.lc_loss import NO_TRITON
except ImportError:  # a checkout: the top-level kernels/ folder, as the project's card lays it out
    from kernels import lc_loss
    from kernels.lc_loss import NO_TRITON

from ..data.batches import Batches
from ..errors import UserError
from .model import SplitForward

# Images of the first batches of the run's stream whose features calibrate eps and measure
# distances: 16 batches of 32 + 128 give about 8,000 labeled pairs and 330,000 LC pairs.
DISTANCE_IMAGES = 2560
# At most this many batches (the paper's 160-image batches need 16): tiny batches would otherwise
# take hundreds of forward passes for no better statistics.
DISTANCE_BATCHES = 16


def distance_steps(batches):
    """The steps (0, 1, ...) whose batches hold about DISTANCE_IMAGES images: at least 2 batches, at
    most DISTANCE_BATCHES."""
    return range(min(DISTANCE_BATCHES, max(2, round(DISTANCE_IMAGES / (batches.n_lab + batches.n_unl)))))


def fused_kernel_checked(device):
    """On a CUDA device the LC loss runs the fused Triton kernel: where Triton cannot be imported, a
    UserError naming the pip command before any step (elsewhere the torch path needs nothing)."""
    if torch.device(device).type != "cuda":
        return
    try:
        import triton  # noqa: F401
    except ImportError:
        raise UserError(NO_TRITON.replace("impl='torch', the torch path", "--device cpu")) from None


def mean_pair_d2(z_labeled, z_unlabeled):
    """Mean d2 over the LC pairs of a batch, in O(N D): centred on the unlabeled mean, the mean
    of |a - b|^2 over rows a and unlabeled b is mean |a|^2 + mean |b|^2."""
    centre = z_unlabeled.mean(0)
    rows = torch.cat([z_labeled, z_unlabeled]) - centre
    return (rows.square().sum(1).mean() + (z_unlabeled - centre).square().sum(1).mean()) / z_unlabeled.shape[1]


def relative_lc_loss(z_labeled, z_unlabeled, ratio, classes=None):
    """(L_lc, neighbour fraction) with eps = ratio x the batch's mean d2 s (detached), so that the
    neighbourhood follows the feature scale. Computed as s L_lc(z / sqrt(s), ratio), which is
    L_lc(z, ratio s) exactly (d2 and eps scale alike) and keeps eps a constant: no host sync.
    Its value still falls when every feature shrinks alike (s is a constant to the gradient)."""
    s = mean_pair_d2(z_labeled.detach(), z_unlabeled.detach()).clamp_min(torch.finfo(z_labeled.dtype).tiny)
    root = s.sqrt()
    loss, fraction = lc_loss(z_labeled / root, z_unlabeled / root, ratio, return_fraction=True, classes=classes)
    return s * loss, fraction


def normalized_lc_loss(z_labeled, z_unlabeled, ratio, classes=None):
    """(L_lc, neighbour fraction) of the features in units of the batch's own scale: L_lc(z / sqrt(s),
    ratio) with s the batch's mean d2 inside the graph. A common factor on all features changes
    neither the neighbours nor the value, so LC cannot lower it by shrinking the space: its gradient
    pulls neighbours together relative to the rest of the batch (and has no component along z).
    Unit-free, so lambda2 weighs it alike whatever the features' scale."""
    s = mean_pair_d2(z_labeled, z_unlabeled).clamp_min(torch.finfo(z_labeled.dtype).tiny)
    root = s.sqrt()
    return lc_loss(z_labeled / root, z_unlabeled / root, ratio, return_fraction=True, classes=classes)


# The relative loss is divided by the features' mean d2 at LC's start, but by no less than this: the
# features of a barely trained network (mean d2 0.26 on digits after 3 epochs of MT) would magnify
# LC's pull by 1/unit, and lambda2 20 then collapsed the space to NaN within 10 steps. Trained
# networks measured 0.7 (a 4-class grayscale folder) to 12.4 (docs/lc-control.md).
MIN_LOSS_UNIT = 1.0


def lc_term(z_labeled, z_unlabeled, eps, eps_scale, eps_ratio=None, unit=1.0, classes=None):
    """(L_lc, neighbour fraction) in one of the three forms of --eps-scale: fixed (the paper's: eps and
    the loss in the features' units), relative (eps = eps_ratio x the batch's mean d2, detached; the
    loss divided by `unit`, the features' mean d2 when LC started, so that it is unit-free and lambda2
    weighs it alike on any data) or normalized (the features divided by their batch scale, eps =
    eps_ratio in those units). With classes (one per row of [z_L; z_U]) only pairs of one class count."""
    if eps_scale == "fixed":
        return lc_loss(z_labeled, z_unlabeled, eps, return_fraction=True, classes=classes)
    if eps_scale == "normalized":
        return normalized_lc_loss(z_labeled, z_unlabeled, eps_ratio, classes)
    loss, fraction = relative_lc_loss(z_labeled, z_unlabeled, eps_ratio, classes)
    return loss / unit, fraction


@torch.no_grad()
def lc_features(student, batches, split_forward=False):
    """(z_labeled, z_unlabeled, labels) of each step's batch as the LC loss sees them: the student
    in training mode (batch means, dropout; labeled and unlabeled images in separate passes with
    split_forward) on its augmented view, in fp32. A copy runs them, so the student's running
    means stay as they are."""
    model = copy.deepcopy(student).train()
    if split_forward:
        model = SplitForward(model, batches.n_lab)
    for step in distance_steps(batches):
        view, _, labels = batches.views(step)  # both views, so that dropout draws as in training
        z = model(view)[0].float()
        yield z[:batches.n_lab], z[batches.n_lab:], labels


def pairwise_d2(a, b):
    """d2 of every pair of rows of a and b, from exact differences (in fp64)."""
    return torch.cdist(a.double(), b.double(), compute_mode="donot_use_mm_for_euclid_dist").square() / a.shape[1]


def batch_pair_d2(z_labeled, z_unlabeled):
    """d2 of every LC pair of one batch but a point with itself (the U x U diagonal)."""
    d2 = pairwise_d2(torch.cat([z_labeled, z_unlabeled]), z_unlabeled)
    n_labeled = len(z_labeled)
    self_pair = torch.zeros_like(d2, dtype=torch.bool)
    self_pair[n_labeled:].fill_diagonal_(True)
    return d2[~self_pair]


@dataclass
class PairDistances:
    """d2 within the batches of a sample: labeled pairs of one class and of different classes, and
    the LC pairs but a point with itself."""
    same: torch.Tensor
    different: torch.Tensor
    lc_pairs: torch.Tensor
    self_pairs: int  # the U x U diagonal: neighbours at d2 = 0 in the LC loss's neighbour fraction
    mean_d2: float  # mean over the batches of each batch's mean d2 over its LC pairs (diagonal included)

    @classmethod
    def of_batches(cls, batches):
        """From (z_labeled, z_unlabeled, labels) per batch."""
        same, different, lc_pairs, means, self_pairs = [], [], [], [], 0
        for z_labeled, z_unlabeled, labels in batches:
            z_labeled, z_unlabeled = z_labeled.double(), z_unlabeled.double()
            d2 = pairwise_d2(z_labeled, z_labeled)
            upper = torch.ones_like(d2, dtype=torch.bool).triu(1)
            one_class = labels[:, None] == labels[None, :]
            same.append(d2[upper & one_class])
            different.append(d2[upper & ~one_class])
            lc_pairs.append(batch_pair_d2(z_labeled, z_unlabeled))
            self_pairs += len(z_unlabeled)
            means.append(mean_pair_d2(z_labeled, z_unlabeled).item())
        return cls(torch.cat(same).cpu(), torch.cat(different).cpu(), torch.cat(lc_pairs).cpu(), self_pairs,
                   sum(means) / len(means))

    def neighbour_fraction(self, eps):
        """The share of the LC pairs within eps, as the LC loss counts it (a point with itself included)."""
        return ((self.lc_pairs <= eps).sum().item() + self.self_pairs) / (len(self.lc_pairs) + self.self_pairs)

    def summary(self, eps=None):
        """Medians of same- and different-class d2, their ratio (lower: tighter clusters relative to
        their separation), the mean d2 (the feature scale) and, given eps, the neighbour fraction."""
        same, different = self.same.median().item(), self.different.median().item()
        # collapsed features (every distance 0) have no ratio: NaN, as the ratio of nothing to nothing
        result = dict(d2_same_median=same, d2_different_median=different,
                      d2_ratio=same / different if different > 0 else float("nan"),
                      d2_mean=self.mean_d2)
        if eps is not None:
            result.update(eps=eps, neighbour_fraction=self.neighbour_fraction(eps))
        return result

    def choose_eps(self):
        """The cut-off that misjudges the fewest labeled pairs (a same-class pair beyond it, a
        different-class pair within it): where the two distributions part. Placed at the geometric
        mean of the two distances it falls between; None without pairs of both kinds."""
        if not len(self.same) or not len(self.different):
            return None
        d2 = torch.cat([self.same, self.different])
        is_same = torch.cat([torch.ones_like(self.same), torch.zeros_like(self.different)])
        order = d2.argsort()
        d2, is_same = d2[order], is_same[order]
        # Keeping the first k pairs (k = 0..n) as neighbours misjudges the different-class pairs
        # among them and the same-class pairs after them.
        zero = torch.zeros(1, dtype=d2.dtype)
        inside_different = torch.cat([zero, (1 - is_same).cumsum(0)])
        outside_same = is_same.sum() - torch.cat([zero, is_same.cumsum(0)])
        k = int((inside_different + outside_same).argmin())
        low = d2[k - 1] if k > 0 else d2[0] / 2
        high = d2[k] if k < len(d2) else d2[-1] * 2
        return (low.clamp_min(1e-12) * high).sqrt().item()


def auto_eps(distances):
    """PairDistances.choose_eps, or exit 2 where it has no pairs to choose from."""
    eps = distances.choose_eps()
    if eps is None:
        raise UserError("--eps auto needs labeled pairs of one class and of different classes in the first "
                        "batches (--labeled-batch too small for the classes?); give --eps a number")
    return eps


def neighbourhood_at_start(eps, student, batches, split_forward=False):
    """(eps, the distances at LC's start): 'auto' becomes the cut-off where the labeled pairs'
    same-class and different-class distances part (auto_eps)."""
    distances = PairDistances.of_batches(lc_features(student, batches, split_forward))
    pairs = (distances.same, distances.different, distances.lc_pairs)
    if not all(d.isfinite().all() for d in pairs):
        raise UserError("stage 1's features are not finite in the first batches (a network that diverged), so LC "
                        "cannot measure them; train stage 1 again (evaluate.py --ckpt on it shows its error)")
    if not any(d.any() for d in pairs):
        raise UserError("stage 1's features have collapsed: every pair of images lies at distance 0 in the first "
                        "batches (a network that learned nothing), so LC has no clusters to act on; train stage 1 "
                        "again (evaluate.py --ckpt on it shows its error)")
    start = dict(eps_auto=eps == "auto")
    if eps == "auto":
        eps = auto_eps(distances)
    return eps, dict(start, **distances.summary(eps))


def checkpoint_distances(config, data, split, student, device):
    """The pairwise d2 of the student's features as LC sees them (PairDistances) in the run's first
    batches (its config and split), and the eps that applies: the LC run's (a relative one at this
    feature scale) or, for an MT checkpoint, the one `finetune_lc.py --eps auto` would choose."""
    batches = Batches(data, split, config, device)
    distances = PairDistances.of_batches(lc_features(student, batches, config.forward == "split"))
    lc = config.lc
    if lc is None:
        return distances, auto_eps(distances), "eps auto"
    if lc.eps_ratio:
        return distances, lc.eps_ratio * distances.mean_d2, f"eps ({lc.eps_ratio:.3g} x mean d2)"
    return distances, lc.eps, "eps"
