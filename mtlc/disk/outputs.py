"""What an output never replaces, checked in one place before any work: something that is not a file
(a folder, a pipe, a device), another output or an input of the same command, a file the tools keep
(a folder's move log, a run's lock, a training run's checkpoints and metrics, anything in the folders
they keep: a decode cache, a step's work folder, a run's staging folder), a file the command reads
from a folder (a checkpoint's images), and a file of another kind than the output writes (a labels
file corrected by hand under the name of a predictions CSV). The undo history, a resumable run, a
cache or someone's notes would otherwise be gone without a word.

Paths are compared as the OS resolves them (links followed) and kept names whatever their case (one
name on a case-insensitive disk). The names of the kept files live here, so that this guard needs
nothing from the wings above that write them.
"""
import codecs
import os
import stat
from pathlib import Path

from ..errors import UserError

# What each training stage writes into its --out (the scripts' outputs).
STAGE_OUTPUTS = dict(mt=("mt.pt", "mt_final.pt", "mt_metrics.jsonl", "mt_last.pt"),
                     lc=("lc.pt", "lc_metrics.jsonl", "lc_last.pt"))
FINAL_OUTPUT = dict(mt="mt_final.pt", lc="lc.pt")  # what a stage writes at its end only
LOG_NAME = "label-log.csv"  # label.py's log of moves in an own-images folder
LOCK_NAME = ".mtlc-run.lock"  # a run's lock in its --out: hidden, so that no image search ever sees it
# Where a run given --overwrite writes its outputs until they all exist (a hidden folder in --out,
# one per stage): the earlier run's outputs are replaced only then.
STAGING = ".mtlc-next-{}"
CACHE_DIR_NAME = "mtlc-cache"  # the decode cache's folder in an image folder
WORK_SUFFIX = ".mtlc-work"  # the folder a long step keeps beside its output while it runs
KEPT_NAMES = {LOG_NAME: "label.py's log of moves (its undo history)", LOCK_NAME: "a run's lock",
              **{name: "a training run's checkpoint or metrics" for names in STAGE_OUTPUTS.values() for name in names}}
KEPT_NAMES = {name.casefold(): what for name, what in KEPT_NAMES.items()}


