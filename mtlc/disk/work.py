"""Work a long step keeps while it runs, so that a run interrupted (Ctrl-C, a kill, a closed laptop)
and started again with the same inputs goes on from where it was instead of from the start.

The work lies in a folder beside the step's output: files appended a batch at a time (rows of
predictions, arrays of features, each fold's logits) and a manifest, rewritten atomically every few
seconds, that says how many bytes of each file are done and how far the step got. The folder may
meet anything (a folder shipped with someone else's files, a file edited since): the manifest is
sealed (seal.py: this machine's secret) over what the work is for (its key: the step's inputs) and
the HMAC of each file's bytes up to the length it names. A run takes up only work whose seal holds
and whose files' bytes still hash to it; anything else is started afresh. Files are never followed
through a link (disk/opening.py).
"""
import contextlib
import hmac
import json
import os
import time
from pathlib import Path

import numpy as np

from ..errors import UserError, WriteFailed
from .opening import check_folder, lock_folder, open_kept, read_kept
from .outputs import WORK_SUFFIX
from .runs import atomic_write
from .seal import holds, seal, secret

MANIFEST = "manifest.json"
# Seconds between two manifests: what an interruption may lose, against an fsync'd write each time.
COMMIT_EVERY = 5.0
WORK_VERSION = 1
READ_BLOCK = 2 ** 24  # bytes hashed at a time when work is taken up again


def work_folder(output):
    """Where the work of a step writing `output` is kept: a hidden folder beside it."""
    output = Path(output)
    return output.parent / f".{output.name}{WORK_SUFFIX}"


def remove_work(folder):
    """Remove a work folder left behind: the files in it (links never followed), then the folder; a
    folder holding anything else stays."""
    if Path(folder).is_dir() and not Path(folder).is_symlink():
        remove_files(folder)
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def remove_files(folder):
    """Remove the files of a work folder (links never followed, never into a folder in it), its
    manifest last: a run killed on the way leaves a folder that still says it is this tool's work."""
    entries = [e for e in os.scandir(folder) if e.is_file(follow_symlinks=False) or e.is_symlink()]
    for entry in sorted(entries, key=lambda e: e.name == MANIFEST):
        with contextlib.suppress(OSError):
            os.unlink(entry.path)


def running_hmac():
    return hmac.new(secret()[0], digestmod="sha256")


def busy_message(folder):
    return (f"another run is writing the same output: its work folder {folder} is in use; let it finish, or give "
            f"this run another output")


def hold(folder, busy=None, wait=None):
    """The work folder made if need be and locked (opening.lock_folder: UserError(busy) where another
    run holds it; where given, wait() says so and the lock is waited for), checked to be the folder
    now at its name (another run may have removed it between the two)."""
    check_folder(folder, "work folder")
    for _ in range(3):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteFailed(folder, exc, "so nothing of this output was written") from None
        fd = lock_folder(folder, busy or busy_message(folder), wait=wait)
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(fd), os.lstat(folder)):
                return fd
        os.close(fd)
    raise UserError(f"{folder} keeps being removed by another run: let it finish first")


class Claim:
    """A work folder held before its work begins (claimed)."""

    def __init__(self, fd):
        self.fd = fd

    def hand_over(self):
        fd, self.fd = self.fd, None
        return fd


@contextlib.contextmanager
def claimed(folder):
    """The work folder of an output held from a run's start, so that a second run writing the same
    output, or an output folder that cannot be written, is refused before any work rather than after
    it; Work(..., claim=) takes it over. Yields None for no folder. Left empty where no Work took it."""
    if folder is None:
        yield None
        return
    claim = Claim(hold(Path(folder)))
    try:
        yield claim
    finally:
        if claim.fd is not None:
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only where empty: an earlier run's kept work stays
            os.close(claim.fd)


class Appended:
    """One file of the work, appended to; its HMAC follows every byte written."""

    def __init__(self, path, fd, length, mac):
        self.path, self.file, self.length, self.mac = path, open(fd, "r+b", buffering=0), length, mac
        self.file.seek(length)
        self.file.truncate()

    def write(self, data):
        data = left = memoryview(data).cast("B")
        try:
            while left:  # an unbuffered write may take part of it (a file-size limit reached): the rest raises
                left = left[self.file.write(left):]
        except OSError as exc:  # a full disk or a size limit: one line naming the work file (its output's)
            raise WriteFailed(self.path, exc, "the work done before it is kept: the same command goes on from there "
                                              "once it can write") from None
        self.mac.update(data)
        self.length += len(data)

    def close(self):
        with contextlib.suppress(OSError):
            self.file.close()


