"""The images a batch of label.py moves into labeled/ that are byte-for-byte copies of test/ images:
trained on with a label, each is a test image the network was taught, and the test error (and the
calibration of --max-error, which rests on it) counts it as unseen. Said before anything moves;
training's start says it too, after the fact. test/ is never read whole: its files are listed with
their sizes, and one is hashed only where a moved image has its size.
"""
import collections
import os
import posixpath

from ..data.files import file_digest, walk_images
from ..disk.console import shown
from ..disk.opening import read_regular

NAMED = 3  # pairs a warning names; the others are counted


def copies_of_test_images(data_dir, moves):
    """[(a moved image's source, the test/ image its bytes equal)], paths relative to data_dir, for
    the moves into labeled/ (Plan's Moves; a move's digest where its row gave one, else its file's)."""
    test = os.path.join(data_dir, "test")
    by_size = collections.defaultdict(list)
    for rel, size, *_ in walk_images(test) if os.path.isdir(test) else ():
        by_size[size].append(rel)
    found, test_digests = [], {}
    if not by_size:
        return found  # no test/ image: nothing to stat (a million moves cost no call)

    def digest(path):
        try:
            return file_digest(read_regular(path))
        except OSError:
            return None
    for move in moves:
        if move.confirms or move.aside or not move.target.startswith("labeled/"):
            continue
        try:
            size = os.stat(os.path.join(data_dir, move.source)).st_size
        except OSError:
            continue
        if size not in by_size:
            continue
        moved = move.digest or digest(os.path.join(data_dir, move.source))
        for rel in by_size[size]:
            if rel not in test_digests:
                test_digests[rel] = digest(os.path.join(test, rel))
            if moved is not None and test_digests[rel] == moved:
                found.append((move.source, posixpath.join("test", rel)))
                break
    return found


def describe_test_copies(found):
    """The warning label.py gives before such moves (found: copies_of_test_images), or None."""
    if not found:
        return None
    named = ", ".join(f"{shown(source)} = {shown(test)}" for source, test in found[:NAMED])
    more = f", and {len(found) - NAMED:,} more" if len(found) > NAMED else ""
    return (f"warning: {len(found):,} of the images moved into labeled/ are byte-for-byte copies of test/ images "
            f"({named}{more}): trained on with a label, they count in the test error and in --max-error's "
            f"calibration as unseen images; leave their rows out, or set the test/ copies aside "
            f"(evaluate.py --audit lists them as leaks)")
