"""A fleet run's recap as `recap.json`, `recap.md` and `recap.junit.xml` (one test case per host).

Written from `FleetResult.to_dict()` (plain data: verdicts, generations, figures, sentences).
In JUnit, a failed, refused or unreachable host is a failure; a host rolled back by
`on_failure=rollback_all` or not started is skipped, with the reason.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from ddtree_deploy.report.run_report import render_template

_FAILED = {"failed", "refused", "unreachable"}
_SKIPPED = {"skipped", "rolled back"}


def write_fleet_reports(run_dir: Path, recap: dict[str, Any]) -> tuple[Path, Path, Path]:
    """Write the three files under `run_dir`; returns their paths (json, markdown, junit)."""
    paths = (run_dir / "recap.json", run_dir / "recap.md", run_dir / "recap.junit.xml")
    paths[0].write_text(json.dumps(recap, indent=2, sort_keys=True) + "\n")
    paths[1].write_text(render_template("fleet-recap.md.j2", recap))
    paths[2].write_text(render_junit(recap))
    return paths


def render_junit(recap: dict[str, Any]) -> str:
    suite = ET.Element("testsuite", name=f"fleet {recap['fleet']} action={recap['action']}")
    for host in recap["hosts"]:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"fleet.{recap['fleet']}.{recap['action']}",
            name=host["host"],
            time=f"{host['wall_s']:.3f}",
        )
        if host["verdict"] in _FAILED:
            failure = ET.SubElement(case, "failure", message=f"{host['verdict']}: {host['detail']}")
            failure.text = host["detail"]
        elif host["verdict"] in _SKIPPED:
            ET.SubElement(case, "skipped", message=f"{host['verdict']}: {host['detail']}")
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    suite.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
    suite.set("errors", "0")
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
