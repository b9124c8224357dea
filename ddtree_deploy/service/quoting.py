"""Quoting for the two systemd syntaxes a value can land in: ExecStart words and env files.

ExecStart (systemd.service(5), "Command lines"): words split on whitespace, double quotes keep a
word together with C-style backslash escapes, `%` starts a specifier (`%%` is a literal `%`) and
`$` starts a variable (`$$` is a literal `$`). Environment files (systemd.exec(5),
"EnvironmentFile="): `KEY=VALUE` per line; a value in single quotes is taken literally.
"""

from __future__ import annotations

import re

_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_./:=,+@-]+$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_C_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def exec_word(value: str) -> str:
    """One ExecStart argument that systemd passes to the program exactly as `value`."""
    escaped = value.replace("%", "%%").replace("$", "$$")
    if _PLAIN_WORD.match(value):
        return escaped
    return '"' + "".join(_C_ESCAPES.get(ch, ch) for ch in escaped) + '"'


def exec_line(words: list[str]) -> str:
    """Already-quoted words joined, one option and its value per continued line."""
    lines: list[list[str]] = []
    for word in words:
        if not lines or word.startswith("-"):
            lines.append([word])
        else:
            lines[-1].append(word)
    return " \\\n    ".join(" ".join(line) for line in lines)


def env_assignment(key: str, value: str) -> str:
    """One environment-file line that systemd reads back as exactly `key`=`value`."""
    if not _ENV_KEY.match(key):
        raise ValueError(f"not an environment variable name: {key!r}")
    if "\n" in value or "\x00" in value:
        raise ValueError(f"the value of {key} spans lines; environment files cannot hold that")
    if "'" not in value:
        return f"{key}='{value}'"
    # Double quotes: backslash escapes only these characters there.
    escaped = "".join("\\" + ch if ch in '"\\`$' else ch for ch in value)
    return f'{key}="{escaped}"'
