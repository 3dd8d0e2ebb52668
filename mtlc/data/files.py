"""Image files on disk: which files are images (by extension, of the formats read), finding them
under a folder in the order sorted paths have, hidden files, reading a file's bytes and the hash of
them that binds a CSV's row to its image, and the lines that name them.
"""
import collections
import hashlib
import os
import stat
from pathlib import Path

from PIL import Image

from ..disk.console import shown as escaped

Image.init()
# The formats a file is opened as, whatever its name says: Pillow picks its decoder by a file's
# content, and some of its decoders run other programs (EPS and PostScript: Ghostscript). JPEG's
# decoder also opens MPO, camera JPEGs that carry a second picture; DIB is BMP without its file header.
FORMATS = ("JPEG", "PNG", "BMP", "DIB", "GIF", "TIFF", "WEBP", "PPM")
# The extensions of those formats, lower case: .jpg .jpeg .mpo .png .bmp .gif .tif .tiff .webp .ppm .pgm ...
IMAGE_EXTENSIONS = frozenset(ext for ext, fmt in Image.registered_extensions().items() if fmt in FORMATS + ("MPO",))
READ_AS = ("JPEG", "PNG", "BMP", "GIF", "TIFF", "WebP", "PPM/PGM/PBM")  # FORMATS, as people name them
# walk_images counts the other files it leaves out in "others", and by kind under (OTHER, kind): the
# name's other_kind, or NOT_REGULAR; MOST_KINDS kinds at most.
OTHER, NOT_REGULAR = "other", "pipes, sockets or devices"
MOST_KINDS = 100


# The bytes of the hash that names a file's content in the decode cache, in the content fingerprint
# checkpoints keep, and in every CSV the project writes (BLAKE2b, 128 bits: a replaced image never
# has its predecessor's; the checkpoints' fingerprints since the decode cache began hashing are of it).
DIGEST_BYTES = 16
# The CSV column that holds it: which image a row was written for.
DIGEST_COLUMN = "blake2b"


class NotRegular(OSError):
    """A path that is no regular file (a pipe, a socket, a device named like an image)."""


def open_regular(path):
    """A file descriptor of a regular file, links followed, opened to read. A pipe named like an image
    would block a plain open or read forever: the file is opened without waiting and refused
    (NotRegular) unless it is a regular file; OSError where it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular("not a regular file (a pipe, a socket or a device)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path):
    """The bytes of a regular file (open_regular); OSError where it cannot be read."""
    with open(open_regular(path), "rb") as f:
        return f.read()


def file_digest(data):
    """The hash of a file's bytes (BLAKE2b, DIGEST_BYTES) as hex."""
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).hexdigest()


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
    time were restored, `touch -r`). walk_images's entries, in its order, as a list. Returns (entries,
    walk_images's counts of what it left out)."""
    counts = collections.Counter()
    found = list(walk_images(root, counts))
    return found, counts


def walk_images(root, counts=None):
    """Yield scan_images's entries one at a time, in the order sorted paths have (part by part),
    holding one folder's listing at a time, not the tree's: a million files cost no list of them.
    Hidden files and folders (is_hidden) are left out and counted in counts["hidden"]; other files
    (other extensions; a pipe, a socket, a device named like an image) in counts["others"], and by
    kind (extension) in counts[OTHER, kind] (describe_others);
    symbolic links are followed, a folder reached twice (a link loop) is walked once, under its first
    name in that order; a file that cannot be stat-ed (a broken link) gets -1 for size and times. One
    os.scandir per folder and one stat per file, no Path objects: a second start-up on 60,000 files
    costs a fraction of a second."""
    counts = counts if counts is not None else collections.Counter()
    seen = set()
    # Depth first, each folder's files and subfolders merged by name: the order of sorted paths
    # (a subfolder "b" comes before a file "b.png"), with no sort of the whole list.
    stack = [(os.fspath(root), "", None)]
    while stack:
        path, rel, stamp = stack.pop()
        if stamp is not None:
            yield (rel, *stamp)
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
                counts["hidden"] += 1
            elif is_folder(entry):
                children.append((name, (entry.path, f"{rel}{name}/", None)))
            elif not is_image_name(name):
                count_other(counts, other_kind(name))
            else:
                try:
                    st = entry.stat()
                except OSError:
                    children.append((name, (None, rel + name, (-1, -1, -1))))
                    continue
                if stat.S_ISREG(st.st_mode):
                    children.append((name, (None, rel + name, (st.st_size, st.st_mtime_ns, st.st_ctime_ns))))
                else:
                    count_other(counts, NOT_REGULAR)
        children.sort(reverse=True)
        stack += [child for _, child in children]


def is_folder(entry):
    """Whether a scandir entry is a folder, links followed; a broken or looping link is not one."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def other_kind(name, longest=12):
    """The kind of a file that is no image, by its name: its extension in lower case, cut short (a
    stranger's 200-character extension is one kind), or '' for none."""
    dot = name.rfind(".")
    extension = name[dot:].lower() if dot > 0 else ""
    return extension if len(extension) <= longest else extension[:longest - 3] + "..."


def count_other(counts, kind):
    """Count a file left out, and its kind among the first MOST_KINDS (a stranger's folder of a
    million extensions costs no million counters)."""
    counts["others"] += 1
    if (OTHER, kind) in counts or len(counts) <= MOST_KINDS:
        counts[OTHER, kind] += 1


def find_images(root):
    """scan_images as paths: (sorted image paths under root, the counts of what was left out)."""
    entries, counts = scan_images(root)
    return [Path(root) / entry[0] for entry in entries], counts


def describe_others(counts, where, shown=5):
    """The one line that names the kinds of other files walk_images left out (counts), or '' for none:
    a folder of phone photos in HEIC, or of videos, is not silently taken for a smaller folder."""
    total = counts.get("others", 0)
    if not total:
        return ""
    kinds = sorted(((n, key[1]) for key, n in counts.items() if isinstance(key, tuple) and key[0] == OTHER),
                   key=lambda item: (-item[0], item[1]))
    named = [f"{n:,} {escaped(kind) if kind else 'without extension'}" for n, kind in kinds[:shown]]
    rest = total - sum(n for n, _ in kinds[:shown])
    heic = ("; HEIC/HEIF photos (iPhones, Macs) are not read: export them as JPEG to use them"
            if {kind for _, kind in kinds} & {".heic", ".heif"} else "")
    return (f"left out {total:,} file{'s' * (total != 1)} in {where} that "
            f"{'are not images' if total != 1 else 'is not an image'} of the formats read ({', '.join(READ_AS)}): "
            f"{', '.join(named)}{f', {rest:,} of other kinds' if rest else ''}{heic}")


def describe_hidden(count, where):
    """The one line that says how many hidden files and folders were left out, or '' for none."""
    if not count:
        return ""
    return (f"left out {count:,} hidden file{'s' * (count != 1)} and folder{'s' * (count != 1)} in {where} "
            f"(names starting with '.', such as macOS's ._* and .DS_Store or .ipynb_checkpoints, and __MACOSX)")


def describe_bad(bad, root, shown=5):
    """'N files cannot be read: a (reason), b (reason), ... and M more'."""
    names = "; ".join(f"{escaped(Path(root) / p)} ({reason})" for p, reason in bad[:shown])
    more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
    return f"{len(bad)} image file{'s' * (len(bad) != 1)} cannot be read: {names}{more}"
