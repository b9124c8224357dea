"""Write a gate audit (`patching.audit.AuditReport`) as JSON, Markdown and JUnit XML.

`write_audit_reports(report, run_dir)` writes `patch-audit.json` (everything, machine-readable),
`patch-audit.md` (rendered from `templates/patch-audit.md.j2`) and `patch-audit.junit.xml` (one
testcase per target file state, per gate site and per unparsable module; drift, unreviewed
sites and unparsable modules are failures) and returns their paths. Deciding the exit code is
the CLI's job (`AuditReport.exit_code`).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from ddtree_deploy.patching.audit import AuditReport
from ddtree_deploy.patching.engine import FileState, SetState

_TEMPLATE = "patch-audit.md.j2"


@dataclass(frozen=True)
class AuditReportPaths:
    """Where `write_audit_reports` put each file."""

    json: Path
    markdown: Path
    junit: Path


def write_audit_reports(report: AuditReport, run_dir: Path) -> AuditReportPaths:
    """Write the three reports into `run_dir` (created if needed), replacing earlier ones."""
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = AuditReportPaths(
        json=run_dir / "patch-audit.json",
        markdown=run_dir / "patch-audit.md",
        junit=run_dir / "patch-audit.junit.xml",
    )
    paths.json.write_text(json.dumps(audit_to_dict(report), indent=2, default=str) + "\n")
    paths.markdown.write_text(render_markdown(report))
    paths.junit.write_text(render_junit(report))
    return paths


def audit_to_dict(report: AuditReport) -> dict[str, Any]:
    """The report as JSON-ready data, with the verdict and counts up front."""
    return {
        "passed": report.passed,
        "exit_code": report.exit_code,
        "host": report.plan.host,
        "site_packages": str(report.plan.site_packages),
        "patch_set": report.plan.patch_set,
        "release": report.plan.release,
        "set_state": report.plan.state.value,
        "drifted": report.drifted,
        "summary": _summary(report),
        **dataclasses.asdict(report),
        "module_api": {
            **dataclasses.asdict(report.module_api),
            "matches": report.module_api.matches,
        },
    }


def _summary(report: AuditReport) -> dict[str, int]:
    states = [f.state for f in report.plan.files]
    return {
        "modules_scanned": report.modules_scanned,
        "gate_sites": len(report.gates),
        "unreviewed": len(report.unreviewed),
        "unparsed": len(report.unparsed),
        "stale_reviews": len(report.stale_reviews),
        **{f"files_{state.value}": states.count(state) for state in FileState},
    }


def render_markdown(report: AuditReport) -> str:
    environment = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    environment.filters["cell"] = _table_cell
    text = (importlib.resources.files("ddtree_deploy.templates") / _TEMPLATE).read_text()
    return environment.from_string(text).render(
        report=report, summary=_summary(report), SetState=SetState, FileState=FileState
    )


def _table_cell(value: object) -> str:
    """A value that cannot break a Markdown table row (source lines may hold `|`)."""
    return str(value).replace("|", "\\|")


def render_junit(report: AuditReport) -> str:
    """One testsuite; each failing testcase carries a one-line message."""
    plan = report.plan
    suite = ET.Element("testsuite", name=f"patch-audit {plan.host} {plan.patch_set}")
    for file in plan.files:
        case = _case(suite, f"patch-audit.files.{plan.host}", f"{file.path} is {file.state}")
        if file.state is FileState.drifted:
            _fail(case, f"{file.path} matches neither the pristine nor the patched hash")
    case = _case(suite, f"patch-audit.files.{plan.host}", f"patch set is {plan.state}")
    if report.drifted and plan.state is SetState.mixed:
        _fail(case, "some files are applied and others not, with no unfinished transaction")
    for finding in report.gates:
        site = finding.site
        case = _case(
            suite,
            f"patch-audit.gates.{site.file}",
            f"{site.line} {site.function}: {site.text}",
        )
        if finding.review is None:
            _fail(case, f"unreviewed DFLASH gate at {site.file}:{site.line}")
    for module in report.unparsed:
        _fail(_case(suite, "patch-audit.parse", str(module.file)), module.error)
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", "0")
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _case(suite: ET.Element, classname: str, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=name)


def _fail(case: ET.Element, message: str) -> None:
    ET.SubElement(case, "failure", message=message).text = message
