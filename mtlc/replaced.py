"""An output replaces an existing file only where that file is what the output writes: predictions
over earlier predictions (--csv), an audit over an audit (--audit). A file of another kind under the
name (a labels file corrected by hand, someone's notes) is refused before any work, never lost."""
import os
import stat

from .audit import AUDIT_HEADER
from .errors import UserError
from .predictions import CSV_HEADER

# The start of the first line each CSV output writes.
HEADERS = {"--csv": ",".join(CSV_HEADER), "--audit": ",".join(AUDIT_HEADER[:2])}
BOM = b"\xef\xbb\xbf"


def first_line(path, limit=4096):
    """The first line of the regular file at `path` (not through a link: a link is replaced, not its
    file), at most `limit` bytes; None where there is no such file or it is empty."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        with open(path, "rb") as f:
            return f.readline(limit) or None
    except OSError:  # unreadable: its writer says what is wrong with it
        return None


def check_replaces_own_kind(outputs):
    """Exit 2 where an output {option: path} of HEADERS would replace a file it did not write."""
    for option, header in HEADERS.items():
        line = first_line(outputs[option]) if outputs.get(option) else None
        if line is not None and not line.removeprefix(BOM).startswith(header.encode()):
            raise UserError(f"{option} {outputs[option]} is a file {option} did not write (its first line: "
                            f"{line[:60].decode(errors='replace').rstrip()}): writing would replace it; give "
                            f"another name, or remove it first")
