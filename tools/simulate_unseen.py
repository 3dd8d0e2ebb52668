"""--max-error's promise for images a learner trained on without labels, by simulation: the checkpoint's
own predictions against heads that never saw the image (mtlc/use/unseen.py), for learners that
memorize their training images more or less.

Each draw: a mixture of Gaussian classes; a few labeled points, many unlabeled ones, held-out labeled
ones. The learner is k-nearest-neighbours self-trained on the unlabeled points (pseudo-labels, twice
refitted): with uniform votes a training point is one of k voters on itself, with distance weights it
decides its own class alone (confidence 1: a network that fits its pseudo-labels). The checkpoint
predicts its own unlabeled points; the FOLDS heads each leave one FOLDS-th of them out and predict
those, a held-out point going to a head at random (unseen.py: by its file's hash); cross-fitted, each
head also takes the held-out points of the other heads as labeled ones (unseen.py). The acceptance
threshold is searched on the held-out points (calibration.acceptance_threshold, as --max-error does)
and applied to the unlabeled points; the promise is broken in a draw where those accepted are more
than --max-error wrong. Prints docs/pretrained.md's table (seeded: the same numbers each time).

    OMP_NUM_THREADS=1 python tools/simulate_unseen.py --draws 200
"""
import sys
from pathlib import Path

import click
import numpy as np
from sklearn.neighbors import KNeighborsClassifier

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's root: mtlc, kernels, the scripts
from mtlc.use.calibration import acceptance_threshold  # noqa: E402
from mtlc.use.unseen import FOLDS  # noqa: E402

LEARNERS = (("k = 15, uniform votes", 15, "uniform"), ("k = 3, uniform votes", 3, "uniform"),
            ("k = 15, distance-weighted (memorizes)", 15, "distance"))


def mixture(rng, n, means, spread):
    y = rng.integers(len(means), size=n)
    return means[y] + rng.normal(0, spread, (n, means.shape[1])), y


def self_trained(x_lab, y_lab, x_unl, k, weights, rounds=2):
    """k-NN fitted on the labeled points and the unlabeled ones with their pseudo-labels, refitted `rounds` times."""
    pseudo = KNeighborsClassifier(min(k, len(x_lab))).fit(x_lab, y_lab).predict(x_unl)
    for _ in range(rounds):
        model = KNeighborsClassifier(k, weights=weights).fit(np.r_[x_lab, x_unl], np.r_[y_lab, pseudo])
        pseudo = model.predict(x_unl)
    return model


def outcome(held, unlabeled, max_error):
    """(promise broken, share of the unlabeled points accepted, their error %) of a threshold searched
    on the held-out points' (probabilities, labels) and applied to the unlabeled points'."""
    (p_held, y_held), (p_unl, y_unl) = held, unlabeled
    found = acceptance_threshold(p_held.max(1).round(4), p_held.argmax(1) == y_held, max_error)
    accepted = p_unl.max(1).round(4) >= found.confidence if found else np.zeros(len(y_unl), bool)
    error = 100 * float((p_unl[accepted].argmax(1) != y_unl[accepted]).mean()) if accepted.any() else 0.0
    return error > max_error, float(accepted.mean()), error


def draw(rng, k, weights, max_error, *, n_labeled=40, n_unlabeled=4000, n_held=1000, dims=8, classes=4):
    """One draw: the outcome of the checkpoint's own predictions, of the heads', of the cross-fitted heads'."""
    means = rng.normal(0, 1.2, (classes, dims))
    (x_lab, y_lab), (x_unl, y_unl), (x_held, y_held) = (mixture(rng, n, means, 1.0)
                                                        for n in (n_labeled, n_unlabeled, n_held))
    checkpoint = self_trained(x_lab, y_lab, x_unl, k, weights)
    own = outcome((checkpoint.predict_proba(x_held), y_held), (checkpoint.predict_proba(x_unl), y_unl), max_error)
    fold_unl, fold_held = rng.permutation(n_unlabeled) % FOLDS, rng.integers(FOLDS, size=n_held)
    heads = []
    for crossfit in (False, True):
        p_unl, p_held = np.zeros((n_unlabeled, classes)), np.zeros((n_held, classes))
        for fold in range(FOLDS):
            more = (fold_held != fold) & crossfit
            head = self_trained(np.r_[x_lab, x_held[more]], np.r_[y_lab, y_held[more]], x_unl[fold_unl != fold], k,
                                weights)
            p_unl[fold_unl == fold] = head.predict_proba(x_unl[fold_unl == fold])
            p_held[fold_held == fold] = head.predict_proba(x_held[fold_held == fold])
        heads.append(outcome((p_held, y_held), (p_unl, y_unl), max_error))
    return own, *heads


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--draws", default=200, show_default=True, help="Draws per row (about 1 s each on one core).")
def main(draws):
    """Print the table: per learner and --max-error, how often the promise broke on the unlabeled
    points, what was accepted and how wrong, for the checkpoint's own predictions, the heads' and the
    cross-fitted heads'."""
    rng = np.random.default_rng(0)
    print("| learner | --max-error | promise broken: checkpoint | heads | cross-fitted | accepted: checkpoint | "
          "heads | cross-fitted | their error (pooled): checkpoint | heads | cross-fitted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, k, weights in LEARNERS:
        for max_error in (5, 10):
            results = np.array([draw(rng, k, weights, max_error) for _ in range(draws)])  # (draws, 3, 3)
            broken, accepted = results[..., 0].mean(0), results[..., 1].mean(0)
            error = (results[..., 1] * results[..., 2]).sum(0) / np.maximum(results[..., 1].sum(0), 1e-12)  # pooled
            cells = ([f"{100 * b:.1f}%" for b in broken] + [f"{100 * a:.0f}%" for a in accepted]
                     + [f"{e:.1f}%" for e in error])
            print(f"| {name} | {max_error} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
