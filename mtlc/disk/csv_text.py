"""The CSV files the project reads (a labels file, label.py's log, a --truth file, a Label Studio
export), read in one set of dialects whoever wrote them: UTF-16 where it starts with that byte-order
mark (Excel's "Unicode text", its columns tab-separated), else UTF-8 with or without a BOM (Excel's
"CSV UTF-8" writes one), Excel's quoting (the csv module's own dialect), and a header with tabs and
no comma read as tab-separated. The file may come from someone else: a bad one is one line, exit 2.
"""
import csv
import io

from ..errors import UserError
from .console import PATH_ERRORS, shown
from .opening import open_regular


def csv_text(binary):
    """A text stream of a CSV file's bytes, read as needed: UTF-16 where it starts with that
    byte-order mark, else UTF-8 (a BOM skipped) with undecodable bytes kept as surrogate escapes: a
    path written from a name that is not UTF-8 reads back to the same name, and a path in another
    encoding (cp1252) names no file and is refused as such."""
    head = binary.peek(2)[:2] if hasattr(binary, "peek") else b""
    if head in (b"\xff\xfe", b"\xfe\xff"):
        return io.TextIOWrapper(binary, encoding="utf-16", newline="")
    return io.TextIOWrapper(binary, encoding="utf-8-sig", errors=PATH_ERRORS, newline="")


def delimiter_of(header):
    """Excel's "Unicode text" separates its columns with tabs: a header with tabs and no comma is read so."""
    return "\t" if "\t" in header and "," not in header else ","


def open_csv(path, what, missing=None):
    """(a text stream of the CSV file at path, its first line) with the stream at its start; a link
    you named is followed, a pipe refused. `missing`: the message where there is no such file."""
    try:
        binary = open(open_regular(path), "rb")
    except FileNotFoundError:
        raise UserError(missing or f"{what} {path} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    text = csv_text(binary)
    try:
        header = text.readline()
        text.seek(0)
    except UnicodeDecodeError:
        text.close()
        raise UserError(f"{what} {path} starts as UTF-16 but is not: save it as UTF-8") from None
    return text, header


def csv_records(text, path, what, delimiter=","):
    """(the columns, a stream of (line number, {column: value})) of a CSV text stream; exit 2 for a
    file the csv module cannot parse (a NUL byte, an unclosed quote) or a UTF-16 file that is not."""
    def guarded(step):
        try:
            return step()
        except csv.Error as exc:
            raise UserError(f"cannot read {what} {path} as CSV: {exc}") from None
        except UnicodeDecodeError:
            raise UserError(f"{what} {path} starts as UTF-16 but is not: save it as UTF-8") from None

    reader = csv.DictReader(text, delimiter=delimiter)
    columns = guarded(lambda: reader.fieldnames) or []

    def records():
        while True:
            row = guarded(lambda: next(reader, None))
            if row is None:
                return
            yield reader.line_num, row
    return columns, records()


def read_mapping(path, key, value, what):
    """{row[key]: row[value]} of the CSV file at path, whose columns must include both; a key given
    twice with two values is refused, naming it and both lines (the same value twice is one)."""
    text, header = open_csv(path, what)
    with text:
        columns, records = csv_records(text, path, what, delimiter_of(header))
        if not {key, value} <= set(columns):
            raise UserError(f"{what} {path} must have the columns {key},{value} (it has {', '.join(columns) or 'none'})")
        mapping, lines = {}, {}
        for line, row in records:
            k, v = row.get(key), row.get(value)
            if k in mapping and mapping[k] != v:
                raise UserError(f"{what} {path} gives {shown(k)!r} two values: {shown(mapping[k])!r} on line {lines[k]} "
                                f"and {shown(v)!r} on line {line}")
            mapping[k], lines[k] = v, lines.get(k, line)
    return mapping
