"""The scripts' text streams and CSV files. A name is written so that it reads back as the same
name whatever it holds: a name that is not valid UTF-8 (old archives, Samba shares) is a str with
surrogate escapes in Python and goes to files and stdout as its own bytes; every CSV is UTF-8
whatever the console's encoding (PYTHONIOENCODING=ascii or latin-1 changes what people see, never
what a CSV holds); a field with a carriage return or a line feed is quoted. What the console cannot
show is escaped, never a UnicodeEncodeError.
"""
import codecs
import contextlib
import csv
import io
import os
import re
import stat
import sys

from ..errors import WriteFailed

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


# What a terminal takes as a command rather than text (ESC starts a sequence; BEL, the C1 codes, DEL):
# the control characters but the tab, the line feed and the carriage return (a progress bar's own).
CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def without_controls(text):
    """text with its control characters (CONTROLS) written as \\xNN escapes."""
    return CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class ControlsEscaped:
    """A text stream (sys.stdout, sys.stderr) that writes its text with the control characters escaped:
    a name from a stranger's folder (a class folder, an image, a labels file's row) reaches a
    terminal, or a log read at one later, as text and never as a command, whichever message it is
    in. Everything else is the stream's own: a CSV or JSON written to stdout goes through
    stdout_rows (its own file descriptor) or JSON's own escapes."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        self.stream.write(without_controls(text) if isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def robust_streams():
    """stdout writes names losslessly where its encoding can, stderr escapes what it cannot show;
    neither ever raises on a name, nor shows a control character of one as itself."""
    for stream, errors in ((sys.stdout, CONSOLE_ERRORS), (sys.stderr, "backslashreplace")):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors=errors)
    if sys.stdout is not None and not isinstance(sys.stdout, ControlsEscaped):
        sys.stdout = ControlsEscaped(sys.stdout)
    if sys.stderr is not None and not isinstance(sys.stderr, ControlsEscaped):
        sys.stderr = ControlsEscaped(sys.stderr)


def path_text(binary_file):
    """A text writer over an open binary file that writes paths losslessly (CSV: newline='')."""
    return io.TextIOWrapper(binary_file, encoding=PATH_ENCODING, errors=PATH_ERRORS, newline="")


def csv_writer(text_file):
    """A csv.writer whose rows read back field for field: RFC 4180's CRLF line ends, so that a field
    holding a carriage return is quoted as one holding a line feed is (with '\\n' alone, Python's
    writer leaves a '\\r' bare and the row splits in two when read)."""
    return csv.writer(text_file, lineterminator="\r\n")


class WholeWrites(io.RawIOBase):
    """Unbuffered writes to a file descriptor, each taking all its bytes or raising: where the OS takes
    part of a write (a file-size limit, a disk filling up) and refuses the rest, Python's buffered
    stdout keeps the rest and says nothing; here the refusal is the OSError it is."""

    def __init__(self, fd):
        self.fd, self.written, self.lines_end = fd, 0, 0  # bytes written; those up to the last line end

    def writable(self):
        return True

    def write(self, data):
        whole = left = memoryview(data).cast("B")
        while left:
            taken = os.write(self.fd, left)
            at = bytes(left[:taken]).rfind(b"\n")
            if at >= 0:
                self.lines_end = self.written + at + 1
            self.written += taken
            left = left[taken:]
        return len(whole)


@contextlib.contextmanager
def stdout_rows():
    """A text stream for the block that writes a CSV to stdout as UTF-8 bytes whatever the console's
    encoding, so that `> labels.csv` holds the names as label.py reads them (stdout's own buffered text
    flushed first). Where stdout refuses a write (a full disk, a file-size limit) the run ends in one
    line (WriteFailed), and where stdout is a file, a last row cut short is cut off, so that it ends
    with a whole row (a pipe keeps what it took); stdout then points at the null device, so that no
    later write fails again. At a terminal the names' control characters are escaped (ControlsEscaped).
    """
    if sys.stdout is None:  # started with stdout closed
        raise WriteFailed("standard output", OSError(9, "it is closed"), after="give --csv FILE for the rows")
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # a stream of no file (click's test runner)
        fd = None
    if fd is None:
        buffer = getattr(sys.stdout, "buffer", None)  # bytes underneath, else text as is
        text = path_text(buffer) if buffer is not None else sys.stdout
        yield text
        text.flush()
        if text is not sys.stdout:
            text.detach()
        return
    raw = WholeWrites(fd)
    start = file_position(fd)
    text = path_text(io.BufferedWriter(raw))
    if os.isatty(fd):  # rows for a person to read: a name's control characters escaped (a file gets them as they are)
        text = ControlsEscaped(text)
    try:
        yield text
        text.flush()
    except OSError as exc:
        if start is not None and raw.written > raw.lines_end:  # a row cut short: cut off
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start + raw.lines_end)
        kept = raw.lines_end > 0
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        raise WriteFailed("standard output", exc, after="the rows before it are whole" if kept else
                          "nothing of the CSV was written") from None
    finally:
        with contextlib.suppress(OSError, ValueError):
            text.detach()


def file_position(fd):
    """Where the next write to fd goes, where fd is a regular file (None for a pipe or a terminal)."""
    try:
        return os.lseek(fd, 0, os.SEEK_CUR) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None


def shown(name):
    """A name from a file, a folder or a labels file as a message shows it: as it is where every
    character prints, else with its control characters escaped (an ESC or a BEL from a stranger's file
    name never reaches the terminal as itself)."""
    name = str(name)
    return name if name.isprintable() else repr(name)[1:-1]


def is_text(name):
    """Whether a name is valid Unicode text (no undecodable bytes from the file system)."""
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
