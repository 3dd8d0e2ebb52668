"""Image files on disk: finding them, decoding them to uint8 tensors (3, S, S) a bounded batch at a
time, the memory-mapped decode cache that training reads them from, and the list of files that
could not be read.
"""
import contextlib
import errno
import hashlib
import io
import json
import mmap
import os
import tempfile
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

from runs import UserError, WriteFailed, atomic_write

Image.init()
# Every extension of a format PIL can open (not only save), lower case.
IMAGE_EXTENSIONS = frozenset(ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN)

# Bumped when the cache's contents would change for the same files (e.g. another resize). 2: EXIF
# orientation, 16/32-bit and float images by their range, transparency on white. 3: a memory-mapped
# array of a folder's training (labeled, then unlabeled) or test images.
CACHE_VERSION = 3
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
    bytes, modification time in ns)]: what a decode cache is keyed by. In the order sorted paths
    have (part by part); hidden files and folders (is_hidden) are left out; symbolic links are
    followed, a folder reached twice (a link loop) is walked once, under its first name in that
    order; a file that cannot be stat-ed (a broken link) gets size and time -1. One os.scandir per
    folder and one stat per file, no Path objects: a second start-up on 60,000 files costs a
    fraction of a second. Returns (entries, number of other files, number of hidden files and
    folders left out)."""
    found, others, hidden, seen = [], 0, 0, set()
    # Depth first, each folder's files and subfolders merged by name: the order of sorted paths
    # (a subfolder "b" comes before a file "b.png"), with no sort of the whole list.
    stack = [(os.fspath(root), "", None)]
    while stack:
        path, rel, stat = stack.pop()
        if stat is not None:
            found.append((rel, *stat))
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
                    children.append((name, (None, rel + name, (st.st_size, st.st_mtime_ns))))
                except OSError:
                    children.append((name, (None, rel + name, (-1, -1))))
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
    return [Path(root) / rel for rel, _, _ in entries], others, hidden


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


def open_as_seen(path, size):
    """An image file opened as_seen, decoded at a reduced scale still at least size x size where the
    format allows it (JPEG: faster). BadImage for an image over PIL's decompression-bomb limit
    (Image.MAX_IMAGE_PIXELS), checked from the header before decoding."""
    with Image.open(path) as img:
        if Image.MAX_IMAGE_PIXELS and img.width * img.height > Image.MAX_IMAGE_PIXELS:
            raise BadImage(f"too large to decode safely ({img.width} x {img.height} pixels, over PIL's "
                           f"limit of {Image.MAX_IMAGE_PIXELS:,})")
        img.draft("RGB", (size, size))
        return as_seen(img)  # a converted copy: it outlives the file


def decode(path, size):
    """One image file as a uint8 (3, size, size) tensor: open_as_seen, then resized (bilinear) to size
    x size. Training, the decode cache and predictions all read images through it. Raises BadImage
    for anything that cannot be read, an image over PIL's decompression-bomb limit included."""
    try:
        img = open_as_seen(path, size).resize((size, size), Image.BILINEAR)
    except BadImage:
        raise
    except Image.DecompressionBombError as exc:
        raise BadImage(f"too large to decode safely ({exc})") from None
    except Exception as exc:  # PIL raises many types for broken files: all are a bad file here
        raise BadImage(f"{type(exc).__name__}: {str(exc).splitlines()[0][:150] if str(exc) else 'unreadable'}") from None
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)


def thumbnail_jpeg(path, size, quality=70):
    """A small JPEG of an image file as a viewer shows it (as_seen, its aspect ratio kept, at most
    size x size), for the review page; None where the file cannot be read."""
    try:
        img = open_as_seen(path, size)
        img.thumbnail((size, size), Image.BILINEAR)
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=quality)
        return out.getvalue()
    except Exception:  # the page lists the file among those that could not be read
        return None


def _decode_or_reason(path, size):
    try:
        return decode(path, size), None
    except BadImage as exc:
        return None, str(exc)


