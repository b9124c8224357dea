"""Port the nearest reviewed patch set to an SGLang release that has none (`action=port`).

`port_patch_set(release)` fetches the release's wheel (`wheels.fetch_wheel`), picks the nearest
reviewed set (`nearest_patch_set`: the newest whose release is <= X by PEP 440, else the oldest
above), applies its hunks in series order to an in-memory scratch copy of X's files with offsets
and up to `MAX_FUZZ` lines of fuzz (`hunks.fit_hunks`), and reports every hunk. It scans X's
DFLASH gates (`audit.scan_sources`, before and after the patches) and carries a review over where
a reviewed set has one for the same file, function and text; every other site is listed as
unreviewed. When every hunk applied, the report holds a `Candidate`: diffs regenerated with
`difflib` against X's pristine files (so they apply with fuzz 0), and a `series.yaml` with
`release: "==X"`, fresh hashes (checked against X's RECORD), the purposes copied and the gate
list. `write_candidate` writes it for a person to review, all or nothing. When every hunk landed
without fuzz and every gate site has a review, the candidate also holds `derived/series.yaml`:
the same release as a derived set of the source (`base:`, its hashes only, reviews of the sites
the base lacks), which a reviewer can ship instead of the regenerated copies.

A candidate never installs by itself: it lives outside `patches/` (so `select_patch_set` never
sees it), and its `disposition: unreviewed` gates keep `manifest.load_patch_set` from loading it
until a person reviews each. Nothing here touches a host.
"""

from __future__ import annotations

import difflib
import json
import shutil
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ddtree_deploy.errors import ExitCode
from ddtree_deploy.patching.audit import UnparsedModule, scan_sources
from ddtree_deploy.patching.errors import HunkFailed, RecordMismatch
from ddtree_deploy.patching.gates import GateSite
from ddtree_deploy.patching.hunks import HunkFit, fit_hunks, split_lines
from ddtree_deploy.patching.manifest import (
    Disposition,
    GateReview,
    Patch,
    PatchedFile,
    PatchSet,
    PatchSetError,
    load_patch_sets,
)
from ddtree_deploy.patching.targets import load_targets, patch_file, sha256_hex
from ddtree_deploy.patching.wheels import WheelFiles, fetch_wheel

MAX_FUZZ = 2  # GNU patch's default; the engine itself always applies with fuzz 0
UNREVIEWED = "unreviewed"  # a candidate's gate disposition that no manifest accepts


class PortRefused(PatchSetError):
    """There is nothing to port: the release already has a reviewed set, or no set exists."""


class HunkStatus(StrEnum):
    """How one hunk landed on the new release."""

    applied = "applied"  # at its stated line
    offset = "offset"  # elsewhere, every line matching
    fuzzed = "fuzzed"  # with outer context lines ignored
    failed = "failed"  # not found; `reason` names the line


@dataclass(frozen=True)
class PortedHunk:
    """One hunk of the source set on the new release's file."""

    file: PurePosixPath
    fit: HunkFit

    @property
    def status(self) -> HunkStatus:
        if self.fit.mismatch is not None:
            return HunkStatus.failed
        if self.fit.fuzz:
            return HunkStatus.fuzzed
        return HunkStatus.offset if self.fit.offset else HunkStatus.applied


@dataclass(frozen=True)
class PortedGate:
    """A gate site of the new release and the review carried over to it (None: unreviewed)."""

    site: GateSite
    review: GateReview | None
    carried_from: str | None  # the set whose review matched

    @property
    def reviewed(self) -> bool:
        return self.review is not None


@dataclass(frozen=True)
class CandidateFile:
    """One file of one candidate patch: hashes before and after it, and its unified diff."""

    path: PurePosixPath
    sha256_before: str
    sha256_after: str
    diff: str


@dataclass(frozen=True)
class CandidatePatch:
    """One patch of the candidate: the source patch's name and purpose, regenerated diffs."""

    name: str
    purpose: str
    files: tuple[CandidateFile, ...]

    @property
    def text(self) -> str:
        return "".join(f.diff for f in self.files)


