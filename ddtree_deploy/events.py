"""Structured run events: rooms `emit`, the CLI decides where they go (JSON lines in the run dir).

A leaf module: any room may import it. With no sink installed (tests, library use) events go to
the standard `logging` module at debug level, so nothing is printed behind the caller's back.
"""

from __future__ import annotations

import json
import logging
import threading
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
    _send(_sinks.get(), event, fields)


def bound_emit() -> Callable[..., None]:
    """`emit` bound to the sinks installed here, for worker threads (a thread starts with none):
    a fleet's hosts run in threads that install their own sinks and report to the fleet's."""
    sinks = _sinks.get()

    def send(event: str, **fields: Any) -> None:
        _send(sinks, event, fields)

    return send


def _send(sinks: tuple[Sink, ...], event: str, fields: dict[str, Any]) -> None:
    record = {"ts": round(time.time(), 3), "event": event, **fields}
    _log.debug("%s %s", event, fields)
    for sink in sinks:
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
    """Appends each event as one JSON line, flushed at once so a killed run keeps its events;
    whole lines also when a fleet's threads write at once."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def __call__(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=str, sort_keys=True) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        self._file.close()
