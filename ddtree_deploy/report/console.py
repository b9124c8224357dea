"""Everything the CLI prints: rich tables on stdout, one red line per error on stderr."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ddtree_deploy.errors import DeployError

# soft_wrap: an error sentence stays one line, whatever the terminal width.
stdout = Console(highlight=False)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A titled table; cells are plain text (rich markup in values is not interpreted)."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_escape(cell) for cell in row))
    stdout.print(table)


def print_line(text: str, style: str | None = None) -> None:
    stdout.print(_escape(text), style=style)


def print_error(err: DeployError) -> None:
    """The user's sentence in red, then the hint (if any) dimmed; never a traceback."""
    stderr.print(f"[bold red]error:[/] {_escape(str(err))}")
    if err.hint:
        stderr.print(_escape(err.hint), style="dim")


def _escape(text: str) -> str:
    return escape(text)


class TuneProgress:
    """An event sink: a rich progress bar over the candidates of `action=tune` (on stderr)."""

    def __init__(self) -> None:
        self.progress: Progress | None = None
        self.task: Any = None

    def __call__(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event == "tune.start":
            self.progress = Progress(
                TextColumn("tune"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=stderr,
                transient=False,
            )
            self.progress.start()
            self.task = self.progress.add_task("baselines", total=int(record["total"]))
        elif self.progress is None:
            return
        elif event == "tune.candidate":
            self.progress.update(self.task, description=str(record["candidate"]))
        elif event == "tune.candidate.done":
            self.progress.advance(self.task)
        elif event == "tune.end":
            self.progress.update(self.task, description="done")
            self.close()

    def close(self) -> None:
        """Stop the bar (a failed sweep stops it where it was)."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class FleetLive:
    """An event sink: a live table of a fleet's hosts (batch, result, the step each is at,
    time) on stderr while the hosts run; gone at the end, where the recap takes its place.
    Fed from the hosts' threads, hence the lock."""

    _COLUMNS = ("host", "batch", "state", "step", "elapsed")

    def __init__(self) -> None:
        self._rows: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._live: Live | None = None

    def __call__(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        with self._lock:
            if event == "fleet.start":
                for number, batch in enumerate(record["batches"], 1):
                    for host in batch:
                        done = host in record.get("finished", ())
                        self._row(host, batch=number, state="done" if done else "waiting")
                self._live = Live(self._table(), console=stderr, transient=True)
                self._live.start()
            elif event == "fleet.host.start":
                state = "rolling back" if record.get("rollback") else "running"
                self._row(record["host"], state=state, started=time.monotonic(), step="")
            elif event == "fleet.step":
                self._row(record["host"], step=str(record["step"]))
            elif event == "fleet.host.end":
                self._row(record["host"], state=record["verdict"], ended=time.monotonic())
            elif event == "fleet.end":
                self.close()
                return
            if self._live is not None:
                self._live.update(self._table(), refresh=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _row(self, host: str, **fields: Any) -> None:
        self._rows.setdefault(host, {"step": "", "state": ""}).update(fields)

    def _table(self) -> Table:
        table = Table(title="fleet", title_justify="left")
        for column in self._COLUMNS:
            table.add_column(column)
        now = time.monotonic()
        for host, row in self._rows.items():
            began = row.get("started")
            elapsed = f"{(row.get('ended') or now) - began:.0f}s" if began else ""
            cells = (host, str(row.get("batch", "")), row["state"], row["step"], elapsed)
            table.add_row(*(_escape(str(cell)) for cell in cells))
        return table
