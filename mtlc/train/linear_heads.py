"""Linear heads on a frozen trunk's features, fitted by scikit-learn's logistic regression: the linear
probe (the labeled images alone), the same self-trained on the unlabeled images' confident
pseudo-labels, and either with the class prior of the unlabeled images estimated and corrected for,
since a few labels a class say nothing of how common each class is among the images to label. The
prior: EM on the probe's posteriors (Saerens, Latinne and Decaestecker 2002), calibrated first by a
temperature fitted on the labeled images by cross-validation (EM needs calibrated posteriors:
Alexandari, Kundaje and Shrikumar 2020; the probe's raw ones, too flat, sent the largest of three
classes from 70% to 80% in tests/test_fitted_heads.py's draw). The correction: each fit weighs its
images so that its classes are in that prior (importance weights for a label shift).
"""
import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

# The inverse L2 strength of the logistic regression on standardized features.
PROBE_C = 0.1
SELF_TRAINING_ROUNDS = 5
# The most of the unlabeled images a round of self-training takes: round r of R takes the r/R * this
# most confident (a global confidence ranking: no quota per class, which would assume equal classes).
SELF_TRAINING_SHARE = 0.8
PRIOR_ITERATIONS = 100
CALIBRATION_FOLDS = 5


class LinearHead:
    """A fitted logistic regression (standardization, then scikit-learn's) of num_classes classes."""

    def __init__(self, model, num_classes):
        self.model, self.num_classes = model, num_classes

    def weights(self):
        """(W (classes, D), b (classes,)) of one linear layer giving its logits from raw features: the
        standardization folded in, two classes' single score spread over two rows, a class the fit
        never saw at -inf in effect."""
        scaler, regression = self.model[0], self.model[-1]
        coef, intercept = regression.coef_, regression.intercept_
        if len(regression.classes_) == 2:  # scikit-learn's one score for the second class
            coef, intercept = np.concatenate([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
        scale = scaler.scale_
        w = np.zeros((self.num_classes, coef.shape[1]))
        b = np.full(self.num_classes, -1e4)
        w[regression.classes_] = coef / scale
        b[regression.classes_] = intercept - (coef / scale) @ scaler.mean_
        return w, b

    def logits(self, x):
        w, b = self.weights()
        return np.asarray(x, np.float64) @ w.T + b

    def predict_proba(self, x, temperature=1.0):
        z = self.logits(x) / temperature
        z = np.exp(z - z.max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)

    def predict(self, x):
        return self.logits(x).argmax(1)


def fit_linear(x, y, num_classes, weights=None, C=PROBE_C):
    model = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=2000))
    model.fit(x, y, logisticregression__sample_weight=weights)
    return LinearHead(model, num_classes)


def linear_probe(x, y, unlabeled, num_classes):
    """The probe: the labeled images alone."""
    return fit_linear(x, y, num_classes)


def cross_validated_temperature(x, y, num_classes):
    """The temperature that calibrates the probe's posteriors: fitted by the likelihood of each labeled
    image's logits from a probe that never saw it (stratified folds; 1 where a class has one image)."""
    folds = min(CALIBRATION_FOLDS, int(np.bincount(y).min()))
    if folds < 2:
        return 1.0
    logits = np.zeros((len(y), num_classes))
    for train, held in StratifiedKFold(folds, shuffle=True, random_state=0).split(x, y):
        logits[held] = fit_linear(x[train], y[train], num_classes).logits(x[held])
    finite = np.where(np.isfinite(logits), logits, -1e4)
    nll = lambda log_t: -log_softmax(finite / np.exp(log_t), 1)[np.arange(len(y)), y].mean()  # noqa: E731
    return float(np.exp(minimize_scalar(nll, bounds=(-5, 5), method="bounded").x))


def class_prior(head, unlabeled, trained_prior, temperature=1.0):
    """The class prior of the unlabeled images (Saerens et al.'s EM), given the prior the head was
    trained under and the temperature that calibrates it; the head's posteriors are re-weighted by
    the ratio until the prior settles."""
    probs = head.predict_proba(unlabeled, temperature)
    prior = trained_prior.copy()
    for _ in range(PRIOR_ITERATIONS):
        adjusted = probs * (prior / trained_prior)
        adjusted /= adjusted.sum(1, keepdims=True)
        new = adjusted.mean(0)
        if np.abs(new - prior).max() < 1e-6:
            break
        prior = new
    return np.maximum(prior, 1e-6)


def prior_weights(y, prior, num_classes):
    """Each image's weight in a fit whose classes are to be in `prior`: prior / the share of its class."""
    return (prior / labeled_prior(y, num_classes))[y]


def unlabeled_prior(x, y, unlabeled, num_classes):
    """The class prior of the unlabeled images, by EM on the calibrated probe's posteriors."""
    temperature = cross_validated_temperature(x, y, num_classes)
    return class_prior(linear_probe(x, y, unlabeled, num_classes), unlabeled, labeled_prior(y, num_classes), temperature)


def labeled_prior(y, num_classes):
    counts = np.bincount(y, minlength=num_classes).astype(float)
    return np.maximum(counts / counts.sum(), 1e-6)


def prior_probe(x, y, unlabeled, num_classes):
    """The probe with the unlabeled images' prior: its labeled images weighed to it."""
    prior = unlabeled_prior(x, y, unlabeled, num_classes)
    return fit_linear(x, y, num_classes, weights=prior_weights(y, prior, num_classes))


def self_trained(x, y, unlabeled, num_classes, correct_prior=False):
    """Rounds of self-training: each fits on the labeled images and the most confident unlabeled ones
    (SELF_TRAINING_SHARE, growing) under the previous head's classes; with correct_prior, every fit's
    images weighed to the unlabeled images' prior (estimated once, unlabeled_prior)."""
    prior = unlabeled_prior(x, y, unlabeled, num_classes) if correct_prior else None

    def fit(xs, ys):
        return fit_linear(xs, ys, num_classes, weights=None if prior is None else prior_weights(ys, prior, num_classes))
    head = fit(x, y)
    for r in range(1, SELF_TRAINING_ROUNDS + 1):
        probs = head.predict_proba(unlabeled)
        take = np.argsort(-probs.max(1))[:round(len(unlabeled) * SELF_TRAINING_SHARE * r / SELF_TRAINING_ROUNDS)]
        head = fit(np.concatenate([x, unlabeled[take]]), np.concatenate([y, probs[take].argmax(1)]))
    return head


HEADS = {
    "probe": linear_probe,
    "probe-prior": prior_probe,
    "self-training": self_trained,
    "self-training-prior": lambda x, y, u, k: self_trained(x, y, u, k, correct_prior=True),
}
