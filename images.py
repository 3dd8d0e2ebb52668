"""Image files on disk: finding them, decoding them to uint8 tensors (3, S, S) a bounded batch at a
time, the memory-mapped decode cache that training reads them from, and the list of files that
could not be read.
"""
import contextlib
import errno
import functools
import hashlib
import io
import json
import mmap
import os
import stat
import tempfile
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from runs import UserError, WriteFailed, atomic_write

Image.init()
# The formats a file is opened as, whatever its name says: Pillow picks its decoder by a file's
# content, and some of its decoders run other programs (EPS and PostScript: Ghostscript). JPEG's
# decoder also opens MPO, camera JPEGs that carry a second picture; DIB is BMP without its file header.
FORMATS = ("JPEG", "PNG", "BMP", "DIB", "GIF", "TIFF", "WEBP", "PPM")
# The extensions of those formats, lower case: .jpg .jpeg .mpo .png .bmp .gif .tif .tiff .webp .ppm .pgm ...
IMAGE_EXTENSIONS = frozenset(ext for ext, fmt in Image.registered_extensions().items() if fmt in FORMATS + ("MPO",))
READ_AS = ("JPEG", "PNG", "BMP", "GIF", "TIFF", "WebP", "PPM/PGM/PBM")  # FORMATS, as people name them

# Bumped when the cache's contents would change for the same files (e.g. another resize). 2: EXIF
# orientation, 16/32-bit and float images by their range, transparency on white. 3: a memory-mapped
# array of a folder's training (labeled, then unlabeled) or test images. 4: keyed by the change
# time too; each row's file named with the hash of its bytes; only the allowed formats.
CACHE_VERSION = 4
# The .u8 cache file's header: its key, padded to one alignment-friendly block.
HEADER_BYTES = 128
# Images decoded (and written to the cache) at a time: 1,024 at 96 px are 28 MB.
DECODE_BATCH = 1024
# What transparent pixels are composited on: white, as a document viewer or a web page shows them.
BACKGROUND = (255, 255, 255)
CACHE_DIR_NAME = "mtlc-cache"
# A cache that cannot be written for these reasons ends the run (the next write would fail too);
# for others (no permission) training goes on without it.
OUT_OF_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class BadImage(Exception):
    """A file that cannot be decoded as an image; the message says why."""


def is_image_name(name):
    """Whether a file name has the extension of a format PIL opens ('.png' alone is a hidden file)."""
    dot = name.rfind(".")
    return dot > 0 and name[dot:].lower() in IMAGE_EXTENSIONS


def is_hidden(name):
    """Hidden files and folders (a leading '.': macOS's ._* AppleDouble files and .DS_Store, Jupyter's
    .ipynb_checkpoints, .git) and the __MACOSX folder of zip files made on a Mac: never images,
    never classes."""
    return name.startswith(".") or name == "__MACOSX"


def scan_images(root):
    """The image files under root (by extension, any nesting) as [(path relative to root, size in
    bytes, modification time in ns, change time in ns)]: what a decode cache is keyed by (the change
    time, which no program can set back, tells an image edited in place whose size and modification
    time were restored, `touch -r`). In the order sorted paths have (part by part); hidden files and
    folders (is_hidden) are left out; what is not a regular file (a pipe, a socket, a device named
    like an image) counts among the other files; symbolic links are followed, a folder reached twice
    (a link loop) is walked once, under its first name in that order; a file that cannot be stat-ed
    (a broken link) gets -1 for size and times. One os.scandir per folder and one stat per file, no
    Path objects: a second start-up on 60,000 files costs a fraction of a second. Returns (entries,
    number of other files, number of hidden files and folders left out)."""
    found, others, hidden, seen = [], 0, 0, set()
    # Depth first, each folder's files and subfolders merged by name: the order of sorted paths
    # (a subfolder "b" comes before a file "b.png"), with no sort of the whole list.
    stack = [(os.fspath(root), "", None)]
    while stack:
        path, rel, stamp = stack.pop()
        if stamp is not None:
            found.append((rel, *stamp))
            continue
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(path) as listing:
                entries = list(listing)
        except OSError:
            continue
        children = []
        for entry in entries:
            name = entry.name
            if is_hidden(name):
                hidden += 1
            elif is_folder(entry):
                children.append((name, (entry.path, f"{rel}{name}/", None)))
            elif not is_image_name(name):
                others += 1
            else:
                try:
                    st = entry.stat()
                except OSError:
                    children.append((name, (None, rel + name, (-1, -1, -1))))
                    continue
                if stat.S_ISREG(st.st_mode):
                    children.append((name, (None, rel + name, (st.st_size, st.st_mtime_ns, st.st_ctime_ns))))
                else:
                    others += 1
        children.sort(reverse=True)
        stack += [child for _, child in children]
    return found, others, hidden


