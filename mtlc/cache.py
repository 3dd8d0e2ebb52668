"""The memory-mapped decode cache that training reads a folder's images from: written a batch at a
time, published atomically, keyed by the files it holds, and rebuilt copying only what is certainly
the same file (cache.DecodeCache).
"""
import contextlib
import errno
import functools
import hashlib
import json
import mmap
import os
import tempfile
import time
import weakref
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .errors import WriteFailed
from .images import pooled, read_for_cache
from .runs import atomic_write

# Bumped when the cache's contents would change for the same files (e.g. another resize). 2: EXIF
# orientation, 16/32-bit and float images by their range, transparency on white. 3: a memory-mapped
# array of a folder's training (labeled, then unlabeled) or test images. 4: keyed by the change
# time too; each row's file named with the hash of its bytes; only the allowed formats.
CACHE_VERSION = 4
# The .u8 cache file's header: its key, padded to one alignment-friendly block.
HEADER_BYTES = 128
# Images decoded (and written to the cache) at a time: 1,024 at 96 px are 28 MB.
DECODE_BATCH = 1024
CACHE_DIR_NAME = "mtlc-cache"
# A cache that cannot be written for these reasons ends the run (the next write would fail too);
# for others (no permission) training goes on without it.
OUT_OF_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def cache_dir(data_dir):
    """Where the decoded images of data_dir are cached: data_dir/mtlc-cache, else (data_dir not
    writable) ~/.cache/mtlc/<data_dir's hash>; with $MTLC_CACHE_DIR set, $MTLC_CACHE_DIR/<data_dir's
    hash>: one folder per image folder, so that no folder's cache replaces another's as stale."""
    data_dir = Path(data_dir).resolve()
    folder_key = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    if os.environ.get("MTLC_CACHE_DIR"):
        return Path(os.environ["MTLC_CACHE_DIR"]) / folder_key
    if os.access(data_dir, os.W_OK):
        return data_dir / CACHE_DIR_NAME
    return Path.home() / ".cache" / "mtlc" / folder_key


# The memory maps behind mapped_images' tensors, by the address of their first image: what
# release_pages needs. Weak: a map closes when the last tensor that reads it is gone.
_MAPS = weakref.WeakValueDictionary()


def mapped_images(file, count, size, offset=0):
    """count uint8 images (3, size, size) stored one after another in file (a path or an open file)
    from offset, as a tensor backed by a private, copy-on-write memory map: pages are read when a
    batch touches them and the page cache holds one copy for every process that maps the file. The
    map is advised random: a scattered batch reads its own pages, not megabytes of read-ahead each."""
    if count == 0:
        return torch.zeros(0, 3, size, size, dtype=torch.uint8)
    with open(file, "rb") if isinstance(file, (str, Path)) else contextlib.nullcontext(file) as f:
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


class Previous(NamedTuple):
    """What an older cache of the same files' group holds, for a new cache to copy instead of decode."""
    images: torch.Tensor  # its rows, memory-mapped
    same_file: dict       # {index in the new paths: (row, digest)}: the same path, size and times
    by_digest: dict       # {digest of a file's bytes: row}


def write_decoded(f, paths, size, progress, previous=None):
    """The images of paths, a batch at a time, written to the open binary file f, the readable
    ones' rows one after another. A file that `previous` (an older cache) holds under the same path,
    size and times, or whose bytes have the digest of one of its rows, is copied from it; every other
    file is decoded. Returns ([(index in paths, reason)] of the files that failed, the digest of each
    file's bytes, None where it could not be read)."""
    old, same_file, known = previous or (None, {}, {})
    fresh = [i for i in range(len(paths)) if i not in same_file]
    stream = pooled(functools.partial(read_for_cache, size=size, known=known), [paths[i] for i in fresh], DECODE_BATCH)
    results, taken = {}, 0  # the stream's current batch by index in paths
    bad, digests, block, reported = [], [None] * len(paths), [], 0
    for i in range(len(paths)):
        if i in same_file:
            row, digests[i] = same_file[i]
            image = old[row]
        else:
            if i not in results:
                chunk, out = next(stream)
                results = {fresh[taken + k]: r for k, r in enumerate(out)}
                taken += len(chunk)
            image, reason, digests[i] = results.pop(i)
            if reason is not None:
                bad.append((i, reason))
            elif isinstance(image, int):
                image = old[image]
        if isinstance(image, torch.Tensor):  # None for a file that failed
            block.append(image)
        if len(block) == DECODE_BATCH or i == len(paths) - 1:
            if block:
                f.write(torch.stack(block).numpy().data)
            progress(i + 1 - reported)
            block, reported = [], i + 1
            if old is not None:
                release_pages(old)
    return bad, digests


