"""Gate audit: every DFLASH gate site of the installed package, matched against the manifest.

Public API: `audit(host, site_packages, patch_set, state=None) -> AuditReport`. It plans the
patch set (file states, per-hunk offsets of a dry run on pristine files), streams every `*.py`
of the package from the host in one command, parses each with `ast` (`gates.find_gate_sites`)
and matches each site to the manifest's `gates:` by (file, enclosing function, stripped line).
A site without a review is a finding, as are a drifted file and a module that does not parse;
`AuditReport.passed` / `exit_code` say whether the audit holds. Reviews that match no site are
listed as `stale_reviews` (information, not a failure: they matter once the tree changes).
Read-only; writing the reports is `report.audit_report`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.engine import PatchPlan, SetState, plan_patch
from ddtree_deploy.patching.errors import PatchError
from ddtree_deploy.patching.gates import GateSite, find_gate_sites
from ddtree_deploy.patching.manifest import GateReview, PatchSet
from ddtree_deploy.patching.tree import read_python_sources


@dataclass(frozen=True)
class GateFinding:
    """One gate site and the review that covers it (None: unreviewed, a finding)."""

    site: GateSite
    review: GateReview | None

    @property
    def reviewed(self) -> bool:
        return self.review is not None


@dataclass(frozen=True)
class UnparsedModule:
    """A module `ast` could not parse: its gates are unknown, so it fails the audit."""

    file: PurePosixPath
    error: str


@dataclass(frozen=True)
class AuditReport:
    """File states and gate sites of one host's package against one patch set."""

    plan: PatchPlan
    gates: tuple[GateFinding, ...]
    unparsed: tuple[UnparsedModule, ...]
    stale_reviews: tuple[GateReview, ...]
    modules_scanned: int

    @property
    def unreviewed(self) -> tuple[GateFinding, ...]:
        return tuple(g for g in self.gates if not g.reviewed)

    @property
    def drifted(self) -> bool:
        """A drifted file, or a mixed set with no unfinished transaction to explain it."""
        state = self.plan.state
        return state is SetState.drifted or (
            state is SetState.mixed and self.plan.unfinished is None
        )

    @property
    def passed(self) -> bool:
        return not (self.drifted or self.unreviewed or self.unparsed)

    @property
    def exit_code(self) -> int:
        """0 when the audit passes, else the patching room's exit code."""
        return 0 if self.passed else PatchError.exit_code


def audit(
    host: ShellHost,
    site_packages: PurePosixPath,
    patch_set: PatchSet,
    state: HostStateStore | None = None,
    *,
    sudo: bool = False,
) -> AuditReport:
    """Audit the package under `site_packages` on `host` (two commands plus the journal)."""
    plan = plan_patch(host, site_packages, patch_set, state, sudo=sudo)
    sources = read_python_sources(host, site_packages, patch_set.package, sudo=sudo)
    sites, unparsed = scan_sources(sources)
    reviews = {(r.file, r.function, r.text): r for r in patch_set.gates}
    findings = tuple(GateFinding(s, reviews.get((s.file, s.function, s.text))) for s in sites)
    matched = {(s.file, s.function, s.text) for s in sites}
    stale = tuple(r for key, r in reviews.items() if key not in matched)
    return AuditReport(plan, findings, unparsed, stale, len(sources))


def scan_sources(
    sources: dict[PurePosixPath, bytes],
) -> tuple[list[GateSite], tuple[UnparsedModule, ...]]:
    """Gate sites of every module, by file and line, and the modules that did not parse."""
    sites: list[GateSite] = []
    unparsed: list[UnparsedModule] = []
    for path in sorted(sources):
        try:
            sites += find_gate_sites(path, sources[path])
        except (SyntaxError, ValueError) as err:  # ValueError: null bytes in the source
            unparsed.append(UnparsedModule(path, str(err)))
    return sites, tuple(unparsed)
