"""Which recorded change a live file is at: the chain of file versions of one host and path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opspatch.core.vocabulary import FileAction
from opspatch.ledger.records import FileVersion


@dataclass(frozen=True)
class AtPostImage:
    """The live file is the bytes `version` wrote: restoring its pre-image undoes it."""

    version: FileVersion


@dataclass(frozen=True)
class PatchedFurther:
    """The live file is `version`'s post-image patched further by the recorded changes
    `on_top` (oldest first, the newest is the live file): those are rolled back first."""

    version: FileVersion
    on_top: tuple[FileVersion, ...]

    def advice(self) -> str:
        """`patched further by run R2 (B)[, then run R3 (C)]: roll C back first`."""
        runs = ", then ".join(f"run {v.run_id} ({v.patch_id})" for v in self.on_top)
        return f"patched further by {runs}: roll {self.on_top[-1].patch_id} back first"


@dataclass(frozen=True)
class AtPreImage:
    """The live file is `version`'s pre-image: the change is not (or no longer) there."""

    version: FileVersion


@dataclass(frozen=True)
class ChangedSince:
    """The live file is none of the bytes the recorded changes lead to (e.g. a reinstall)."""

    version: FileVersion


Located = AtPostImage | PatchedFurther | AtPreImage | ChangedSince


def applied_versions(history: Sequence[FileVersion], patch_id: str) -> list[FileVersion]:
    """The `patch` changes `patch_id` made in `history` (one path's, newest first) that the
    same run did not restore afterwards (a run that rolled itself back), newest first."""
    found = []
    for index, version in enumerate(history):
        if version.action != FileAction.PATCH or version.patch_id != patch_id:
            continue
        if not any(
            later.run_id == version.run_id and later.action == FileAction.RESTORE
            for later in history[:index]
        ):
            found.append(version)
    return found


def locate(
    history: Sequence[FileVersion], candidates: Sequence[FileVersion], live_sha256: str
) -> Located | None:
    """Where the live file stands against `candidates` (changes of one path, newest first),
    given that path's whole `history` (newest first); None without candidates.

    A post-image of any candidate wins (a patch applied twice is undone one run at a time),
    then a candidate under later recorded patches, then a pre-image; else the newest candidate
    has been changed since.
    """
    for version in candidates:
        if version.sha256_after == live_sha256:
            return AtPostImage(version)
    for version in candidates:
        on_top = _patches_on_top(history, version, live_sha256)
        if on_top:
            return PatchedFurther(version, on_top)
    for version in candidates:
        if version.sha256_before == live_sha256:
            return AtPreImage(version)
    return ChangedSince(candidates[0]) if candidates else None


def _patches_on_top(
    history: Sequence[FileVersion], base: FileVersion, live_sha256: str
) -> tuple[FileVersion, ...]:
    """The later `patch` versions leading from `base`'s post-image to the live bytes, oldest
    first; empty when none does. Restores are not followed: they lead back to bytes a patch
    version started from, which the search reaches by that version's own hash."""
    later = sorted(
        (v for v in history if v.action == FileAction.PATCH and v.event_id > base.event_id),
        key=lambda v: v.event_id,
    )

    def search(sha256: str, after: int, seen: frozenset[str]) -> tuple[FileVersion, ...] | None:
        for version in later:
            if version.event_id <= after or version.sha256_before != sha256:
                continue
            if version.sha256_after == live_sha256:
                return (version,)
            if version.sha256_after in seen:
                continue
            rest = search(version.sha256_after, version.event_id, seen | {version.sha256_after})
            if rest is not None:
                return (version, *rest)
        return None

    return search(base.sha256_after, base.event_id, frozenset({base.sha256_after})) or ()
