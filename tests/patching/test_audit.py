"""The gate audit on real wheels (pristine and patched) and its findings on a tiny package."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest
import yaml

from ddtree_deploy.hosts.local import LocalHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.audit import audit
from ddtree_deploy.patching.engine import SetState, apply_patch_set
from ddtree_deploy.patching.gates import GatePattern
from ddtree_deploy.patching.manifest import PatchSet, load_patch_set
from ddtree_deploy.report.audit_report import write_audit_reports
from patching.trees import CASES_DIR, REAL_RELEASES, real_patch_set, rewrite

# Gate lines of the unpatched trees (shared/research/sglang-releases.md, section 4.5).
PRISTINE_GATE_LINES = {
    "0.5.11": 21,
    "0.5.12": 21,
    "0.5.12.post1": 21,
    "0.5.13": 21,
    "0.5.13.post1": 21,
    "0.5.14": 33,
    "0.5.15": 28,
    "0.5.15.post1": 28,
    "0.5.16": 29,
    "0.5.17": 34,
    "0.5.18": 33,
    "0.5.19": 43,
    "0.5.20": 46,
    "0.5.21": 51,
    "0.5.22": 67,
    "0.5.23": 82,
}
TINY = CASES_DIR / "eof-and-anchors"


@pytest.mark.parametrize("release", REAL_RELEASES)
def test_audit_counts_gate_sites_of_pristine_wheel(
    release: str, pristine_root: Callable[[str], Path], host: LocalHost
) -> None:
    report = audit(host, PurePosixPath(pristine_root(release)), real_patch_set(release))
    assert len(report.gates) == PRISTINE_GATE_LINES[release]
    assert report.plan.state is SetState.pristine
    assert not report.unparsed
    assert all(f.hunks for f in report.plan.files)  # the dry run's per-hunk offsets


def test_audit_names_a_known_pristine_site(
    pristine_root: Callable[[str], Path], host: LocalHost
) -> None:
    report = audit(host, PurePosixPath(pristine_root("0.5.11")), real_patch_set("0.5.11"))
    sites = {(str(g.site.file), g.site.line): g.site for g in report.gates}
    site = sites[("sglang/srt/server_args.py", 3319)]
    assert site.function == "ServerArgs._handle_speculative_decoding"
    assert site.text == 'if self.speculative_algorithm == "DFLASH":'
    assert site.patterns == (GatePattern.dflash_literal,)


@pytest.mark.parametrize("release", REAL_RELEASES)
def test_audit_of_patched_tree_shows_none_unreviewed(
    release: str, make_tree: Callable[[str], Path], host: LocalHost, state: HostStateStore
) -> None:
    patch_set = real_patch_set(release)
    site = PurePosixPath(make_tree(release))
    apply_patch_set(host, site, patch_set, state)
    report = audit(host, site, patch_set, state)
    assert report.plan.state is SetState.applied
    assert [f"{g.site.file}:{g.site.line}" for g in report.unreviewed] == []
    assert report.passed and report.exit_code == 0


def _tiny_set(tmp_path: Path, gates: list[dict[str, str]]) -> PatchSet:
    """The tiny case's patch set with `gates` as its reviews."""
    directory = tmp_path / "series"
    shutil.copytree(TINY / "series", directory)
    raw = yaml.safe_load((directory / "series.yaml").read_text())
    raw["gates"] = gates
    (directory / "series.yaml").write_text(yaml.safe_dump(raw))
    return load_patch_set(directory)


