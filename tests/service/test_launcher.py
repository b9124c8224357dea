"""The unit's launcher (kernels/ddtree_launch.py), run as the unit runs it: `python -m`.

A probe module stands in for `sglang.launch_server`: like SGLang's server it runs as
`__main__`, reads `sys.argv[1:]`, and starts a child with multiprocessing's spawn method, whose
target is defined in that `__main__` module (the case that needs the launcher to make the
server module `__main__` for its children too). It also forks a child without an exec, which
shows the environment the server's program was started with (`/proc/<pid>/environ`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
KEY = "sk-probe-5d1e"

PROBE = """
import json, logging, multiprocessing, os, sys

def environ():
    return open("/proc/self/environ", "rb").read().decode(errors="replace")

def forked_environ():
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        os.write(write_end, environ().encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        return pipe.read().decode()

def report(queue):
    queue.put({
        "cmdline": open("/proc/self/cmdline", "rb").read().decode(),
        "environ": environ(),
    })

if __name__ == "__main__":
    # As SGLang does at start: its own handlers, then the whole server arguments in the log.
    logging.basicConfig(force=True, level=logging.INFO, format="%(message)s")
    logging.getLogger("probe").info("server_args=%s", sys.argv[1:])
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=report, args=(queue,))
    child.start()
    seen = queue.get(timeout=60)
    child.join()
    print(json.dumps({
        "argv": sys.argv[1:],
        "cmdline": open("/proc/self/cmdline", "rb").read().decode(),
        "var_left": "PROBE_KEY" in os.environ,
        "environ": environ(),
        "forked_environ": forked_environ(),
        "child": seen,
    }))
"""


def launch(tmp_path: Path, *args: str, key: str | None = KEY) -> subprocess.CompletedProcess[str]:
    (tmp_path / "keyprobe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": f"{KERNELS}{os.pathsep}{tmp_path}"}
    env.pop("PROBE_KEY", None)
    if key is not None:
        env["PROBE_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "ddtree_launch", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_launcher_hands_the_key_in_process_and_to_no_child(tmp_path: Path) -> None:
    done = launch(tmp_path, "--api-key-env", "PROBE_KEY", "keyprobe", "--port", "30000")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["argv"] == ["--port", "30000", "--api-key", KEY]
    assert KEY not in seen["cmdline"]
    assert not seen["var_left"]
    assert KEY not in seen["environ"] and KEY not in seen["forked_environ"]
    assert "PROBE_KEY" not in seen["environ"]
    assert KEY not in seen["child"]["cmdline"] + seen["child"]["environ"]
    assert "server_args=['--port', '30000', '--api-key', '***']" in done.stderr
    assert KEY not in done.stderr


@pytest.mark.parametrize(
    ("args", "key", "sentence"),
    [
        (
            ["--api-key-env", "PROBE_KEY", "keyprobe"],
            None,
            "ddtree_launch: $PROBE_KEY is not set or empty in the service's environment; the "
            "server was meant to require an API key, so it does not start without one.",
        ),
        (
            ["--api-key-env", "PROBE_KEY", "keyprobe", "--api-key=other"],
            KEY,
            "ddtree_launch: the server arguments already hold --api-key, which would show on "
            "the command line; the key comes from $PROBE_KEY only.",
        ),
        (
            ["keyprobe", "--port", "1"],
            KEY,
            "ddtree_launch needs --api-key-env VAR and a module first; usage: python -m "
            "ddtree_launch --api-key-env VAR MODULE [SERVER ARGS...]",
        ),
    ],
    ids=["key-missing", "key-on-command-line", "usage"],
)
def test_launcher_refuses_with_one_sentence_and_starts_nothing(
    tmp_path: Path, args: list[str], key: str | None, sentence: str
) -> None:
    done = launch(tmp_path, *args, key=key)
    assert (done.returncode, done.stderr.strip(), done.stdout) == (2, sentence, "")
