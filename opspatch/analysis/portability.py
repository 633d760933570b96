"""The portability matrix: does a patch work on each release of its target (`check --releases`)?"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from opspatch.analysis.proofs import in_range as version_in_range
from opspatch.analysis.proofs import version_key
from opspatch.analysis.upstream import part_verdict
from opspatch.core.edit import (
    AlreadyApplied,
    NotApplicable,
    apply_patch,
    reverse,
    unapply,
    undone_from_text,
)
from opspatch.core.spec import PatchSpec
from opspatch.core.syntax import parse_python
from opspatch.core.validate import check_postconditions
from opspatch.core.vocabulary import UpstreamState

# NotApplicable reasons that mean the edits were placed but the result was refused (edit.py).
_VALIDATION_PREFIXES = ("the result fails validation", "the result does not parse")
STAGES = ("applies", "validates", "postconditions", "idempotent", "reverse")


@dataclass(frozen=True)
class ReleaseResult:
    """One release's verdict. A stage is True, False, or None (not reached / not applicable)."""

    version: str
    in_range: bool
    applies: bool | None = None
    validates: bool | None = None
    postconditions: bool | None = None
    idempotent: bool | None = None
    reverse: bool | None = None
    already_applied: bool = False
    reason: str = ""
    field: str = ""
    candidates: tuple[str, ...] = ()
    lines_added: int = 0
    lines_removed: int = 0
    matched: tuple[str, ...] = ()
    """Which alternative of each edit that has alternatives fit this release."""
    upstream: UpstreamState | None = None
    """Whether the release's own file already has the fix (None: not judged)."""
    upstream_reason: str = ""
    disagreement: str | None = None
    """The patch's `upstream.fixed_in` and this release's file disagree."""

    @property
    def fixed_upstream(self) -> bool:
        return self.upstream == UpstreamState.FIXED_UPSTREAM

    @property
    def ok(self) -> bool:
        stages = [getattr(self, s) for s in STAGES]
        return all(s is not False for s in stages) and any(s is True for s in stages)

    @property
    def verdict(self) -> str:
        if self.fixed_upstream:
            return str(UpstreamState.FIXED_UPSTREAM)
        if self.already_applied:
            return "already-applied"
        return "ok" if self.ok else "FAIL"

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "in_range": self.in_range,
            "verdict": self.verdict,
            **{stage: getattr(self, stage) for stage in STAGES},
            "reason": self.reason,
            "field": self.field,
            "candidates": list(self.candidates),
            "lines_added": self.lines_added,
            "lines_removed": self.lines_removed,
            "matched": list(self.matched),
            "upstream": self.upstream,
            "upstream_reason": self.upstream_reason,
            "disagreement": self.disagreement,
        }


def _diff_counts(diff: str) -> tuple[int, int]:
    lines = diff.splitlines()
    added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in lines if line.startswith("-") and not line.startswith("---"))
    return added, removed


def evaluate_release(patch: PatchSpec, version: str, source: bytes) -> ReleaseResult:
    """Judge `patch` on one release's file (`source`, the released bytes of the target module),
    and whether that file already has the fix (`upstream`)."""
    upstream = part_verdict(patch, source, version)
    return replace(
        _evaluate_edits(patch, version, source),
        upstream=upstream.state,
        upstream_reason=upstream.reason,
        disagreement=upstream.disagreement,
    )


def _evaluate_edits(patch: PatchSpec, version: str, source: bytes) -> ReleaseResult:
    in_range = version_in_range(patch, version)
    placed = apply_patch(source, patch.model_copy(update={"postconditions": []}))
    if isinstance(placed, AlreadyApplied):
        holds = not check_postconditions(parse_python(source), patch)
        return ReleaseResult(
            version, in_range, applies=True, validates=True, postconditions=holds,
            idempotent=True, already_applied=True,
            reason=f"the release already contains the change ({placed.reason})",
            matched=placed.matched,
        )  # fmt: skip
    if isinstance(placed, NotApplicable):
        validation = placed.reason.startswith(_VALIDATION_PREFIXES)
        return ReleaseResult(
            version,
            in_range,
            applies=validation,
            validates=False if validation else None,
            reason=placed.reason,
            field=placed.field,
            candidates=placed.candidates,
        )
    problems = check_postconditions(parse_python(placed.new_source), patch)
    if problems:
        return ReleaseResult(
            version, in_range, applies=True, validates=True, postconditions=False,
            reason="; ".join(problems),
        )  # fmt: skip
    again = apply_patch(placed.new_source, patch)
    idempotent = isinstance(again, AlreadyApplied)
    reasons = [] if idempotent else [f"applying again gives {again.outcome}, not already-applied"]
    reversed_ok = reverse(placed) == source
    if not reversed_ok:
        reasons.append("reversing from the recorded splices does not give the release's bytes")
    if undone_from_text(patch):
        undone = unapply(placed.new_source, patch)
        if isinstance(undone, NotApplicable) or undone.old_source != source:
            reversed_ok = False
            reasons.append(
                "removing it from the patched text does not give the release's bytes"
                + (f": {undone.reason}" if isinstance(undone, NotApplicable) else "")
            )
    added, removed = _diff_counts(placed.diff)
    return ReleaseResult(
        version, in_range, applies=True, validates=True, postconditions=True,
        idempotent=idempotent, reverse=reversed_ok, reason="; ".join(reasons),
        lines_added=added, lines_removed=removed, matched=placed.matched,
    )  # fmt: skip


