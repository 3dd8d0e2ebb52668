"""The scripts' text streams. A file name that is not valid UTF-8 (old archives, Samba shares) is
a str with surrogate escapes in Python: it is written back as its own bytes to stdout and to CSV
files (rows stay lossless: label.py reads them back to the same name) and shown escaped on stderr,
never a UnicodeEncodeError, whatever PYTHONIOENCODING says.
"""
import io
import sys

# How files of paths are read and written: UTF-8, a name's undecodable bytes as surrogate escapes.
PATH_ENCODING, PATH_ERRORS = "utf-8", "surrogateescape"


def robust_streams():
    """stdout writes names losslessly, stderr escapes what its encoding cannot show."""
    for stream, errors in ((sys.stdout, PATH_ERRORS), (sys.stderr, "backslashreplace")):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors=errors)


def path_text(binary_file):
    """A text writer over an open binary file that writes paths losslessly (CSV: newline='')."""
    return io.TextIOWrapper(binary_file, encoding=PATH_ENCODING, errors=PATH_ERRORS, newline="")


def is_text(name):
    """Whether a name is valid Unicode text (no undecodable bytes from the file system)."""
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
