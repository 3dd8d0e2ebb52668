"""nearest.py against scikit-learn's brute-force neighbours on fresh random vectors: the exact search
(block after block of the base) gives the same neighbours and distances; the inverted-file index
finds nearly all of them."""
import sys
from functools import partial

import numpy as np
import pytest
from sklearn.neighbors import NearestNeighbors

from mtlc.data import nearest
from mtlc.data.nearest import in_memory


def reference(base, queries, k):
    distances, indices = NearestNeighbors(n_neighbors=k, algorithm="brute").fit(base).kneighbors(queries)
    return distances ** 2, indices


@pytest.fixture(params=["faiss", "torch"])
def engine(request, monkeypatch):
    """The exact search with faiss, and in torch where faiss cannot be imported (the GPU hosts)."""
    if request.param == "torch":
        monkeypatch.setitem(sys.modules, "faiss", None)
    return request.param


@pytest.mark.parametrize("n_base,block", [(300, 65_536), (1027, 128)])  # one block; many, the last smaller than k
def test_the_exact_search_is_brute_force(monkeypatch, engine, n_base, block):
    monkeypatch.setattr(nearest, "BLOCK", block)
    monkeypatch.setattr(nearest, "torch_exact_search", partial(nearest.torch_exact_search, rows=100))
    rng = np.random.default_rng(n_base)
    base, queries = rng.normal(size=(n_base, 16)), rng.normal(size=(257, 16))
    distances, indices = nearest.nearest(in_memory(base), in_memory(queries), 5)
    expected_d, expected_i = reference(base, queries, 5)
    np.testing.assert_array_equal(indices, expected_i)
    np.testing.assert_allclose(distances, expected_d, rtol=1e-4, atol=1e-4)


def test_fewer_base_vectors_than_asked_are_padded(engine):
    rng = np.random.default_rng(1)
    base, queries = rng.normal(size=(3, 4)), rng.normal(size=(6, 4))
    distances, indices = nearest.nearest(in_memory(base), in_memory(queries), 5)
    np.testing.assert_array_equal(indices[:, :3], reference(base, queries, 3)[1])
    assert (indices[:, 3:] == -1).all() and np.isinf(distances[:, 3:]).all()


def test_the_approximate_search_finds_nearly_every_nearest_neighbour(monkeypatch):
    """Past EXACT_PAIRS (here 0) the base goes into an inverted-file index of 8-bit codes: on 20,000
    vectors in 200 clusters, at least 95% of the queries' nearest neighbours are found, at distances
    mostly within the codes' rounding (each value rounded to one of 256 steps over its dimension's range
    in the index's training sample: off by at most the norm of half a step in every dimension, except
    where a value outside that range is clipped). The copy search measures the exact distance of the
    candidates again."""
    monkeypatch.setattr(nearest, "EXACT_PAIRS", 0)
    rng = np.random.default_rng(2)
    centres = rng.normal(size=(200, 24))
    base = centres[rng.integers(0, 200, 20_000)] + rng.normal(0, 0.3, (20_000, 24))
    queries = base[rng.choice(20_000, 500, replace=False)] + rng.normal(0, 0.05, (500, 24))
    distances, indices = nearest.nearest(in_memory(base), in_memory(queries), 1)
    expected_d, expected_i = reference(base, queries, 1)
    found = indices[:, 0] == expected_i[:, 0]
    assert found.mean() >= 0.95
    half_steps = (base.max(0) - base.min(0)) / 255 / 2
    error = np.abs(np.sqrt(distances[found, 0]) - np.sqrt(expected_d[found, 0]))
    assert np.mean(error <= np.linalg.norm(half_steps)) >= 0.99