def _tiny_tree(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    shutil.copytree(TINY / "before", site)
    return site


_REVIEW = {
    "file": "sglang/mod.py",
    "function": "<module>",
    "text": 'LAST = "DFLASH"',
    "disposition": "dflash-only",
    "reason": "test fixture",
}


def test_audit_fails_on_unreviewed_site(host: LocalHost, tmp_path: Path) -> None:
    report = audit(host, PurePosixPath(_tiny_tree(tmp_path)), _tiny_set(tmp_path, []))
    assert [(str(g.site.file), g.site.line) for g in report.unreviewed] == [("sglang/mod.py", 3)]
    assert not report.passed and report.exit_code == 6


def test_audit_passes_once_the_site_is_reviewed(host: LocalHost, tmp_path: Path) -> None:
    report = audit(host, PurePosixPath(_tiny_tree(tmp_path)), _tiny_set(tmp_path, [_REVIEW]))
    assert report.unreviewed == () and report.stale_reviews == ()
    assert report.passed


def test_audit_fails_on_drift_and_unparsable_module(host: LocalHost, tmp_path: Path) -> None:
    site = _tiny_tree(tmp_path)
    rewrite(site / "sglang/notes.txt", b"first = 'drifted'\n")
    (site / "sglang/broken.py").write_text("def broken(:\n")
    stale = {**_REVIEW, "text": "no such line"}
    report = audit(host, PurePosixPath(site), _tiny_set(tmp_path, [stale]))
    assert report.drifted
    assert [str(m.file) for m in report.unparsed] == ["sglang/broken.py"]
    assert [r.text for r in report.stale_reviews] == ["no such line"]
    assert not report.passed


def test_audit_reports_write_json_markdown_and_junit(host: LocalHost, tmp_path: Path) -> None:
    site = _tiny_tree(tmp_path)
    (site / "sglang/gate.py").write_text("def f(a):\n    return a.is_dflash() | 1\n")
    report = audit(host, PurePosixPath(site), _tiny_set(tmp_path, [_REVIEW]))
    paths = write_audit_reports(report, tmp_path / "run")

    data = json.loads(paths.json.read_text())
    assert data["passed"] is False and data["exit_code"] == 6
    assert data["summary"]["gate_sites"] == 2 and data["summary"]["unreviewed"] == 1
    assert data["plan"]["files"][0]["hunks"][0]["offset"] == 0

    markdown = paths.markdown.read_text()
    assert "**FAILED**" in markdown
    assert "| `sglang/gate.py:2` | `f` | `return a.is_dflash() \\| 1` |" in markdown

    suite = ET.parse(paths.junit).getroot()
    cases = suite.findall("testcase")
    assert len(cases) == len(report.plan.files) + 1 + len(report.gates)
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == ["2 f: return a.is_dflash() | 1"]
    assert suite.get("failures") == "1"


def _install_module(site: Path, api: int) -> None:
    """A `ddtree_kernels.sglang` as a kernels wheel installs it beside SGLang, at `api`: the
    checkout's own module with its version line rewritten (the audit reads, never imports)."""
    source = Path(__file__).parents[2] / "kernels" / "ddtree_kernels" / "sglang.py"
    text = re.sub(r"(?m)^API_VERSION = \d+$", f"API_VERSION = {api}", source.read_text())
    (site / "ddtree_kernels").mkdir()
    (site / "ddtree_kernels" / "__init__.py").write_text("")
    (site / "ddtree_kernels" / "sglang.py").write_text(text)


def test_audit_reports_the_module_api_beside_the_set_s(
    make_tree: Callable[[str], Path], host: LocalHost, state: HostStateStore, tmp_path: Path
) -> None:
    """Issue 21: the installed module's API version beside the one the set calls, on the real
    0.5.11 set; none installed and a mismatch are said, and neither fails the audit (DFLASH
    needs no module; DDTREE refuses at start in one sentence)."""
    patch_set = real_patch_set("0.5.11")
    wanted = patch_set.module_api()
    assert wanted is not None
    site = make_tree("0.5.11")
    apply_patch_set(host, PurePosixPath(site), patch_set, state)

    report = audit(host, PurePosixPath(site), patch_set, state)
    assert (report.module_api.wanted, report.module_api.installed) == (wanted, None)
    assert not report.module_api.matches and report.passed
    markdown = write_audit_reports(report, tmp_path / "none").markdown.read_text()
    assert f"the set calls API {wanted}, installed none: DDTREE refuses at start" in markdown

    _install_module(site, wanted)
    report = audit(host, PurePosixPath(site), patch_set, state)
    assert report.module_api.installed == wanted and report.module_api.matches
    paths = write_audit_reports(report, tmp_path / "same")
    assert f"the set calls API {wanted}, installed API {wanted}\n" in paths.markdown.read_text()
    data = json.loads(paths.json.read_text())
    assert data["module_api"] == {"wanted": wanted, "installed": wanted, "matches": True}

    shutil.rmtree(site / "ddtree_kernels")
    _install_module(site, wanted + 1)
    report = audit(host, PurePosixPath(site), patch_set, state)
    assert report.module_api.installed == wanted + 1 and not report.module_api.matches
    markdown = write_audit_reports(report, tmp_path / "other").markdown.read_text()
    assert f"installed API {wanted + 1}: DDTREE refuses at start; run `action=build-kernels`" in (
        markdown
    )
    assert report.passed


def test_audit_of_a_set_with_its_own_logic_wants_no_module(host: LocalHost, tmp_path: Path) -> None:
    report = audit(host, PurePosixPath(_tiny_tree(tmp_path)), _tiny_set(tmp_path, [_REVIEW]))
    assert report.module_api.wanted is None and report.module_api.matches
    markdown = write_audit_reports(report, tmp_path / "run").markdown.read_text()
    assert "ddtree_kernels.sglang: the set calls none (its logic is its own)" in markdown
