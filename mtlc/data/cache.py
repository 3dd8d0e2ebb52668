"""The memory-mapped decode cache that training reads a folder's images from: written a batch at a
time, published atomically, keyed by the files it holds, sealed so that only a cache this machine made
is ever used (a folder may come with a cache painted by someone else), and rebuilt copying only what
is certainly the same file (cache.DecodeCache).
"""
import contextlib
import errno
import functools
import hashlib
import io
import json
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ..disk.json_arrays import json_array_items
from ..disk.opening import check_folder, identity, read_kept
from ..disk.outputs import CACHE_DIR_NAME, WORK_SUFFIX
from ..disk.room import check_room
from ..disk.runs import atomic_write
from ..disk.seal import holds, seal, secret
from ..disk.work import Work, remove_work
from ..errors import UserError, WriteFailed
from .cache_rows import Previous, SortedRows, entry_key
from .framing import SQUASH
from .images import pooled, read_for_cache
from .mapped import mapped_images, release_pages

# Bumped when the cache's contents would change for the same files (e.g. another resize). 2: EXIF
# orientation, 16/32-bit and float images by their range, transparency on white. 3: a memory-mapped
# array of a folder's training (labeled, then unlabeled) or test images. 4: keyed by the change
# time too; each row's file named with the hash of its bytes; only the allowed formats. 5: sealed with
# this machine's secret and bound to the very files it wrote. 6: an image of more than
# images.REDUCE_ABOVE pixels reduced as soon as it is decoded (bounded memory).
CACHE_VERSION = 6
# The .u8 cache file's header: its key, padded to one alignment-friendly block.
HEADER_BYTES = 128
# Images decoded (and written to the cache) at a time: 1,024 at 96 px are 28 MB.
DECODE_BATCH = 1024
KEPT_IMAGES = "images.u8"  # the rows decoded so far, in a decode's work folder
# A cache that cannot be written for these reasons ends the run (the next write would fail too);
# for others (no permission) training goes on without it.
OUT_OF_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def read_cache_file(path, sealed_identity=None):
    """A file of the cache open to read (opening.read_kept: never through a link, given its sealed
    identity the very file this machine wrote); ValueError for any other file, the cache then decoded again."""
    try:
        return read_kept(path, "decode cache file", sealed_identity)
    except UserError:
        raise ValueError(f"{path.name} is not a regular file (a link or a pipe)") from None


