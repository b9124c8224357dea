"""Reading a failed `pip wheel` log: the compiler's first error, as one sentence.

pip, setuptools and ninja all print their own `error:` lines after the compiler's, so the first
diagnostic of nvcc (`file.cu(12): error: ...`) or gcc (`file.cpp:12:5: error: ...`) is preferred,
then the first `error:` line of any kind, then the last line of output.
"""

from __future__ import annotations

import re

_COMPILER_ERROR = re.compile(
    r"^(?P<where>\S+?(?:\(\d+\)|:\d+(?::\d+)?)):\s*(?:fatal\s+)?error:\s*(?P<what>.+)$"
)
_ANY_ERROR = re.compile(r"\berror:\s*(?P<what>.+)$", re.IGNORECASE)


def first_error(log: str) -> str:
    """The line a person should read first in a failed build log ("" for an empty log)."""
    lines = [line.strip() for line in log.splitlines()]
    for line in lines:
        match = _COMPILER_ERROR.match(line)
        if match:
            return f"{match['where']}: error: {match['what'].strip()}"
    for line in lines:
        if _ANY_ERROR.search(line):
            return line
    return next((line for line in reversed(lines) if line), "")
