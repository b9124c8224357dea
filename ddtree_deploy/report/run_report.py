"""The validation run report: `report.json` and `report.md` (from templates/run-report.md.j2).

Both are written from `ValidationRecord.to_dict()`, which holds figures and sentences only (the
API key never reaches the record).
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Any

import jinja2

from ddtree_deploy.report import console

TEMPLATE = "run-report.md.j2"


def _load_template(name: str) -> str:
    return (importlib.resources.files("ddtree_deploy.templates") / name).read_text()


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _figures(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in figures.items() if k != "per_prompt")


_ENV = jinja2.Environment(
    loader=jinja2.FunctionLoader(_load_template),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # Markdown, not HTML
)
_ENV.filters["cell"] = _cell
_ENV.filters["figures"] = _figures


def render_markdown(record: dict[str, Any]) -> str:
    return render_template(TEMPLATE, record)


def render_template(name: str, record: dict[str, Any]) -> str:
    """A Markdown template of templates/ with `record` as `r` (and the table-cell filters)."""
    return _ENV.get_template(name).render(r=record)


def write_run_report(run_dir: Path, record: dict[str, Any]) -> tuple[Path, Path]:
    """Write `report.json` and `report.md` under `run_dir`; returns both paths."""
    json_path, md_path = run_dir / "report.json", run_dir / "report.md"
    json_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    md_path.write_text(render_markdown(record))
    return json_path, md_path


def tune_rows(tune: dict[str, Any]) -> list[tuple[str, ...]]:
    """The sweep as rows: one per candidate x concurrency (tokens/s, acceptance, speedup,
    outcome), the candidate's verdict and geometric mean on each of its rows."""
    rows: list[tuple[str, ...]] = []
    for cand in tune["candidates"]:
        mark = "*" if cand["candidate"] == tune["winner"] else ""
        for cell in cand["cells"]:
            best = [
                c for c, slug in tune["best_per_concurrency"].items() if slug == cand["candidate"]
            ]
            rows.append(
                (
                    f"{cand['candidate']}{mark}",
                    str(cell["concurrency"]),
                    _number(cell["tokens_per_s"]),
                    _number(cell["baseline_tokens_per_s"]),
                    _number(cell["accept_length"]),
                    _number(cell["speedup"])
                    + (" best" if str(cell["concurrency"]) in best else ""),
                    str(cell["outcome"]),
                    _number(cand["geomean_speedup"]),
                    str(cand["verdict"]),
                )
            )
    return rows


TUNE_COLUMNS = (
    "candidate",
    "c",
    "tok/s",
    "base tok/s",
    "accept",
    "speedup",
    "cell",
    "geomean",
    "verdict",
)


def _number(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


_ENV.globals["tune_rows"] = tune_rows
_ENV.globals["tune_columns"] = TUNE_COLUMNS


def print_tune(record: dict[str, Any]) -> None:
    """The sweep's table, then which candidate was best at each concurrency."""
    tune = record.get("tune")
    if not tune:
        return
    console.print_table(f"tune: {record['host']}", TUNE_COLUMNS, tune_rows(tune))
    for level, slug in tune["best_per_concurrency"].items():
        console.print_line(f"best at concurrency {level}: {slug or 'none passed'}")


def print_gates(record: dict[str, Any]) -> None:
    """One table row per gate, phase by phase, then the decision."""
    rows = [
        (phase["name"], gate["gate"], gate["outcome"], gate["sentence"])
        for phase in record["phases"]
        for gate in phase["gates"]
    ]
    if rows:
        console.print_table(
            f"validation: {record['host']}", ("phase", "gate", "outcome", "result"), rows
        )
    style = "green" if record["decision"] in ("promote", "unchanged", "staging") else "red"
    console.print_line(f"decision: {record['decision']}: {record['sentence']}", style=style)
