"""Decoding image files to uint8 tensors (3, S, S) the way a viewer shows them, a bounded batch at
a time on a pool of threads; the file's bytes are read once (and hashed, for the decode cache).
"""
import contextlib
import ctypes
import ctypes.util
import functools
import io
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from ..disk.opening import read_regular
from ..disk.spill import batched
from .files import FORMATS, READ_AS, file_digest
from .framing import SQUASH

# What transparent pixels are composited on: white, as a document viewer or a web page shows them.
BACKGROUND = (255, 255, 255)
# An image of more pixels than this is reduced (a box average by a whole factor, to at least 4x the
# side asked for) as soon as it is decoded, before it is turned upright, composited or converted: each
# of those steps copies the image, and a 9,400 x 9,400 RGBA PNG of 343 KB cost 1.5 GB of them
# (docs/decode-memory.md). Smaller images (a phone's 12-megapixel photos) decode as they always did.
REDUCE_ABOVE = 16_000_000
# The pixels that the decoding threads may hold at once, whatever the number of cores: a thread waits
# until the images in flight leave room for its own (an image larger than this decodes alone).
PIXELS_IN_FLIGHT = 64_000_000
STRIP_PIXELS = 1_000_000  # the pixels of a strip that reduced() reduces at a time


class PixelBudget:
    """The pixels of the images being decoded at once, bounded: `holding(n)` waits until n more fit
    (or nothing else is held), and gives them back after."""

    def __init__(self, most):
        self.most, self.held, self.changed = most, 0, threading.Condition()

    @contextlib.contextmanager
    def holding(self, n):
        n = min(n, self.most)  # an image over the budget takes all of it: it decodes alone
        with self.changed:
            self.changed.wait_for(lambda: self.held + n <= self.most)
            self.held += n
        try:
            yield
        finally:
            with self.changed:
                self.held -= n
                self.changed.notify_all()


DECODING = PixelBudget(PIXELS_IN_FLIGHT)


class BadImage(Exception):
    """A file that cannot be decoded as an image; the message says why."""


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
    return converted(img)


def converted(img):
    """as_seen's conversions of an upright image (8 bits, composited, RGB)."""
    if img.mode.startswith("I") or img.mode == "F":
        img = eight_bit(img)
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info:
        background = Image.new("RGBA", img.size, BACKGROUND + (255,))
        img = Image.alpha_composite(background, img.convert("RGBA"))
    return img.convert("RGB")


def read_file(path):
    """The bytes of an image file (disk.opening.read_regular: never a pipe); BadImage where it cannot be read."""
    try:
        return read_regular(path)
    except OSError as exc:
        raise BadImage(exc.strerror or str(exc) or type(exc).__name__) from None


def open_as_seen(data, size):
    """An image file's bytes opened as_seen, decoded at a reduced scale still at least size x size
    where the format allows it (JPEG: faster). Only the FORMATS are tried, whatever the file's name.
    BadImage for another format, or an image over PIL's decompression-bomb limit
    (Image.MAX_IMAGE_PIXELS), checked from the header before decoding."""
    if not data:
        raise BadImage("an empty file (0 bytes)")
    # A photo's EXIF block that claims more bytes than the file holds ("Tag data larger than file") is
    # read as far as it goes; PIL's warning of it, per tag and decode thread, is nothing a user can act on.
    # Set here, not at import: a filter set inside a caller's catch_warnings (pytest's) ends with it.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.TiffImagePlugin")
    try:
        img = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise BadImage(f"not an image in a format read here ({', '.join(READ_AS)})") from None
    with img:
        if Image.MAX_IMAGE_PIXELS and img.width * img.height > Image.MAX_IMAGE_PIXELS:
            raise BadImage(f"too large to decode safely ({img.width} x {img.height} pixels, over PIL's "
                           f"limit of {Image.MAX_IMAGE_PIXELS:,})")
        img.draft("RGB", (size, size))
        with DECODING.holding(img.width * img.height):
            return as_seen(reduced(img, size))  # a converted copy: it outlives the file


@functools.cache
def c_library():
    """The C library, where it has glibc's malloc_trim (Linux), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def return_freed_memory():
    """Give the memory a huge image was decoded in back to the system: glibc keeps what a thread frees
    in that thread's own arena, where the next huge image (on another thread) cannot reuse it, so that
    each decoding thread would hold an image's worth (measured: docs/decode-memory.md)."""
    libc = c_library()
    if libc is not None:
        libc.malloc_trim(0)