@dataclass(frozen=True)
class Candidate:
    """A patch set for one release, regenerated from a port, waiting for a person's review."""

    release: str
    package: str
    source: str
    patches: tuple[CandidatePatch, ...]
    gates: tuple[PortedGate, ...]
    pristine: dict[PurePosixPath, bytes]  # the release's own bytes of every target file
    derivable: bool = False  # no fuzz, every site reviewed, the source not derived itself

    def series_yaml(self) -> str:
        """`series.yaml` in the shipped sets' layout; strings are JSON-quoted (valid YAML)."""
        q = json.dumps
        out = [
            f"# CANDIDATE written by `ddtree-deploy action=port` from patch set {self.source}.",
            "# Review every hunk and every gate marked `disposition: unreviewed` (set it to",
            "# covered, widened or dflash-only with a reason) before moving this folder to",
            f"# patches/{self.package}/{self.release}/: until then no manifest loader accepts it.",
            f"release: {q('==' + self.release)}",
            f"package: {self.package}",
            "patches:",
            *_patches_yaml(self.patches, purposes=True),
            "gates:",
        ]
        for gate in self.gates:
            out += _gate_yaml(gate, self.release)
        return "\n".join(out) + "\n"

    def derived_series_yaml(self) -> str:
        """The release as a derived set of the source: hashes, and the reviews it carried from
        other sets (the base's own apply through `base:`)."""
        out = [
            "# DERIVED CANDIDATE written by `ddtree-deploy action=port`: every hunk of patch",
            f"# set {self.source} lands on {self.release} without fuzz and every gate site has a",
            f"# review, so this file alone, moved to patches/{self.package}/{self.release}/,",
            f"# serves it with {self.source}'s diffs; review it as the candidate beside it.",
            f"release: {json.dumps('==' + self.release)}",
            f"package: {self.package}",
            f"base: {json.dumps(self.source)}",
            "patches:",
            *_patches_yaml(self.patches, purposes=False),
        ]
        own = [g for g in self.gates if g.carried_from != self.source]
        out.append("gates:" if own else "gates: []")
        for gate in own:
            out += _gate_yaml(gate, self.release)
        return "\n".join(out) + "\n"


def _patches_yaml(patches: tuple[CandidatePatch, ...], *, purposes: bool) -> list[str]:
    """The `patches:` entries (a derived set takes its base's purposes, so it names none)."""
    out = []
    for patch in patches:
        out.append(f"  - name: {patch.name}")
        if purposes:
            out.append(f"    purpose: {json.dumps(patch.purpose)}")
        out.append("    files:")
        for file in patch.files:
            out += [
                f"      - path: {file.path}",
                f"        sha256_before: {file.sha256_before}",
                f"        sha256_after: {file.sha256_after}",
            ]
    return out


@dataclass(frozen=True)
class PortReport:
    """What `port_patch_set` found: the set chosen and why, every hunk, every gate site."""

    release: str
    wheel: Path
    source: str
    why: str  # one sentence: why this set is the nearest
    hunks: tuple[PortedHunk, ...]
    gates: tuple[PortedGate, ...]
    dropped_reviews: tuple[GateReview, ...]  # source reviews whose site X no longer has
    unparsed: tuple[UnparsedModule, ...]
    candidate: Candidate | None  # None when any hunk failed

    @property
    def failed(self) -> tuple[PortedHunk, ...]:
        return tuple(h for h in self.hunks if h.status is HunkStatus.failed)

    @property
    def unreviewed(self) -> tuple[PortedGate, ...]:
        return tuple(g for g in self.gates if not g.reviewed)

    @property
    def exit_code(self) -> int:
        """0 when every hunk applied (unreviewed gates are for the reviewer), else 5."""
        return PatchSetError.exit_code if self.failed else ExitCode.OK


def nearest_patch_set(release: str, sets: list[PatchSet]) -> tuple[PatchSet, str]:
    """The set to port from, and a sentence saying why: the newest whose release is <= X
    (fewest upstream changes to cross), else the oldest above X."""
    if not sets:
        raise PortRefused("There is no reviewed patch set to port from; nothing was written.")
    target = Version(release)
    below = [s for s in sets if _anchor(s) <= target]
    if below:
        chosen = max(below, key=_anchor)
        return chosen, (
            f"patch set {chosen.name} ({chosen.release}) is the newest reviewed set whose "
            f"release is not newer than {release}."
        )
    chosen = min(sets, key=_anchor)
    return chosen, (
        f"no reviewed set serves a release up to {release}, so patch set {chosen.name} "
        f"({chosen.release}) is the oldest one above it."
    )


def _anchor(patch_set: PatchSet) -> Version:
    """The release a set was made for: the newest version its specifiers name and it serves
    (for `==X` sets, X), else the oldest version they name."""
    named = sorted(Version(spec.version) for spec in patch_set.release)
    served = [v for v in named if v in patch_set.release]
    return served[-1] if served else named[0]


