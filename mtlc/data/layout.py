"""Which layout an image folder has: your own images (labeled/, unlabeled/, optionally test/) or the
benchmark's (train/, test/), and the parts a person named almost right (Labeled/, unlabelled/)."""
from pathlib import Path

from ..disk.console import shown
from ..errors import UserError
from .files import is_hidden, is_image_name

# A part's name as people write it (any case; British spelling) -> the name the folder must use.
PART_NAMES = {"labeled": "labeled", "labelled": "labeled", "unlabeled": "unlabeled", "unlabelled": "unlabeled",
              "test": "test", "train": "train"}


def is_own_layout(data_dir):
    """Whether a folder holds your own images (labeled/, unlabeled/) rather than train/ and test/."""
    return (Path(data_dir) / "labeled").exists() or (Path(data_dir) / "unlabeled").exists()


def check_part_names(data_dir):
    """Exit 2 where a folder directly in data_dir is named almost as a part (Labeled/, unlabelled/,
    Test/) and no folder has the part's name itself: its images would be missed, or the folder read as
    another layout, with a message about something else."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        return
    # a part's own name where it exists (on a file system blind to case, Labeled/ is labeled/ too)
    misnamed = sorted(f"{p.name}/ (name it {PART_NAMES[p.name.lower()]}/)" for p in data_dir.iterdir()
                      if PART_NAMES.get(p.name.lower(), p.name) != p.name and p.is_dir()
                      and not (data_dir / PART_NAMES[p.name.lower()]).exists())
    if misnamed:
        raise UserError(f"{data_dir} holds {', '.join(misnamed)}: the folders of images are named labeled/, "
                        f"unlabeled/ and test/ (or train/ and test/), in lower case; rename them")


def describe_loose(data_dir, own):
    """The line that says which images lie directly in data_dir, beside its parts (read by nothing),
    or None."""
    loose = sorted(p.name for p in Path(data_dir).iterdir()
                   if not is_hidden(p.name) and is_image_name(p.name) and p.is_file())
    if not loose:
        return None
    parts = "labeled/, unlabeled/ and test/" if own else "train/ and test/"
    return (f"left out {len(loose)} image{'s' * (len(loose) > 1)} lying in {shown(str(data_dir))} itself "
            f"({', '.join(map(shown, loose[:3]))}{', ...' * (len(loose) > 3)}): only {parts} are read")
