"""A long list of small records (label.py's planned moves, the rows of a batch to put back) kept in an
unnamed temporary file instead of memory: appended one at a time, read back in order or in reverse
order a chunk at a time. A million records cost a few megabytes of memory, not hundreds. And any
stream taken a chunk at a time (batched). No torch, no numpy: label.py imports it.
"""
import itertools
import json
import os
import tempfile

from ..errors import WriteFailed

CHUNK = 10_000  # records read back at a time


def batched(items, batch_size):
    """Consecutive lists of batch_size items (the last one shorter) of any iterable, taken as needed."""
    items = iter(items)
    while chunk := list(itertools.islice(items, batch_size)):
        yield chunk


class Spill:
    """Records (JSON-able lists) in a temporary file, deleted when closed or collected."""

    def __init__(self):
        try:
            self.file = tempfile.TemporaryFile()
        except OSError as exc:  # a full disk: no usable temporary folder
            raise spill_failed(exc) from None
        self.count, self.offsets = 0, []  # offsets: where each chunk of CHUNK records starts
        self.unwritten = False  # records appended since the last read, maybe still in the buffer

    def append(self, record):
        try:  # a seek writes out what the buffer holds: the disk may refuse it there too
            end = self.file.seek(0, 2)  # a read back may have moved the file's position
            self.file.write(json.dumps(record).encode() + b"\n")
        except OSError as exc:
            raise spill_failed(exc) from None
        self.unwritten = True
        if self.count % CHUNK == 0:
            self.offsets.append(end)
        self.count += 1

    def __len__(self):
        return self.count

    def chunk(self, k):
        """The records of chunk k, in order. The first read after appends writes the buffer out: where
        the disk refuses it, that is said as the temporary file's failure (before anything moved)."""
        if self.unwritten:
            try:
                self.file.flush()
            except OSError as exc:
                raise spill_failed(exc) from None
            self.unwritten = False
        self.file.seek(self.offsets[k])
        return [json.loads(self.file.readline()) for _ in range(min(CHUNK, self.count - k * CHUNK))]

    def chunks(self, limit=None):
        """Lists of consecutive records, in order, up to the first `limit` of them."""
        limit = self.count if limit is None else limit
        for k in range(-(-limit // CHUNK)):
            yield self.chunk(k)[:limit - k * CHUNK]

    def __iter__(self):
        for chunk in self.chunks():
            yield from chunk

    def reversed(self, limit=None):
        """The first `limit` records (all of them), last first."""
        limit = self.count if limit is None else limit
        for k in reversed(range(-(-limit // CHUNK))):
            yield from reversed(self.chunk(k)[:limit - k * CHUNK])

    def close(self):
        self.file.close()


def spill_failed(error):
    """The one-line end of a run whose temporary file the disk refused (before anything moved)."""
    folder = tempfile.tempdir or os.environ.get("TMPDIR") or "/tmp"
    return WriteFailed(f"a temporary file in {folder}", error, after="nothing was moved")
