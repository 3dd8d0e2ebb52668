"""Which unlabeled images to label next.

TypiClust (Hacohen, Dekel and Weinshall, "Active learning on a budget", ICML 2022): with few labels,
the images worth labeling are typical ones from parts of the feature space that no label covers
yet. The features (the network's pooled features, the vectors LC acts on, L2-normalized so that
only their direction counts) of the labeled and unlabeled images are clustered by k-means into as
many clusters as there will be labels; clusters holding no labeled image come first, largest first,
and from each the most typical unlabeled image (the inverse mean distance to its nearest neighbours
in the cluster) is taken. Once every cluster holds a label, the ones with the fewest labels come next.

At scale (a million images) the features are a memory map (prediction_rows.py) read a batch at a
time: k-means is faiss's, trained on a sample of TRAINING_PER_CLUSTER points a cluster (its own
default), every point then assigned to its nearest centre a batch at a time. Its centres start from
scikit-learn's k-means++ seeding on SEEDING_PER_CLUSTER points a cluster, as scikit-learn's KMeans
starts below that size: faiss's own start (random points) recovered the 6 blobs of
tests/test_selection.py in 8 of 30 draws (seeds 0-29), k-means++ in 30; seeding from the whole sample
would take far longer than the clustering itself (575 s against 38 s for 1,010 clusters of 128-value
features, beside another job). And a cluster's
typicality is measured among at most TYPICALITY_MAX of its members drawn at random, so that a cluster
of a hundred thousand images costs no hundred-thousand-squared distances.
"""
import heapq

import numpy as np

from ..data.mapped import release_pages

TYPICALITY_NEIGHBOURS = 20  # as TypiClust
FULL_KMEANS_MAX = 50_000    # points; beyond, faiss's k-means on a sample keeps time and memory bounded
TRAINING_PER_CLUSTER = 256  # faiss's max_points_per_centroid: the sample k-means is trained on
SEEDING_PER_CLUSTER = 16   # points a cluster k-means++ chooses the starting centres among
TYPICALITY_MAX = 10_000     # members of a cluster its typicality is measured among
BATCH = 65_536              # feature rows read at a time


def unit_rows(x):
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def typicality(points):
    """1 / mean (Euclidean) distance to the k nearest other points (k = min(20, half the points)),
    per point."""
    import faiss  # here, not above: only --suggest needs it (the GPU hosts, which train, lack faiss)
    if len(points) < 3:
        return np.ones(len(points))
    k = min(TYPICALITY_NEIGHBOURS, len(points) // 2)
    squared, _ = faiss.knn(np.ascontiguousarray(points, np.float32), np.ascontiguousarray(points, np.float32), k + 1)
    distances = np.sqrt(np.maximum(squared, 0))
    return 1.0 / (distances[:, 1:].mean(1) + 1e-12)


class Points:
    """The labeled features (in memory: few) then the unlabeled ones (an array or a memory map), as
    one sequence of unit rows read a batch at a time."""

    def __init__(self, labeled, unlabeled):
        self.labeled, self.unlabeled = unit_rows(labeled).reshape(-1, unlabeled.shape[1]), unlabeled
        self.n_labeled = len(self.labeled)
        self.n = self.n_labeled + len(unlabeled)

    def rows(self, idx):
        """Unit rows of the points at sorted positions idx."""
        idx = np.asarray(idx)
        at = np.searchsorted(idx, self.n_labeled)
        unlabeled = idx[at:] - self.n_labeled
        return np.concatenate([self.labeled[idx[:at]], *(self.read(unlabeled[start:start + BATCH])
                                                         for start in range(0, len(unlabeled), BATCH))])

    def batches(self):
        yield self.labeled
        for start in range(0, len(self.unlabeled), BATCH):
            yield self.read(slice(start, start + BATCH))

    def read(self, idx):
        """Unit rows of the unlabeled points idx, the pages of a memory map let go after."""
        rows = unit_rows(self.unlabeled[idx])
        release_pages(self.unlabeled)
        return rows


def cluster(points, n_clusters, seed):
    """The cluster of each of the Points (int64): scikit-learn's k-means over all of them in memory up
    to FULL_KMEANS_MAX points, else faiss's trained on a sample and every point assigned in batches."""
    from sklearn.cluster import KMeans, kmeans_plusplus  # here: its import takes seconds --suggest alone needs
    if points.n <= FULL_KMEANS_MAX:
        everything = points.rows(np.arange(points.n))
        return KMeans(n_clusters, n_init=1, random_state=seed).fit_predict(everything)
    import faiss
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(points.n, min(points.n, TRAINING_PER_CLUSTER * n_clusters), replace=False))
    dim = points.labeled.shape[1]
    training = points.rows(sample)
    seeding = training[np.sort(rng.choice(len(training), min(len(training), SEEDING_PER_CLUSTER * n_clusters),
                                          replace=False))]
    start, _ = kmeans_plusplus(seeding, n_clusters, random_state=seed)
    kmeans = faiss.Kmeans(dim, n_clusters, niter=20, seed=seed, max_points_per_centroid=TRAINING_PER_CLUSTER)
    kmeans.train(training, init_centroids=np.ascontiguousarray(start, np.float32))
    return np.concatenate([kmeans.index.search(batch, 1)[1][:, 0] for batch in points.batches()]).astype(np.int64)


