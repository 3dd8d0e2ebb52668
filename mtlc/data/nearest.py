"""Each query's nearest vectors among many (the audit's copy search and outlier scores, the check of
test/ for copies of training images at the start of training), with faiss, at any size: the vectors
are made a batch at a time (thumbnails of memory-mapped images, features of a network) and never
held all at once.

The work decides how: where queries x base vectors is at most EXACT_PAIRS (a few thousand test images
against a million training ones; any query set against a few hundred labeled images), every query is
compared with every base vector, block after block of the base, which is exact; beyond (a million
images against each other: 10^12 pairs, hours here), an inverted-file index (faiss
IndexIVFScalarQuantizer): the base clustered into cells by k-means on a sample, each vector stored as
8-bit codes (192 bytes for a thumbnail), and a query compared with the vectors of its NPROBE nearest
cells only. Its answers are approximate (a true neighbour in a cell not probed is missed; distances
carry the codes' rounding); docs/audit.md measures what that costs the copy search.
"""
import math

import numpy as np
import torch

from .mapped import release_pages

EXACT_PAIRS = 10 ** 10   # queries x base vectors compared one by one at most: about a minute here
BLOCK = 65_536           # vectors made or searched at a time
CELL_POINTS = 256        # base vectors per cell, about: sqrt-like growth keeps cells and probes balanced
TRAINING_PER_CELL = 39   # faiss's minimum sample per cell for its k-means
NPROBE = 16              # cells searched per query


class Vectors:
    """n vectors of `dim` float32 values, made a batch at a time: batches() yields consecutive arrays
    (BLOCK rows), rows(idx) the vectors at sorted positions idx."""

    def __init__(self, n, dim, batches, rows):
        self.n, self.dim, self.batches, self.rows = n, dim, batches, rows


def in_memory(array):
    """Vectors of an array, a memory map or a mapped tensor (mapped.py: its pages let go after each read) of rows."""
    if not isinstance(array, (np.memmap, torch.Tensor)):
        array = np.asarray(array, dtype=np.float32)
    dim = array.shape[1] if array.ndim == 2 else 0

    def read(rows):
        out = np.ascontiguousarray(np.asarray(rows), dtype=np.float32)
        release_pages(array)
        return out

    def batches():
        for start in range(0, len(array), BLOCK):
            yield read(array[start:start + BLOCK])
    return Vectors(len(array), dim, batches, lambda idx: read(array[idx]))


def nearest(base, queries, k, seed=0, progress=lambda n: None):
    """(squared Euclidean distances, indices into base), each (queries.n, k), of every query's k
    nearest base vectors, nearest first (inf and -1 where the base has fewer). progress(n) after each
    batch of queries answered."""
    k_found = min(k, base.n)
    distances = np.full((queries.n, k), np.inf, np.float32)
    indices = np.full((queries.n, k), -1, np.int64)
    if not queries.n or not base.n:
        return distances, indices
    search = exact_search(base, k_found) if base.n * queries.n <= EXACT_PAIRS else approximate_search(base, k_found, seed)
    start = 0
    for batch in queries.batches():
        found_d, found_i = search(batch)
        distances[start:start + len(batch), :k_found], indices[start:start + len(batch), :k_found] = found_d, found_i
        start += len(batch)
        progress(len(batch))
    return distances, indices


def exact_search(base, k):
    """A search that compares a batch of queries with every base vector (faiss.knn block by block,
    merged in a faiss.ResultHeap); a base of one block is made once. Where faiss is missing (the GPU
    hosts lack it), the same search in torch."""
    try:
        import faiss  # here, not above: training on a dataset without files never searches
    except ImportError:
        return torch_exact_search(base, k)
    held = list(base.batches()) if base.n <= BLOCK else None

    def search(batch):
        heap = faiss.ResultHeap(len(batch), k)
        start = 0
        for block in held if held is not None else base.batches():
            d, i = faiss.knn(batch, block, min(k, len(block)))
            if d.shape[1] < k:  # a last block smaller than k
                d = np.pad(d, ((0, 0), (0, k - d.shape[1])), constant_values=np.inf)
                i = np.pad(i, ((0, 0), (0, k - i.shape[1])), constant_values=-1)
            heap.add_result(np.ascontiguousarray(d), np.where(i >= 0, i + start, -1))
            start += len(block)
        heap.finalize()
        return heap.D, heap.I
    return search


def torch_exact_search(base, k, rows=1024):
    """exact_search's answers from torch, `rows` queries at a time: each base block's k nearest by squared
    distance (matrix products, as faiss.knn computes them), merged with the best so far."""
    held = list(base.batches()) if base.n <= BLOCK else None

    def search_rows(queries):
        best_d, best_i = torch.empty(len(queries), 0), torch.empty(len(queries), 0, dtype=torch.long)
        start = 0
        for block in held if held is not None else base.batches():
            block = torch.from_numpy(np.ascontiguousarray(block, np.float32))
            d, i = torch.cdist(queries, block).square().topk(min(k, len(block)), largest=False)  # the block's best
            best_d, order = torch.cat([best_d, d], 1).topk(min(k, best_d.shape[1] + d.shape[1]), largest=False)
            best_i = torch.cat([best_i, i + start], 1).gather(1, order)
            start += len(block)
        return best_d.numpy(), best_i.numpy()

    def search(batch):
        queries = torch.from_numpy(np.ascontiguousarray(batch, np.float32))
        found = [search_rows(queries[i:i + rows]) for i in range(0, len(queries), rows)]
        return np.concatenate([d for d, _ in found]), np.concatenate([i for _, i in found])
    return search


def approximate_search(base, k, seed):
    """A search in an inverted-file index of the base (8-bit scalar-quantized codes), trained on a
    sample of it and filled a batch at a time."""
    import faiss
    cells = max(1, min(base.n // TRAINING_PER_CELL, 2 ** round(math.log2(max(1, base.n // CELL_POINTS)))))
    index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatL2(base.dim), base.dim, cells, faiss.ScalarQuantizer.QT_8bit,
                                          faiss.METRIC_L2)
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(base.n, min(base.n, 64 * cells), replace=False))
    index.cp.seed = seed
    index.train(base.rows(sample))
    for batch in base.batches():
        index.add(batch)
    index.nprobe = min(NPROBE, cells)

    def search(batch):
        return index.search(batch, k)
    return search
