"""Render a port (`patching.port.PortReport`): the console table, port-report.json and .md.

`print_port(report, candidate_dir)` prints one row per hunk (applied / offset N / fuzzed N /
failed, with the line that did not match) and every gate site no reviewed set has reviewed;
`write_port_reports(report, run_dir, candidate_dir)` writes `port-report.json` (everything,
machine-readable) and `port-report.md` into the run folder. The Markdown is built here rather
than from a template, since it is one table per section. Deciding the exit code is the CLI's
job (`PortReport.exit_code`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_deploy.patching.port import HunkStatus, PortedHunk, PortReport
from ddtree_deploy.report import console
from ddtree_deploy.report.audit_report import _table_cell


@dataclass(frozen=True)
class PortReportPaths:
    """Where `write_port_reports` put each file."""

    json: Path
    markdown: Path


def hunk_result(hunk: PortedHunk) -> str:
    """`applied`, `offset +14`, `fuzzed 1 (offset +14)` or `failed`."""
    fit = hunk.fit
    if hunk.status is HunkStatus.offset:
        return f"offset {fit.offset:+d}"
    if hunk.status is HunkStatus.fuzzed:
        moved = f" (offset {fit.offset:+d})" if fit.offset else ""
        return f"fuzzed {fit.fuzz}{moved}"
    return hunk.status.value


def verdict(report: PortReport, candidate_dir: Path | None) -> str:
    """The one closing sentence: what came of the port and what to do next."""
    unreviewed = len(report.unreviewed)
    if report.failed:
        return (
            f"{len(report.failed)} of {len(report.hunks)} hunks of patch set {report.source} do "
            f"not apply to SGLang {report.release}; no candidate was written: port those hunks "
            "by hand."
        )
    derived = (
        f" (no fuzz and no new site: {candidate_dir}/derived/series.yaml serves it as a set "
        f"derived from {report.source}, hashes only)"
        if report.candidate is not None and report.candidate.derivable
        else ""
    )
    return (
        f"All {len(report.hunks)} hunks of patch set {report.source} apply to SGLang "
        f"{report.release}; candidate in {candidate_dir}{derived}: review it and its "
        f"{unreviewed} unreviewed gate sites before it may serve a release."
    )


def print_port(report: PortReport, candidate_dir: Path | None) -> None:
    """The per-hunk table, the unreviewed gate sites, then the verdict."""
    console.print_line(f"port to SGLang {report.release}: {report.why}")
    rows = [
        (h.fit.patch, str(h.file), f"#{h.fit.index}", str(h.fit.line), hunk_result(h),
         h.fit.mismatch or "")
        for h in report.hunks
    ]  # fmt: skip
    console.print_table(
        f"port: patch set {report.source} -> {report.release}",
        ("patch", "file", "hunk", "line", "result", "why it failed"),
        rows,
    )
    for gate in report.unreviewed:
        site = gate.site
        console.print_line(f"unreviewed: {site.file}:{site.line} ({site.function}) {site.text}")
    console.print_line(
        f"{len(report.gates)} DFLASH gate sites, {len(report.unreviewed)} unreviewed.",
    )
    console.print_line(verdict(report, candidate_dir), style="red" if report.failed else "green")


def port_to_dict(report: PortReport, candidate_dir: Path | None) -> dict[str, Any]:
    """The report as JSON-ready data, verdict and counts first."""
    statuses = [h.status for h in report.hunks]
    return {
        "exit_code": report.exit_code,
        "release": report.release,
        "wheel": str(report.wheel),
        "source": report.source,
        "why": report.why,
        "candidate": str(candidate_dir) if candidate_dir else None,
        "verdict": verdict(report, candidate_dir),
        "summary": {
            **{f"hunks_{s.value}": statuses.count(s) for s in HunkStatus},
            "gate_sites": len(report.gates),
            "unreviewed": len(report.unreviewed),
            "dropped_reviews": len(report.dropped_reviews),
            "unparsed": len(report.unparsed),
        },
        "hunks": [
            {
                "patch": h.fit.patch,
                "file": str(h.file),
                "hunk": h.fit.index,
                "line": h.fit.line,
                "status": h.status.value,
                "offset": h.fit.offset,
                "fuzz": h.fit.fuzz,
                "reason": h.fit.mismatch,
            }
            for h in report.hunks
        ],
        "gates": [
            {
                "file": str(g.site.file),
                "line": g.site.line,
                "function": g.site.function,
                "text": g.site.text,
                "patterns": [p.value for p in g.site.patterns],
                "disposition": g.review.disposition.value if g.review else "unreviewed",
                "carried_from": g.carried_from,
            }
            for g in report.gates
        ],
        "dropped_reviews": [
            {"file": str(r.file), "function": r.function, "text": r.text}
            for r in report.dropped_reviews
        ],
        "unparsed": [{"file": str(u.file), "error": u.error} for u in report.unparsed],
    }


def render_markdown(report: PortReport, candidate_dir: Path | None) -> str:
    """A reviewer's page: the verdict, the hunks, then the gates still to review."""
    cell = _table_cell
    out = [
        f"# Port of patch set {report.source} to SGLang {report.release}",
        "",
        verdict(report, candidate_dir),
        "",
        f"Source: {report.why} Wheel: `{report.wheel.name}`.",
        "",
        "## Hunks",
        "",
        "| patch | file | hunk | line | result | why it failed |",
        "|---|---|---|---|---|---|",
    ]
    out += [
        f"| {h.fit.patch} | {h.file} | #{h.fit.index} | {h.fit.line} | {hunk_result(h)} | "
        f"{cell(h.fit.mismatch or '')} |"
        for h in report.hunks
    ]
    out += ["", f"## Unreviewed gate sites ({len(report.unreviewed)} of {len(report.gates)})", ""]
    if report.unreviewed:
        out += ["| file | line | function | text |", "|---|---|---|---|"]
        out += [
            f"| {g.site.file} | {g.site.line} | {cell(g.site.function)} | `{cell(g.site.text)}` |"
            for g in report.unreviewed
        ]
    else:
        out.append("Every gate site has a review carried over from a reviewed set.")
    if report.dropped_reviews:
        out += ["", "## Reviews left behind (their site is gone in this release)", ""]
        out += [
            f"- {r.file} `{cell(r.function)}`: `{cell(r.text)}`" for r in report.dropped_reviews
        ]
    return "\n".join(out) + "\n"


def write_port_reports(
    report: PortReport, run_dir: Path, candidate_dir: Path | None
) -> PortReportPaths:
    """Write both files into `run_dir` (created if needed), replacing earlier ones."""
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = PortReportPaths(run_dir / "port-report.json", run_dir / "port-report.md")
    data = port_to_dict(report, candidate_dir)
    paths.json.write_text(json.dumps(data, indent=2) + "\n")
    paths.markdown.write_text(render_markdown(report, candidate_dir))
    return paths
