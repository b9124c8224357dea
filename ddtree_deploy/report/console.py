"""Everything the CLI prints: rich tables on stdout, one red line per error on stderr."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
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