def is_folder(entry):
    """Whether a scandir entry is a folder, links followed; a broken or looping link is not one."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def find_images(root):
    """scan_images as paths: (sorted image paths under root, number of other files, number of hidden
    files and folders left out)."""
    entries, others, hidden = scan_images(root)
    return [Path(root) / entry[0] for entry in entries], others, hidden


def describe_hidden(count, where):
    """The one line that says how many hidden files and folders were left out, or '' for none."""
    if not count:
        return ""
    return (f"left out {count:,} hidden file{'s' * (count != 1)} and folder{'s' * (count != 1)} in {where} "
            f"(names starting with '.', such as macOS's ._* and .DS_Store or .ipynb_checkpoints, and __MACOSX)")


def eight_bit(img):
    """A 16- or 32-bit integer or a float image (PIL modes I;16*, I, F) as 8-bit grayscale, scaled by
    its range, not clipped: integers by the smallest of 0-255 and 0-65535 that holds them (a 16-bit
    export looks as its 8-bit copy does), floats within [0, 1] by 255, anything else from its own
    minimum to its maximum."""
    x = np.asarray(img, dtype=np.float64)
    low, high = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    if img.mode == "F" and 0 <= low and high <= 1:
        scale, offset = 255.0, 0.0
    elif img.mode != "F" and 0 <= low and high <= 255:
        scale, offset = 1.0, 0.0
    elif img.mode != "F" and 0 <= low and high <= 65535:
        scale, offset = 255.0 / 65535.0, 0.0
    else:
        scale, offset = 255.0 / (high - low) if high > low else 0.0, low
    return Image.fromarray(np.clip((x - offset) * scale, 0, 255).round().astype(np.uint8), "L")


def as_seen(img):
    """An opened image as 8-bit RGB, the way a viewer shows it: its first frame (animated GIF and
    WebP, multi-page TIFF: PIL opens that one), turned upright by its EXIF orientation (phone
    photos), 16/32-bit and float images scaled to 8 bits by their range, transparent pixels
    composited on BACKGROUND, palette, CMYK and other modes converted."""
    try:
        img = ImageOps.exif_transpose(img)
    except Exception:  # a broken EXIF block: the pixels as stored
        pass
    if img.mode.startswith("I") or img.mode == "F":
        img = eight_bit(img)
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info:
        background = Image.new("RGBA", img.size, BACKGROUND + (255,))
        img = Image.alpha_composite(background, img.convert("RGBA"))
    return img.convert("RGB")


def read_file(path):
    """The bytes of an image file. BadImage for what is not a regular file (a pipe named like an
    image would block a plain read forever; it is opened without waiting and refused) or cannot be
    read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise BadImage(exc.strerror or type(exc).__name__) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadImage("not a regular file (a pipe, a socket or a device)")
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError as exc:
        raise BadImage(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)


def file_digest(data):
    """The hash of a file's bytes that names its row in the decode cache (BLAKE2b, 128 bits)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def open_as_seen(data, size):
    """An image file's bytes opened as_seen, decoded at a reduced scale still at least size x size
    where the format allows it (JPEG: faster). Only the FORMATS are tried, whatever the file's name.
    BadImage for another format, or an image over PIL's decompression-bomb limit
    (Image.MAX_IMAGE_PIXELS), checked from the header before decoding."""
    try:
        img = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise BadImage(f"not an image in a format read here ({', '.join(READ_AS)})") from None
    with img:
        if Image.MAX_IMAGE_PIXELS and img.width * img.height > Image.MAX_IMAGE_PIXELS:
            raise BadImage(f"too large to decode safely ({img.width} x {img.height} pixels, over PIL's "
                           f"limit of {Image.MAX_IMAGE_PIXELS:,})")
        img.draft("RGB", (size, size))
        return as_seen(img)  # a converted copy: it outlives the file


def decode_bytes(data, size):
    """An image file's bytes as a uint8 (3, size, size) tensor: open_as_seen, then resized
    (bilinear) to size x size. Training, the decode cache and predictions all decode through it.
    Raises BadImage for anything that cannot be read, an image over PIL's decompression-bomb limit
    included."""
    try:
        img = open_as_seen(data, size).resize((size, size), Image.BILINEAR)
    except BadImage:
        raise
    except Image.DecompressionBombError as exc:
        raise BadImage(f"too large to decode safely ({exc})") from None
    except Exception as exc:  # PIL raises many types for broken files: all are a bad file here
        raise BadImage(f"{type(exc).__name__}: {str(exc).splitlines()[0][:150] if str(exc) else 'unreadable'}") from None
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)


def decode(path, size):
    """One image file as a uint8 (3, size, size) tensor (read_file, decode_bytes); BadImage where
    it cannot be read."""
    return decode_bytes(read_file(path), size)


def thumbnail_jpeg(path, size, quality=70):
    """A small JPEG of an image file as a viewer shows it (as_seen, its aspect ratio kept, at most
    size x size), for the review page; None where the file cannot be read."""
    try:
        img = open_as_seen(read_file(path), size)
        img.thumbnail((size, size), Image.BILINEAR)
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=quality)
        return out.getvalue()
    except Exception:  # the page lists the file among those that could not be read
        return None


def decode_or_reason(path, size):
    """(image, None) or (None, why it cannot be read)."""
    try:
        return decode(path, size), None
    except BadImage as exc:
        return None, str(exc)


def read_for_cache(path, size, known):
    """(image, or the row of an older cache that holds a file with the same bytes (known: {digest:
    row}), or None; None or why the file cannot be read; the digest of its bytes or None)."""
    try:
        data = read_file(path)
    except BadImage as exc:
        return None, str(exc), None
    digest = file_digest(data)
    if digest in known:
        return known[digest], None, digest
    try:
        return decode_bytes(data, size), None, digest
    except BadImage as exc:
        return None, str(exc), digest


def pooled(work, items, batch_size, workers=None):
    """Yield (batch of items, [work(item) for each]) for consecutive batches; the next batch is
    worked on by the pool's threads while the caller handles this one: at most two batches held."""
    chunks = [items[start:start + batch_size] for start in range(0, len(items), batch_size)]
    with ThreadPoolExecutor(workers or os.cpu_count()) as pool:  # PIL releases the GIL while it decodes
        pending = pool.map(work, chunks[0]) if chunks else None
        for k, chunk in enumerate(chunks):
            results = list(pending)
            if k + 1 < len(chunks):
                pending = pool.map(work, chunks[k + 1])
            yield chunk, results


