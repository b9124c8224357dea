"""Start an SGLang server module with its API key taken from the environment, not the command line.

    python -m ddtree_launch --api-key-env VAR MODULE [SERVER ARGS...]

SGLang reads its API key only from `--api-key`, and an argument systemd passes to the program
stands in `/proc/<pid>/cmdline`, which every local user can read. The unit runs this module
instead: it takes the key out of the environment variable `VAR` (set by the 0600 environment
file) and executes itself again, in the same process, with `VAR` gone from the environment and
the key in a pipe whose descriptor it names (`--api-key-fd N`). Removing `VAR` alone is not
enough: `/proc/<pid>/environ` shows the environment a program was started with, whatever it
unsets later, and every process forked from it without an exec shows the same. The second
start reads the
key from the pipe, appends `--api-key` to `sys.argv` in this process (a change to `sys.argv`
never reaches `/proc/<pid>/cmdline`), and runs `MODULE` as `__main__`, as `python -m MODULE`
would. SGLang logs its whole `ServerArgs` at start, key included, so every log record of this
process has the key masked before any handler (the journal) sees it.

Standard library only, and outside the `ddtree_kernels` package: importing that package imports
torch, and SGLang sets environment variables that must come before torch's import.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
from collections.abc import Sequence

USAGE = "usage: python -m ddtree_launch --api-key-env VAR MODULE [SERVER ARGS...]"
KEY_FLAGS = ("--api-key", "--admin-api-key")
KEY_FD_FLAG = "--api-key-fd"  # the second start's first argument: the key's pipe, not the user's
MAX_KEY_BYTES = 16384  # well inside a pipe's buffer, so writing it before the exec cannot block


class LaunchRefused(Exception):
    """The launcher cannot start the server; `str` is the one sentence the journal shows."""


def split_command(argv: Sequence[str], flag: str = "--api-key-env") -> tuple[str, str, list[str]]:
    """(the flag's value, MODULE, server args) from the launcher's own arguments."""
    if len(argv) < 3 or argv[0] != flag or argv[2].startswith("-"):
        raise LaunchRefused(f"ddtree_launch needs --api-key-env VAR and a module first; {USAGE}")
    var, module, server_args = argv[1], argv[2], list(argv[3:])
    given = [a for a in server_args if a.split("=", 1)[0] in KEY_FLAGS]
    if given:
        raise LaunchRefused(
            f"ddtree_launch: the server arguments already hold {given[0].split('=', 1)[0]}, "
            f"which would show on the command line; the key comes from ${var} only."
        )
    return var, module, server_args


def take_key(var: str) -> str:
    """The key in `var`, removed from `os.environ` (children spawned later do not get it)."""
    key = os.environ.pop(var, "")
    if not key:
        raise LaunchRefused(
            f"ddtree_launch: ${var} is not set or empty in the service's environment; the "
            "server was meant to require an API key, so it does not start without one."
        )
    if len(key.encode()) > MAX_KEY_BYTES:
        raise LaunchRefused(
            f"ddtree_launch: ${var} holds {len(key.encode())} bytes, more than an API key's "
            f"{MAX_KEY_BYTES}; put the key itself in the service's environment file."
        )
    return key


def restart_without_key(key: str, module: str, server_args: list[str]) -> None:
    """Execute this launcher again (same pid, so systemd's main process stays) with the key in
    an inherited pipe: the new program's initial environment, which `/proc/<pid>/environ` and
    any forked child show, never held it."""
    read_end, write_end = os.pipe()
    os.write(write_end, key.encode())
    os.close(write_end)
    os.set_inheritable(read_end, True)
    argv = [sys.executable, "-m", "ddtree_launch", KEY_FD_FLAG, str(read_end), module]
    os.execv(sys.executable, [*argv, *server_args])


def read_key(fd: str) -> str:
    """The key the first start wrote to pipe `fd`; the descriptor is closed, so no child gets it."""
    with os.fdopen(int(fd), "rb") as pipe:
        return pipe.read().decode()


def mask_in_logs(key: str) -> None:
    """Replace `key` in every log record this process makes, through the record factory: it
    survives SGLang configuring its own handlers, unlike a handler's or a logger's filter."""
    make_record = logging.getLogRecordFactory()

    def masked_record(*args: object, **kwargs: object) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        message = record.getMessage()
        if key in message:
            record.msg, record.args = message.replace(key, "***"), None
        return record

    logging.setLogRecordFactory(masked_record)


def main(argv: Sequence[str]) -> int:
    """Run the server module with the key in its arguments; returns the launcher's exit code
    when it refuses (the server's own exit passes through as `SystemExit`)."""
    try:
        if argv[:1] != [KEY_FD_FLAG]:
            var, module, server_args = split_command(argv)
            restart_without_key(take_key(var), module, server_args)
        fd, module, server_args = split_command(argv, KEY_FD_FLAG)
        key = read_key(fd)
    except LaunchRefused as refusal:
        print(refusal, file=sys.stderr)
        return 2
    # alter_sys: `__main__` is the server module while it runs, so multiprocessing's spawn
    # children re-import that module (as `__mp_main__`), exactly as under `python -m MODULE`.
    mask_in_logs(key)
    sys.argv = [module, *server_args, "--api-key", key]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