def port_patch_set(
    release: str, *, root: Path | None = None, wheel: Path | None = None
) -> PortReport:
    """Port the nearest reviewed set (from `root`, default the shipped sets) to `release`.

    Raises `PortRefused` when `release` already has a reviewed set, `CommandFailed` when its
    wheel cannot be downloaded. Reads only the wheel; writing is `write_candidate`'s job.
    """
    sets = load_patch_sets(root)
    serving = [s for s in sets if s.serves(release)]
    if serving:
        raise PortRefused(
            f"SGLang {release} already has the reviewed patch set {serving[0].name}; run "
            f"`ddtree-deploy action=audit sglang.version={release}` on a host to check it there "
            "instead of porting."
        )
    source, why = nearest_patch_set(release, sets)
    files = WheelFiles(wheel or fetch_wheel(release, source.package), source.package, release)
    record = files.record()
    pristine_sources = files.python_sources()
    texts: dict[PurePosixPath, str] = {}  # each target's text as the patches so far leave it
    pristine: dict[PurePosixPath, bytes] = {}
    hunks: list[PortedHunk] = []
    regenerated: list[CandidatePatch] = []
    steps = {(step.patch, t.path): step for t in load_targets(source) for step in t.steps}
    for patch in source.patches:
        made: list[CandidateFile] = []
        for (name, path), step in steps.items():
            if name != patch.name:
                continue
            if path not in texts:
                data = pristine_sources.get(path) or files.read(path)
                if data is None:
                    hunks += _missing_file(patch.name, path, len(step.diff), release)
                    continue
                pristine[path] = data
                texts[path] = data.decode("utf-8", errors="surrogateescape")
            before = texts[path]
            after, fits = fit_hunks(before, step.diff, patch=patch.name, max_fuzz=MAX_FUZZ)
            hunks += [PortedHunk(path, fit) for fit in fits]
            texts[path] = after
            made.append(_candidate_file(path, before, after))
        regenerated.append(CandidatePatch(patch.name, patch.purpose, tuple(made)))
    report_hunks = tuple(hunks)
    ok = not any(h.fit.mismatch for h in report_hunks)
    patched = dict(pristine_sources)
    if ok:  # the gates a reviewer meets after applying; a partial result would mislead
        patched.update({p: t.encode("utf-8", errors="surrogateescape") for p, t in texts.items()})
    gates, dropped, unparsed = _port_gates(source, sets, pristine_sources, patched)
    candidate = None
    if ok:
        _check_record(pristine, record, release)
        derivable = (
            source.base is None
            and not any(h.fit.fuzz for h in report_hunks)
            and all(g.reviewed for g in gates)
        )
        candidate = Candidate(
            release, source.package, source.name, tuple(regenerated), gates, pristine, derivable
        )
    return PortReport(
        release, files.wheel, source.name, why, report_hunks, gates, dropped, unparsed, candidate
    )


def _missing_file(patch: str, path: PurePosixPath, count: int, release: str) -> list[PortedHunk]:
    reason = f"{path} is not in sglang=={release}"
    return [PortedHunk(path, HunkFit(patch, i, 0, 0, 0, reason)) for i in range(1, count + 1)]


def _candidate_file(path: PurePosixPath, before: str, after: str) -> CandidateFile:
    """The file's diff with the shipped sets' `a/` `b/` headers, no timestamps."""
    out: list[str] = []
    lines = difflib.unified_diff(
        split_lines(before), split_lines(after), f"a/{path}", f"b/{path}", n=3
    )
    for line in lines:
        out.append(line)
        if not line.endswith("\n"):  # a last line without its newline, as diff -u marks it
            out.append("\n\\ No newline at end of file\n")
    return CandidateFile(path, _digest(before), _digest(after), "".join(out))


def _digest(text: str) -> str:
    return sha256_hex(text.encode("utf-8", errors="surrogateescape"))


def _check_record(
    pristine: dict[PurePosixPath, bytes], record: dict[PurePosixPath, str], release: str
) -> None:
    """Every pre-image hash the candidate records must be the wheel's RECORD hash."""
    for path, data in pristine.items():
        if record.get(path) != sha256_hex(data):
            raise RecordMismatch(
                f"{path} in the sglang=={release} wheel does not hash to its RECORD entry; the "
                "download is damaged: delete it from the wheel cache and run again."
            )


