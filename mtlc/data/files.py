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
from ..errors import UserError

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
OUTSIDE = "links leading out"  # walk_images's count of the links it followed out of its root
MOST_KINDS = 100


# The bytes of the hash that names a file's content in the decode cache, in the content fingerprint
# checkpoints keep, and in every CSV the project writes (BLAKE2b, 128 bits: a replaced image never
# has its predecessor's; the checkpoints' fingerprints since the decode cache began hashing are of it).
DIGEST_BYTES = 16
# The CSV column that holds it: which image a row was written for.
DIGEST_COLUMN = "blake2b"


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
    symbolic links are followed (those that lead out of root counted in counts[OUTSIDE]), a folder
    reached twice (a link loop) is walked once, under its first name in that order; a file that
    cannot be stat-ed (a broken link) gets -1 for size and times. One
    os.scandir per folder and one stat per file, no Path objects: a second start-up on 60,000 files
    costs a fraction of a second."""
    counts = counts if counts is not None else collections.Counter()
    seen, inside = set(), os.path.realpath(root) + os.sep
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
                continue
            if entry.is_symlink() and not os.path.realpath(entry.path).startswith(inside):
                counts[OUTSIDE] += 1
            if is_folder(entry):
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
    stranger's 200-character extension is one kind), or '' for none; an image's extension with the
    spaces and dots after it (IMG_1.JPG. is of kind '.jpg.')."""
    stripped = name.rstrip(" .")
    dot = stripped.rfind(".") if stripped != name and is_image_name(stripped) else name.rfind(".")
    extension = name[dot:].lower() if dot > 0 else ""
    return extension if len(extension) <= longest else extension[:longest - 3] + "..."


def telling(kind):
    """Whether a kind of file is one a person must hear of whatever else the folder holds: photos in a
    format not read (HEIC, HEIF), or an image's name with something after its extension (IMG_1.JPG
    with a trailing space or dot: not read as an image)."""
    return kind in (".heic", ".heif") or (kind != kind.rstrip(" .") and kind.rstrip(" .") in IMAGE_EXTENSIONS)


def count_other(counts, kind):
    """Count a file left out, and its kind: at most MOST_KINDS kinds are counted (a stranger's folder of
    a million extensions costs no million counters); where a new kind finds them all taken, the kinds
    of the fewest files make room (the largest kinds stay, and their counts are of files seen; those
    let go are among "of other kinds"). A telling kind is always counted."""
    counts["others"] += 1
    key = (OTHER, kind)
    if key not in counts and not telling(kind):
        kinds = [k for k in counts if isinstance(k, tuple) and k[0] == OTHER and not telling(k[1])]
        if len(kinds) >= MOST_KINDS:
            fewest = min(counts[k] for k in kinds)
            for k in kinds:
                if counts[k] == fewest:
                    del counts[k]
    counts[key] += 1


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
    named_kinds = kinds[:shown] + [item for item in kinds[shown:] if telling(item[1])][:shown]
    named = [f"{n:,} {kind_shown(kind)}" for n, kind in named_kinds]
    rest = total - sum(n for n, _ in named_kinds)
    found = {kind for _, kind in kinds}
    heic = ("; HEIC/HEIF photos (iPhones, Macs) are not read: export them as JPEG to use them"
            if found & {".heic", ".heif"} else "")
    trailing = ("; an image's name with a space or a dot after its extension is not read as an image: rename it"
                if any(telling(kind) and kind not in (".heic", ".heif") for kind in found) else "")
    return (f"left out {total:,} file{'s' * (total != 1)} in {where} that "
            f"{'are not images' if total != 1 else 'is not an image'} of the formats read ({', '.join(READ_AS)}): "
            f"{', '.join(named)}{f', {rest:,} of other kinds' if rest else ''}{heic}{trailing}")


