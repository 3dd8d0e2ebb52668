"""What the LC loss's gradient does to a checkpoint's features: how much of it only shrinks the whole
space, how many of its neighbour pairs join different true classes, and how strong it is beside the
cross-entropy. The measurements behind docs/lc-control.md; a user needs none of this.

    python examples/lc_mechanism.py --ckpt runs/digits-mt1/mt.pt
    python examples/lc_mechanism.py --ckpt runs/dev-cifar-mt1/mt.pt --truth data/dev-cifar-truth.csv

Over the first batches of the run's stream, as LC sees them (the student in training mode on its
augmented view, neighbours.lc_features), for each form of the loss (features_units: the relative
loss before it was divided by the features' mean d2 at LC's start; relative: the default for digits
and folder, unit-free; normalized):
  radial_share     the share of the gradient's squared norm along z itself (features centred on the
                   batch): the part of LC's first-order decrease that shrinking every feature alike
                   buys. 1: LC only contracts the space; 0: it moves points relative to each other.
  grad_ratio       |lambda2 grad_z L_lc| / |grad_z L_ce| (the labeled rows' cross-entropy through the
                   classifier): LC's pull beside the labels' at full lambda2.
and, once per batch, the neighbour fraction and the share of neighbour pairs (a point with itself
not counted) whose true classes differ, the share of the loss those pairs carry, and the share of
all LC pairs whose classes differ (what neighbours drawn at random would give).

Prints one JSON object per checkpoint (means over the batches).
"""
import json
import statistics
import sys
from pathlib import Path

import click
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc
from mtlc.data.batches import Batches  # noqa: E402
from mtlc.train.checkpoints import checkpoint_split, load_checkpoint, restore_data, restore_models  # noqa: E402
from mtlc.train.lc import PairDistances, distance_steps, lc_features, lc_term, mean_pair_d2  # noqa: E402
from mtlc.train.presets import preset  # noqa: E402
from mtlc.data.splits import true_classes  # noqa: E402


def pair_classes(batches, truth):
    """The true classes of each distance step's batch (labeled rows first), in lc_features' order."""
    for step in distance_steps(batches):
        yield truth[batches.indices(step)]


def cross_class_shares(z_labeled, z_unlabeled, classes, eps):
    """(neighbour fraction, share of the neighbour pairs joining different classes, share of the
    loss's w d2 mass on them, share of all LC pairs joining different classes: what neighbours
    chosen at random would give), a point with itself left out of the last three."""
    rows = torch.cat([z_labeled, z_unlabeled]).double()
    d2 = torch.cdist(rows, z_unlabeled.double(), compute_mode="donot_use_mm_for_euclid_dist").square() / rows.shape[1]
    neighbour = d2 <= eps
    fraction = neighbour.double().mean().item()
    n = len(z_labeled)
    neighbour[n:].fill_diagonal_(False)
    differ = classes[:, None] != classes[None, n:]
    mass = torch.exp(-d2 / eps) * d2 * neighbour
    pairs = torch.ones_like(neighbour)
    pairs[n:].fill_diagonal_(False)
    return (fraction, (neighbour & differ).sum().item() / max(1, neighbour.sum().item()),
            (mass * differ).sum().item() / max(1e-300, mass.sum().item()),
            (pairs & differ).sum().item() / pairs.sum().item())


def lc_gradient(z_labeled, z_unlabeled, eps_scale, ratio, unit=1.0):
    """grad_z of the LC loss in the given form (relative or normalized) at eps = ratio x mean d2."""
    z = torch.cat([z_labeled, z_unlabeled]).detach().requires_grad_()
    n = len(z_labeled)
    loss, _ = lc_term(z[:n], z[n:], None, eps_scale, ratio, unit)
    (grad,) = torch.autograd.grad(loss, z)
    return z.detach(), grad


def radial_share(z, grad):
    centred = z - z.mean(0)  # grad sums to 0 over the points (distances ignore a shift), so the centre is free
    return ((grad * centred).sum().square() / (grad.square().sum() * centred.square().sum())).item()


def ce_gradient(classifier, z_labeled, z_unlabeled, labels):
    """grad_z of the labeled rows' cross-entropy, the classifier's batch means over the whole batch as in training."""
    z = torch.cat([z_labeled, z_unlabeled]).detach().requires_grad_()
    (grad,) = torch.autograd.grad(F.cross_entropy(classifier(z)[:len(labels)], labels), z)
    return grad


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("more_ckpts", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--ckpt", "ckpts", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="An MT or LC checkpoint; several after it, or --ckpt again.")
@click.option("--truth", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A folder's <folder>-truth.csv (examples/own_images.py): the classes of unlabeled/.")
@click.option("--lam", type=float, default=None, help="lambda2 for grad_ratio. [default: the LC run's, or the preset's]")
def main(more_ckpts, ckpts, truth, lam):
    """Measure LC's gradient on each checkpoint's features; one JSON line each."""
    ckpts += more_ckpts
    if not ckpts:
        raise click.UsageError("give at least one --ckpt")
    for path in ckpts:
        state = load_checkpoint(path)
        config = state["config"]
        data = restore_data(state, echo=lambda line: None)
        student, _ = restore_models(state, torch.device("cpu"))
        batches = Batches(data, checkpoint_split(state), config, torch.device("cpu"))
        feats = list(lc_features(student, batches, config.forward == "split"))
        lc = config.lc
        distances = PairDistances.of_batches(feats)
        ratio = (lc and lc.eps_ratio) or distances.choose_eps() / distances.mean_d2  # as --eps auto would
        unit = (lc and lc.loss_unit) or distances.mean_d2  # as a run starting here would divide the relative loss by
        weight = lam if lam is not None else lc.lam if lc else preset(config.dataset, config.labels)["lam"]
        student.train()
        rows = []
        for (z_labeled, z_unlabeled, labels), classes in zip(feats, pair_classes(batches, true_classes(data, truth))):
            s = mean_pair_d2(z_labeled, z_unlabeled).item()
            fraction, cross, cross_mass, cross_all = cross_class_shares(z_labeled, z_unlabeled, classes, ratio * s)
            ce = ce_gradient(student.classifier, z_labeled, z_unlabeled, labels).norm().item()
            row = dict(d2_mean=s, neighbour_fraction=fraction, cross_class_pairs=cross, cross_class_loss=cross_mass,
                       cross_class_any_pair=cross_all)
            for name, form, u in (("features_units", "relative", 1.0), ("relative", "relative", unit),
                                  ("normalized", "normalized", 1.0)):
                z, grad = lc_gradient(z_labeled, z_unlabeled, form, ratio, u)
                row[f"{name}_radial_share"] = radial_share(z, grad)
                row[f"{name}_grad_ratio"] = weight * grad.norm().item() / ce
            rows.append(row)
        result = dict(checkpoint=path, stage=state["stage"], eps_ratio=ratio, lam=weight,
                      classifier_gain=student.classifier.g.abs().mean().item())
        result.update({key: statistics.mean(r[key] for r in rows) for key in rows[0]})
        click.echo(json.dumps(result))


if __name__ == "__main__":
    main()
