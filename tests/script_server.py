"""A Python that has imported what the project's scripts import, and runs each script in a fork of itself.

The suite starts the scripts a few hundred times, as a user would (`python train_mt.py ...`), and each
start spent seconds importing torch, numpy, click and the project before its first line of work. This
server pays that once per test worker: for each request it forks, and the child becomes
`python SCRIPT ARGS` (its argv, sys.path[0], working folder, environment, standard streams), runs the
script as __main__ and exits the way Python does (SystemExit, an uncaught exception's traceback and
status 1, atexit handlers, non-daemon threads joined).

Started as `python script_server.py ROOT FOLDER`, it answers {"launcher": path} once the launcher is in
FOLDER. Two doors. The test worker (conftest.run) writes one JSON request a line on the server's stdin,
{"argv": [...], "cwd": ..., "env": {...}, "stdout": path, "stderr": path}, and reads {"pid": N}, then
{"status": S} (the exit status as subprocess reports it); the child's stdin is /dev/null. And the tools
a test runs start scripts of their own (`[sys.executable, "train_mt.py", ...]`): in a child,
sys.executable is a launcher made for this server, which sends the same request and its own three
standard streams and its file-size limit (`ulimit -f`) over a Unix socket, waits, forwards the signals
it gets to the child, and ends as the child ended (`-`, a script on stdin, too); a command it cannot hand over (`-c`, `-m`, a flag, no such file) or one the server refuses
it runs with the real Python instead (exec).

What a fork shares and a fresh Python would not is chosen away: only environments that differ from
this server's in variables the project reads when a function runs (never at import; RUN_TIME_VARIABLES)
are served; anything else (Python's or torch's start-up variables, Triton's interpreter switch) runs as
its own process. The child reseeds Python's and numpy's global generators, as a fresh process draws new seeds.
"""
import atexit
import codecs
import gc
import io
import json
import os
import random
import resource
import runpy
import selectors
import shutil
import signal
import socket
import sys
import threading
import types

import numpy as np

PROJECT_PACKAGES = {"mtlc", "kernels", "model"}  # importable from the project's root alone
# What the project imports inside the functions that use them (seconds a script each: digits' loader
# brings scikit-learn and scipy, the first optimizer torch._dynamo), and a fresh Python imports again
# each time; they read no variable a test sets but through an environment the server does not serve.
LIBRARIES_IMPORTED_WHEN_USED = ("torch._dynamo", "sklearn.datasets", "sklearn.model_selection", "sklearn.cluster",
                                "sklearn.metrics", "scipy.optimize", "scipy.special", "scipy.stats",
                                "torchvision.transforms.v2", "tqdm")
# Read by the project (and by click and shutil: the terminal's size) only inside the functions that use
# them, never at import: a fork of a server started with other values behaves as a fresh Python given these.
RUN_TIME_VARIABLES = {"MTLC_CACHE_DIR", "MTLC_CONFIG_DIR", "HOME", "XDG_CONFIG_HOME", "WORLD_SIZE", "RANK",
                      "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SE_AVOID_STATS",
                      "PYTEST_CURRENT_TEST", "COLUMNS", "LINES"}
# Read by Python at start-up, and given to each child as Python gives them (become): unbuffered stdout and
# stderr; and the standard streams' encoding and errors, served only by a server started without it (its
# own streams have Python's defaults, which the child's keep where the variable leaves them out).
START_UP_VARIABLES_SERVED = {"PYTHONUNBUFFERED"}
SERVED_UNLESS_THE_SERVERS = {"PYTHONIOENCODING"}
# What a shell on the way sets (`bash -c 'ulimit -f N && exec "$@"' ...`) or drops (a non-interactive bash
# drops the prompt, which a virtual environment's `activate` exports), or is given (tools/gpu_session.sh's
# PYTHON), read by neither Python nor the project.
SHELL_VARIABLES = {"_", "SHLVL", "PWD", "OLDPWD", "PS1", "PS2", "PYTHON"}
ROOT = None  # the project's root, where the scripts that find the project without help live
LAUNCHER = None  # the sys.executable of every child: the path of the launcher below
LAUNCHER_SOURCE = """#!{python} -S
# Starts `python SCRIPT ARGS` as a fork of the tests' script server (tests/script_server.py), or as
# the real Python where it cannot.
import json, os, resource, signal, socket, sys
PYTHON, SOCKET = {python!r}, {socket!r}
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
args = sys.argv[1:]
reply = {{}}
if args and (args[0] == "-" or not args[0].startswith("-") and args[0].endswith(".py") and os.path.isfile(args[0])):
    try:
        client = socket.socket(socket.AF_UNIX)
        client.connect(SOCKET)
        request = json.dumps(dict(argv=args, cwd=os.getcwd(), env=dict(os.environ),
                                  file_size_limit=resource.getrlimit(resource.RLIMIT_FSIZE))) + "\\n"
        socket.send_fds(client, [request.encode()], [0, 1, 2])
        replies = client.makefile("rb")
        reply = json.loads(replies.readline() or "{{}}")
    except OSError:  # no server, or a standard stream closed
        pass
if "pid" not in reply:
    os.execv(PYTHON, [PYTHON, *args])
for number in FORWARDED:
    signal.signal(number, lambda number, frame: os.kill(reply["pid"], number))
line = replies.readline()
status = json.loads(line)["status"] if line else -signal.SIGKILL
if status < 0:  # ended by a signal: end by it too, so that the parent sees it
    signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
os._exit(status)
"""


