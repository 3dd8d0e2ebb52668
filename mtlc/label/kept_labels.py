"""The labels given in Label Studio, kept by the backend in a labels file that label.py --apply reads:
columns path,label,blake2b (the image's path relative to the folder, its class, the hash of the bytes
it was labeled for),
one row an image, its latest label. Each change is written whole before Label Studio is answered
(disk/runs.py atomic_write: the file is as before or as after, never half, whenever the server is
killed), holding the lock on the file's folder, so that two servers, or label.py reading it, see
each other's rows and never a mixture; a server reads the file again under the lock before it
writes, so neither loses the other's labels.
"""
import csv
import io
import os
import re
from pathlib import Path

from ..data.files import DIGEST_BYTES, DIGEST_COLUMN
from ..disk.console import csv_writer
from ..disk.opening import lock_folder, open_regular
from ..errors import UserError

COLUMNS = ("path", "label", DIGEST_COLUMN)
MAX_BYTES = 256 * 2 ** 20  # a million labels take about 150 MB
DIGEST = re.compile(f"[0-9a-f]{{{2 * DIGEST_BYTES}}}")  # files.file_digest's hex


def read_rows(path):
    """{path: (label, digest)} of a labels file this backend keeps; none where there is no file.
    UserError where a file there is not one (another file of the user's is never written over)."""
    try:
        with open(open_regular(path), "rb") as f:  # a pipe there is refused, never waited on
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UserError(f"cannot read the labels file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8", "surrogateescape")
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise UserError(f"{path} is not a labels file this backend kept ({exc}): give --labels another path") from None
    # a file cut short by another writer ends without its line end, or inside a row's hash
    whole = raw.endswith(b"\n") and all(DIGEST.fullmatch(r[2]) for r in rows[1:] if len(r) == len(COLUMNS))
    if (len(raw) > MAX_BYTES or not rows or tuple(rows[0]) != COLUMNS or not whole
            or any(len(r) != len(COLUMNS) for r in rows[1:])):
        raise UserError(f"{path} is there and is not a labels file this backend kept (columns "
                        f"{','.join(COLUMNS)}): give --labels another path, or move that file")
    return {r[0]: (r[1], r[2]) for r in rows[1:]}


def csv_bytes(rows):
    out = io.StringIO(newline="")
    writer = csv_writer(out)  # a name holding \r is quoted too: every row reads back as written
    writer.writerow(COLUMNS)
    writer.writerows((path, label, digest) for path, (label, digest) in sorted(rows.items()))
    return out.getvalue().encode("utf-8", "surrogateescape")


class KeptLabels:
    """The labels file at `path` (module docstring); rows: {path: (label, digest)} as last read."""

    def __init__(self, path, echo):
        self.path, self.echo = Path(os.path.abspath(path)), echo
        if not self.path.parent.is_dir():
            raise UserError(f"--labels {path}: its folder {self.path.parent} does not exist")
        self.rows = read_rows(self.path)

    def keep(self, given):
        """Keep each image's label ({path: (label, digest)}), replacing its earlier one, in one write;
        the rows after (with those another server kept meanwhile)."""
        from ..disk.runs import atomic_write  # imports torch: kept apart for label.py's light imports
        fd = lock_folder(self.path.parent, "", follow_link=True,
                         wait=lambda: self.echo(f"waiting for another process writing in {self.path.parent}"))
        try:
            rows = read_rows(self.path)
            rows.update(given)
            atomic_write(self.path, lambda f: f.write(csv_bytes(rows)))
            self.rows = rows
        finally:
            os.close(fd)
        return self.rows