def suggest(unlabeled_features, labeled_features, n, seed=0, skip=None):
    """The indices of n distinct unlabeled images to label next, best first, and the cluster of each
    (TypiClust: uncovered clusters first, largest first; the most typical image of each).
    unlabeled_features: (N, D), an array or a memory map (read a batch at a time); skip: a bool mask
    of the images never to suggest (they still shape the clusters)."""
    unlabeled_features = unlabeled_features if hasattr(unlabeled_features, "shape") else np.asarray(unlabeled_features)
    points = Points(labeled_features, unlabeled_features)
    n = min(n, len(unlabeled_features))
    assignment = cluster(points, min(points.n_labeled + n, points.n), seed)
    labeled_in, unlabeled_in = assignment[:points.n_labeled], assignment[points.n_labeled:]
    size = np.bincount(assignment)
    labels_in = np.bincount(labeled_in, minlength=len(size))
    order = np.argsort(unlabeled_in, kind="stable")
    starts = np.searchsorted(unlabeled_in[order], np.arange(len(size) + 1))
    rng = np.random.default_rng(seed)
    candidates = {}  # cluster -> its unlabeled images, most typical last; made when the cluster is first drawn from

    def members_by_typicality(c):
        members = order[starts[c]:starts[c + 1]]
        if skip is not None:
            members = members[~skip[members]]
        if len(members) > TYPICALITY_MAX:
            members = np.sort(rng.choice(members, TYPICALITY_MAX, replace=False))
        return list(members[np.argsort(typicality(points.rows(members + points.n_labeled)), kind="stable")])

    queue = [(int(labels_in[c]), -int(size[c]), int(c)) for c in np.unique(unlabeled_in)]  # fewest labels, then largest
    heapq.heapify(queue)
    picks, clusters = [], []
    while len(picks) < n and queue:
        labels, minus_size, c = heapq.heappop(queue)
        if c not in candidates:
            candidates[c] = members_by_typicality(c)
        if not candidates[c]:  # every image of it skipped
            continue
        picks.append(int(candidates[c].pop()))
        clusters.append(c)
        if candidates[c]:
            heapq.heappush(queue, (labels + 1, minus_size, c))
    return np.array(picks, dtype=np.int64), np.array(clusters, dtype=np.int64)


def suggest_rows(store, labeled, *, n, seed):
    """The n kept predictions (prediction_rows.PredictionStore; readable files only) whose images
    TypiClust (selection.py) would label next, best first, and the cluster of each; labeled: the
    labeled images' features. An image like no class (Prediction.like_no_class) is never suggested:
    a blank page is no class to teach."""
    strays = np.array([row.like_no_class for row in store.rows() if row.label is not None], dtype=bool)
    picks, clusters = suggest(store.features(), labeled, n, seed, skip=strays if strays.any() else None)
    wanted = {int(p): k for k, p in enumerate(picks)}
    chosen, readable = [None] * len(picks), 0
    for row in store.rows():
        if row.label is not None:
            if readable in wanted:
                chosen[wanted[readable]] = row
            readable += 1
    return chosen, clusters.tolist()
