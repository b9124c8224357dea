"""Everything the CLI prints: rich tables on stdout, one red line per error on stderr."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
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
