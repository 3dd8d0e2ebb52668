"""The rows of an earlier decode cache, looked up by what tells a file (its path, size and times) or
by the digest of its bytes, in sorted arrays of fixed-size keys: a new cache copies a row instead of
decoding the file again where it is certainly the same file.
"""
import hashlib
import json
from typing import NamedTuple

import numpy as np
import torch


def entry_key(entry):
    """A file's path, size, modification and change time as 16 bytes (BLAKE2b, 128 bits): what a
    previous cache's row is looked up by, without a million tuples in a dict."""
    return hashlib.blake2b(json.dumps(list(entry[:4])).encode("utf-8", "surrogateescape"), digest_size=16).digest()


class SortedRows:
    """Rows of a previous cache looked up by a fixed-size key (entry_key, or the digest of a file's
    bytes) in sorted arrays: a million rows in tens of megabytes, each look-up a binary search. The
    first row of a key where several share it. `key in rows` and `rows[key]` take a key as bytes or
    hex text (read_for_cache's `known`)."""

    def __init__(self, keys):
        self.order = np.argsort(keys, kind="stable")
        self.keys = keys[self.order]

    def rows(self, queries):
        """The row of each query key, -1 where none."""
        pos = np.minimum(np.searchsorted(self.keys, queries), max(len(self.keys) - 1, 0))
        found = (self.keys[pos] == queries) if len(self.keys) else np.zeros(len(queries), bool)
        return np.where(found, self.order[pos] if len(self.keys) else -1, -1)

    def __contains__(self, key):
        return self[key] >= 0

    def __getitem__(self, key):
        key = key.encode() if isinstance(key, str) else key
        return int(self.rows(np.array([key], self.keys.dtype))[0])


class Previous(NamedTuple):
    """What an older cache of the same files' group holds, for a new cache to copy instead of decode."""
    images: torch.Tensor    # its rows, memory-mapped
    same_row: np.ndarray    # per file of the new cache: the row of the very same file (path, size, times), or -1
    digests: np.ndarray     # the digest of each row's file (hex, S32)
    by_digest: SortedRows   # its rows by the digest of their files' bytes
