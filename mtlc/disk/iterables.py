"""Taking a stream a chunk at a time (no torch, no numpy: label.py imports it)."""
import itertools


def batched(items, batch_size):
    """Consecutive lists of batch_size items (the last one shorter) of any iterable, taken as needed."""
    items = iter(items)
    while chunk := list(itertools.islice(items, batch_size)):
        yield chunk
