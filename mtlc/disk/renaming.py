"""A rename that never replaces a file: os.rename replaces whatever has the target's name, and on a
case- or normalization-insensitive file system (macOS, exFAT, SMB) "IMG.JPG" and "img.jpg" are one
name, so a file made between a check and the rename (or a name the check could not see as the same)
would be lost. The OS's own no-replace rename does the check and the rename in one step: Linux's
renameat2(RENAME_NOREPLACE), macOS's renamex_np(RENAME_EXCL). A file system that has no such rename
(some network and FUSE ones answer EINVAL) gets a check just before an ordinary rename.
"""
import ctypes
import errno
import os
import sys

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