def decode_batches(paths, size, batch_size, workers=None):
    """Yield (paths, uint8 images (n, 3, size, size), {index in the batch: reason} for the files that
    failed) for consecutive batches of paths. The next batch decodes on the pool's threads while the
    caller works on this one: at most two batches are held. The images of failed files are zeros."""
    workers = workers or os.cpu_count()
    chunks = [paths[start:start + batch_size] for start in range(0, len(paths), batch_size)]
    with ThreadPoolExecutor(workers) as pool:  # PIL releases the GIL while it decodes
        pending = pool.map(_decode_or_reason, chunks[0], [size] * len(chunks[0])) if chunks else None
        for k, chunk in enumerate(chunks):
            results = list(pending)
            if k + 1 < len(chunks):
                pending = pool.map(_decode_or_reason, chunks[k + 1], [size] * len(chunks[k + 1]))
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


def write_decoded(f, paths, size, progress, reused=None):
    """The images of paths, decoded a batch at a time, written to the open binary file f, the readable
    ones' rows one after another; returns [(index in paths, reason)] of the files that failed.
    reused: (images, {index in paths: row of images}) of files an older cache already holds: copied,
    not decoded."""
    old, rows = reused or (None, {})
    fresh = [i for i in range(len(paths)) if i not in rows]
    stream = decode_batches([paths[i] for i in fresh], size, DECODE_BATCH)
    decoded, taken = {}, 0  # images of the stream's current batch by index in paths (or the reason it failed)
    bad, block, reported = [], [], 0
    for i in range(len(paths)):
        if i in rows:
            image = old[rows[i]]
        else:
            if i not in decoded:
                chunk, x, failed = next(stream)
                decoded = {fresh[taken + k]: failed.get(k, x[k]) for k in range(len(chunk))}
                taken += len(chunk)
            image = decoded.pop(i)
        if isinstance(image, str):
            bad.append((i, image))
        else:
            block.append(image)
        if len(block) == DECODE_BATCH or i == len(paths) - 1:
            if block:
                f.write(torch.stack(block).numpy().data)
            progress(i + 1 - reported)
            block, reported = [], i + 1
            if old is not None:
                release_pages(old)
    return bad


