"""Structured run events: rooms `emit`, the CLI decides where they go (JSON lines in the run dir).

A leaf module: any room may import it. With no sink installed (tests, library use) events go to
the standard `logging` module at debug level, so nothing is printed behind the caller's back.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

Sink = Callable[[dict[str, Any]], None]

_log = logging.getLogger("ddtree_deploy.events")
_sinks: ContextVar[tuple[Sink, ...]] = ContextVar("ddtree_deploy_event_sinks", default=())


def emit(event: str, **fields: Any) -> None:
    """Record one event; fields must be JSON-serialisable and never hold a secret."""
    record = {"ts": round(time.time(), 3), "event": event, **fields}
    _log.debug("%s %s", event, fields)
    for sink in _sinks.get():
        sink(record)


@contextmanager
def sink_installed(sink: Sink) -> Iterator[None]:
    """Send every event emitted inside the block to `sink` as well."""
    token = _sinks.set((*_sinks.get(), sink))
    try:
        yield
    finally:
        _sinks.reset(token)


class JsonLinesSink:
    """Appends each event as one JSON line, flushed at once so a killed run keeps its events."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def __call__(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, default=str, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
