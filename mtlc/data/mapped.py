"""Files the tools keep, opened and memory-mapped: a kept file checked to be the very file this machine
wrote (its identity), and uint8 images mapped from a file as a tensor whose pages are read when a batch
touches them and let go after (release_pages), read ahead on a pass in order (in_order).
"""
import contextlib
import mmap
import os
import weakref

import numpy as np
import torch

from ..errors import UserError
from ..disk.opening import open_kept


def identity(st):
    """What tells one file from every other and from itself after a change: its device, inode, size,
    modification and change time (no program can set a change time back)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def open_identified(path, expected):
    """An open binary file of the kept file `path` (never through a link), checked to be the very
    file whose identity was sealed; ValueError otherwise."""
    f = open_cache_file(path)
    if identity(os.fstat(f.fileno())) != expected:
        f.close()
        raise ValueError(f"{path.name} is not the file this machine wrote (changed, replaced or copied since)")
    return f


# The memory maps behind mapped_images' tensors, by the address of their first image: what
# release_pages needs. Weak: a map closes when the last tensor that reads it is gone.
_MAPS = weakref.WeakValueDictionary()


def open_cache_file(path):
    """An open binary file of a file of the cache, never through a link, never a pipe (ValueError)."""
    try:
        return open(open_kept(path, os.O_RDONLY, "decode cache file"), "rb")
    except UserError:
        raise ValueError(f"{path.name} is not a regular file (a link or a pipe)") from None


def mapped_images(f, count, size, offset=0):
    """count uint8 images (3, size, size) stored one after another in the open file f from offset, as a tensor backed by a private, copy-on-write memory map: pages are read when a
    batch touches them and the page cache holds one copy for every process that maps the file. The
    map is advised random: a scattered batch reads its own pages, not megabytes of read-ahead each."""
    if count == 0:
        return torch.zeros(0, 3, size, size, dtype=torch.uint8)
    length = offset + count * 3 * size * size
    mm = mmap.mmap(f.fileno(), length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    mm.madvise(mmap.MADV_RANDOM)
    x = torch.from_numpy(np.frombuffer(mm, dtype=np.uint8, count=length - offset, offset=offset)).view(count, 3, size, size)
    _MAPS[x.untyped_storage().data_ptr()] = mm
    return x


def release_pages(x):
    """Let go of the pages of a mapped_images tensor that this process has read (the page cache
    keeps them for the next reader): its resident memory then holds the batch in use, not every
    image read so far (a page fault maps a whole large folio of the page cache, up to 2 MB, for one
    image of a few kB). A no-op for a tensor in memory."""
    mm = _MAPS.get(x.untyped_storage().data_ptr())
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
