"""The words each command says about a host, as tables over where its files stand."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from opspatch.core.vocabulary import (
    Detected,
    DriftCause,
    FileState,
    PatchState,
    SyncAction,
    Word,
)
from opspatch.runs.judgments.patchset import FileStanding, Place, Reference, ServerAge

V = TypeVar("V")


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()
"""A cell's pattern that any value of its column fits."""


@dataclass(frozen=True)
class DecisionTable(Generic[V]):
    """The last item of each row is its value; a pattern is a value, a tuple (any of them) or `ANY`."""

    columns: tuple[str, ...]
    domains: tuple[tuple[object, ...], ...]
    rows: tuple[tuple[object, ...], ...]

    def matching(self, key: Sequence[object]) -> list[int]:
        """The rows `key` fits (exactly one, for every key in `cases()`)."""
        return [
            index
            for index, row in enumerate(self.rows)
            if all(_fits(pattern, value) for pattern, value in zip(row, key, strict=False))
        ]

    def __call__(self, *key: object) -> V:
        found = self.matching(key)
        if not found:
            raise KeyError(f"no row for {dict(zip(self.columns, key, strict=True))}")
        return cast(V, self.rows[found[0]][-1])

    def cases(self) -> Iterator[tuple[object, ...]]:
        """Every key the table must answer."""
        return itertools.product(*self.domains)


def _fits(pattern: object, value: object) -> bool:
    if pattern is ANY:
        return True
    if isinstance(pattern, tuple):
        return any(_fits(one, value) for one in pattern)
    return type(pattern) is type(value) and bool(pattern == value)


BOOL = (True, False)
NEWER_OR_NONE = (ServerAge.NEWER, ServerAge.NONE)
MISSING = (Detected.NOT_APPLIED, Detected.PARTIAL, Detected.UNKNOWN)
"""What a file carries when it does not carry the whole patch."""
WIPED = (Place.RECREATED, Place.OLD, Place.CHANGED)
"""Where a recorded change was, and is no longer."""

# ---------------------------------------------------------------------------------------------
# status: one patch in one file

STATUS: DecisionTable[PatchState] = DecisionTable(
    ("place", "carried", "applicable", "server"),
    (tuple(Place), tuple(Detected), BOOL, tuple(ServerAge)),
    (
        (Place.FIXED_UPSTREAM, ANY, ANY, ANY, PatchState.FIXED_UPSTREAM),
        (Place.BAKED, ANY, ANY, ANY, PatchState.APPLIED),
        # the bytes a run wrote: the server's age says whether it runs them
        (Place.NEW, ANY, ANY, ServerAge.OLDER, PatchState.STAGED),
        (Place.NEW, ANY, ANY, NEWER_OR_NONE, PatchState.APPLIED),
        # patched further by recorded changes: not drifted, what it carries says
        (Place.PATCHED_FURTHER, Detected.APPLIED, ANY, ServerAge.OLDER, PatchState.STAGED),
        (Place.PATCHED_FURTHER, Detected.APPLIED, ANY, NEWER_OR_NONE, PatchState.APPLIED),
        (Place.PATCHED_FURTHER, Detected.NOT_APPLIED, ANY, ANY, PatchState.NOT_APPLIED),
        (Place.PATCHED_FURTHER, Detected.PARTIAL, ANY, ANY, PatchState.PARTIAL),
        (Place.PATCHED_FURTHER, Detected.UNKNOWN, ANY, ANY, PatchState.UNKNOWN),
        # the fix is not in the file and the patch's versions do not cover the host: it cannot
        # be put back there (needs-port), whatever wiped it
        (WIPED, MISSING, False, ANY, PatchState.NOT_APPLICABLE),
        (Place.RECREATED, Detected.APPLIED, ANY, ANY, PatchState.APPLIED),
        (Place.RECREATED, Detected.NOT_APPLIED, True, ANY, PatchState.NOT_APPLIED),
        (Place.RECREATED, Detected.PARTIAL, True, ANY, PatchState.PARTIAL),
        (Place.RECREATED, Detected.UNKNOWN, True, ANY, PatchState.UNKNOWN),
        (Place.OLD, Detected.APPLIED, ANY, ANY, PatchState.NOT_APPLIED),
        (Place.OLD, MISSING, True, ANY, PatchState.NOT_APPLIED),
        (Place.CHANGED, Detected.APPLIED, ANY, ANY, PatchState.DRIFTED),
        (Place.CHANGED, MISSING, True, ANY, PatchState.DRIFTED),
        # no record: what the file carries says, then whether the patch covers the host
        (Place.UNRECORDED, Detected.APPLIED, ANY, ServerAge.OLDER, PatchState.STAGED),
        (Place.UNRECORDED, Detected.APPLIED, ANY, NEWER_OR_NONE, PatchState.APPLIED),
        (Place.UNRECORDED, MISSING, False, ANY, PatchState.NOT_APPLICABLE),
        (Place.UNRECORDED, Detected.NOT_APPLIED, True, ANY, PatchState.NOT_APPLIED),
        (Place.UNRECORDED, Detected.PARTIAL, True, ANY, PatchState.PARTIAL),
        (Place.UNRECORDED, Detected.UNKNOWN, True, ANY, PatchState.UNKNOWN),
    ),
)
"""`status`'s word for one patch in one file (a patch set's is its files' together)."""


