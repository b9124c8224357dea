"""Patching room: versioned SGLang patch sets, transactional apply/revert, and the gate audit.

Public API (re-exported here; each module's docstring has the contract):

- `select_patch_set(version) -> PatchSet` (`manifest`): the set serving a release, or
  `UnsupportedRelease` naming the supported ones.
- `site_packages_for(sglang_path)`, `plan_patch(host, site_packages, patch_set, state=None)
  -> PatchPlan`, `apply_patch_set(host, site_packages, patch_set, state) -> PatchOutcome`,
  `revert_patch_set(...) -> PatchOutcome`, `recover(host, site_packages, state) ->
  Recovery | None` (`engine`).
- `audit(host, site_packages, patch_set, state=None) -> AuditReport` (`audit`); the report
  files are written by `ddtree_deploy.report.audit_report.write_audit_reports`.
- `port_patch_set(release) -> PortReport`, `write_candidate(candidate, dest)` (`port`): the
  nearest reviewed set ported to a release without one, as a candidate for review.

Errors: `PatchSetError` (exit 5) and its `RecordMismatch`, `DiffRejected`, `HunkFailed`,
`UnsupportedRelease`; `PatchError` (exit 6) and its `DriftedFile`, `PackageNotFound`,
`PathEscape`, `TransactionStuck`. Nothing in this room prints.
"""

from ddtree_deploy.patching.audit import AuditReport, GateFinding, audit
from ddtree_deploy.patching.engine import (
    FilePlan,
    FileState,
    PatchOutcome,
    PatchPlan,
    Recovery,
    RecoveryAction,
    SetState,
    apply_patch_set,
    plan_patch,
    recover,
    revert_patch_set,
    site_packages_for,
)
from ddtree_deploy.patching.errors import (
    DiffRejected,
    DriftedFile,
    HunkFailed,
    PackageNotFound,
    PatchError,
    PathEscape,
    RecordMismatch,
    TransactionStuck,
)
from ddtree_deploy.patching.manifest import (
    PatchSet,
    PatchSetError,
    UnsupportedRelease,
    select_patch_set,
)

__all__ = [
    "AuditReport",
    "DiffRejected",
    "DriftedFile",
    "FilePlan",
    "FileState",
    "GateFinding",
    "HunkFailed",
    "PackageNotFound",
    "PatchError",
    "PatchOutcome",
    "PatchPlan",
    "PatchSet",
    "PatchSetError",
    "PathEscape",
    "RecordMismatch",
    "Recovery",
    "RecoveryAction",
    "SetState",
    "TransactionStuck",
    "UnsupportedRelease",
    "apply_patch_set",
    "audit",
    "plan_patch",
    "recover",
    "revert_patch_set",
    "select_patch_set",
    "site_packages_for",
]
