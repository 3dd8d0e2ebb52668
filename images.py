"""Image files on disk: finding them, decoding them to uint8 tensors (3, S, S), in bounded batches
for prediction or all at once for training, the decode cache, and the list of files that could
not be read.
"""
import errno
import hashlib
import io
import json
import os
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
# orientation, 16/32-bit and float images by their range, transparency on white.
CACHE_VERSION = 2
# What transparent pixels are composited on: white, as a document viewer or a web page shows them.
BACKGROUND = (255, 255, 255)
CACHE_DIR_NAME = "mtlc-cache"
# A cache that cannot be written for these reasons ends the run (the next write would fail too);
# for others (no permission) training goes on without it.
OUT_OF_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class BadImage(Exception):
    """A file that cannot be decoded as an image; the message says why."""


def is_image_name(path):
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def is_hidden(name):
    """Hidden files and folders (a leading '.': macOS's ._* AppleDouble files and .DS_Store, Jupyter's
    .ipynb_checkpoints, .git) and the __MACOSX folder of zip files made on a Mac: never images,
    never classes."""
    return name.startswith(".") or name == "__MACOSX"


def find_images(root):
    """The image files under root (by extension, any nesting), sorted; hidden files and folders
    (is_hidden) are left out; symbolic links are followed, a folder reached twice (a link loop) is
    walked once. Returns (paths, number of other files, number of hidden files and folders left out)."""
    found, others, hidden, seen = [], 0, 0, set()
    for folder, dirs, files in os.walk(root, followlinks=True):
        try:
            st = os.stat(folder)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        hidden += sum(map(is_hidden, dirs))
        # Sorted: a folder reached by two names is listed under the same one on every run.
        dirs[:] = sorted(d for d in dirs if not is_hidden(d))
        for name in files:
            if is_hidden(name):
                hidden += 1
            elif is_image_name(name):
                found.append(Path(folder) / name)
            else:
                others += 1
    return sorted(found), others, hidden


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
    failed) for consecutive batches of paths; only one batch is decoded at a time. The images of
    failed files are zeros."""
    workers = workers or os.cpu_count()
    with ThreadPoolExecutor(workers) as pool:  # PIL releases the GIL while it decodes
        for start in range(0, len(paths), batch_size):
            chunk = paths[start:start + batch_size]
            out = torch.zeros(len(chunk), 3, size, size, dtype=torch.uint8)
            failed = {}
            for i, (img, reason) in enumerate(pool.map(_decode_or_reason, chunk, [size] * len(chunk))):
                if reason is None:
                    out[i] = img
                else:
                    failed[i] = reason
            yield chunk, out, failed


def decode_all(paths, size, progress=None):
    """All files as one uint8 tensor (N good, 3, size, size) and [(path, reason)] of those that
    failed. `progress(n)` is called after each batch of n files."""
    out = torch.empty(len(paths), 3, size, size, dtype=torch.uint8)
    good, bad, done = torch.ones(len(paths), dtype=torch.bool), [], 0
    for chunk, x, failed in decode_batches(paths, size, 1024):
        out[done:done + len(chunk)] = x
        for i, reason in failed.items():
            good[done + i] = False
            bad.append((chunk[i], reason))
        done += len(chunk)
        if progress:
            progress(len(chunk))
    return (out if not bad else out[good]), bad


def file_list(root, paths):
    """[(path relative to root, size in bytes, modification time in ns)]: what a cache is keyed by.
    A file that cannot be stat-ed (a broken link) gets size and time -1."""
    entries = []
    for p in paths:
        try:
            st = os.stat(p)
            entries.append((Path(p).relative_to(root).as_posix(), st.st_size, st.st_mtime_ns))
        except OSError:
            entries.append((Path(p).relative_to(root).as_posix(), -1, -1))
    return entries


def cache_dir(data_dir):
    """Where the decoded images of data_dir are cached: $MTLC_CACHE_DIR if set, else
    data_dir/mtlc-cache, else (data_dir not writable) ~/.cache/mtlc/<data_dir's hash>."""
    if os.environ.get("MTLC_CACHE_DIR"):
        return Path(os.environ["MTLC_CACHE_DIR"])
    data_dir = Path(data_dir).resolve()
    if os.access(data_dir, os.W_OK):
        return data_dir / CACHE_DIR_NAME
    return Path.home() / ".cache" / "mtlc" / hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]