def status_word(file: FileStanding) -> PatchState:
    """`status`'s word for a file read against a patch (`carried` and `server` read)."""
    assert file.carried is not None and file.server is not None
    return STATUS(file.place, file.carried.state, file.gate is None, file.server)


def unread_word(target_missing: bool) -> PatchState:
    """A module that does not resolve there is `not-applicable`; any other failure: unknown."""
    return PatchState.NOT_APPLICABLE if target_missing else PatchState.UNREACHABLE


SET_FIRST = (
    PatchState.UNREACHABLE,
    PatchState.NOT_APPLICABLE,
    PatchState.DRIFTED,
    PatchState.UNKNOWN,
)
"""A set's word when one of its files has one of these and they differ (the first found wins)."""


def set_word(words: Sequence[PatchState]) -> PatchState:
    """`applied` only when every file is, `not-applied` only when none is; else `partial` (a run
    stopped between two swaps), never `applied`."""
    kinds = set(words)
    assert kinds, "a set has files"
    if len(kinds) == 1:
        return kinds.pop()
    if kinds == {PatchState.APPLIED, PatchState.STAGED}:
        return PatchState.STAGED
    return next((w for w in SET_FIRST if w in kinds), PatchState.PARTIAL)


def set_carried(carried: Sequence[Detected | None]) -> Detected | None:
    """What a set's files carry together: a file not read (None) or not fitting decides first."""
    if None in carried:
        return None
    kinds = set(carried)
    if Detected.UNKNOWN in kinds:
        return Detected.UNKNOWN
    return kinds.pop() if len(kinds) == 1 else Detected.PARTIAL


LIVE: DecisionTable[PatchState] = DecisionTable(
    ("state", "held", "unread"),
    (tuple(PatchState), BOOL, BOOL),
    (
        *((s, ANY, ANY, s) for s in PatchState if s != PatchState.STAGED),
        # the server started before the file, but holds the file's fix live: it runs it
        (PatchState.STAGED, True, False, PatchState.APPLIED),
        (PatchState.STAGED, False, ANY, PatchState.STAGED),
        # a process that did not answer may run the old code: a restart makes it certain
        (PatchState.STAGED, True, True, PatchState.STAGED),
    ),
)
"""`status`'s word once the processes said which live fixes they hold."""


def most_common(ranked: Sequence[V]) -> V:
    """The value most of `ranked` hold (a tie: the first in rank order), what a unit's odd
    nodes are told apart from."""
    return max(ranked, key=lambda value: (ranked.count(value), -ranked.index(value)))


def unit_words(ranked: Sequence[PatchState]) -> tuple[PatchState | None, tuple[PatchState, ...]]:
    """The most common word (a tie: the first node's; None when all agree) and each node's; a unit
    is one server, so nodes whose words differ are each `partial`."""
    if len(set(ranked)) < 2:
        return None, tuple(ranked)
    reference = most_common(ranked)
    said = tuple(w if w == PatchState.UNREACHABLE else PatchState.PARTIAL for w in ranked)
    return reference, said


# ---------------------------------------------------------------------------------------------
# diagnose: an imported file, whatever patch