def reduced(img, size):
    """A decoded image of more than REDUCE_ABOVE pixels reduced by a whole factor, at least 4 * size on
    its shorter side (its EXIF orientation kept for as_seen), a strip of rows at a time (Pillow's own
    reduce of an RGBA image makes a premultiplied copy of all of it first), the decoded image let go
    at once; others as they are."""
    factor = min(img.width, img.height) // (4 * size)
    if img.width * img.height <= REDUCE_ABOVE or factor < 2:
        return img
    exif, info = img.getexif(), dict(img.info)
    img.load()
    if img.mode in ("P", "PA", "1"):  # no reduce for a palette: its colours first
        img = img.convert("RGBA" if img.mode == "PA" or "transparency" in img.info else "RGB")
    small = Image.new(img.mode, (img.width // factor, img.height // factor))
    rows = factor * max(1, STRIP_PIXELS // (img.width * factor))
    for top in range(0, small.height * factor, rows):
        bottom = min(top + rows, small.height * factor)
        small.paste(img.crop((0, top, small.width * factor, bottom)).reduce(factor), (0, top // factor))
    img.close()  # its pixels freed now, not when the caller lets go of it
    return_freed_memory()
    small.info.update(info)
    if exif:
        small.getexif().update(exif)
    return small


def decode_bytes(data, size, framing=SQUASH):
    """An image file's bytes as a uint8 (3, size, size) tensor: open_as_seen, then framed (framing.py:
    squashed, cropped or padded) to size x size. Training, the decode cache and predictions all decode
    through it. Raises BadImage for anything that cannot be read, an image over PIL's
    decompression-bomb limit included."""
    try:
        img = framing(open_as_seen(data, framing.decoded_side(size)), size)
    except BadImage:
        raise
    except Image.DecompressionBombError as exc:
        raise BadImage(f"too large to decode safely ({exc})") from None
    except Exception as exc:  # PIL raises many types for broken files: all are a bad file here
        raise BadImage(f"{type(exc).__name__}: {str(exc).splitlines()[0][:150] if str(exc) else 'unreadable'}") from None
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)


def decode(path, size, framing=SQUASH):
    """One image file as a uint8 (3, size, size) tensor (read_file, decode_bytes); BadImage where
    it cannot be read."""
    return decode_bytes(read_file(path), size, framing)


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


def decode_or_reason(path, size, framing=SQUASH):
    """(image, None, the digest of the file's bytes) or (None, why it cannot be read, the digest or
    None where not even its bytes could be read)."""
    try:
        data = read_file(path)
    except BadImage as exc:
        return None, str(exc), None
    try:
        return decode_bytes(data, size, framing), None, file_digest(data)
    except BadImage as exc:
        return None, str(exc), file_digest(data)


def read_for_cache(path, size, known, framing=SQUASH):
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
        return decode_bytes(data, size, framing), None, digest
    except BadImage as exc:
        return None, str(exc), digest


def pooled(work, items, batch_size, workers=None):
    """Yield (batch of items, [work(item) for each]) for consecutive batches of an iterable (a list,
    or a stream of files as they are found); the next batch is worked on by the pool's threads while
    the caller handles this one: at most two batches held."""
    chunks = batched(items, batch_size)
    with ThreadPoolExecutor(workers or os.cpu_count()) as pool:  # PIL releases the GIL while it decodes
        chunk = next(chunks, None)
        pending = pool.map(work, chunk) if chunk else None
        while chunk is not None:
            results = list(pending)
            following = next(chunks, None)
            if following is not None:
                pending = pool.map(work, following)
            yield chunk, results
            chunk = following


def decode_batches(paths, size, batch_size, workers=None, framing=SQUASH):
    """Yield (paths, uint8 images (n, 3, size, size), {index in the batch: reason} for the files that
    failed, the digest of each file's bytes (None where they could not be read)) for consecutive
    batches of paths, the next batch decoding meanwhile (pooled). The images of failed files are zeros."""
    for chunk, results in pooled(functools.partial(decode_or_reason, size=size, framing=framing), paths, batch_size, workers):
        out = torch.zeros(len(chunk), 3, size, size, dtype=torch.uint8)
        failed = {}
        for i, (img, reason, _) in enumerate(results):
            if reason is None:
                out[i] = img
            else:
                failed[i] = reason
        yield chunk, out, failed, [digest for _, _, digest in results]
