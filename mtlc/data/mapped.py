"""Arrays memory-mapped from a file the tools keep (the decode cache's uint8 images, a trunk's kept
features) as tensors whose pages are read when a batch touches them and let go after (release_pages),
read ahead on a pass in order (in_order).
"""
import contextlib
import mmap
import os
import weakref

import numpy as np
import torch

from ..disk.opening import open_kept

# The memory maps behind mapped_array's tensors, by the address of their first value: what
# release_pages needs. Weak: a map closes when the last tensor that reads it is gone.
_MAPS = weakref.WeakValueDictionary()


def mapped_array(fd, dtype, shape, offset=0):
    """The values of dtype stored one after another in the open file descriptor fd from offset, as a
    tensor of that shape backed by a private, copy-on-write memory map: pages are read when a batch
    touches them and the page cache holds one copy for every process that maps the file. The map is
    advised random: a scattered batch reads its own pages, not megabytes of read-ahead each."""
    count = int(np.prod(shape))
    if count == 0:
        return torch.from_numpy(np.zeros(shape, dtype))
    length = offset + count * np.dtype(dtype).itemsize
    mm = mmap.mmap(fd, length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    mm.madvise(mmap.MADV_RANDOM)
    x = torch.from_numpy(np.frombuffer(mm, dtype=dtype, count=count, offset=offset)).view(shape)
    _MAPS[x.untyped_storage().data_ptr()] = mm
    return x


def mapped_work_rows(work, name, dtype, width):
    """The rows (width values of dtype each) of the work file `name` (disk/work.py) written so far,
    as a tensor whose pages release_pages lets go."""
    count = work.appended(name).length // (np.dtype(dtype).itemsize * width)
    fd = open_kept(work.folder / name, os.O_RDONLY, "work file")
    try:
        return mapped_array(fd, dtype, (count, width))
    finally:
        os.close(fd)


def mapped_images(f, count, size, offset=0):
    """count uint8 images (3, size, size) stored one after another in the open file f from offset
    (mapped_array)."""
    return mapped_array(f.fileno(), np.uint8, (count, 3, size, size), offset)


def release_pages(x):
    """Let go of the pages of a mapped_array tensor (or a view of one) that this process has read (the page cache
    keeps them for the next reader): its resident memory then holds the batch in use, not every
    image read so far (a page fault maps a whole large folio of the page cache, up to 2 MB, for one
    image of a few kB). A no-op for anything else (a tensor in memory, a numpy array)."""
    mm = _MAPS.get(x.untyped_storage().data_ptr()) if isinstance(x, torch.Tensor) else None
    if mm is not None:
        mm.madvise(mmap.MADV_DONTNEED)


@contextlib.contextmanager
def in_order(x):
    """A pass over every image of a mapped_images tensor in order: the map is advised sequential
    (read ahead) for its duration, random again after."""
    mm = _MAPS.get(x.untyped_storage().data_ptr())
    if mm is None:
        yield
        return
    mm.madvise(mmap.MADV_SEQUENTIAL)
    try:
        yield
    finally:
        mm.madvise(mmap.MADV_RANDOM)


class StackedRows:
    """The rows (n, views, D) of two arrays, `first` then `second`, read as one array of their rows
    without copying either (each may be a memory map, its pages let go after every read): where the
    second has fewer views than the first (held-out images embedded as they are only), its first
    view stands for the others."""

    def __init__(self, first, second):
        self.first, self.second = first, second
        self.shape = (len(first) + len(second), *first.shape[1:])
        self.dtype = first.dtype
        self.nbytes = first.nbytes + second[:, :1].nbytes * first.shape[1]

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, idx):
        if isinstance(idx, int):
            return self[torch.tensor([idx])][0]
        idx = torch.arange(len(self))[idx] if isinstance(idx, slice) else torch.as_tensor(idx)
        rows = torch.empty((len(idx), *self.shape[1:]), dtype=self.dtype)
        in_first = idx < len(self.first)
        rows[in_first] = self.first[idx[in_first]]
        release_pages(self.first)
        if (~in_first).any():
            second = self.second[idx[~in_first] - len(self.first)]
            rows[~in_first] = second[:, :1].expand(-1, self.shape[1], *self.shape[2:])
            release_pages(self.second)
        return rows
