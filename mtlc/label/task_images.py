"""Which image of the served folder a Label Studio task names, read without ever leaving the folder.

A task's data names its image by the local-files URL that evaluate.py --label-studio writes
(/data/local-files/?d=<path under the document root>, use/label_studio.py) and by its `path`. Either
must name a file inside the served folder: no other host's URL, no absolute path, no '..', no
link anywhere on the way (each folder is opened from the one before without following a link, so
a link swapped in meanwhile is refused too), a regular file (never a pipe or a device), at most
MAX_IMAGE_BYTES. Nothing outside the folder is read, and nothing is fetched.
"""
import os
import stat
from pathlib import Path
from urllib.parse import unquote_to_bytes, urlsplit

from ..use.label_studio import LOCAL_FILES, TO_NAME

MAX_IMAGE_BYTES = 256 * 2 ** 20  # a photo is a few MB; a file larger than this is refused unread


class Refused(Exception):
    """Why a task's image is not read (a line for Label Studio and the log)."""


def local_files_path(url):
    """The path under the document root that a local-files URL names, read as Label Studio's server
    reads its `d` (a '+' is a space; evaluate.py --label-studio writes names URL-quoted, '+' as %2B),
    as text (its bytes as a file name holds them); Refused for any other URL."""
    if not url.startswith(LOCAL_FILES.split("?")[0]):
        parts = urlsplit(url)
        where = f"another host's URL ({parts.netloc})" if parts.netloc else f"not a local-files URL ({url[:80]!r})"
        raise Refused(f"the task's image is {where}: this backend reads only the files of the folder it serves")
    parts = urlsplit(url)
    if (parts.netloc or parts.path != "/data/local-files/" or not parts.query.startswith("d=")
            or any(c in parts.query for c in "&;")):
        raise Refused(f"the task's image URL is not Label Studio's local-files URL /data/local-files/?d=<path>: "
                      f"{url[:120]!r}")
    return os.fsdecode(unquote_to_bytes(parts.query[2:].replace("+", "%20")))


def parts_inside(folder, path, what):
    """The parts of `path` below the folder (absolute, or relative to `folder`); Refused where it is
    not there as named: empty, a NUL, a '.' or '..' part, or outside."""
    if not path or "\0" in path:
        raise Refused(f"the task's {what} is empty or holds a NUL byte")
    folder = os.path.abspath(folder)
    absolute = path if os.path.isabs(path) else os.path.join(folder, path)
    if any(p in (".", "..") for p in absolute.split(os.sep)):
        raise Refused(f"the task's {what} has a '.' or '..' part: {path!r}")
    absolute = os.path.normpath(absolute)
    if not absolute.startswith(folder.rstrip(os.sep) + os.sep):
        raise Refused(f"the task's {what} lies outside the folder this backend serves: {path!r}")
    return Path(os.path.relpath(absolute, folder)).parts


def task_image_parts(data, folder, root, image_key=TO_NAME):
    """The parts (below the served folder) of the image a task's data names: by its local-files
    URL (data[image_key], relative to the document root `root`), else its `path`; where both are
    given and the path names a file of the folder, they must name the same one."""
    if not isinstance(data, dict):
        raise Refused("the task has no data (a JSON object)")
    url, path = data.get(image_key), data.get("path")
    if url not in (None, "") and not isinstance(url, str):
        raise Refused(f"the task's {image_key!r} is not a URL ({type(url).__name__})")
    if path not in (None, "") and not isinstance(path, str):
        raise Refused(f"the task's 'path' is not text ({type(path).__name__})")
    if url and not url.encode("utf-8", "replace") == url.encode("utf-8", "surrogatepass"):
        raise Refused(f"the task's image URL holds a lone surrogate, which no URL holds: {url[:120]!r}")
    if path:
        try:
            os.fsencode(path)  # a name's undecodable bytes come as surrogates of 0x80-0xff, any other is none
        except UnicodeEncodeError:
            raise Refused(f"the task's path holds a character no file name holds: {path[:120]!r}") from None
    by_path, there = path_parts(folder, path) if path else (None, False)
    if not url:
        if by_path is None:
            raise Refused(f"the task names no image: its data has neither {image_key!r} (a local-files URL) nor "
                          f"'path'")
        return by_path
    relative = local_files_path(url)
    if os.path.isabs(relative):
        raise Refused(f"the task's image URL names an absolute path: {relative!r}")
    by_url = parts_inside(folder, os.path.join(os.path.abspath(root), relative), "image URL")
    if there and by_path != by_url:  # what Label Studio shows is the URL's image; a path found elsewhere is no check
        raise Refused(f"the task's image URL and its path name two files ({'/'.join(by_url)} and "
                      f"{'/'.join(by_path)})")
    return by_url


def path_parts(folder, path):
    """(the parts below the folder, whether a file is there) of a task's `path` as --csv and
    --label-studio write it: absolute, or relative to where evaluate.py ran (unknown here: this
    process's working folder is tried) or to the folder; as label.py reads it, the first of those
    that is a file inside the folder, else the first inside it; Refused where none is inside."""
    if "\0" in path:
        raise Refused("the task's path holds a NUL byte")
    if any(p in (".", "..") for p in path.replace(os.sep, "/").split("/")):
        raise Refused(f"the task's path has a '.' or '..' part: {path!r}")
    candidates = [path] if os.path.isabs(path) else [os.path.abspath(path), os.path.join(os.path.abspath(folder), path)]
    inside, refused = [], None
    for candidate in candidates:
        try:
            inside.append(parts_inside(folder, candidate, "path"))
        except Refused:
            refused = refused or Refused(f"the task's path lies outside the folder this backend serves: {path!r}")
    for parts in inside:
        if os.path.isfile(os.path.join(folder, *parts)):
            return parts, True
    if inside:
        return inside[0], False
    raise refused


def read_inside(folder, parts):
    """The bytes of the regular file folder/parts, each folder on the way opened from the one before
    without following a link (O_NOFOLLOW); Refused where any is a link, or the file is no regular
    file, too large or cannot be read."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    where = "/".join(parts)
    try:
        fd = os.open(folder, flags | os.O_DIRECTORY)
    except OSError as exc:
        raise Refused(f"the folder this backend serves cannot be opened ({exc.strerror})") from None
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, flags | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise Refused(f"{where}: its folder {part!r} is a link or cannot be opened ({exc.strerror}): "
                              f"this backend reads only the folder's own files") from None
            os.close(fd)
            fd = inner
        try:
            file_fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError as exc:
            raise Refused(f"{where} is a link or cannot be opened ({exc.strerror})") from None
    finally:
        os.close(fd)
    try:  # the descriptor is closed on every path, a refusal's too
        st = os.fstat(file_fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{where} is not a regular file (a folder, a pipe, a socket or a device)")
        if st.st_size > MAX_IMAGE_BYTES:
            raise Refused(f"{where} is {st.st_size / 2 ** 20:.0f} MB, over the {MAX_IMAGE_BYTES // 2 ** 20} MB "
                          f"an image may be here")
        os.set_blocking(file_fd, True)
        with open(file_fd, "rb", closefd=False) as f:
            return f.read(MAX_IMAGE_BYTES + 1)[:MAX_IMAGE_BYTES]
    except OSError as exc:
        raise Refused(f"{where} cannot be read ({exc.strerror})") from None
    finally:
        os.close(file_fd)


def task_image(data, folder, root, image_key=TO_NAME):
    """(the image's path below the folder, '/'-separated, its bytes) of the task's data."""
    parts = task_image_parts(data, folder, root, image_key)
    return "/".join(parts), read_inside(folder, parts)
