"""Room on a disk for a large file, weighed before it is written."""
import shutil
from pathlib import Path

from ..errors import UserError

# A file this large is said before it is written (a decode cache of 10,000 photos at 260 px is 2 GB).
LARGE = 1e9


def check_room(folder, need, what, how_else, echo):
    """Refuse (UserError, one line, nothing written) `what` of `need` bytes in folder (or the nearest of
    its parents that exists) where its disk has less free; say one over LARGE. how_else: what to do."""
    folder = Path(folder)
    where = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(where).free
    if need > free:
        raise UserError(f"{what} takes {need / 1e9:.1f} GB in {folder}, which has {free / 1e9:.1f} GB free: free some "
                        f"space, or {how_else}")
    if need > LARGE:
        echo(f"{what} takes {need / 1e9:.1f} GB in {folder} ({free / 1e9:.1f} GB free)")