def decode_batches(paths, size, batch_size, workers=None):
    """Yield (paths, uint8 images (n, 3, size, size), {index in the batch: reason} for the files that
    failed) for consecutive batches of paths, the next batch decoding meanwhile (pooled). The images
    of failed files are zeros."""
    for chunk, results in pooled(functools.partial(decode_or_reason, size=size), paths, batch_size, workers):
        out = torch.zeros(len(chunk), 3, size, size, dtype=torch.uint8)
        failed = {}
        for i, (img, reason) in enumerate(results):
            if reason is None:
                out[i] = img
            else:
                failed[i] = reason
        yield chunk, out, failed


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


def content_fingerprint(names, digests):
    """One hash of which files hold which bytes: equal for two folders exactly when the same names
    hold the same bytes, in the same order."""
    return hashlib.sha256(json.dumps([[n, d] for n, d in zip(names, digests)]).encode()).hexdigest()


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
            unreadable = {i for i, _ in failed}
            bad = [(self.entries[i][0], reason) for i, reason in failed]
            readable = [i for i in range(len(paths)) if i not in unreadable]
            content = content_fingerprint([self.entries[i][0] for i in readable], [digests[i] for i in readable])
            rows = [[*self.entries[i], digests[i]] for i in readable]
            atomic_write(self.folder / f"{self.stem}.files.json", lambda f: f.write(json.dumps(rows).encode()))
            atomic_write(self.meta, lambda f: f.write(json.dumps(dict(
                version=CACHE_VERSION, key=self.key, size=self.size, images=len(readable),
                bad=[list(b) for b in bad], content=content)).encode()))
        except (OSError, WriteFailed) as exc:
            if exc.errno in OUT_OF_SPACE:
                raise (WriteFailed(self.path, exc) if isinstance(exc, OSError) else exc) from None
            reason = exc.strerror if isinstance(exc, OSError) else exc.message
            self.echo(f"note: cannot write the decode cache in {self.folder} ({reason}); the images will be "
                      f"decoded again next time (set MTLC_CACHE_DIR to cache elsewhere)")
            return (*self.unnamed(paths, progress), 0)
        self.remove_stale()
        return mapped_images(self.path, len(readable), self.size, HEADER_BYTES), bad, content, self.path.stat().st_size

    def unnamed(self, paths, progress):
        """(images, bad, content fingerprint) decoded into an unnamed temporary file, deleted when
        the run ends."""
        try:
            f = tempfile.TemporaryFile()
            failed, digests = write_decoded(f, paths, self.size, progress)
            f.flush()
        except OSError as exc:
            raise WriteFailed(Path(tempfile.gettempdir()) / "<temporary file>", exc) from None
        unreadable = {i for i, _ in failed}
        readable = [i for i in range(len(paths)) if i not in unreadable]
        content = content_fingerprint([self.entries[i][0] for i in readable], [digests[i] for i in readable])
        return mapped_images(f, len(readable), self.size), [(self.entries[i][0], r) for i, r in failed], content

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


def describe_bad(bad, root, shown=5):
    """'N files cannot be read: a (reason), b (reason), ... and M more'."""
    names = "; ".join(f"{Path(root) / p} ({reason})" for p, reason in bad[:shown])
    more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
    return f"{len(bad)} image file{'s' * (len(bad) != 1)} cannot be read: {names}{more}"


def check_image_size(size):
    if size < 16:
        raise UserError(f"--image-size {size} is too small: the network pools twice and has a 3x3 convolution "
                        f"without padding after that (16 or more)")