class DecodeCache:
    """Decoded images of one group of files (e.g. D/unlabeled at 32 px) in one file
    `<group>-<size>px-<key>.pt`, keyed by the files' relative paths, sizes and modification times
    and the image size. A cache is used only if the file list stored in it equals the current one
    exactly; a stale one (the files changed) is replaced, an unreadable one rebuilt."""

    def __init__(self, folder, group, size, entries, echo):
        self.folder, self.group, self.size, self.entries, self.echo = Path(folder), group, size, entries, echo
        key = json.dumps([CACHE_VERSION, size, entries]).encode()
        self.path = self.folder / f"{group}-{size}px-{hashlib.sha256(key).hexdigest()[:20]}.pt"

    def load(self):
        """(images, bad files as [(relative path, reason)]) or None when there is no usable cache."""
        if not self.path.exists():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
            if state["version"] != CACHE_VERSION or state["size"] != self.size:
                raise ValueError("another version")
            if [tuple(e) for e in state["entries"]] != self.entries:
                raise ValueError("made from other files")
            x, bad = state["images"], [tuple(b) for b in state["bad"]]
            if x.dtype != torch.uint8 or tuple(x.shape) != (len(self.entries) - len(bad), 3, self.size, self.size):
                raise ValueError("wrong shape")
        except Exception as exc:
            self.echo(f"cache {self.path} is unusable ({type(exc).__name__}: {str(exc)[:100]}): decoding again")
            return None
        return x, bad

    def save(self, x, bad):
        """Write the cache and delete the stale ones of the same group and size; returns the bytes
        written. A folder that cannot be written is said, not fatal (0 bytes)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            state = dict(version=CACHE_VERSION, size=self.size, entries=self.entries, images=x,
                         bad=[list(b) for b in bad])
            atomic_write(self.path, lambda f: torch.save(state, f))
        except (OSError, WriteFailed) as exc:
            if exc.errno in OUT_OF_SPACE:
                raise (WriteFailed(self.path, exc) if isinstance(exc, OSError) else exc) from None
            reason = exc.strerror if isinstance(exc, OSError) else exc.message
            self.echo(f"note: cannot write the decode cache in {self.folder} ({reason}); the images will be "
                      f"decoded again next time (set MTLC_CACHE_DIR to cache elsewhere)")
            return 0
        for old in self.folder.glob(f"{self.group}-{self.size}px-*.pt"):
            if old != self.path:
                old.unlink(missing_ok=True)
        return self.path.stat().st_size


def load_images(root, paths, group, size, echo, data_dir=None):
    """The files `paths` (under root) decoded to one uint8 tensor, through the decode cache of
    data_dir (default root). Returns (images of the good files in order, [(relative path, reason)]
    of the bad ones, commit): commit() writes the cache after a miss, once the caller has checked
    the files (a run that ends on bad input writes nothing) and returns the bytes it wrote."""
    from tqdm import tqdm
    entries = file_list(root, paths)
    cache = DecodeCache(cache_dir(data_dir or root), group, size, entries, echo)
    hit = cache.load()
    if hit is not None:
        return (*hit, lambda: 0)
    if len(paths) > 1000:
        echo(f"decoding {len(paths):,} images of {root} (once: they are cached for the next runs)")
    bar = tqdm(total=len(paths), desc=f"decoding {group}", unit="img", disable=None, leave=False)
    x, bad = decode_all(paths, size, progress=bar.update)
    bar.close()
    bad = [(Path(p).relative_to(root).as_posix(), reason) for p, reason in bad]
    return x, bad, lambda: cache.save(x, bad)


def describe_bad(bad, root, shown=5):
    """'N files cannot be read: a (reason), b (reason), ... and M more'."""
    names = "; ".join(f"{Path(root) / p} ({reason})" for p, reason in bad[:shown])
    more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
    return f"{len(bad)} image file{'s' * (len(bad) != 1)} cannot be read: {names}{more}"


def check_image_size(size):
    if size < 16:
        raise UserError(f"--image-size {size} is too small: the network pools twice and has a 3x3 convolution "
                        f"without padding after that (16 or more)")
