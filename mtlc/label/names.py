"""Names as file systems and people compare them: a file name folded as a case- and
normalization-insensitive disk folds it (macOS, exFAT, SMB), the free names of a folder a plan moves
files into, and a class's name as a person reads it (its compatibility form, case folded, white space
and invisible characters left out), so that a label names exactly one class folder.
"""
import os
import posixpath
import unicodedata

from ..data.files import is_hidden
from ..disk.console import is_text
from .inputs import inside


def fold(name):
    """A name as a case- and normalization-insensitive file system (macOS, exFAT, SMB) compares it:
    'IMG.JPG' and 'img.jpg' are one name there, and so are an 'é' composed and one decomposed."""
    return unicodedata.normalize("NFC", name).casefold()


def loose(name):
    """A class name as a person reads it: its compatibility form (a fullwidth 'ｃ' is a 'c'), case folded,
    white space and invisible characters (a zero-width space) left out: 'red ', 'Red' and 'r\u200bed'
    are one class to a reader, three folders to a file system."""
    folded = unicodedata.normalize("NFKC", name).casefold()
    return "".join(c for c in folded if not c.isspace() and unicodedata.category(c) != "Cf")


# Planning: every row checked before anything moves ---------------------------------------------------

def known_classes(data_dir):
    labeled = data_dir / "labeled"
    return sorted(p.name for p in labeled.iterdir() if p.is_dir() and not is_hidden(p.name)) if labeled.is_dir() else []


def name_max(folder):
    """The longest file name (bytes) the folder's file system takes."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def label_problem(label, labeled, longest, realpath=os.path.realpath):
    """Why a label cannot be a class folder's name under labeled/, or None."""
    if not label.strip():
        return "the label is blank (give the image its class, or leave its row out of the file)"
    if (label in (".", "..") or is_hidden(label) or any(c in label for c in "/\\\0")
            or any(ord(c) < 32 for c in label)):
        return f"{label!r} cannot be a class folder's name"
    if not is_text(label):
        return f"{label!r} is not text (save the CSV as UTF-8)"
    if len(label.encode()) > longest:
        return f"a class name of {len(label.encode())} bytes is longer than the file system takes ({longest})"
    folder = labeled / label
    if os.path.lexists(folder) and not folder.is_dir():
        return f"labeled/{label} is a file, not a class folder"
    if folder.is_dir() and not inside(labeled.parent, f"labeled/{label}/x", ("labeled",), realpath):
        return f"labeled/{label} leads outside the folder through a link"
    return None


class Names:
    """The names taken in each folder a plan moves files into: what is there (listed once a folder)
    and what the plan gives, compared as fold does; a name taken gets the first free suffix
    (photo-1.jpg), counted on from the last one given for that name, so that a thousand rows of one
    name cost a thousand tries, not half a million."""

    def __init__(self, data_dir):
        self.data_dir, self.taken, self.next = data_dir, {}, {}

    def in_folder(self, folder):
        if folder not in self.taken:
            path = self.data_dir / folder
            self.taken[folder] = {fold(name) for name in os.listdir(path)} if path.is_dir() else set()
        return self.taken[folder]

    def free(self, folder, name):
        taken = self.in_folder(folder)
        candidate, stem, suffix = name, posixpath.splitext(name)[0], posixpath.splitext(name)[1]
        key = (folder, fold(stem), fold(suffix))
        k = self.next.get(key, 1)
        while fold(candidate) in taken:
            candidate = f"{stem}-{k}{suffix}"
            k += 1
        if k > 1:  # only names that met a clash are remembered: a million distinct names cost no counters
            self.next[key] = k
        taken.add(fold(candidate))
        return candidate


def class_problem(label, source, classes, spelled, new_classes):
    """Why `label` cannot be the class of the image at source, or None: a class labeled/ lacks
    (without --new-classes; for a test/ image, ever), or one that differs from a class folder only in
    case, white space or Unicode form (loose: 'red ' beside 'red', 'Cat' beside 'cat'), which names two
    folders to a reader's eye and one on many file systems: both names are given."""
    others = [c for c in spelled.get(loose(label), ()) if c != label]
    if others:
        return (f"the class {label!a} differs from the class folder {others[0]!a} only in case, white space, "
                f"invisible characters or Unicode form: rename one of them so that each class has one name")
    if label in classes:
        return None
    if source.startswith("test/"):
        return f"a test image can only take a class labeled/ has ({', '.join(sorted(classes))})"
    if not new_classes:
        return f"unknown class {label!r} (labeled/ has {', '.join(sorted(classes))}; --new-classes creates it)"
    spelled.setdefault(loose(label), []).append(label)
    return None