class DecodeCache:
    """Decoded images of one group of files (a folder's training or test images at one size) in
    three files named `<group>-<size>px-<key>`, keyed by the files' relative paths, sizes and
    modification times and the image size: `.u8`, a header that holds the full key, then the
    readable images' uint8 rows (3, size, size) one after another; `.files.json`, the file of each
    row; `.json`, the counts and the unreadable files.

    Written while decoding, a batch at a time, to a temporary file renamed into place once complete;
    the .json comes last. A cache is used only if its .json and the .u8's header both hold the
    current key and the .u8 has the size they imply: a run killed mid-write leaves only a hidden
    temporary file, never a cache that looks valid. Read memory-mapped (mapped_images). When files
    change (label.py moves some from unlabeled/ to labeled/), the new cache copies every image the
    previous one holds for a file of the same name, size and modification time: only new or
    changed files are decoded."""

    def __init__(self, folder, group, size, entries, echo):
        self.folder, self.group, self.size, self.entries, self.echo = Path(folder), group, size, entries, echo
        self.key = hashlib.sha256(json.dumps([CACHE_VERSION, size, entries]).encode()).hexdigest()
        self.stem = f"{group}-{size}px-{self.key[:20]}"
        self.path, self.meta = self.folder / f"{self.stem}.u8", self.folder / f"{self.stem}.json"
        self.header = f"mtlc decode cache {CACHE_VERSION} {self.key}\n".encode().ljust(HEADER_BYTES)

    def load(self):
        """(images, bad files as [(relative path, reason)]) or None when there is no usable cache."""
        if not self.meta.exists():
            return None
        try:
            return self.read(self.meta, self.entries)
        except Exception as exc:
            self.echo(f"cache {self.meta} is unusable ({type(exc).__name__}: {str(exc)[:100]}): decoding again")
            return None

    def read(self, meta_path, entries=None):
        """(images, bad) of the cache whose .json is meta_path, checked against its header and size
        (and, given entries, against them: the current key)."""
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
        return mapped_images(path, count, self.size, HEADER_BYTES), bad

    def previous(self):
        """(images, {index in paths: row}) of the files that this group's most recent other cache at
        this size holds (same name, size and modification time), or None."""
        metas = sorted((m for m in self.folder.glob(f"{self.group}-{self.size}px-*.json")
                        if not m.name.endswith(".files.json") and m != self.meta), key=lambda m: m.stat().st_mtime)
        if not metas:
            return None
        try:
            old, _ = self.read(metas[-1])
            held = json.loads(metas[-1].with_suffix(".files.json").read_text())
            if len(held) != len(old):
                return None
        except Exception:  # any doubt about the old cache: decode everything
            return None
        rows = {(rel.rsplit("/", 1)[-1], size, mtime): r for r, (rel, size, mtime) in enumerate(held) if size >= 0}
        found = {i: rows.get((rel.rsplit("/", 1)[-1], size, mtime)) for i, (rel, size, mtime) in enumerate(self.entries)}
        return old, {i: r for i, r in found.items() if r is not None}

    def build(self, root, paths, progress):
        """Decode paths into the cache; returns (images, bad, bytes written). Where the cache folder
        cannot be written (no permission) the images go to an unnamed temporary file instead, said in
        one line; a full disk or a file-size limit ends the run (WriteFailed)."""
        reused = self.previous() if self.folder.is_dir() else None
        n_reused = len(reused[1]) if reused else 0
        if len(paths) - n_reused > 1000:
            self.echo(f"decoding {len(paths) - n_reused:,} images of {root} (once: they are cached for the next runs)"
                      + (f"; {n_reused:,} more are taken from the previous cache" if n_reused else ""))

        def write(f):
            f.write(self.header)
            return write_decoded(f, paths, self.size, progress, reused)

        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            failed = atomic_write(self.path, write)
            bad = [(self.entries[i][0], reason) for i, reason in failed]
            unreadable = {i for i, _ in failed}
            rows = [e for i, e in enumerate(self.entries) if i not in unreadable]
            atomic_write(self.folder / f"{self.stem}.files.json", lambda f: f.write(json.dumps(rows).encode()))
            atomic_write(self.meta, lambda f: f.write(json.dumps(dict(
                version=CACHE_VERSION, key=self.key, size=self.size, images=len(paths) - len(bad),
                bad=[list(b) for b in bad])).encode()))
        except (OSError, WriteFailed) as exc:
            if exc.errno in OUT_OF_SPACE:
                raise (WriteFailed(self.path, exc) if isinstance(exc, OSError) else exc) from None
            reason = exc.strerror if isinstance(exc, OSError) else exc.message
            self.echo(f"note: cannot write the decode cache in {self.folder} ({reason}); the images will be "
                      f"decoded again next time (set MTLC_CACHE_DIR to cache elsewhere)")
            return (*self.unnamed(paths, progress), 0)
        self.remove_stale()
        return mapped_images(self.path, len(paths) - len(bad), self.size, HEADER_BYTES), bad, self.path.stat().st_size

    def unnamed(self, paths, progress):
        """(images, bad) decoded into an unnamed temporary file, deleted when the run ends."""
        try:
            f = tempfile.TemporaryFile()
            failed = write_decoded(f, paths, self.size, progress)
            f.flush()
        except OSError as exc:
            raise WriteFailed(Path(tempfile.gettempdir()) / "<temporary file>", exc) from None
        return mapped_images(f, len(paths) - len(failed), self.size), [(self.entries[i][0], r) for i, r in failed]

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
    """The files of entries [(path relative to root, size, modification time)] (scan_images)
    decoded to uint8 images, through root's decode cache (a memory map: the images are read when
    used). Returns (images of the readable files in order, [(path relative to root, reason)] of the
    others, bytes written to the cache: 0 on a hit)."""
    from tqdm import tqdm
    cache = DecodeCache(cache_dir(root), group, size, entries, echo)
    hit = cache.load()
    if hit is not None:
        return (*hit, 0)
    paths = [os.path.join(root, rel) for rel, _, _ in entries]
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
