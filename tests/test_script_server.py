"""The script server (tests/script_server.py) against a fresh Python: the same scripts, run both ways,
give the same exit status, stdout and stderr, tracebacks included; what a fork cannot give the same
way runs as a process of its own."""
import json
import subprocess
import sys

import pytest

import conftest
from conftest import ROOT, run

SCRIPTS = {
    "prints": "import sys\nprint('out', sys.argv[1:], __name__)\nprint('err', file=sys.stderr)\n",
    "where": "import os, sys\nprint(os.getcwd(), sys.path[0], os.path.basename(__file__), os.environ.get('MTLC_CONFIG_DIR'))\n",
    "exit_code": "import sys\nprint('before')\nsys.exit(3)\n",
    "exit_message": "import sys\nsys.exit('a message')\n",
    "raises": "def f():\n    raise ValueError('bad')\nf()\n",
    "at_exit": "import atexit, threading, time\natexit.register(lambda: print('atexit'))\n"
               "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\nprint('main')\n",
    "stdin": "import sys\nprint(repr(sys.stdin.read()))\n",
    "no_project": "import mtlc\n",  # outside the project's root: not importable without help
    # A tool's own children (sys.executable): piped streams (stderr into stdout too) and exit status, a relative script in another
    # folder, a terminated child, two at once, and what the launcher hands to the real Python (-c).
    "spawns": """import os, subprocess, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "child.py"), "w") as f:
    f.write("import sys\\nprint('child', sys.argv[1:], repr(sys.stdin.read()))\\nprint('e', file=sys.stderr)\\n"
            "sys.exit(int(sys.argv[1]))\\n")
with open(os.path.join(here, "sleeper.py"), "w") as f:
    f.write("import time\\nprint('up', flush=True)\\ntime.sleep(60)\\n")
r = subprocess.run([sys.executable, "child.py", "3", "x y"], input="fed", capture_output=True, text=True, cwd=here)
print(r.returncode, r.stdout, r.stderr)
r = subprocess.run([sys.executable, "child.py", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=here)
print(r.returncode, r.stdout)
sleepers = [subprocess.Popen([sys.executable, os.path.join(here, "sleeper.py")], stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
print([p.stdout.readline().strip() for p in sleepers])
for p in sleepers:
    p.terminate()
print([p.wait() for p in sleepers])
print(subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip())
""",
}