THEIRS = tuple(p for p in Place if p not in (Place.BAKED, Place.NEW))
"""The places where no opspatch write is the file's bytes."""

FILE_STATES: DecisionTable[FileState] = DecisionTable(
    ("place", "reference"),
    (tuple(Place), tuple(Reference)),
    (
        ((Place.BAKED, Place.NEW), ANY, FileState.PATCHED_BY_OPSPATCH),
        (THEIRS, Reference.MATCHES, FileState.PRISTINE),
        (THEIRS, Reference.NONE, FileState.UNKNOWN),
        (THEIRS, Reference.DIFFERS, FileState.EDITED_OUTSIDE),
    ),
)


def file_state(file: FileStanding) -> FileState:
    return FILE_STATES(file.place, file.reference)


def unresolved_state(error_code: str | None) -> FileState:
    """`diagnose`'s word for a module that did not resolve to a file (the agent's error code)."""
    return FileState.NOT_INSTALLED if error_code == "module-not-found" else FileState.UNRESOLVED


# ---------------------------------------------------------------------------------------------
# sync: a desired patch against what status says


class Coverage(Word):
    """Whether a fleet entry's `releases` cover the host's release."""

    ALL = "all"
    """The entry names no range (or the patch is not desired there)."""
    COVERED = "covered"
    OUTSIDE = "outside"
    UNKNOWN = "unknown"
    """The host's release is not known."""
    UNREADABLE = "unreadable"
    """The host's release is no release version the range can be checked against."""


READ = tuple(s for s in PatchState if s != PatchState.UNREACHABLE)
IN_RANGE = (Coverage.ALL, Coverage.COVERED)
CARRIED = (*Detected, None)
THERE = (PatchState.APPLIED, PatchState.STAGED)
SILENT = tuple(s for s in READ if s not in (*THERE, PatchState.DRIFTED))
"""Words of a patch sync says nothing about where it is not desired."""
UNTOLD = (Coverage.UNKNOWN, Coverage.UNREADABLE)

# fmt: off
SYNC: DecisionTable[SyncAction | None] = DecisionTable(
    ("state", "carried", "held", "disagrees", "desired", "coverage", "served"),
    (tuple(PatchState), CARRIED, BOOL, BOOL, BOOL, tuple(Coverage), BOOL),
    (
        # whether desired or not: a host not inspected is unknown, never "as desired"
        (PatchState.UNREACHABLE, ANY, ANY, ANY, ANY, ANY, ANY, SyncAction.UNREACHABLE),
        # not desired: said only when it is there (sync leaves it), a unit's only when whole
        (READ, ANY, ANY, True, False, ANY, ANY, None),
        (THERE, ANY, ANY, False, False, ANY, ANY, SyncAction.EXTRA),
        (PatchState.DRIFTED, Detected.APPLIED, ANY, False, False, ANY, ANY, SyncAction.EXTRA),
        (PatchState.DRIFTED, (*MISSING, None), ANY, False, False, ANY, ANY, None),
        (SILENT, ANY, ANY, False, False, ANY, ANY, None),
        # desired: the entry's range first
        (READ, ANY, ANY, ANY, True, UNTOLD, ANY, SyncAction.BY_HAND),
        (READ, ANY, ANY, ANY, True, Coverage.OUTSIDE, ANY, SyncAction.OUTSIDE_RANGE),
        # a node of a unit whose nodes' words differ: one server, partly changed
        (READ, ANY, ANY, True, True, IN_RANGE, ANY, SyncAction.BY_HAND),
        # then the files: a fix on disk is at goal only while the host serves it
        (PatchState.APPLIED, ANY, ANY, False, True, IN_RANGE, True, SyncAction.NOTHING),
        (PatchState.APPLIED, ANY, ANY, False, True, IN_RANGE, False, SyncAction.RECOVER),
        (PatchState.FIXED_UPSTREAM, ANY, ANY, False, True, IN_RANGE, True, SyncAction.FIXED_UPSTREAM),
        (PatchState.FIXED_UPSTREAM, ANY, ANY, False, True, IN_RANGE, False, SyncAction.RECOVER),
        # staged: the server started before the file, and runs its fix only when held live
        (PatchState.STAGED, ANY, True, False, True, IN_RANGE, True, SyncAction.NOTHING),
        (PatchState.STAGED, ANY, True, False, True, IN_RANGE, False, SyncAction.RECOVER),
        (PatchState.STAGED, ANY, False, False, True, IN_RANGE, ANY, SyncAction.RESTART),
        (PatchState.NOT_APPLIED, ANY, ANY, False, True, IN_RANGE, ANY, SyncAction.APPLY),
        (PatchState.NOT_APPLICABLE, ANY, ANY, False, True, IN_RANGE, ANY, SyncAction.NEEDS_PORT),
        (PatchState.PARTIAL, ANY, ANY, False, True, IN_RANGE, ANY, SyncAction.BY_HAND),
        (PatchState.UNKNOWN, ANY, ANY, False, True, IN_RANGE, ANY, SyncAction.NEEDS_PORT),
        # drifted (the ledger no longer explains the file): what it carries says
        (PatchState.DRIFTED, Detected.APPLIED, ANY, False, True, IN_RANGE, True, SyncAction.NOTHING),
        (PatchState.DRIFTED, Detected.APPLIED, ANY, False, True, IN_RANGE, False, SyncAction.RECOVER),
        (PatchState.DRIFTED, Detected.NOT_APPLIED, ANY, False, True, IN_RANGE, ANY, SyncAction.APPLY),
        (PatchState.DRIFTED, (Detected.PARTIAL, None), ANY, False, True, IN_RANGE, ANY, SyncAction.BY_HAND),
        (PatchState.DRIFTED, Detected.UNKNOWN, ANY, False, True, IN_RANGE, ANY, SyncAction.NEEDS_PORT),
    ),
)
# fmt: on
"""What sync does about a patch on a host (None: not desired and not there)."""


