"""Gate audit: every DFLASH gate site of the installed package, matched against the manifest.

Public API: `audit(host, site_packages, patch_set, state=None) -> AuditReport`. It plans the
patch set (file states, per-hunk offsets of a dry run on pristine files), streams every `*.py`
of the package from the host in one command, parses each with `ast` (`gates.find_gate_sites`)
and matches each site to the manifest's `gates:` by (file, enclosing function, stripped line).
A site without a review is a finding, as are a drifted file and a module that does not parse;
`AuditReport.passed` / `exit_code` say whether the audit holds. Reviews that match no site are
listed as `stale_reviews` (information, not a failure: they matter once the tree changes).
Beside them, `module_api`: the `ddtree_kernels.sglang` API the set calls and the one installed in
the same site-packages (information too: DFLASH needs no module, and a mismatch only makes DDTREE
refuse at start, in one sentence, until `action=build-kernels` installs the matching one).
Read-only; writing the reports is `report.audit_report`'s job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from ddtree_deploy.errors import ExitCode
from ddtree_deploy.hosts.connection import ShellHost
from ddtree_deploy.hosts.state import HostStateStore
from ddtree_deploy.patching.engine import PatchPlan, SetState, plan_patch
from ddtree_deploy.patching.errors import PackageNotFound, PatchError
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


_KERNELS_PACKAGE = "ddtree_kernels"
_MODULE_FILE = PurePosixPath(_KERNELS_PACKAGE, "sglang.py")
_API_LINE = re.compile(rb"^API_VERSION = (\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class ModuleApi:
    """The `ddtree_kernels.sglang` API version the patch set's code calls (None: the set carries
    its own logic) and the one installed beside SGLang (None: no module there)."""

    wanted: int | None
    installed: int | None

    @property
    def matches(self) -> bool:
        return self.wanted is None or self.wanted == self.installed

    @property
    def sentence(self) -> str:
        """What the versions mean for the host, as the console and report.md say it."""
        if self.wanted is None:
            return "the set calls none (its logic is its own)"
        said = f"the set calls API {self.wanted}, installed "
        if self.installed is None:
            return said + "none: DDTREE refuses at start until `action=build-kernels` installs it"
        if self.matches:
            return said + f"API {self.installed}"
        return said + (
            f"API {self.installed}: DDTREE refuses at start; run `action=build-kernels` from the "
            "checkout that holds this set"
        )


@dataclass(frozen=True)
class AuditReport:
    """File states and gate sites of one host's package against one patch set."""

    plan: PatchPlan
    gates: tuple[GateFinding, ...]
    unparsed: tuple[UnparsedModule, ...]
    stale_reviews: tuple[GateReview, ...]
    modules_scanned: int
    module_api: ModuleApi

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
        return ExitCode.OK if self.passed else PatchError.exit_code


def audit(
    host: ShellHost,
    site_packages: PurePosixPath,
    patch_set: PatchSet,
    state: HostStateStore | None = None,
    *,
    sudo: bool = False,
) -> AuditReport:
    """Audit the package under `site_packages` on `host` (three commands plus the journal)."""
    plan = plan_patch(host, site_packages, patch_set, state, sudo=sudo)
    sources = read_python_sources(host, site_packages, patch_set.package, sudo=sudo)
    sites, unparsed = scan_sources(sources)
    reviews = {(r.file, r.function, r.text): r for r in patch_set.gates}
    findings = tuple(GateFinding(s, reviews.get((s.file, s.function, s.text))) for s in sites)
    matched = {(s.file, s.function, s.text) for s in sites}
    stale = tuple(r for key, r in reviews.items() if key not in matched)
    module_api = ModuleApi(
        patch_set.module_api(), installed_module_api(host, site_packages, sudo=sudo)
    )
    return AuditReport(plan, findings, unparsed, stale, len(sources), module_api)


def installed_module_api(
    host: ShellHost, site_packages: PurePosixPath, *, sudo: bool = False
) -> int | None:
    """`API_VERSION` of the `ddtree_kernels.sglang` installed under `site_packages`, read from
    its source (importing it would need torch in the audit's shell); None without it."""
    try:
        sources = read_python_sources(host, site_packages, _KERNELS_PACKAGE, sudo=sudo)
    except PackageNotFound:
        return None
    found = _API_LINE.search(sources.get(_MODULE_FILE, b""))
    return int(found.group(1)) if found else None


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
