"""Which of the images still unlabeled a person labels next, in a round of labels: orders of them,
best first, from what the heads that never saw an image (unseen.py) say of each. Measured against one
another, by the labels a person gives until a folder is finished, in docs/label-in-rounds.md
(tools/bench_rounds.py).

- `least-confident`: lowest calibrated confidence first (uncertainty sampling; Lewis and Gale 1994).
  An image is left for the person exactly where its confidence is under the acceptance threshold, so
  these are the images a finished folder needs labeled anyway, and the ones whose labels move the
  heads' boundaries.
- `disagreement`: the images the FOLDS heads disagree on most first (query by committee; Seung,
  Opper and Sompolinsky 1992), then the least confident.
- `typiclust`: the most typical image of each region of the feature space with the fewest labels
  (selection.py; Hacohen, Dekel and Weinshall 2022), best with few labels.
- `typiclust-first`: TypiClust while the person has given no label yet, least-confident after.
- `random`: the control.
"""
import heapq

import numpy as np

from .selection import suggest, suggest_rows

ORDERS = ("least-confident", "disagreement", "typiclust", "typiclust-first", "random")
DEFAULT_ORDER = "least-confident"
# evaluate.py --suggest's: one head answers each image there, so no heads can disagree
SUGGEST_ORDERS = tuple(order for order in ORDERS if order != "disagreement")


def next_images(order, n, *, confidence, head_logits=None, features=None, labeled_features=None, given=0, seed=0):
    """The positions of the n images to label next among the images still unlabeled, best first.
    confidence: each image's calibrated confidence by the head that never saw it; head_logits
    (FOLDS, images, classes): every head's logits of them (`disagreement`); features, labeled_features:
    their pooled features and the labeled images' (`typiclust`); given: the labels the person gave so
    far (`typiclust-first`); seed: `random`'s and TypiClust's."""
    confidence = np.asarray(confidence)
    n = min(n, len(confidence))
    if order == "typiclust-first":
        order = "typiclust" if given == 0 else "least-confident"
    if order == "least-confident":
        return np.argsort(confidence, kind="stable")[:n]
    if order == "disagreement":
        votes = np.asarray(head_logits).argmax(2)  # (heads, images)
        agreeing = np.max([(votes == c).sum(0) for c in np.unique(votes)], 0)  # the largest group of heads per image
        return np.lexsort((confidence, agreeing))[:n]
    if order == "typiclust":
        return suggest(features, labeled_features, n, seed)[0]
    if order == "random":
        return np.random.default_rng(seed).permutation(len(confidence))[:n]
    raise ValueError(f"no order {order!r}: one of {', '.join(ORDERS)}")


def suggested_rows(store, labeled, *, order, n, seed, given=0):
    """The n kept predictions (prediction_rows.PredictionStore) to label next in this order, best
    first, and a `cluster` value for each (TypiClust's cluster, else empty): readable files only, an
    image like no class never (a blank page is no class to teach: evaluate.py --audit sets such
    images aside). labeled: the labeled images' pooled features (TypiClust's); given: the labels a
    person gave so far (typiclust-first's)."""
    if order == "typiclust-first":
        order = "typiclust" if given == 0 else "least-confident"
    if order == "typiclust":
        return suggest_rows(store, labeled, n=n, seed=seed)
    candidates = ((row.confidence, position, row) for position, row in enumerate(store.rows())
                  if row.label is not None and not row.like_no_class)
    if order == "least-confident":
        chosen = [row for _, _, row in heapq.nsmallest(n, candidates, key=lambda c: c[:2])]
    else:  # random: the n of a fixed random key each, streamed
        keys = np.random.default_rng(seed)
        chosen = [row for _, _, row in heapq.nsmallest(n, ((keys.random(), position, row)
                                                           for _, position, row in candidates), key=lambda c: c[:2])]
    return chosen, [""] * len(chosen)
