"""Read rendered systemd files back the way systemd reads them, to check what a value became.

Written for the tests from systemd's documented rules (systemd.syntax(7), systemd.service(5)
"Command lines", systemd.exec(5) "EnvironmentFile=") and systemd 252's parsers, because no
library parses them and systemd itself only loads a unit inside a running manager; each reader
is strict: anything it does not know (an unknown escape, a specifier other than `%%`, a variable
reference) fails the test instead of guessing. `systemd-analyze verify` judges the same files
alongside (tests/service/test_hostile_values.py).
"""

from __future__ import annotations

import re

_WHITESPACE = " \t\n\r"
_C_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", '"': '"', "'": "'", "s": " ",
}  # fmt: skip
_VARIABLE = re.compile(r"\$(\{|[A-Za-z_])")


def unit_directives(text: str) -> list[tuple[str, str, str]]:
    """(section, key, raw value) of every directive, in order: comments and blank lines
    dropped, a line ending in a backslash joined with the next (the backslash becomes a
    space), whitespace around key and value stripped."""
    directives = []
    section = ""
    pending = ""
    for line in text.split("\n"):
        stripped = line.strip()
        if not pending and (not stripped or stripped[0] in "#;"):
            continue
        if pending and stripped[:1] in ("#", ";"):
            continue  # a comment inside a continued line is skipped
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        stripped, pending = (pending + stripped).strip(), ""
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1]
            continue
        key, sep, value = stripped.partition("=")
        assert sep, f"not a directive: {stripped!r}"
        directives.append((section, key.strip(), value.strip()))
    assert not pending, "the file ends inside a continued line"
    return directives


def specifiers_resolved(value: str) -> str:
    """`value` after systemd resolves its specifiers: `%%` is `%`; any other is refused."""
    out = []
    i = 0
    while i < len(value):
        if value[i] == "%":
            assert value[i + 1 : i + 2] == "%", f"a specifier would expand in {value!r}"
            i += 1
        out.append(value[i])
        i += 1
    return "".join(out)


def exec_argv(value: str) -> list[str]:
    """The argv systemd runs for an ExecStart= value: words split on whitespace, single or
    double quotes keeping a word together, C escapes undone in and out of quotes, then each
    word's specifiers resolved and `$$` made `$` (a variable reference fails)."""
    words = []
    i = 0
    while True:
        while i < len(value) and value[i] in _WHITESPACE:
            i += 1
        if i == len(value):
            return words
        assert not (words == [] and value[i] in "@-:+!|"), "a prefix on the program"
        word, quote = [], ""
        while i < len(value) and (quote or value[i] not in _WHITESPACE):
            ch = value[i]
            if ch == "\\":
                i += 1
                word.append(_c_unescape(value, i))
                i += 3 if value[i] == "x" else 1
                continue
            if quote and ch == quote:
                quote = ""
            elif not quote and ch in "\"'":
                quote = ch
            else:
                word.append(ch)
            i += 1
        assert not quote, f"an unclosed quote in {value!r}"
        words.append(_variables_resolved(specifiers_resolved("".join(word))))


def _c_unescape(value: str, i: int) -> str:
    ch = value[i]
    if ch == "x":
        return chr(int(value[i + 1 : i + 3], 16))
    assert ch in _C_ESCAPES, f"systemd refuses the escape \\{ch} in {value!r}"
    return _C_ESCAPES[ch]


def _variables_resolved(word: str) -> str:
    """`$$` is a literal `$`; `$NAME` or `${NAME}` would be replaced from the environment."""
    parts = word.split("$$")
    for part in parts:
        assert not _VARIABLE.search(part), f"a variable would expand in {word!r}"
    return "$".join(parts)


def env_file_values(text: str) -> dict[str, str]:
    """KEY -> value of an environment file as systemd's EnvironmentFile= reads it: `#`/`;`
    comment lines, a single-quoted value literal, a double-quoted one with backslash escaping
    `"`, `\\`, `` ` `` and `$` only, an unquoted one with trailing whitespace dropped."""
    values: dict[str, str] = {}
    i = 0
    while i < len(text):
        while i < len(text) and text[i] in _WHITESPACE:
            i += 1
        if i == len(text):
            break
        if text[i] in "#;":
            i = text.find("\n", i) + 1 or len(text)
            continue
        eq = text.index("=", i)
        key = text[i:eq].strip()
        assert "\n" not in key, f"a line without '=': {text[i:eq]!r}"
        i, value = _env_value(text, eq + 1)
        values[key] = value
    return values


def _env_value(text: str, i: int) -> tuple[int, str]:
    """The value starting at `i` and the index after its line."""
    out: list[str] = []
    while i < len(text) and text[i] in " \t":
        i += 1
    unquoted_end = 0
    while i < len(text) and text[i] != "\n":
        ch = text[i]
        if ch == "'":
            close = text.index("'", i + 1)
            out.append(text[i + 1 : close])
            i = close + 1
            unquoted_end = len("".join(out))
        elif ch == '"':
            i += 1
            while text[i] != '"':
                if text[i] == "\\" and text[i + 1] in '"\\`$':
                    i += 1
                out.append(text[i])
                i += 1
            i += 1
            unquoted_end = len("".join(out))
        else:
            out.append(ch)
            i += 1
    value = "".join(out)
    head, tail = value[:unquoted_end], value[unquoted_end:]
    return i + 1, head + tail.rstrip(_WHITESPACE)