# ---------------------------------------------------------------------------------------------
# drift: why a file is not what the ledger and the fleet file expect


class Written(Word):
    """The newest record of opspatch writing a patch into the file (or taking it out)."""

    NEVER = "never"
    PATCHED = "patched"
    RESTORED = "restored"
    """A rollback took it out since."""


NOT_THERE = (Written.NEVER, Written.RESTORED)
LACKING = (SyncAction.APPLY, SyncAction.NEEDS_PORT, SyncAction.BY_HAND)
"""Sync actions of a file without the fix."""
KEPT = (
    SyncAction.NOTHING,
    SyncAction.RESTART,
    SyncAction.RECOVER,
    SyncAction.FIXED_UPSTREAM,
    SyncAction.OUTSIDE_RANGE,
)
"""Sync actions of a file with the fix, or not the entry's to have it: drift only if changed."""

DRIFT: DecisionTable[DriftCause | None] = DecisionTable(
    ("action", "drifted", "recreated", "written", "upgraded", "at_pre_image"),
    (tuple(SyncAction), BOOL, BOOL, tuple(Written), BOOL, BOOL),
    (
        (SyncAction.EXTRA, ANY, ANY, ANY, ANY, ANY, DriftCause.PATCH_EXTRA),
        (SyncAction.UNREACHABLE, ANY, ANY, ANY, ANY, ANY, None),
        (KEPT, False, ANY, ANY, ANY, ANY, None),
        (LACKING, ANY, True, ANY, ANY, ANY, DriftCause.RECREATED_CONTAINER),
        (KEPT, True, True, ANY, ANY, ANY, DriftCause.RECREATED_CONTAINER),
        # never written here, or rolled back since
        (LACKING, ANY, False, NOT_THERE, ANY, ANY, DriftCause.PATCH_MISSING),
        (KEPT, True, False, NOT_THERE, ANY, ANY, DriftCause.PATCH_MISSING),
        (LACKING, ANY, False, Written.PATCHED, True, ANY, DriftCause.UPGRADED),
        (KEPT, True, False, Written.PATCHED, True, ANY, DriftCause.UPGRADED),
        (LACKING, ANY, False, Written.PATCHED, False, True, DriftCause.REINSTALLED),
        (KEPT, True, False, Written.PATCHED, False, True, DriftCause.REINSTALLED),
        (LACKING, ANY, False, Written.PATCHED, False, False, DriftCause.HAND_EDIT),
        (KEPT, True, False, Written.PATCHED, False, False, DriftCause.HAND_EDIT),
    ),
)
"""Why a host's file is not what the ledger and the fleet file expect (None: it is)."""
