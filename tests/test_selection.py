"""--suggest's choice (TypiClust) on synthetic features where the answer is known."""
import numpy as np

from mtlc.use import selection
from mtlc.use.selection import suggest

CENTRES = [(1, 0, 0), (0, 1, 0), (0, 0, 1), (-1, 0, 0), (0, -1, 0), (0, 0, -1)]


def blobs(per_blob=40, spread=0.05, seed=0):
    rng = np.random.default_rng(seed)
    points = np.concatenate([np.array(c) + rng.normal(0, spread, (per_blob, 3)) for c in CENTRES])
    return points, np.repeat(np.arange(len(CENTRES)), per_blob)


def test_clusters_without_labels_come_first_and_their_most_typical_image():
    points, blob = blobs()
    labeled = np.array([CENTRES[0], CENTRES[2], CENTRES[4]], float)  # blobs 1, 3 and 5 hold no label
    picks, clusters = suggest(points, labeled, 3)
    assert sorted(blob[picks]) == [1, 3, 5] and len(set(clusters)) == 3
    directions = points / np.linalg.norm(points, axis=1, keepdims=True)  # what the clustering sees
    for p in picks:  # the most typical: in the dense middle of its blob
        mine = directions[blob == blob[p]]
        centre_distance = np.linalg.norm(mine - mine.mean(0), axis=1)
        assert np.linalg.norm(directions[p] - mine.mean(0)) <= np.median(centre_distance)


def test_images_to_skip_are_never_suggested_their_cluster_passed_over():
    """Blob 1 made of images like no class (a pile of blank pages, say): the three suggestions come
    from the other blobs without a label, 3 and 5, then the next of them, never from blob 1."""
    points, blob = blobs()
    labeled = np.array([CENTRES[0], CENTRES[2], CENTRES[4]], float)
    picks, _ = suggest(points, labeled, 3, skip=blob == 1)
    assert len(picks) == 3 and 1 not in blob[picks] and {3, 5} <= set(blob[picks])


def test_n_distinct_images_stable_under_a_seed():
    points, _ = blobs(per_blob=30, spread=0.3, seed=1)
    labeled = points[:5] + 0.01
    first, _ = suggest(points, labeled, 25, seed=4)
    again, _ = suggest(points, labeled, 25, seed=4)
    assert len(set(first.tolist())) == 25 and np.array_equal(first, again)
    assert all(0 <= p < len(points) for p in first)


def test_more_asked_than_there_are():
    points, _ = blobs(per_blob=3)
    picks, _ = suggest(points, points[:2] + 0.01, 100)
    assert sorted(picks.tolist()) == list(range(len(points)))


def test_no_labeled_images_yet():
    points, blob = blobs()
    picks, _ = suggest(points, np.zeros((0, 3)), 6)
    assert sorted(blob[picks]) == list(range(6))  # one from each blob


def test_beyond_the_in_memory_size_faiss_clusters_a_memory_map_with_the_same_answer(monkeypatch, tmp_path):
    """Past FULL_KMEANS_MAX points (here made 0) the features are read from a memory map a batch at a
    time and clustered by faiss's k-means on a sample, with a cluster's typicality among at most
    TYPICALITY_MAX of its members: the uncovered blobs still come first, one image each."""
    monkeypatch.setattr(selection, "FULL_KMEANS_MAX", 0)
    monkeypatch.setattr(selection, "TYPICALITY_MAX", 25)
    monkeypatch.setattr(selection, "BATCH", 7)
    points, blob = blobs()
    stored = np.lib.format.open_memmap(tmp_path / "features.npy", mode="w+", dtype=np.float32, shape=points.shape)
    stored[:] = points
    stored.flush()
    features = np.load(tmp_path / "features.npy", mmap_mode="r")
    labeled = np.array([CENTRES[0], CENTRES[2], CENTRES[4]], float)
    picks, clusters = suggest(features, labeled, 3)
    assert sorted(blob[picks]) == [1, 3, 5] and len(set(clusters)) == 3
    picks, _ = suggest(features, np.zeros((0, 3)), 6)
    assert sorted(blob[picks]) == list(range(6))


def test_a_million_images_features_are_read_a_batch_at_a_time_their_pages_let_go(monkeypatch, tmp_path):
    """The kept predictions' features (1 GB at a million images and 256 values) are mapped: the sample
    k-means trains on and every batch assigned to a centre leave no pages of the file resident."""
    from conftest import resident_bytes
    from mtlc.data.mapped import mapped_work_rows
    from mtlc.disk.work import Work
    monkeypatch.setattr(selection, "FULL_KMEANS_MAX", 0)
    work = Work(tmp_path / "predictions", dict(step="predict"))
    work.appended("features.f32").write(np.random.default_rng(0).normal(size=(20_000, 128)).astype(np.float32).tobytes())
    work.commit(force=True)
    features = mapped_work_rows(work, "features.f32", np.float32, 128)
    picks, _ = suggest(features, np.zeros((0, 128)), 10)
    assert len(set(picks.tolist())) == 10
    assert (tmp_path / "predictions" / "features.f32").stat().st_size == 10_240_000
    assert resident_bytes(tmp_path / "predictions" / "features.f32") < 2 * 2 ** 20