class Work:
    """A step's work folder (see the module): `appended(name)` files, `state` (a dict of small
    JSON values the step keeps, e.g. how many images are done), `commit()` after each batch (a
    manifest at most every COMMIT_EVERY seconds), `remove()` once the outputs are written.
    `resumed` says whether earlier work was taken up. One run at a time holds the folder (the OS's
    lock on it, from before its work is read until it is removed or the run ends): a second run
    writing the same output is refused in one line instead of sharing its work."""

    def __init__(self, folder, key, echo=lambda line: None, busy=None, wait=None, claim=None):
        self.folder, self.key, self.echo = Path(folder), dict(key, version=WORK_VERSION), echo
        self.files, self.state, self.last_commit = {}, {}, time.monotonic()
        self.taken_up = {}  # {name: (length, its HMAC so far)} of the files earlier work left
        # claim: a Claim of the folder held since before the key was known (claimed), handed over
        self.lock = claim.hand_over() if claim is not None else hold(self.folder, busy, wait)
        manifest = self.manifest()
        self.resumed = manifest is not None
        if manifest:
            self.state = manifest["state"]
        else:
            try:
                self.clear()
                self.commit(force=True)  # from its first moment the folder says it is this tool's work
            except BaseException:
                self.close()
                raise

    def manifest(self):
        """The folder's manifest where it is this machine's, for this key, and every file it names
        still holds the bytes it was sealed with; else None."""
        try:
            fd = open_kept(self.folder / MANIFEST, os.O_RDONLY, "work manifest")
        except (OSError, UserError):
            return None
        try:
            with open(fd, "rb") as f:
                manifest = json.loads(f.read())
            body = {k: v for k, v in manifest.items() if k != "seal"}
            if not holds(body, manifest.get("seal")) or body["key"] != self.key:
                return None
            for name, (length, digest) in body["files"].items():
                mac = self.prefix_mac(name, length)
                if mac.hexdigest() != digest:
                    self.taken_up = {}
                    return None
                self.taken_up[name] = (length, mac)
            return body
        except Exception:  # anything unreadable or unexpected: the work is done again
            self.taken_up = {}
            return None

    def prefix_mac(self, name, length):
        """The HMAC of the first `length` bytes of the work file `name` (ValueError if it is shorter)."""
        mac = running_hmac()
        with read_kept(self.folder / name, "work file") as f:
            left = length
            while left:
                block = f.read(min(left, READ_BLOCK))
                if not block:
                    raise ValueError(f"{name} is shorter than its manifest says")
                mac.update(block)
                left -= len(block)
        return mac

    def clear(self):
        """Remove what the folder holds of earlier work (files only, links never followed). A folder
        that holds anything but no manifest (each run writes one first) is not this tool's work, and
        whatever it holds is not the tool's to remove: refused, nothing removed."""
        entries = os.listdir(self.folder)
        if entries and not any(e == MANIFEST or e.startswith(f".{MANIFEST}.") for e in entries):
            raise UserError(f"{self.folder} holds files that are not this tool's work ({entries[0]}, ...), nothing of "
                            f"them removed: move it away or give this run another output")
        remove_files(self.folder)

    def appended(self, name):
        """The work file `name`, positioned after what earlier work did of it (nothing, where none)."""
        if name not in self.files:
            length, mac = self.taken_up.pop(name, (0, running_hmac()))
            fd = open_kept(self.folder / name, os.O_RDWR | os.O_CREAT, "work file", writing=True)
            self.files[name] = Appended(self.folder / name, fd, length, mac)
        return self.files[name]

    def restarted(self, name):
        """The work file `name` emptied, to be written anew (its earlier bytes dropped)."""
        self.taken_up.pop(name, None)
        if name in self.files:
            self.files.pop(name).close()
        self.taken_up[name] = (0, running_hmac())
        return self.appended(name)

    def rows(self, name, dtype, width, mode="r"):
        """The rows (width values of dtype each) of the work file `name` written so far, memory-mapped
        read-only, or with mode "c" copy-on-write (writes stay in this process: what torch's tensors
        on it ask for), an empty array where none."""
        count = self.appended(name).length // (np.dtype(dtype).itemsize * width)
        if not count:
            return np.zeros((0, width), dtype)
        return np.memmap(self.folder / name, dtype=dtype, mode=mode, shape=(count, width))

    def commit(self, force=False):
        """Write the manifest (the files' lengths and HMACs, the state) if COMMIT_EVERY seconds have
        passed since the last one, or if forced."""
        if not force and time.monotonic() - self.last_commit < COMMIT_EVERY:
            return
        files = {name: [f.length, f.mac.copy().hexdigest()] for name, f in self.files.items()}
        for name, (length, mac) in self.taken_up.items():  # files this run has not opened yet
            files.setdefault(name, [length, mac.copy().hexdigest()])
        body = dict(key=self.key, files=files, state=self.state)
        atomic_write(self.folder / MANIFEST, lambda f: f.write(json.dumps(dict(body, seal=seal(body))).encode()),
                     own_name=True)
        self.last_commit = time.monotonic()

    def close(self):
        """Close its files and let go of the folder."""
        for f in self.files.values():
            f.close()
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None

    def remove(self):
        """The step is done and its outputs written: its work goes (before the folder is let go)."""
        for f in self.files.values():
            f.close()
        remove_work(self.folder)
        self.close()

    @contextlib.contextmanager
    def kept_if_interrupted(self, what):
        """While the step runs: an exception (Ctrl-C, a full disk) commits what is done and says where
        it is kept (`what`: "the predictions made so far") before it goes on."""
        try:
            yield self
        except BaseException:
            with contextlib.suppress(Exception):
                self.commit(force=True)
                self.echo(f"interrupted: {what} are kept in {self.folder}; the same command goes on from there")
            self.close()
            raise
