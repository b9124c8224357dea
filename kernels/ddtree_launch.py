"""Start an SGLang server module with its API key taken from the environment, not the command line.

    python -m ddtree_launch --api-key-env VAR MODULE [SERVER ARGS...]

SGLang reads its API key only from `--api-key`, and an argument systemd passes to the program
stands in `/proc/<pid>/cmdline`, which every local user can read. The unit runs this module
instead: it takes the key out of the environment variable `VAR` (set by the 0600 environment
file), removes `VAR` from the environment so that the server's child processes do not inherit
it, appends `--api-key` to `sys.argv` in this process (a change to `sys.argv` never reaches
`/proc/<pid>/cmdline`), and runs `MODULE` as `__main__`, as `python -m MODULE` would. SGLang
logs its whole `ServerArgs` at start, key included, so every log record of this process has the
key masked before any handler (the journal) sees it.

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


class LaunchRefused(Exception):
    """The launcher cannot start the server; `str` is the one sentence the journal shows."""


def split_command(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """(VAR, MODULE, server args) from the launcher's own arguments."""
    if len(argv) < 3 or argv[0] != "--api-key-env" or argv[2].startswith("-"):
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
    return key


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
        var, module, server_args = split_command(argv)
        key = take_key(var)
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
