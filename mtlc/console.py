"""The scripts' text streams and CSV files. A name is written so that it reads back as the same
name whatever it holds: a name that is not valid UTF-8 (old archives, Samba shares) is a str with
surrogate escapes in Python and goes to files and stdout as its own bytes; every CSV is UTF-8
whatever the console's encoding (PYTHONIOENCODING=ascii or latin-1 changes what people see, never
what a CSV holds); a field with a carriage return or a line feed is quoted. What the console cannot
show is escaped, never a UnicodeEncodeError.
"""
import codecs
import csv
import io
import sys

# How files of paths are read and written: UTF-8, a name's undecodable bytes as surrogate escapes.
PATH_ENCODING, PATH_ERRORS = "utf-8", "surrogateescape"
# On the console: a name's undecodable bytes as themselves where the encoding is a byte encoding,
# anything else the encoding cannot show (an 'é' on an ASCII console) as a backslash escape.
CONSOLE_ERRORS = "mtlc-console"


def console_errors(exc):
    """surrogateescape where it can, backslashreplace where it cannot."""
    try:
        return codecs.lookup_error("surrogateescape")(exc)
    except UnicodeError:
        return codecs.lookup_error("backslashreplace")(exc)


codecs.register_error(CONSOLE_ERRORS, console_errors)


def robust_streams():
    """stdout writes names losslessly where its encoding can, stderr escapes what it cannot show;
    neither ever raises on a name."""
    for stream, errors in ((sys.stdout, CONSOLE_ERRORS), (sys.stderr, "backslashreplace")):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors=errors)


def path_text(binary_file):
    """A text writer over an open binary file that writes paths losslessly (CSV: newline='')."""
    return io.TextIOWrapper(binary_file, encoding=PATH_ENCODING, errors=PATH_ERRORS, newline="")


def csv_writer(text_file):
    """A csv.writer whose rows read back field for field: RFC 4180's CRLF line ends, so that a field
    holding a carriage return is quoted as one holding a line feed is (with '\\n' alone, Python's
    writer leaves a '\\r' bare and the row splits in two when read)."""
    return csv.writer(text_file, lineterminator="\r\n")


def stdout_csv():
    """A text stream that writes a CSV to stdout as UTF-8 bytes whatever the console's encoding, so
    that `> labels.csv` holds the names as label.py reads them; stdout's own buffered text is
    flushed first. Detach it when done (the stream stays open)."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a stream without bytes underneath (click's test runner): it takes text as is
        return sys.stdout
    return path_text(buffer)


def is_text(name):
    """Whether a name is valid Unicode text (no undecodable bytes from the file system)."""
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
