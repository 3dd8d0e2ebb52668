"""Opening and renaming files carefully, in one place.

The files the tools keep inside a folder they do not own outright (label.py's log, a run's lock, the
decode cache and its folder, a step's work, the secret that seals them): a folder shipped by someone
else may hold a symbolic link, a pipe or a hard link under any of those names. open_kept is the one
way such a file is opened: without following a link (O_NOFOLLOW) and without waiting (O_NONBLOCK: a
pipe opens at once instead of blocking the run), then checked by fstat to be a regular file, where it
will be written to have no other name (a hard link to a file elsewhere would be rewritten there too),
and where its identity was sealed to be that very file; a folder is checked to be a real folder, not a
link to one. Anything else is refused with UserError (one line, exit 2) before a byte is written.

A user's own files (images, labels files) are read through links (a folder of links is a folder of
images), but never block on a pipe named like one: open_regular.

A rename that never replaces a file (rename_no_replace): os.rename replaces whatever has the target's
name, and on a case- or normalization-insensitive file system (macOS, exFAT, SMB) "IMG.JPG" and
"img.jpg" are one name, so a file made between a check and the rename (or a name the check could not
see as the same) would be lost. The OS's own no-replace rename does the check and the rename in one
step: Linux's renameat2(RENAME_NOREPLACE), macOS's renamex_np(RENAME_EXCL). A file system that has no
such rename (some network and FUSE ones answer EINVAL) gets a check just before an ordinary rename.
"""
import ctypes
import errno
import fcntl
import os
import stat
import sys
from pathlib import Path

from ..errors import UserError


class NotRegular(OSError):
    """A path that is no regular file (a pipe, a socket, a device named like an image)."""


def identity(st):
    """What tells one file from every other and from itself after a change: its device, inode, size,
    modification and change time (no program can set a change time back)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def refusal(path, what, st):
    """The one line that says why `path` is not the regular file or folder it should be."""
    kind = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a pipe" if stat.S_ISFIFO(st.st_mode) else
            "a socket" if stat.S_ISSOCK(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a folder" if stat.S_ISDIR(st.st_mode) else "a file" if stat.S_ISREG(st.st_mode) else "not a file")
    return (f"{path} is {kind}, not the {what} this project keeps there (a folder from elsewhere may hold one): "
            f"nothing was written; remove it and run again")


def open_kept(path, flags, what, mode=0o666, writing=False, sealed_identity=None):
    """A file descriptor of the kept file `path` (os.open flags: O_NOFOLLOW and O_NONBLOCK are added),
    checked to be a regular file, when `writing` to have a single name, and given sealed_identity
    (identity() of the file when it was written) to be that very file. UserError for a link, a pipe,
    a folder or a hard-linked file; ValueError for another file than the one sealed (changed,
    replaced or copied since); OSError for the OS's own refusals (no permission, a full disk)."""
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):  # a device is never even opened
        raise UserError(refusal(path, what, os.lstat(path)))
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError:  # ELOOP for a link, ENXIO for a pipe opened to write, EISDIR for a folder: say which
        st = os.lstat(path) if os.path.lexists(path) else None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise UserError(refusal(path, what, st)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(refusal(path, what, st))
        if writing and st.st_nlink > 1:
            raise UserError(f"{path} has {st.st_nlink} names (a hard link to a file elsewhere?), not the {what} "
                            f"this project keeps there: nothing was written; remove it and run again")
        if sealed_identity is not None and identity(st) != sealed_identity:
            raise ValueError(f"{Path(path).name} is not the file this machine wrote (changed, replaced or copied since)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_kept(path, what, sealed_identity=None):
    """The kept file `path` open to read, as a binary file (open_kept)."""
    return open(open_kept(path, os.O_RDONLY, what, sealed_identity=sealed_identity), "rb")


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


def lock_folder(path, busy, follow_link=False, wait=None):
    """A file descriptor of the folder `path` (not through a link unless follow_link: a folder you
    named) holding the OS's exclusive lock on it: one process at a time, and the lock ends with the
    process however it ends (never stale, no file written). UserError(busy) where another holds it,
    or, given wait, wait() said once and the lock waited for; UserError where the file system has no
    locks. Closing the descriptor lets go."""
    nofollow = 0 if follow_link else os.O_NOFOLLOW
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | nofollow | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UserError(f"cannot open {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if wait is None:
            os.close(fd)
            raise UserError(busy) from None
        wait()
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:  # ENOLCK: a network file system without locks
        os.close(fd)
        raise UserError(f"cannot lock {path} ({exc.strerror}): run this on a local disk, where one run at a time "
                        f"can be made sure of") from None
    return fd


def check_folder(path, what):
    """Exit 2 unless `path`, where it exists, is a real folder (not a link to one, not a file)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(refusal(Path(path), what, st))


AT_FDCWD = -100
RENAME_NOREPLACE = 1   # linux/fs.h
RENAME_EXCL = 0x4      # macOS sys/stdio.h


def _native():
    """The C function that renames without replacing, with its flag, or None."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    if sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
        function = libc.renameat2
        function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
        return lambda source, target: function(AT_FDCWD, source, AT_FDCWD, target, RENAME_NOREPLACE)
    if sys.platform == "darwin" and hasattr(libc, "renamex_np"):
        function = libc.renamex_np
        function.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint)
        return lambda source, target: function(source, target, RENAME_EXCL)
    return None


NATIVE = _native()


def rename_no_replace(source, target):
    """Rename source to target; FileExistsError where target's name is taken (on this file system's
    terms), and source is left as it was."""
    source, target = os.fsencode(source), os.fsencode(target)
    if NATIVE is not None:
        if NATIVE(source, target) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), os.fsdecode(source), None, os.fsdecode(target))
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(source), None, os.fsdecode(target))
    os.rename(source, target)