def unserved_variables(environment, server_environment):
    """The variables by which `environment` differs from the server's and that a fork cannot take on."""
    changed = {key for key in {*environment, *server_environment}
               if environment.get(key) != server_environment.get(key)}
    served = RUN_TIME_VARIABLES | SHELL_VARIABLES | START_UP_VARIABLES_SERVED | (
        SERVED_UNLESS_THE_SERVERS - set(server_environment))
    return changed - served


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


def become(request, streams):
    """In the child: the process `python argv...` would be, up to its first line of the script. streams:
    the child's stdin, stdout and stderr (file descriptors)."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "file_size_limit" in request:  # Python ignores SIGXFSZ: a write past it raises EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, tuple(request["file_size_limit"]))
    for fd, stream in enumerate(streams):
        os.dup2(stream, fd)
        os.close(stream)
    # New stream objects, as Python makes at start: the server's remember what fd 0-2 were then (its
    # stdout, /dev/null, was seekable; a pipe is not).
    unbuffered, io_encoding = bool(os.environ.get("PYTHONUNBUFFERED")), os.environ.get("PYTHONIOENCODING", "")
    sys.stdin, sys.stdout, sys.stderr = (standard_stream(old, fd, unbuffered, io_encoding) for fd, old in enumerate(
        (sys.__stdin__, sys.__stdout__, sys.__stderr__)))
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    sys.executable = LAUNCHER
    seed = int.from_bytes(os.urandom(8), "little")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    sys.argv = list(request["argv"])
    if sys.argv[0] == "-":  # the script on stdin; its folder the working one
        script, sys.path[0], folder = "-", "", os.getcwd()
    else:
        script = os.path.abspath(sys.argv[0])
        sys.path[0] = folder = os.path.dirname(script)
    if folder != ROOT:  # the project is importable there only if the script makes it so: it imports it afresh
        for name in [name for name in sys.modules if name.split(".")[0] in PROJECT_PACKAGES]:
            del sys.modules[name]
    return script


def standard_stream(old, fd, unbuffered, io_encoding):
    """A text stream on fd as Python makes it at start (create_stdio): PYTHONIOENCODING's "encoding:errors"
    (stderr's errors always backslashreplace), where it leaves one out the server's (Python's default),
    but strict errors after an encoding;
    under PYTHONUNBUFFERED stdout and stderr unbuffered (written through), else buffered, stderr and a
    terminal's stdout line by line; stdin buffered either way."""
    name, _, errors = io_encoding.partition(":")
    encoding = codecs.lookup(name).name if name else old.encoding
    if fd == 2:
        errors = old.errors
    elif not errors:
        errors = "strict" if name else old.errors  # an encoding named alone is strict
    raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
    if fd == 0:
        buffered = io.BufferedReader(raw)
    else:
        buffered = raw if unbuffered else io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding=encoding, errors=errors, write_through=unbuffered,
                            line_buffering=not unbuffered and (fd == 2 or raw.isatty()))


class Server:
    """Forks a child for each request from either door and answers with its exit status when it ends."""

    def __init__(self, replies, folder):
        self.replies = replies  # the worker's answers
        self.folder = folder  # the launcher and the socket
        socket_path = make_launcher(folder)
        self.environment = dict(os.environ)
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(socket_path)
        self.listener.listen(64)
        self.wake_read, self.wake_write = os.pipe()  # SIGCHLD wakes the loop
        for fd in (self.wake_read, self.wake_write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda number, frame: None)
        self.selector = selectors.DefaultSelector()
        self.selector.register(0, selectors.EVENT_READ, self.from_worker)
        self.selector.register(self.listener, selectors.EVENT_READ, self.accept)
        self.selector.register(self.wake_read, selectors.EVENT_READ, self.reap)
        self.worker_input = b""
        self.children = {}  # pid: the client's connection, or None for the worker's
        self.script = None  # set in a child, which leaves the loop to run it

    def serve(self):
        """The loop; returns only in a child, with the script to run."""
        while self.script is None:
            for key, _ in self.selector.select():
                key.data(key.fileobj)
                if self.script is not None:
                    break
        return self.script

    def from_worker(self, fd):
        chunk = os.read(fd, 1 << 16)
        if not chunk:  # the worker has ended
            shutil.rmtree(self.folder, ignore_errors=True)
            sys.exit(0)
        self.worker_input += chunk
        while b"\n" in self.worker_input:
            line, self.worker_input = self.worker_input.split(b"\n", 1)
            request = json.loads(line)
            streams = [os.open(os.devnull, os.O_RDONLY), os.open(request["stdout"], os.O_WRONLY),
                       os.open(request["stderr"], os.O_WRONLY)]
            pid = self.fork(request, streams, None)
            if pid is None:
                return
            self.replies.write(json.dumps({"pid": pid}) + "\n")

    def accept(self, listener):
        connection, _ = listener.accept()
        self.selector.register(connection, selectors.EVENT_READ, self.from_client)

    def from_client(self, connection):
        """A launcher's request and its standard streams, or its end (then its child is killed)."""
        pid = next((pid for pid, client in self.children.items() if client is connection), None)
        if pid is not None:  # readable while its child runs: the launcher has gone
            self.selector.unregister(connection)
            os.kill(pid, signal.SIGKILL)
            return
        data, streams = b"", []
        while not data.endswith(b"\n"):
            chunk, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
            streams += fds
            if not chunk:
                break
            data += chunk
        request = json.loads(data) if data.endswith(b"\n") else None
        if request is None or len(streams) != 3 or unserved_variables(request["env"], self.environment):
            self.close_client(connection, {"refused": True})
            for fd in streams:
                os.close(fd)
            return
        pid = self.fork(request, streams, connection)
        if pid is not None:
            connection.sendall((json.dumps({"pid": pid}) + "\n").encode())

    def fork(self, request, streams, client):
        """The child's pid in the server; None in the child, which has become the script."""
        pid = os.fork()
        if pid == 0:
            self.leave()
            self.script = become(request, streams)
            return None
        for fd in streams:
            os.close(fd)
        self.children[pid] = client
        return pid

    def leave(self):
        """In a child: nothing of the server's is kept open or handled."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for key in list(self.selector.get_map().values()):
            if isinstance(key.fileobj, socket.socket):
                key.fileobj.close()
        self.selector.close()
        for fd in (self.wake_read, self.wake_write):
            os.close(fd)
        self.replies.close()

    def reap(self, wake_read):
        while True:
            try:
                os.read(wake_read, 512)
            except BlockingIOError:
                break
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            client, answer = self.children.pop(pid), {"status": os.waitstatus_to_exitcode(status)}
            if client is None:
                self.replies.write(json.dumps(answer) + "\n")
            else:
                self.close_client(client, answer)

    def close_client(self, connection, answer):
        try:
            connection.sendall((json.dumps(answer) + "\n").encode())
        except OSError:
            pass  # the launcher has gone
        if connection in (key.fileobj for key in self.selector.get_map().values()):
            self.selector.unregister(connection)
        connection.close()


def make_launcher(folder):
    """The launcher for this server's socket, in `folder`; returns the socket's path."""
    global LAUNCHER
    socket_path = os.path.join(folder, "socket")
    LAUNCHER = os.path.join(folder, "python")
    with open(LAUNCHER, "w") as f:
        f.write(LAUNCHER_SOURCE.format(python=sys.executable, socket=socket_path))
    os.chmod(LAUNCHER, 0o755)
    return socket_path


def run_as_main(script):
    """Run the script as `python script` would (`-`: read from stdin, as `python -`), then exit as Python does: the status SystemExit gives (its
    message printed), or 1 after an uncaught exception's traceback; non-daemon threads joined, atexit
    handlers run, stdio flushed. The interpreter's own teardown is skipped (os._exit): in a fork it writes
    to every page the server shares (reference counts) and takes seconds, and a script leaves nothing to it."""
    filename = "<stdin>" if script == "-" else script
    try:
        if script == "-":
            main = types.ModuleType("__main__")
            main.__file__ = filename
            sys.modules["__main__"] = main
            exec(compile(sys.stdin.read(), filename, "exec"), main.__dict__)
        else:
            runpy.run_path(script, run_name="__main__")
        status = 0
    except SystemExit as exit_:
        status = exit_status(exit_.code)
    except KeyboardInterrupt:
        print_uncaught(filename)
        status = -signal.SIGINT
    except BaseException:
        print_uncaught(filename)
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
    replies = os.fdopen(os.dup(1), "w", buffering=1)  # the worker's answers; fd 1 is each child's stdout
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # and nothing the server's imports print reaches them
    server = Server(replies, sys.argv[2])  # its environment: the worker's, before the imports
    replies.write(json.dumps({"launcher": LAUNCHER}) + "\n")  # ready to be used: requests wait for the imports
    preload(sys.argv[1])
    sys.path[0] = ""  # this folder (tests/) is no script's
    gc.freeze()  # the server's objects stay out of the children's collections: fewer pages copied
    run_as_main(server.serve())