def _port_gates(
    source: PatchSet,
    sets: list[PatchSet],
    pristine: dict[PurePosixPath, bytes],
    patched: dict[PurePosixPath, bytes],
) -> tuple[tuple[PortedGate, ...], tuple[GateReview, ...], tuple[UnparsedModule, ...]]:
    """Sites of X before and after the patches, each with the review carried over to it:
    the source set's first, else another set's that names no patch of its own (`covered`
    reviews belong to the set whose patch covers the site)."""
    before, unparsed = scan_sources(pristine)
    changed = {p: data for p, data in patched.items() if pristine.get(p) != data}
    after, _ = scan_sources(changed)
    sites: dict[tuple[PurePosixPath, str, str], GateSite] = {}
    for site in [*before, *after]:
        sites.setdefault((site.file, site.function, site.text), site)
    reviews: dict[tuple[PurePosixPath, str, str], tuple[GateReview, str]] = {}
    for other in sets:
        if other.name == source.name:
            continue
        for review in other.gates:
            if review.disposition is not Disposition.covered:
                reviews.setdefault(
                    (review.file, review.function, review.text), (review, other.name)
                )
    for review in source.gates:  # the source's reviews win
        reviews[(review.file, review.function, review.text)] = (review, source.name)
    gates = []
    for key, site in sorted(sites.items(), key=lambda item: (item[1].file, item[1].line)):
        found = reviews.get(key)
        gates.append(PortedGate(site, found[0] if found else None, found[1] if found else None))
    dropped = tuple(r for r in source.gates if (r.file, r.function, r.text) not in sites)
    return tuple(gates), dropped, unparsed


def _gate_yaml(gate: PortedGate, release: str) -> list[str]:
    q = json.dumps
    site, review = gate.site, gate.review
    lines = [
        f"  - file: {site.file}",
        f"    function: {q(site.function)}",
        f"    text: {q(site.text)}",
    ]
    if review is None:
        patterns = ", ".join(p.value for p in site.patterns)
        reason = (
            f"Not reviewed: no reviewed set has this site ({site.file}:{site.line} in "
            f"{release}, {patterns}); decide covered, widened or dflash-only."
        )
        return [*lines, f"    disposition: {UNREVIEWED}", f"    reason: {q(reason)}"]
    lines.append(f"    disposition: {review.disposition.value}")
    if review.patch:
        lines.append(f"    patch: {review.patch}")
    if review.reason:
        lines.append(f"    reason: {q(review.reason)}")
    return [*lines, f"    carried_from: {q(gate.carried_from)}"]


def write_candidate(candidate: Candidate, dest: Path) -> Path:
    """Write the candidate's diffs and series.yaml into `dest` (which must not exist), all or
    nothing: into a temporary folder beside it, checked, then renamed.

    The check runs the engine's own fuzz-0 application (`targets.patch_file`) on the release's
    pristine bytes, so a candidate that is written is one `action=patch` could apply.
    """
    if dest.exists():
        raise PortRefused(f"{dest} already exists; nothing was written: choose another port.out.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        for patch in candidate.patches:
            (staging / patch.name).write_text(
                patch.text, encoding="utf-8", errors="surrogateescape"
            )
        (staging / "series.yaml").write_text(candidate.series_yaml(), encoding="utf-8")
        if candidate.derivable:  # its hashes are the candidate's, which the check covers
            (staging / "derived").mkdir()
            (staging / "derived" / "series.yaml").write_text(
                candidate.derived_series_yaml(), encoding="utf-8"
            )
        _check_candidate(candidate, staging)
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def _check_candidate(candidate: Candidate, directory: Path) -> None:
    """Raise `HunkFailed` unless the written diffs turn every pristine file into its
    post-image with fuzz 0 (gates play no part, so unreviewed ones do not stop it)."""
    patches = tuple(
        Patch(
            p.name,
            p.purpose,
            tuple(PatchedFile(f.path, f.sha256_before, f.sha256_after) for f in p.files),
            directory / p.name,
        )
        for p in candidate.patches
    )
    as_set = PatchSet(
        directory.name, SpecifierSet(f"=={candidate.release}"), candidate.package, patches, (),
        directory,
    )  # fmt: skip
    for target in load_targets(as_set):
        patched, _ = patch_file(target, candidate.pristine[target.path])
        if sha256_hex(patched) != target.applied:  # patch_file checks each step; belt and braces
            raise HunkFailed(f"The candidate's diffs do not reproduce {target.path}.")