def missing_module_result(patch: PatchSpec, version: str, where: str) -> ReleaseResult:
    """The verdict for a release that does not ship the target module at all."""
    return ReleaseResult(
        version,
        version_in_range(patch, version),
        applies=False,
        reason=f"release {version} has no {patch.target.module_relpaths()[0]} ({where})",
        field="target.module",
    )


@dataclass(frozen=True)
class UncheckedRelease:
    """A release in range that could not be checked (offline and not cached, no wheel, ...)."""

    version: str
    reason: str


@dataclass(frozen=True)
class ReleaseMatrix:
    """The portability matrix of one patch: a result per release checked, and the rest."""

    patch_id: str
    distribution: str
    range: str  # the specifier the releases were chosen by
    listed_from: str  # "index", "cache" or "given"
    results: tuple[ReleaseResult, ...]
    unchecked: tuple[UncheckedRelease, ...] = ()
    notes: tuple[str, ...] = ()
    module: str | None = None
    """The target module, named for one part of a patch set (each file has its own matrix)."""

    @property
    def failed(self) -> tuple[ReleaseResult, ...]:
        """Releases inside the patch's own range where it does not work."""
        return tuple(r for r in self.results if r.in_range and not r.ok)

    @property
    def exit_code(self) -> int:
        """1 when any release in the patch's range fails, else 0."""
        return 1 if self.failed else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "patch": self.patch_id,
            "distribution": self.distribution,
            "range": self.range,
            "listed_from": self.listed_from,
            "ok": not self.failed,
            "results": [r.to_json() for r in self.results],
            "failed": [r.version for r in self.failed],
            "fixed_upstream": [r.version for r in self.results if r.fixed_upstream],
            "unchecked": [{"version": u.version, "reason": u.reason} for u in self.unchecked],
            "notes": list(self.notes),
            **({"module": self.module} if self.module else {}),
        }

    def render(self) -> str:
        """The table `opspatch check PATCH --releases` prints."""

        def mark(value: bool | None) -> str:
            return "-" if value is None else ("yes" if value else "NO")

        header = ["version", "range", *STAGES, "result"]
        rows = [
            [r.version, "in" if r.in_range else "out", *(mark(getattr(r, s)) for s in STAGES),
             r.verdict]
            for r in sorted(self.results, key=lambda r: version_key(r.version))
        ]  # fmt: skip
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        out = [
            f"{self.patch_id}{f' ({self.module})' if self.module else ''} on {self.distribution} "
            f"{self.range or '(any version)'}: "
            f"{len(self.results)} release(s) checked (listed from {self.listed_from})",
            "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(),
        ]
        for row in rows:
            out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        for result in sorted(self.results, key=lambda r: version_key(r.version)):
            if (
                result.reason
                and (not result.ok or result.already_applied)
                and not result.fixed_upstream
            ):
                where = f"{result.field}: " if result.field else ""
                out.append(f"{result.version}: {where}{result.reason}")
                out += [f"    {c}" for c in result.candidates]
        for result in sorted(self.results, key=lambda r: version_key(r.version)):
            if result.fixed_upstream:
                out.append(f"{result.version}: fixed upstream: {result.upstream_reason}")
            if result.disagreement:
                out.append(f"{result.version}: disagreement: {result.disagreement}")
        for result in sorted(self.results, key=lambda r: version_key(r.version)):
            if result.matched:
                out.append(f"{result.version}: fits with {'; '.join(result.matched)}")
        for unchecked in self.unchecked:
            out.append(f"not checked: {unchecked.version}: {unchecked.reason}")
        out += [f"note: {n}" for n in self.notes]
        fixed = [r.version for r in self.results if r.fixed_upstream]
        if fixed:
            out.append(
                f"fixed upstream in: {', '.join(sorted(fixed, key=version_key))} "
                "(the patch is not needed there)"
            )
        failed = ", ".join(r.version for r in self.failed)
        out.append(
            f"FAILED in range: {failed}" if failed else "every release checked in range passes"
        )
        return "\n".join(out)
