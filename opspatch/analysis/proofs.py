"""Which releases a patch is proven on: what `check --releases` found, kept for plain `check`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from opspatch.core.remedy import remedy_text
from opspatch.core.spec import PatchSpec
from opspatch.core.vocabulary import Command

if TYPE_CHECKING:
    from opspatch.analysis.portability import ReleaseMatrix


def version_key(version: str) -> tuple[int, Any]:
    """Sort key: PEP 440 order, anything unparsable after."""
    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)


def sort_versions(versions: Sequence[str]) -> list[str]:
    return sorted(versions, key=version_key)


def in_range(patch: PatchSpec, version: str) -> bool:
    """Whether `version` is inside the patch's `versions` (no range: every version)."""
    if not patch.target.versions:
        return True
    try:
        return patch.target.specifier.contains(version, prereleases=True)
    except InvalidVersion:
        return False


def canonical_range(text: str) -> str:
    """A version range written one way (`>= 0.5.4,<0.6` and `<0.6,>=0.5.4` are the same)."""
    try:
        return str(SpecifierSet(text))
    except InvalidSpecifier:
        return text


def proof_key(patch: PatchSpec) -> str:
    """What a proof on a release depends on: the patch's id (its marker), its target module and
    gates other than `versions`, its edits and postconditions. Rewording the summary or the
    rationale keeps a proof; changing an edit voids it; changing `versions` keeps it, so a
    widened range shows exactly the releases not proven yet."""
    document = patch.model_dump(
        mode="json",
        include={"id", "target", "edits", "postconditions"},
        exclude={"target": {"versions"}},
    )
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class ReleaseProofs:
    """What `check --releases` found for one version of a patch (one `proof_key`): every release
    it listed, those where the patch passed, and the ranges it listed in full from the index."""

    patch_id: str
    key: str
    listed: tuple[str, ...] = ()
    proven: tuple[str, ...] = ()
    full_ranges: tuple[str, ...] = ()

    def merged(self, matrix: ReleaseMatrix) -> ReleaseProofs:
        """These proofs updated by a new matrix of the same patch: a release checked again takes
        its new verdict; the others keep theirs."""
        checked = {r.version for r in matrix.results}
        passed = {r.version for r in matrix.results if r.ok}
        listed = set(self.listed) | checked | {u.version for u in matrix.unchecked}
        full = set(self.full_ranges)
        if matrix.listed_from == "index":
            full.add(canonical_range(matrix.range))
        return ReleaseProofs(
            patch_id=self.patch_id,
            key=self.key,
            listed=tuple(sort_versions(list(listed))),
            proven=tuple(sort_versions(list((set(self.proven) - checked) | passed))),
            full_ranges=tuple(sorted(full)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "patch": self.patch_id,
            "key": self.key,
            "listed": list(self.listed),
            "proven": list(self.proven),
            "full_ranges": list(self.full_ranges),
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> ReleaseProofs:
        """Raises ValueError when the document is not a proofs record."""
        try:
            return cls(
                patch_id=str(document["patch"]),
                key=str(document["key"]),
                listed=tuple(str(v) for v in document["listed"]),
                proven=tuple(str(v) for v in document["proven"]),
                full_ranges=tuple(str(r) for r in document["full_ranges"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a proofs record: {exc}") from None


@dataclass(frozen=True)
class ProofCoverage:
    """How much of a patch's `versions` range `check --releases` has proven: the releases in
    range it passed on, those it listed but did not pass (failed, or not checked), and whether
    every release in the range was listed (from the index, for exactly this range)."""

    patch_id: str
    versions: str
    proven: tuple[str, ...]
    unproven: tuple[str, ...]
    listed_in_full: bool
    recorded: bool

    @property
    def warning(self) -> str | None:
        """One sentence for the author, or None when every release in range is proven."""
        run = f"run `{remedy_text(Command.CHECK, self.patch_id, releases=True)}`"
        covers = f"versions {self.versions!r}" if self.versions else "its range (any version)"
        if not self.recorded or not (self.proven or self.unproven):
            return f"{covers} is not proven on any release: {run}"
        if self.unproven:
            shown = ", ".join(self.unproven[:8]) + (
                f" (+{len(self.unproven) - 8} more)" if len(self.unproven) > 8 else ""
            )
            return f"{covers} covers releases it is not proven on: {shown}: {run}"
        if not self.listed_in_full:
            return (
                f"{covers} may cover releases never checked (proven on "
                f"{len(self.proven)} release(s), but the range was not listed in full from the "
                f"index): {run} online"
            )
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "proven": list(self.proven),
            "unproven": list(self.unproven),
            "listed_in_full": self.listed_in_full,
            "warning": self.warning,
        }


def proof_coverage(patch: PatchSpec, proofs: ReleaseProofs | None) -> ProofCoverage:
    """Judge the patch's own `versions` range against the recorded proofs (None: no record, or
    a record of other edits: it proves nothing about these)."""
    if proofs is None or proofs.key != proof_key(patch):
        return ProofCoverage(patch.id, patch.target.versions, (), (), False, recorded=False)
    listed = [v for v in proofs.listed if in_range(patch, v)]
    proven = set(proofs.proven)
    return ProofCoverage(
        patch_id=patch.id,
        versions=patch.target.versions,
        proven=tuple(v for v in listed if v in proven),
        unproven=tuple(v for v in listed if v not in proven),
        listed_in_full=canonical_range(patch.target.versions) in proofs.full_ranges,
        recorded=True,
    )


def combined_coverage(coverages: Sequence[ProofCoverage]) -> ProofCoverage:
    """The coverage of one fix in several files (a patch set's parts, each proven on its own):
    a release is proven only where every file is, and unproven where any file is not."""
    if len(coverages) == 1:
        return coverages[0]
    proven_everywhere = set.intersection(*(set(c.proven) for c in coverages))
    named = {v for c in coverages for v in (*c.proven, *c.unproven)}
    versions = list(dict.fromkeys(c.versions for c in coverages))
    return ProofCoverage(
        patch_id=coverages[0].patch_id,
        versions="; ".join(versions),
        proven=tuple(sort_versions(list(proven_everywhere))),
        unproven=tuple(sort_versions(list(named - proven_everywhere))),
        listed_in_full=all(c.listed_in_full for c in coverages),
        recorded=all(c.recorded for c in coverages),
    )