def not_a_file(path):
    """What stands at path if it is neither a regular file nor a link nor nothing (a folder, a pipe, a
    device, a socket): an output never replaces one (as root, /dev/full or a FIFO would otherwise
    become a plain file); None otherwise."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return None
    return "a folder" if stat.S_ISDIR(mode) else "a pipe" if stat.S_ISFIFO(mode) else \
        "a socket" if stat.S_ISSOCK(mode) else "a device"


def written_at(option, path):
    """Where an output named `path` is written: path itself, or, where path is a link, the file the link
    leads to, so that the link stays (an output never replaces a link it did not make); a link that
    leads nowhere yet names the file to create. A link to what is not a file (a terminal, a device,
    a pipe, a folder) is refused in one line: an output is written whole beside its file, then renamed
    onto it, which no stream can take."""
    if not path or not os.path.islink(path):
        return path
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG  # nothing at its end yet
    except OSError as exc:  # a loop of links, one that cannot be read
        raise UserError(f"{option} {path} is a link that cannot be followed ({exc.strerror}): give the output "
                        f"another name") from None
    target = os.path.realpath(path)
    if not stat.S_ISREG(mode) or through_streams(path):
        kind = "a folder" if stat.S_ISDIR(mode) else "a pipe, device or terminal"
        raise UserError(f"{option} {path} is a link to {kind} ({target}), not to a file of its own: outputs are "
                        f"written as files; give the output another name (and copy the file there once written)")
    return type(path)(target)


def through_streams(path, hops=40):
    """Whether a link leads through /dev or /proc (/dev/stdout to /proc/self/fd/1 to whatever the
    process's stdout is: a terminal, a pipe, a file deleted or not), where no output is written."""
    hop = os.path.abspath(path)
    for _ in range(hops):
        # its folder as the OS resolves it: a link to /proc/self/fd, or ../../dev, is there too
        hop = os.path.join(os.path.realpath(os.path.dirname(hop)), os.path.basename(hop))
        if hop.startswith(("/dev/", "/proc/")):
            return True
        if not os.path.islink(hop):
            return False
        hop = os.path.join(os.path.dirname(hop), os.readlink(hop))
    return True


def same_file(a, b):
    """Whether two paths name one file: the same file where both exist (links, hard links and
    another spelling of a name resolved), else the same absolute path, links resolved."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def cache_roots():
    """The folders that hold decode caches outside image folders ($MTLC_CACHE_DIR, ~/.cache/mtlc), resolved."""
    roots = [os.environ.get("MTLC_CACHE_DIR"), os.path.join(os.path.expanduser("~"), ".cache", "mtlc")]
    return [os.path.realpath(r) for r in roots if r]


def kept_folder(path):
    """The folder the tools keep that `path` is (or lies in), resolved, or None."""
    real = Path(os.path.realpath(path))
    roots = cache_roots()
    for folder in (real, *real.parents):
        name = folder.name.casefold()
        if (name == CACHE_DIR_NAME or name.endswith(WORK_SUFFIX) or name.startswith(STAGING.format(""))
                or str(folder) in roots):
            return folder
    return None


def kept_file(path):
    """What the tools keep at `path` (KEPT_NAMES, or a file in one of their folders), or None."""
    name = Path(os.path.realpath(path)).name.casefold()
    if name in KEPT_NAMES or Path(path).name.casefold() in KEPT_NAMES:
        return KEPT_NAMES.get(name) or KEPT_NAMES[Path(path).name.casefold()]
    folder = kept_folder(Path(path).parent)
    return f"a file in {folder}, a folder the tools keep" if folder else None


def first_line(path, limit=4096):
    """The first line of the regular file at `path` (not through a link: a link is replaced, not its
    file), at most `limit` bytes; None where there is no such file or it is empty; OSError where it
    cannot be read."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or not st.st_size:
        return None
    with open(path, "rb") as f:
        return f.readline(limit)


def check_outputs(outputs, *, inputs=None, read_from=(), kinds=None, its_own=False):
    """Exit 2 before any work where an output {option: path} (None: not asked for) would replace
    - what is not a file, or another output of the same command;
    - an input {option: path} of the command;
    - a file the tools keep (kept_file), unless the outputs are its_own: a training run's checkpoints
      and metrics, which only that run's own stage writes;
    - one of the files a command reads from a folder: read_from, (folder, names '/'-separated
      relative to it, what they are) each;
    - a file that the output did not write: kinds, {option: the start of the first line it writes}
      (a CSV's header), for the outputs that replace only their own kind."""
    given = [(option, path) for option, path in outputs.items() if path]
    for option, path in given:
        kind = not_a_file(path)
        if kind:
            raise UserError(f"{option} {path} is {kind}, not a file: give the output another name")
    for k, (option, path) in enumerate(given):
        for other, other_path in given[k + 1:]:
            if same_file(path, other_path):
                raise UserError(f"{option} and {other} name the same file ({path}): each output needs its own")
        for other, other_path in (inputs or {}).items():
            if other_path and same_file(path, other_path):
                raise UserError(f"{option} {path} is {other} ({other_path}): writing it would replace what this "
                                f"command reads; give the output another name")
    for option, path in given if not its_own else ():
        what = kept_file(path)
        if what:
            raise UserError(f"{option} {path} is {what}: writing it would replace it; give the output another name")
    for folder, names, what in read_from:
        check_not_among(given, folder, set(names), what)
    for option, header in (kinds or {}).items():
        check_own_kind(option, outputs.get(option), header)


def check_not_among(outputs, folder, names, what):
    """Exit 2 where one of the outputs [(option, path)] is one of the files `names` in folder."""
    root = os.path.realpath(folder) + os.sep
    for option, path in outputs:
        real = os.path.realpath(path)
        if real.startswith(root) and real[len(root):].replace(os.sep, "/") in names:
            raise UserError(f"{option} {path} is one of {what}: writing it would replace what this command reads; "
                            f"give the output another name")


def check_own_kind(option, path, header):
    """Exit 2 where the file at path (if any) does not begin with `header` (BOM or not): the output
    would replace a file it did not write."""
    try:
        line = first_line(path) if path else None
    except OSError as exc:
        raise UserError(f"{option} {path} cannot be read ({exc.strerror}) to make sure it is a CSV {option} wrote: "
                        f"give another name, or remove it first") from None
    if line is not None and not line.removeprefix(codecs.BOM_UTF8).startswith(header.encode()):
        raise UserError(f"{option} {path} is a file {option} did not write (its first line: "
                        f"{line[:60].decode(errors='replace').rstrip()}): writing would replace it; give "
                        f"another name, or remove it first")


def check_output_folder(option, path):
    """Exit 2 where a run's output folder ({option} path) is, or lies in, a folder the tools keep."""
    folder = kept_folder(path) if path else None
    if folder:
        raise UserError(f"{option} {path} lies in {folder}, a folder the tools keep (a cache, a run's work or staging "
                        f"folder): choose another folder")