def content_fingerprint(named_digests):
    """One hash of which files hold which bytes, from (name, digest of its bytes) pairs in order:
    equal for two folders exactly when the same names hold the same bytes, in the same order.
    Hashed a pair at a time, so that a million files need no second list."""
    fingerprint = hashlib.sha256()
    for name, digest in named_digests:
        fingerprint.update(json.dumps([name, digest]).encode() + b"\n")
    return fingerprint.hexdigest()


class DecodeCache:
    """Decoded images of one group of files (a folder's training or test images at one size) in
    three files named `<group>-<size>px-<key>`, keyed by the files' relative paths, sizes,
    modification and change times and the image size: `.u8`, a header that holds the full key, then
    the readable images' uint8 rows (3, size, size) one after another; `.files.json`, the file of
    each row (its path, size, times and the digest of its bytes); `.json`, the counts, the
    unreadable files and the content fingerprint.

    Written while decoding, a batch at a time, to a temporary file renamed into place once complete;
    the .json comes last. A cache is used only if its .json and the .u8's header both hold the
    current key and the .u8 has the size they imply: a run killed mid-write leaves only a hidden
    temporary file, never a cache that looks valid. Read memory-mapped (mapped_images).

    When files change (label.py moves some from unlabeled/ to labeled/), the new cache copies a row
    of the previous one only for the very same file: the same path, size and times, or the same
    bytes (each other file is read and its digest looked up; identical bytes decode to identical
    pixels). A file's name alone never selects a row: two folders' 000.bmp of one size and time are
    two files."""

    def __init__(self, folder, group, size, entries, echo):
        self.folder, self.group, self.size, self.entries, self.echo = Path(folder), group, size, entries, echo
        self.key = hashlib.sha256(json.dumps([CACHE_VERSION, size, entries]).encode()).hexdigest()
        self.stem = f"{group}-{size}px-{self.key[:20]}"
        self.path, self.meta = self.folder / f"{self.stem}.u8", self.folder / f"{self.stem}.json"
        self.header = f"mtlc decode cache {CACHE_VERSION} {self.key}\n".encode().ljust(HEADER_BYTES)

    def load(self):
        """(images, bad files as [(relative path, reason)], content fingerprint) or None when there
        is no usable cache."""
        if not self.meta.exists():
            return None
        try:
            return self.read(self.meta, self.entries)
        except Exception as exc:
            self.echo(f"cache {self.meta} is unusable ({type(exc).__name__}: {str(exc)[:100]}): decoding again")
            return None

    def read(self, meta_path, entries=None):
        """(images, bad, content fingerprint) of the cache whose .json is meta_path, checked against
        its header and size (and, given entries, against them: the current key)."""
        meta = json.loads(meta_path.read_text())
        if meta["version"] != CACHE_VERSION or (entries is not None and meta["key"] != self.key):
            raise ValueError("made from other files")
        bad, count = [tuple(b) for b in meta["bad"]], meta["images"]
        path = meta_path.with_suffix(".u8")
        with open(path, "rb") as f:
            header, length = f.read(HEADER_BYTES), os.fstat(f.fileno()).st_size
        if header != f"mtlc decode cache {CACHE_VERSION} {meta['key']}\n".encode().ljust(HEADER_BYTES):
            raise ValueError("its images were made from other files")
        if (entries is not None and count != len(entries) - len(bad)) or length != HEADER_BYTES + count * 3 * self.size ** 2:
            raise ValueError("wrong size")
        return mapped_images(path, count, self.size, HEADER_BYTES), bad, meta["content"]

    def previous(self):
        """A Previous: the rows of this group's most recent other cache at this size that hold the
        very files of self.entries (same path, size and times) or files with known bytes; None
        where there is no such cache or any doubt about it."""
        metas = sorted((m for m in self.folder.glob(f"{self.group}-{self.size}px-*.json")
                        if not m.name.endswith(".files.json") and m != self.meta), key=lambda m: m.stat().st_mtime)
        if not metas:
            return None
        try:
            old, _, _ = self.read(metas[-1])
            held = json.loads(metas[-1].with_suffix(".files.json").read_text())
            if len(held) != len(old):
                return None
            by_file = {tuple(row[:4]): (r, row[4]) for r, row in enumerate(held)}
            by_digest = {}
            for r, row in enumerate(held):
                by_digest.setdefault(row[4], r)
        except Exception:  # any doubt about the old cache: decode everything
            return None
        same_file = {i: by_file[tuple(e)] for i, e in enumerate(self.entries) if e[1] >= 0 and tuple(e) in by_file}
        return Previous(old, same_file, by_digest)

    def build(self, root, paths, progress):
        """Decode paths into the cache; returns (images, bad, content fingerprint, bytes written).
        Where the cache folder cannot be written (no permission) the images go to an unnamed
        temporary file instead, said in one line; a full disk or a file-size limit ends the run
        (WriteFailed)."""
        previous = self.previous() if self.folder.is_dir() else None
        n_same = len(previous.same_file) if previous else 0
        if len(paths) - n_same > 1000:
            self.echo(f"decoding {len(paths) - n_same:,} images of {root} (once: they are cached for the next runs)"
                      + (f"; {n_same:,} more are taken from the previous cache" if n_same else ""))
        outcome = []

        def write(f):
            f.write(self.header)
            outcome.extend(write_decoded(f, paths, self.size, progress, previous))

        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, write)
            failed, digests = outcome
            bad, count, content = self.outcome(failed, digests)
            atomic_write(self.folder / f"{self.stem}.files.json", lambda f: self.write_rows(f, failed, digests))
            atomic_write(self.meta, lambda f: f.write(json.dumps(dict(
                version=CACHE_VERSION, key=self.key, size=self.size, images=count,
                bad=[list(b) for b in bad], content=content)).encode()))
        except (OSError, WriteFailed) as exc:
            if exc.errno in OUT_OF_SPACE:
                raise (WriteFailed(self.path, exc) if isinstance(exc, OSError) else exc) from None
            reason = exc.strerror if isinstance(exc, OSError) else exc.message
            self.echo(f"note: cannot write the decode cache in {self.folder} ({reason}); the images will be "
                      f"decoded again next time (set MTLC_CACHE_DIR to cache elsewhere)")
            return (*self.unnamed(paths, progress), 0)
        self.remove_stale()
        return mapped_images(self.path, count, self.size, HEADER_BYTES), bad, content, self.path.stat().st_size

    def readable(self, failed):
        """The indices of the files that were read, in order."""
        unreadable = {i for i, _ in failed}
        return (i for i in range(len(self.entries)) if i not in unreadable)

    def outcome(self, failed, digests):
        """(bad files as [(relative path, reason)], the number of rows, the content fingerprint)."""
        return ([(self.entries[i][0], reason) for i, reason in failed], len(self.entries) - len(failed),
                content_fingerprint((self.entries[i][0], digests[i]) for i in self.readable(failed)))

    def write_rows(self, f, failed, digests):
        """The .files.json: [path, size, times, digest] of the file of each row, a row at a time."""
        f.write(b"[")
        for k, i in enumerate(self.readable(failed)):
            f.write((b"," if k else b"") + json.dumps([*self.entries[i], digests[i]]).encode())
        f.write(b"]")

    def unnamed(self, paths, progress):
        """(images, bad, content fingerprint) decoded into an unnamed temporary file, deleted when
        the run ends."""
        try:
            f = tempfile.TemporaryFile()
            failed, digests = write_decoded(f, paths, self.size, progress)
            f.flush()
        except OSError as exc:
            raise WriteFailed(Path(tempfile.gettempdir()) / "<temporary file>", exc) from None
        bad, count, content = self.outcome(failed, digests)
        return mapped_images(f, count, self.size), bad, content

    def remove_stale(self):
        """Delete this group's caches of other files at this size, and temporary files that runs killed
        mid-write left behind (untouched for an hour: a running decode writes every few seconds)."""
        for old in self.folder.glob(f"{self.group}-{self.size}px-*"):
            if not old.name.startswith(self.stem + "."):
                old.unlink(missing_ok=True)
        for tmp in self.folder.glob(f".{self.group}-{self.size}px-*.tmp"):
            with contextlib.suppress(OSError):
                if time.time() - tmp.stat().st_mtime > 3600:
                    tmp.unlink()


def load_images(root, entries, group, size, echo):
    """The files of entries [(path relative to root, size, modification time, change time)]
    (scan_images) decoded to uint8 images, through root's decode cache (a memory map: the images are
    read when used). Returns (images of the readable files in order, [(path relative to root,
    reason)] of the others, their content fingerprint (which names hold which bytes), bytes written
    to the cache: 0 on a hit)."""
    from tqdm import tqdm
    cache = DecodeCache(cache_dir(root), group, size, entries, echo)
    hit = cache.load()
    if hit is not None:
        return (*hit, 0)
    paths = [os.path.join(root, entry[0]) for entry in entries]
    with tqdm(total=len(paths), desc=f"decoding {group}", unit="img", disable=None, leave=False) as bar:
        return cache.build(root, paths, bar.update)