def cache_dir(data_dir):
    """Where the decoded images of data_dir are cached: data_dir/mtlc-cache, else (data_dir not
    writable) ~/.cache/mtlc/<data_dir's hash>; with $MTLC_CACHE_DIR set, $MTLC_CACHE_DIR/<data_dir's
    hash>: one folder per image folder, so that no folder's cache replaces another's as stale."""
    data_dir = Path(data_dir).resolve()
    folder_key = hashlib.sha256(str(data_dir).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    if os.environ.get("MTLC_CACHE_DIR"):
        return Path(os.environ["MTLC_CACHE_DIR"]) / folder_key
    if os.access(data_dir, os.W_OK):
        check_folder(data_dir / CACHE_DIR_NAME, "decode cache folder")  # a link would take the cache elsewhere
        return data_dir / CACHE_DIR_NAME
    return Path.home() / ".cache" / "mtlc" / folder_key


class JoinedPaths:
    """The full paths of entries under root, made when asked for (a million joined paths are no list)."""

    def __init__(self, root, entries):
        self.root, self.entries = root, entries

    def __len__(self):
        return len(self.entries)

    def __getitem__(self, i):
        return os.path.join(self.root, self.entries[i][0])


def write_decoded(f, paths, size, progress, previous=None, start=0, digests=None, kept=lambda done, bad: None,
                  framing=SQUASH):
    """The images of paths from `start` on, a batch at a time, written to f (anything with a write),
    the readable ones' rows one after another; kept(files done, [(index, reason)] so far) after each
    batch. A file that `previous` (an older cache) holds under the same path, size and times, or whose
    bytes have the digest of one of its rows, is copied from it; every other file is decoded. Returns
    ([(index in paths, reason)] of the files that failed, the digest of each file's bytes as hex (an
    S32 array, empty where it could not be read; `digests` filled in where given)); framed by `framing`."""
    old, same_row, old_digests, known = previous or (None, np.full(len(paths), -1), None, {})
    fresh = np.flatnonzero(same_row[start:] < 0) + start
    stream = pooled(functools.partial(read_for_cache, size=size, known=known, framing=framing), (paths[i] for i in fresh), DECODE_BATCH)
    results, taken = {}, 0  # the stream's current batch by index in paths
    digests = np.zeros(len(paths), "S32") if digests is None else digests
    bad, block, reported = [], [], start
    for i in range(start, len(paths)):
        if same_row[i] >= 0:
            digests[i] = old_digests[same_row[i]]
            image = old[same_row[i]]
        else:
            if i not in results:
                chunk, out = next(stream)
                results = {int(fresh[taken + k]): r for k, r in enumerate(out)}
                taken += len(chunk)
            image, reason, digest = results.pop(i)
            digests[i] = (digest or "").encode()
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
            kept(reported, bad)
            if old is not None:
                release_pages(old)
    return bad, digests


def held_rows(f):
    """Each row [path, size, modification time, change time, digest] of an open .files.json (a JSON
    list of such lists), read a row at a time (a million rows are never one JSON document in memory).
    ValueError for anything else."""
    for row in json_array_items(io.TextIOWrapper(f, encoding="utf-8", errors="surrogateescape")):
        if not isinstance(row, list) or len(row) != 5:
            raise ValueError("a row is not [path, size, modification time, change time, digest]")
        yield row


def content_fingerprint(named_digests):
    """One hash of which files hold which bytes, from (name, digest of its bytes) pairs in order:
    equal for two folders exactly when the same names hold the same bytes, in the same order.
    Hashed a pair at a time, so that a million files need no second list."""
    fingerprint = hashlib.sha256()
    for name, digest in named_digests:
        fingerprint.update(json.dumps([name, digest]).encode() + b"\n")
    return fingerprint.hexdigest()


class DecodeCache:
    """Decoded images of one group of files (a folder's training or test images at one size and
    framing) in three files named `<group>-<size>px<framing's tag>-<key>`, keyed by the files'
    relative paths, sizes, modification and change times, the image size and the framing: `.u8`, a header that holds the full key, then
    the readable images' uint8 rows (3, size, size) one after another; `.files.json`, the file of
    each row (its path, size, times and the digest of its bytes); `.json`, the counts, the
    unreadable files and the content fingerprint.

    Written while decoding, a batch at a time, to a temporary file renamed into place once complete;
    the .json comes last. A cache is used only if its .json and the .u8's header both hold the
    current key and the .u8 has the size they imply: a run killed mid-write leaves only a hidden
    temporary file, never a cache that looks valid. Read memory-mapped (mapped_images).

    A folder may come with a cache made elsewhere, its rows painted and its listing to match. The
    .json holds the identity (device, inode, size, times) of the .u8 and the .files.json this machine
    wrote, and a seal (seal.py: an HMAC under a secret kept outside the folder) of all it says: a cache
    is used, or its rows copied, only where the seal holds and both files are still those very files.
    Anything else (another machine's cache, a tar round trip, a file changed since) is decoded again.

    When files change (label.py moves some from unlabeled/ to labeled/), the new cache copies a row
    of the previous one only for the very same file: the same path, size and times, or the same
    bytes (each other file is read and its digest looked up; identical bytes decode to identical
    pixels). A file's name alone never selects a row: two folders' 000.bmp of one size and time are
    two files."""

    def __init__(self, folder, group, size, entries, echo, framing=SQUASH):
        self.folder, self.group, self.size, self.entries, self.echo = Path(folder), group, size, entries, echo
        self.framing = framing
        # squash's key and names are those of before framings: its caches stay valid
        framed = [framing.as_dict()] if framing != SQUASH else []
        self.key = hashlib.sha256(json.dumps([CACHE_VERSION, size, entries, *framed]).encode()).hexdigest()
        self.sized = f"{group}-{size}px{framing.tag}"  # the caches of one group, size and framing: sized-<key>
        self.stem = f"{self.sized}-{self.key[:20]}"
        self.path, self.meta = self.folder / f"{self.stem}.u8", self.folder / f"{self.stem}.json"
        self.header = f"mtlc decode cache {CACHE_VERSION} {self.key}\n".encode().ljust(HEADER_BYTES)

    def load(self):
        """(images, bad files as [(relative path, reason)], content fingerprint, the rows' digests: a
        function that reads them) or None when there is no usable cache."""
        if not os.path.lexists(self.meta):
            return None
        try:
            images, bad, content, meta = self.read(self.meta, self.entries)
            return images, bad, content, functools.partial(self.row_digests, meta)
        except Exception as exc:
            self.echo(f"cache {self.meta} is unusable ({type(exc).__name__}: {str(exc)[:100]}): decoding again")
            return None

    def read(self, meta_path, entries=None):
        """(images, bad, content fingerprint, the checked metadata) of the cache whose .json is
        meta_path: sealed by this machine, its .u8 the very file it wrote, checked against its header
        and size (and, given entries, against them: the current key). ValueError for anything else."""
        with read_cache_file(meta_path) as f:
            meta = json.loads(f.read())
        if not isinstance(meta, dict) or not holds({k: v for k, v in meta.items() if k != "seal"}, meta.get("seal")):
            raise ValueError("not made by this machine's runs, or changed since")
        if meta["version"] != CACHE_VERSION or (entries is not None and meta["key"] != self.key):
            raise ValueError("made from other files")
        bad, count = [tuple(b) for b in meta["bad"]], meta["images"]
        with read_cache_file(meta_path.with_suffix(".u8"), meta["u8"]) as f:
            header, length = f.read(HEADER_BYTES), os.fstat(f.fileno()).st_size
            if header != f"mtlc decode cache {CACHE_VERSION} {meta['key']}\n".encode().ljust(HEADER_BYTES):
                raise ValueError("its images were made from other files")
            if (entries is not None and count != len(entries) - len(bad)) or length != HEADER_BYTES + count * 3 * self.size ** 2:
                raise ValueError("wrong size")
            return mapped_images(f, count, self.size, HEADER_BYTES), bad, meta["content"], meta

    def row_digests(self, meta):
        """The digest of each row's file (hex, an S32 array) as this cache's .files.json holds them
        (the very file it wrote: meta's identity of it), read a block at a time."""
        digests = np.zeros(meta["images"], "S32")
        with read_cache_file(self.meta.with_suffix(".files.json"), meta["rows"]) as f:
            for r, row in enumerate(held_rows(f)):
                digests[r] = row[4].encode()
        return digests

    def previous(self):
        """A Previous: the rows of this group's most recent other cache at this size that hold the
        very files of self.entries (same path, size and times) or files with known bytes; None
        where there is no such cache or any doubt about it (read's checks: this machine's own)."""
        metas = []
        for m in self.folder.glob(f"{self.sized}-*.json"):
            with contextlib.suppress(OSError):
                st = os.lstat(m)
                if stat.S_ISREG(st.st_mode) and not m.name.endswith(".files.json") and m != self.meta:
                    metas.append((st.st_mtime_ns, m))
        if not metas:
            return None
        latest = max(metas)[1]
        try:
            old, _, _, meta = self.read(latest)
            keys, digests, count = np.zeros(len(old), "S16"), np.zeros(len(old), "S32"), 0
            with read_cache_file(latest.with_suffix(".files.json"), meta["rows"]) as f:
                for count, row in enumerate(held_rows(f), 1):
                    keys[count - 1], digests[count - 1] = entry_key(row), row[4].encode()
            if count != len(old):
                return None
        except Exception:  # any doubt about the old cache: decode everything
            return None
        new_keys = np.array([entry_key(e) for e in self.entries], "S16")
        stamped = np.array([e[1] >= 0 for e in self.entries], bool)
        same_row = np.where(stamped, SortedRows(keys).rows(new_keys), -1)
        return Previous(old, same_row, digests, SortedRows(digests))

    def build(self, root, paths, progress):
        """Decode paths into the cache; returns (images, bad, content fingerprint, the rows' digests
        (a function), bytes written).
        Where the cache folder cannot be written (no permission) the images go to an unnamed
        temporary file instead, said in one line; a full disk or a file-size limit ends the run
        (WriteFailed)."""
        previous = self.previous() if self.folder.is_dir() else None
        n_same = int((previous.same_row >= 0).sum()) if previous else 0
        kept = self.folder / f".{self.stem}{WORK_SUFFIX}" / KEPT_IMAGES  # an interrupted decode's rows, on disk
        kept_bytes = kept.stat().st_size if kept.is_file() else 0
        check_room(self.folder, HEADER_BYTES + len(paths) * 3 * self.size ** 2 - kept_bytes,
                   f"decoding {len(paths):,} images at {self.size} px", "set MTLC_CACHE_DIR to a larger disk, or take "
                   "a smaller --image-size", self.echo)
        if len(paths) - n_same > 1000:
            self.echo(f"decoding {len(paths) - n_same:,} images of {root} (once: they are cached for the next runs"
                      + ("; a file whose bytes the previous cache holds, moved or renamed, is copied from it" * bool(previous))
                      + ")" + (f"; {n_same:,} more are taken from the previous cache as they are" if n_same else ""))
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            work = Work(self.folder / f".{self.stem}{WORK_SUFFIX}", dict(step="decode", key=self.key), self.echo,
                        busy="another run is decoding these images into it now")
            with work.kept_if_interrupted("the images decoded so far"):
                failed, digests = self.decode_into(work, paths, progress, previous)
            os.replace(work.folder / KEPT_IMAGES, self.path)
            work.remove()
            bad, count, content = self.outcome(failed, digests)
            atomic_write(self.folder / f"{self.stem}.files.json", lambda f: self.write_rows(f, failed, digests),
                         own_name=True)
            meta = dict(version=CACHE_VERSION, key=self.key, size=self.size, images=count, bad=[list(b) for b in bad],
                        content=content, u8=identity(os.lstat(self.path)),
                        rows=identity(os.lstat(self.folder / f"{self.stem}.files.json")))
            atomic_write(self.meta, lambda f: f.write(json.dumps(dict(meta, seal=seal(meta))).encode()), own_name=True)
        except (OSError, WriteFailed, UserError) as exc:  # UserError: a folder stands at one of the cache's names
            if getattr(exc, "errno", None) in OUT_OF_SPACE:
                raise (WriteFailed(self.path, exc) if isinstance(exc, OSError) else exc) from None
            reason = exc.strerror if isinstance(exc, OSError) else exc.message
            self.echo(f"note: cannot write the decode cache in {self.folder} ({reason}); the images will be "
                      f"decoded again next time (set MTLC_CACHE_DIR to cache elsewhere)")
            return (*self.unnamed(paths, progress), 0)
        rows = digests[list(self.readable(failed))]
        self.remove_stale()
        if secret()[1]:
            self.echo(f"note: {secret()[1]}: this cache will be decoded again by the next run (set MTLC_CONFIG_DIR "
                      f"to a folder you can write)")
        with read_cache_file(self.path) as f:
            return (mapped_images(f, count, self.size, HEADER_BYTES), bad, content, lambda: rows,
                    os.fstat(f.fileno()).st_size)

    def decode_into(self, work, paths, progress, previous):
        """Decode paths (write_decoded) into the Work's file KEPT_IMAGES, the header first, going on
        after the files an interrupted run kept there (their rows, digests and failures); returns
        (failed, digests) of every file. The file is flushed to disk before it becomes the cache."""
        images, kept_digests = work.appended(KEPT_IMAGES), work.appended("digests")
        if not images.length:
            images.write(self.header)
        done, failed = work.state.setdefault("done", 0), [tuple(b) for b in work.state.setdefault("bad", [])]
        digests = np.zeros(len(paths), "S32")
        if done:
            digests[:done] = np.asarray(work.rows("digests", "S32", 1))[:done, 0]
            self.echo(f"going on with the decode kept in {work.folder}: {done:,} of {len(paths):,} files were done before")
            progress(done)

        def keep(upto, bad):
            kept_digests.write(digests[work.state["done"]:upto].tobytes())
            work.state.update(done=upto, bad=[list(b) for b in failed + bad])
            work.commit()

        bad, digests = write_decoded(images, paths, self.size, progress, previous, start=done, digests=digests, kept=keep,
                                     framing=self.framing)
        work.commit(force=True)
        os.fsync(images.file.fileno())
        work.close()
        return failed + bad, digests

    def readable(self, failed):
        """The indices of the files that were read, in order."""
        unreadable = {i for i, _ in failed}
        return (i for i in range(len(self.entries)) if i not in unreadable)

    def outcome(self, failed, digests):
        """(bad files as [(relative path, reason)], the number of rows, the content fingerprint)."""
        return ([(self.entries[i][0], reason) for i, reason in failed], len(self.entries) - len(failed),
                content_fingerprint((self.entries[i][0], digests[i].decode()) for i in self.readable(failed)))

    def write_rows(self, f, failed, digests):
        """The .files.json: [path, size, times, digest] of the file of each row, a row at a time."""
        f.write(b"[")
        for k, i in enumerate(self.readable(failed)):
            f.write((b"," if k else b"") + json.dumps([*self.entries[i], digests[i].decode()]).encode())
        f.write(b"]")

    def unnamed(self, paths, progress):
        """(images, bad, content fingerprint, the rows' digests (a function)) decoded into an unnamed
        temporary file, deleted when the run ends."""
        try:
            f = tempfile.TemporaryFile()
            failed, digests = write_decoded(f, paths, self.size, progress, framing=self.framing)
            f.flush()
        except OSError as exc:
            raise WriteFailed(Path(tempfile.gettempdir()) / "<temporary file>", exc) from None
        bad, count, content = self.outcome(failed, digests)
        rows = digests[list(self.readable(failed))]
        return mapped_images(f, count, self.size), bad, content, lambda: rows

    def remove_stale(self):
        """Delete this group's caches of other files at this size, and the temporary files and decodes
        kept that runs killed mid-write left behind (untouched for an hour: a running decode writes every
        few seconds)."""
        for old in self.folder.glob(f"{self.sized}-*"):
            if not old.name.startswith(self.stem + "."):
                with contextlib.suppress(OSError):  # a folder of that name (a folder from elsewhere) stays
                    old.unlink(missing_ok=True)
        for tmp in self.folder.glob(f".{self.sized}-*"):
            with contextlib.suppress(OSError):
                if time.time() - os.lstat(tmp).st_mtime > 3600:
                    remove_work(tmp) if tmp.name.endswith(WORK_SUFFIX) else tmp.unlink()


class CachedImages(NamedTuple):
    """A group of a folder's files through the decode cache (load_images)."""
    images: torch.Tensor  # the readable files' images in order, memory-mapped
    bad: list             # [(path relative to root, reason)] of the others
    content: str          # their content fingerprint (which names hold which bytes)
    digests: object       # a function giving the digest of each readable file's bytes (hex, an S32 array)
    written: int          # bytes written to the cache: 0 on a hit


def load_images(root, entries, group, size, echo, framing=SQUASH):
    """The files of entries [(path relative to root, size, modification time, change time)]
    (scan_images) decoded to uint8 images framed by `framing`, through root's decode cache (a memory
    map: the images are read when used): CachedImages."""
    from tqdm import tqdm
    cache = DecodeCache(cache_dir(root), group, size, entries, echo, framing)
    hit = cache.load()
    if hit is not None:
        return CachedImages(*hit, 0)
    paths = JoinedPaths(root, entries)
    with tqdm(total=len(paths), desc=f"decoding {group}", unit="img", disable=None, leave=False) as bar:
        return CachedImages(*cache.build(root, paths, bar.update))
