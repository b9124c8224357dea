"""A secret value that never prints: `str`, `repr` and f-strings all give `***`.

The API key is read on the control machine (an env var or a file the config names) and reaches
the host only inside the 0600 environment file. Anything read back from a host (journal lines)
passes through `mask` before it is reported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ddtree_deploy.config.schema import ServiceConfig
from ddtree_deploy.config.text import breaking_character
from ddtree_deploy.errors import ConfigError

MASK = "***"


@dataclass(frozen=True)
class Secret:
    """Holds a secret; only `reveal()` gives the value, for the one place that writes it."""

    _value: str = field(repr=False)

    def reveal(self) -> str:
        return self._value

    def mask(self, text: str) -> str:
        """`text` with every occurrence of the secret replaced by `***`."""
        return text.replace(self._value, MASK) if self._value else text

    def __str__(self) -> str:
        return MASK

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    def __format__(self, spec: str) -> str:
        return MASK


def load_api_key(service: ServiceConfig) -> Secret | None:
    """The server's API key from `service.api_key_env` or `service.api_key_file`, or None.

    Raises `ConfigError` when the named variable or file is missing or empty (a deploy must not
    silently start an open server that was meant to have a key).
    """
    if service.api_key_env and service.api_key_file:
        raise ConfigError(
            "service.api_key_env and service.api_key_file are both set; name one source of the "
            "API key."
        )
    if service.api_key_env:
        value = os.environ.get(service.api_key_env, "")
        if not value:
            raise ConfigError(
                f"service.api_key_env names {service.api_key_env}, which is not set or empty on "
                "this machine; export it before running."
            )
        return _checked(value.strip(), f"${service.api_key_env}")
    if service.api_key_file:
        path = Path(service.api_key_file).expanduser()
        try:
            value = path.read_text().strip()
        except OSError as err:
            raise ConfigError(
                f"Cannot read the API key file {path} (service.api_key_file): {err.strerror}."
            ) from err
        if not value:
            raise ConfigError(f"The API key file {path} (service.api_key_file) is empty.")
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:  # as ssh treats a private key
            raise ConfigError(
                f"The API key file {path} (service.api_key_file) is open to its group or others "
                f"(mode {mode:04o}); make it private: chmod 600 {path}."
            )
        return _checked(value, str(path))
    return None


def _checked(value: str, source: str) -> Secret:
    if found := breaking_character(value):
        raise ConfigError(
            f"The API key from {source} holds the control character {found}; give it on one "
            "line without control characters."
        )
    return Secret(value)
