"""A Python that has imported what the project's scripts import, and runs each script in a fork of itself.

The suite starts the scripts a few hundred times, as a user would (`python train_mt.py ...`), and each
start spent seconds importing torch, numpy, click and the project before its first line of work. This
server pays that once per test worker: for each request it forks, and the child becomes
`python SCRIPT ARGS` (its argv, sys.path[0], working folder, environment, stdin from /dev/null, stdout
and stderr to the files named), runs the script as __main__ and exits the way Python does (SystemExit,
an uncaught exception's traceback and status 1, atexit handlers, non-daemon threads joined). The parent
answers each request with the child's pid, then with its exit status as subprocess reports it.

What a fork shares and a fresh Python would not is chosen away by conftest.run: only environments that
differ from this server's in variables the project reads when a function runs (never at import) come
here; anything else (Python's or torch's start-up variables, file-size limits, `-c`) runs as its own
process. The child reseeds Python's and numpy's global generators, as a fresh process draws new seeds.

Protocol (one JSON object a line): in {"argv": [...], "cwd": ..., "env": {...}, "stdout": path,
"stderr": path}; out {"pid": N}, then {"status": S}.
"""
import atexit
import gc
import json
import os
import random
import runpy
import signal
import sys
import threading

import numpy as np

PROJECT_PACKAGES = {"mtlc", "kernels", "model"}  # importable from the project's root alone
# What the project imports inside the functions that use them (seconds a script each: digits' loader
# brings scikit-learn and scipy, the first optimizer torch._dynamo), and a fresh Python imports again
# each time; they read no variable a test sets but through an environment the server does not serve.
LIBRARIES_IMPORTED_WHEN_USED = ("torch._dynamo", "sklearn.datasets", "sklearn.model_selection", "sklearn.cluster",
                                "sklearn.metrics", "scipy.optimize", "scipy.special", "scipy.stats",
                                "torchvision.transforms.v2", "tqdm")
ROOT = None  # the project's root, where the scripts that find the project without help live
REPLIES = os.fdopen(os.dup(1), "w", buffering=1)  # the answers; fd 1 is each child's stdout
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # and nothing the server's imports print reaches them


def preload(root):
    """Import every module of the project (the scripts' imports) once, here."""
    global ROOT
    ROOT = root
    sys.path.insert(0, root)
    import importlib
    import pkgutil
    for name in ("torch", "click", "cloup", "mtlc", *LIBRARIES_IMPORTED_WHEN_USED):
        importlib.import_module(name)
    for module in pkgutil.iter_modules(sys.modules["mtlc"].__path__, "mtlc."):
        importlib.import_module(module.name)
    importlib.import_module("model")
    sys.path.remove(root)


def become(request):
    """In the child: the process `python argv...` would be, up to its first line of the script."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                            (2, request["stderr"], os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    REPLIES.close()
    seed = int.from_bytes(os.urandom(8), "little")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    script = os.path.abspath(request["argv"][0])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)
    if sys.path[0] != ROOT:  # the project is importable there only if the script makes it so: it imports it afresh
        for name in [name for name in sys.modules if name.split(".")[0] in PROJECT_PACKAGES]:
            del sys.modules[name]
    return script


def serve():
    """Fork a child for each request; the child returns the script to run, the parent never returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return become(request)
        REPLIES.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        REPLIES.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
    sys.exit(0)


def run_as_main(script):
    """Run the script as `python script` would, then exit as Python does: the status SystemExit gives (its
    message printed), or 1 after an uncaught exception's traceback; non-daemon threads joined, atexit
    handlers run, stdio flushed. The interpreter's own teardown is skipped (os._exit): in a fork it writes
    to every page the server shares (reference counts) and takes seconds, and a script leaves nothing to it."""
    try:
        runpy.run_path(script, run_name="__main__")
        status = 0
    except SystemExit as exit_:
        status = exit_status(exit_.code)
    except KeyboardInterrupt:
        print_uncaught(script)
        status = -signal.SIGINT
    except BaseException:
        print_uncaught(script)
        status = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 120  # as Python does when it cannot flush stdout at exit
    if status == -signal.SIGINT:  # Python ends by the signal itself, so that its parent sees it
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def print_uncaught(script):
    """The traceback Python prints, from the script's first frame (this server's and runpy's left out)."""
    kind, error, tb = sys.exc_info()
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    if tb is not None:
        error.__traceback__ = tb  # what the default hook prints
    sys.excepthook(kind, error, error.__traceback__)


def exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    preload(sys.argv[1])
    sys.path[0] = ""  # this folder (tests/) is no script's
    gc.freeze()  # the server's objects stay out of the children's collections: fewer pages copied
    run_as_main(serve())