def kind_shown(kind):
    """A kind as the line names it: quoted where a space or a dot after an image's extension would be unseen."""
    if not kind:
        return "without extension"
    return f"'{escaped(kind)}'" if telling(kind) and kind not in (".heic", ".heif") else escaped(kind)


def describe_links_out(count, where):
    """The line that says how many links under where lead out of it (walk_images followed them), or ''."""
    if not count:
        return ""
    return (f"followed {count:,} link{'s' * (count != 1)} in {escaped(where)} that lead{'s' * (count == 1)} out of "
            f"it: the images there are read, but label.py moves no file through a link to outside the folder")


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


class ImageFiles:
    """The files to predict, in the order given: a file as it is, a folder's images (files.walk_images:
    recursively, by extension, hidden files and folders left out) in sorted order, streamed: a
    million files are never a list. Each image once: a path given twice, or a file or folder that a
    folder given also lists, is left to that folder (links resolved). A path that does not exist exits
    2 before any work. `others` and `hidden` count the other files and the hidden ones left out, once
    a pass is over, and `left_out` holds walk_images's counts (files.describe_others)."""

    def __init__(self, targets):
        missing = [t for t in targets if not Path(t).exists()]
        if missing:
            raise UserError(f"--predict: {', '.join(map(str, missing))} does not exist")
        self.targets = distinct_targets([Path(t) for t in targets])
        self.others = self.hidden = 0
        self.left_out = collections.Counter()

    def entries(self):
        """(path, (size, modification and change time)) of each file, in order."""
        counts = collections.Counter()
        for target in self.targets:
            if target.is_dir():
                for relative, *stamp in walk_images(target, counts):
                    yield target / relative, stamp
            else:
                try:
                    st = os.stat(target)
                    yield target, [st.st_size, st.st_mtime_ns, st.st_ctime_ns]
                except OSError:
                    yield target, [-1, -1, -1]
        self.others, self.hidden, self.left_out = counts["others"], counts["hidden"], counts

    def __iter__(self):
        return (path for path, _ in self.entries())

    def survey(self, outputs):
        """One pass before any work: (the number of files, a key of the listing: the hash of every
        path, size and time, so that work kept from an interrupted run is taken up only for the very
        same files). Exit 2 where an output {option: path} would replace one of the files (a file
        in a folder given to --predict, links resolved)."""
        folders = [os.path.realpath(t) + os.sep for t in self.targets if t.is_dir()]
        inside = {os.path.realpath(path): name for name, path in outputs.items()
                  if path and any(os.path.realpath(path).startswith(f) for f in folders)}
        count, key = 0, hashlib.sha256()
        for path, stamp in self.entries():
            count += 1
            key.update("\0".join(map(str, (path, *stamp))).encode("utf-8", "surrogateescape") + b"\n")
            if inside and os.path.realpath(path) in inside:
                name = inside[os.path.realpath(path)]
                raise UserError(f"{name} {outputs[name]} is one of the images --predict reads: give the output "
                                f"another name")
        return count, key.hexdigest()


def distinct_targets(targets):
    """The targets without those another one covers: the same path again (links resolved), or one that
    a folder among them lists itself (under it, no hidden part on the way, an image's name for a file)."""
    real = [os.path.realpath(t) for t in targets]
    folders = [r for r, t in zip(real, targets) if t.is_dir()]
    kept, seen = [], set()
    for target, path in zip(targets, real):
        listed_by = [f for f in folders if f != path and path.startswith(f.rstrip(os.sep) + os.sep)
                     and not any(is_hidden(part) for part in Path(os.path.relpath(path, f)).parts)]
        if path in seen or (listed_by and (target.is_dir() or is_image_name(target.name))):
            continue
        seen.add(path)
        kept.append(target)
    return kept


def image_paths(targets):
    """(the files ImageFiles finds under targets as a list, number of other files, number of hidden
    ones left out)."""
    files = ImageFiles(targets)
    paths = list(files)
    return paths, files.others, files.hidden
