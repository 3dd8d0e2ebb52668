"""An output replaces an existing file only where that file is what the output writes: predictions
over earlier predictions (--csv), an audit over an audit (--audit). A file of another kind under the
name (a labels file corrected by hand, someone's notes) is refused before any work, never lost."""
import codecs
import os
import stat

from ..use.audit import AUDIT_HEADER
from ..errors import UserError
from ..use.predictions import CSV_HEADER

# The start of the first line each CSV output writes.
HEADERS = {"--csv": ",".join(CSV_HEADER), "--audit": ",".join(AUDIT_HEADER[:2])}


def first_line(path, limit=4096):
    """The first line of the regular file at `path` (not through a link: a link is replaced, not its
    file), at most `limit` bytes; None where there is no such file or it is empty; OSError where it
    cannot be read."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or not st.st_size:
        return None
    with open(path, "rb") as f:
        return f.readline(limit)


def check_replaces_own_kind(outputs):
    """Exit 2 where an output {option: path} of HEADERS would replace a file it did not write."""
    for option, header in HEADERS.items():
        path = outputs.get(option)
        try:
            line = first_line(path) if path else None
        except OSError as exc:
            raise UserError(f"{option} {path} cannot be read ({exc.strerror}) to make sure it is a CSV {option} wrote: "
                            f"give another name, or remove it first") from None
        if line is not None and not line.removeprefix(codecs.BOM_UTF8).startswith(header.encode()):
            raise UserError(f"{option} {path} is a file {option} did not write (its first line: "
                            f"{line[:60].decode(errors='replace').rstrip()}): writing would replace it; give "
                            f"another name, or remove it first")
