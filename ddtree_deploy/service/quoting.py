"""Quoting for the systemd syntaxes a value can land in: unit settings, ExecStart, env files.

Every value a systemd template shows goes through one of these functions, which return `Quoted`
(the template environment refuses any other string, `render.TEMPLATES`). The rules:

- Unit files (systemd.syntax(7)): one `Key=value` per line; a line ending in a backslash goes on
  into the next; leading and trailing whitespace of a value is dropped; `%` starts a specifier
  (`%%` is a literal `%`) in the settings that take specifiers (Description=, User=,
  EnvironmentFile=, SyslogIdentifier= and ExecStart= among them).
- ExecStart= (systemd.service(5), "Command lines"): words split on whitespace; a double-quoted
  word keeps spaces, with C-style backslash escapes; `$` starts a variable (`$$` is a literal
  `$`); the first word's leading `@-:+!|` are prefixes, so it must be an absolute path, and
  systemd refuses quotes and backslashes in it and leaves its `$` unexpanded (argv[0] not).
- Environment files (systemd.exec(5), "EnvironmentFile="): `KEY=VALUE` per line; a value in
  single quotes is taken literally, in double quotes with `\\` escaping only `"`, `\\`, `` ` ``
  and `$`. Neither form expands variables.

No systemd syntax can carry NUL, and a line break would start a new directive: each function
refuses a line-breaking character (`config.text`) with `ValueError`. Composition refuses them
first with a sentence naming the key, so reaching that `ValueError` is a bug.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ddtree_deploy.config.rules import PROGRAM_UNSAFE
from ddtree_deploy.config.text import breaking_character

_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_./:=,+@-]+$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Quoted(str):
    """Text one of this module's functions made safe for the place it is meant for."""


def _one_line(value: str, what: str) -> str:
    if found := breaking_character(value):
        raise ValueError(f"{what} holds the control character {found}; it cannot be quoted")
    return value


def unit_value(value: str) -> Quoted:
    """A unit setting's value (Description=, User=, SyslogIdentifier=) that systemd reads back
    as exactly `value`: specifiers escaped; whitespace at either end or a final backslash,
    which the line syntax would drop or join, refused."""
    _one_line(value, "a unit setting")
    if value != value.strip() or value.endswith("\\"):
        raise ValueError(f"a unit setting cannot start or end with a space or backslash: {value!r}")
    return Quoted(value.replace("%", "%%"))


def path_value(value: str) -> Quoted:
    """An absolute path as a path setting's value (EnvironmentFile=): not quoted, since systemd
    takes the whole rest of the line as the path; specifiers escaped."""
    if not value.startswith("/"):
        raise ValueError(f"not an absolute path: {value!r}")
    return unit_value(value)


def exec_word(value: str) -> Quoted:
    """One ExecStart argument that systemd passes to the program exactly as `value`."""
    _one_line(value, "a command-line argument")
    escaped = value.replace("%", "%%").replace("$", "$$")
    if _PLAIN_WORD.match(value):
        return Quoted(escaped)
    return Quoted('"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"')


def exec_command(argv: Sequence[str]) -> Quoted:
    """ExecStart='s value for `argv`: each word quoted, one option and its values per
    continued line. argv[0] must be an absolute path (no prefix character can start it)."""
    if not argv or not argv[0].startswith("/") or set(argv[0]) & set(PROGRAM_UNSAFE):
        raise ValueError(f"ExecStart's program must be a plain absolute path: {argv[:1]!r}")
    lines: list[list[str]] = []
    for word in map(exec_word, argv):
        if not lines or word.startswith("-"):
            lines.append([word])
        else:
            lines[-1].append(word)
    return Quoted(" \\\n    ".join(" ".join(line) for line in lines))


def env_assignment(key: str, value: str) -> Quoted:
    """One environment-file line that systemd reads back as exactly `key`=`value`."""
    if not _ENV_KEY.match(key):
        raise ValueError(f"not an environment variable name: {key!r}")
    _one_line(value, f"the value of {key}")
    if "'" not in value:
        return Quoted(f"{key}='{value}'")
    # Double quotes: backslash escapes only these characters there.
    escaped = "".join("\\" + ch if ch in '"\\`$' else ch for ch in value)
    return Quoted(f'{key}="{escaped}"')
