"""Which unlabeled images to label next.

TypiClust (Hacohen, Dekel and Weinshall, "Active learning on a budget", ICML 2022): with few labels,
the images worth labeling are typical ones from parts of the feature space that no label covers
yet. The features (the network's pooled features, the vectors LC acts on, L2-normalized so that
only their direction counts) of the labeled and unlabeled images are clustered by k-means into as
many clusters as there will be labels; clusters holding no labeled image come first, largest first,
and from each the most typical unlabeled image (the inverse mean distance to its nearest neighbours
in the cluster) is taken. Once every cluster holds a label, the ones with the fewest labels come next.
"""
import heapq

import numpy as np
from sklearn.cluster import KMeans, MiniBatchKMeans
from sklearn.neighbors import NearestNeighbors

TYPICALITY_NEIGHBOURS = 20  # as TypiClust
FULL_KMEANS_MAX = 50_000    # points; beyond, mini-batch k-means keeps time and memory bounded


def unit_rows(x):
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def typicality(points):
    """1 / mean distance to the k nearest other points (k = min(20, half the points)), per point."""
    if len(points) < 3:
        return np.ones(len(points))
    k = min(TYPICALITY_NEIGHBOURS, len(points) // 2)
    distances, _ = NearestNeighbors(n_neighbors=k + 1).fit(points).kneighbors(points)
    return 1.0 / (distances[:, 1:].mean(1) + 1e-12)


def cluster(points, n_clusters, seed):
    kind = KMeans(n_clusters, n_init=1, random_state=seed) if len(points) <= FULL_KMEANS_MAX else \
        MiniBatchKMeans(n_clusters, n_init=1, random_state=seed, batch_size=4096)
    return kind.fit_predict(points)


def suggest(unlabeled_features, labeled_features, n, seed=0):
    """The indices of n distinct unlabeled images to label next, best first, and the cluster of each
    (TypiClust: uncovered clusters first, largest first; the most typical image of each)."""
    unlabeled = unit_rows(unlabeled_features)
    labeled = unit_rows(labeled_features).reshape(-1, unlabeled.shape[1])
    n = min(n, len(unlabeled))
    points = np.concatenate([labeled, unlabeled])
    assignment = cluster(points, min(len(labeled) + n, len(points)), seed)
    labeled_in, unlabeled_in = assignment[:len(labeled)], assignment[len(labeled):]
    candidates = {}  # cluster -> its unlabeled images, most typical first
    for c in np.unique(unlabeled_in):
        members = np.flatnonzero(unlabeled_in == c)
        candidates[int(c)] = list(members[np.argsort(typicality(unlabeled[members]), kind="stable")])  # most typical last
    labels_in = {c: int((labeled_in == c).sum()) for c in candidates}
    size = {c: int((assignment == c).sum()) for c in candidates}
    queue = [(labels_in[c], -size[c], int(c)) for c in candidates]  # fewest labels, then largest
    heapq.heapify(queue)
    picks, clusters = [], []
    while len(picks) < n:
        labels, minus_size, c = heapq.heappop(queue)
        picks.append(int(candidates[c].pop()))
        clusters.append(c)
        if candidates[c]:
            heapq.heappush(queue, (labels + 1, minus_size, c))
    return np.array(picks, dtype=np.int64), np.array(clusters, dtype=np.int64)