def fresh(path, env):
    return subprocess.run([sys.executable, str(path), "a b", "c"], cwd=ROOT, capture_output=True, text=True,
                          errors="surrogateescape", env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_run_by_the_server_is_as_a_fresh_python_runs_it(name, tmp_path, monkeypatch):
    path = tmp_path / f"{name}.py"
    path.write_text(SCRIPTS[name])
    environment = dict(conftest.os.environ, MTLC_CONFIG_DIR="/x")
    served = conftest.SCRIPT_SERVER.run([str(path), "a b", "c"], environment, None)
    assert served is not None, conftest.SCRIPT_SERVER.unserved_variables(environment)  # the server took it
    expected = fresh(path, environment)
    assert (served.returncode, served.stdout, served.stderr) == (expected.returncode, expected.stdout, expected.stderr)


def test_what_a_fork_would_see_differently_runs_as_its_own_process(tmp_path):
    """Python reads PYTHONHASHSEED at start-up: a run given it is a fresh Python, whose string hashes
    then follow it; a variable the project reads at run time goes to the server."""
    path = tmp_path / "hashes.py"
    path.write_text("print(hash('a'))\n")
    runs = [run(path, env=dict(PYTHONHASHSEED="7")).stdout for _ in range(2)]
    assert runs[0] == runs[1] and runs[0].strip().lstrip("-").isdigit()
    server = conftest.SCRIPT_SERVER
    assert server.unserved_variables(dict(conftest.os.environ, PYTHONHASHSEED="7")) == {"PYTHONHASHSEED"}
    assert server.unserved_variables(dict(conftest.os.environ, MTLC_CACHE_DIR="/elsewhere")) == set()


def test_a_run_past_its_timeout_is_killed(tmp_path):
    path = tmp_path / "slow.py"
    path.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run(path, timeout=1)
    assert run(ROOT / "train_mt.py", "--bogus").returncode == 2  # and the server goes on serving


def test_a_tools_own_scripts_are_forks_of_the_server_too(tmp_path):
    """A script started by a served script as `[sys.executable, SCRIPT]` begins with the server's imports
    (a fresh Python has not imported torch before its first line); its launcher killed, it is killed too."""
    (tmp_path / "child.py").write_text("import os, sys, time\nprint('torch' in sys.modules, os.getpid(), flush=True)\n"
                                       "time.sleep(60)\n")
    (tmp_path / "tool.py").write_text(
        "import os, subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, sys.argv[1]], stdout=subprocess.PIPE, text=True)\n"
        "preloaded, pid = p.stdout.readline().split()\n"
        "p.kill(); p.wait()\n"
        "deadline = time.monotonic() + 10\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n        os.kill(int(pid), 0)\n    except ProcessLookupError:\n        break\n"
        "    time.sleep(0.05)\n"
        "else:\n    sys.exit('the child outlived its launcher')\n"
        "print(preloaded)\n")
    served = conftest.SCRIPT_SERVER.run([str(tmp_path / "tool.py"), str(tmp_path / "child.py")], dict(conftest.os.environ), 60)
    assert served is not None and (served.returncode, served.stdout, served.stderr) == (0, "True\n", "")


# What Python sets up at start from a variable or a limit the server gives each child: its standard
# streams' buffering, encoding and errors, and the largest file it may write.
START_UP = """import sys
for stream in (sys.stdin, sys.stdout, sys.stderr):
    print(type(stream.buffer).__name__, stream.write_through, stream.line_buffering, stream.encoding, stream.errors)
try:
    with open(sys.argv[1], "w") as f:
        f.write("x" * 5000)
    print("wrote")
except OSError as error:
    print("refused", error.errno)
print("torch" in sys.modules, file=sys.stderr)  # a fork of the server has imported it
"""


@pytest.mark.parametrize("env, limit_kb", [
    ({"PYTHONUNBUFFERED": "1"}, None), ({"PYTHONUNBUFFERED": ""}, 2),
    ({"PYTHONUNBUFFERED": "", "PYTHONIOENCODING": "latin-1:strict"}, None),
    ({"PYTHONUNBUFFERED": "", "PYTHONIOENCODING": "ascii"}, None),
    ({"PYTHONUNBUFFERED": "", "PYTHONIOENCODING": ":strict"}, None),
    ({"PYTHONUNBUFFERED": "", "PYTHONIOENCODING": "utf-8:"}, None)],
    ids=["PYTHONUNBUFFERED", "ulimit -f", "PYTHONIOENCODING encoding:errors", "... encoding", "... :errors", "... utf-8:"])
def test_start_up_settings_are_given_to_a_fork_as_python_gives_them(tmp_path, env, limit_kb):
    """Through the launcher, as run(..., limit_kb=) and a tool's children start a script."""
    path = tmp_path / "start_up.py"
    path.write_text(START_UP)
    environment = dict(conftest.os.environ, **env)
    shell = ["bash", "-c", f'ulimit -f {limit_kb} && exec "$@"', "limited"] if limit_kb is not None else []
    outputs = {}
    for python, name in ((conftest.SCRIPT_SERVER.launcher(), "served"), (sys.executable, "fresh")):
        outputs[name] = subprocess.run([*shell, python, str(path), str(tmp_path / name)], cwd=ROOT, capture_output=True,
                                       text=True, env=environment, stdin=subprocess.DEVNULL)
    served, expected = outputs["served"], outputs["fresh"]
    assert (served.returncode, served.stdout) == (expected.returncode, expected.stdout)
    # Served (a fork: torch imported) exactly where the environment that reaches the launcher, through the
    # shell where there is one, differs from the server's only in variables the server serves.
    reached = subprocess.run([*shell, sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                             cwd=ROOT, capture_output=True, text=True, env=environment, check=True)
    unserved = conftest.SCRIPT_SERVER.unserved_variables(json.loads(reached.stdout))
    assert expected.stderr == "False\n" and served.stderr == f"{not unserved}\n", unserved
    assert ("refused 27" in served.stdout) == (limit_kb is not None)  # EFBIG
    assert ("FileIO" in served.stdout) == bool(env["PYTHONUNBUFFERED"])


@pytest.mark.parametrize("code", ["import os, sys\nprint(__name__, __file__, sys.argv, repr(sys.path[0]), os.getcwd())\n",
                                  "import sys\nprint('before', flush=True)\ndef f():\n    raise ValueError('bad')\nf()\n"],
                         ids=["where", "raises"])
def test_a_script_on_stdin_is_served_as_python_reads_it(tmp_path, code):
    """`python - ARGS` with the script on stdin (as tools/gpu_session.sh checks its imports)."""
    marker = "import sys\nprint('torch' in sys.modules, file=sys.stderr)\n"  # a fork of the server has imported it
    outputs = [subprocess.run([python, "-", "a b"], input=marker + code, cwd=tmp_path, capture_output=True, text=True)
               for python in (conftest.SCRIPT_SERVER.launcher(), sys.executable)]
    (served, expected) = outputs
    assert (served.returncode, served.stdout) == (expected.returncode, expected.stdout)
    first, *rest = served.stderr.splitlines(keepends=True)
    assert first == "True\n" and expected.stderr == "False\n" + "".join(rest)
