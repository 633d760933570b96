"""A patch set on one host: which recorded change each of its files is at, read together.

A set's files change as one. `apply` records every file's pre- and post-image in the ledger
before the first swap, so the ledger is the set's journal (docs/design.md, "Patch sets"):
whatever a run left behind, the ledger names every file of the set, and each file's bytes say
whether it is old (its pre-image) or new (its post-image). `recover`, `rollback` and `status`
read a set here and then act on all of its files or on none.

A single file is a set of one: `standing` judges both, from the facts `runs.fleet.standing`
reads (each file's `lineage.locate`, the server's age against the write, the ledger's proof)
to one of a closed set of `Standing` words; what each command does about them is one table
(`runs.judgments.decisions`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opspatch.core.vocabulary import SetState, Word
from opspatch.hosts.results import RemoteFile, ServerProcess
from opspatch.ledger.lineage import AtPostImage, AtPreImage, ChangedSince, PatchedFurther
from opspatch.ledger.lineage import Standing as Located
from opspatch.ledger.store import FileVersion
from opspatch.runs.report import FileChange, SetFile, set_state


@dataclass(frozen=True)
class Member:
    """One file of a set on a host: the recorded change its bytes are about, and those bytes."""

    version: FileVersion
    live_sha256: str

    @property
    def path(self) -> str:
        return self.version.path

    @property
    def is_new(self) -> bool:
        return self.live_sha256 == self.version.sha256_after

    @property
    def is_old(self) -> bool:
        return self.live_sha256 == self.version.sha256_before

    def set_file(self, live_sha256: str | None = None) -> SetFile:
        live = self.live_sha256 if live_sha256 is None else live_sha256
        return SetFile(self.path, self.version.sha256_before, self.version.sha256_after, live)


@dataclass(frozen=True)
class SetOnHost:
    """Every file of a set on one host, in the order they were recorded (swapped)."""

    members: tuple[Member, ...]

    @property
    def state(self) -> SetState:
        return set_state(tuple(m.set_file() for m in self.members))

    @property
    def new(self) -> tuple[Member, ...]:
        return tuple(m for m in self.members if m.is_new)

    def change(self, live: Mapping[str, str] | None = None) -> FileChange:
        """The set as a host outcome's file (`live`: the bytes some files hold now, by path)."""
        live = live or {}
        files = tuple(m.set_file(live.get(m.path)) for m in self.members)
        first = files[0]
        return FileChange(
            first.path, self.members[0].live_sha256, first.live_sha256, set_files=files
        )

    def all_old(self) -> FileChange:
        """The set once every file is back at its pre-image."""
        return self.change({m.path: m.version.sha256_before for m in self.members})

    def describe(self) -> str:
        """`a.py new, b.py old` (file names only: the JSON has the paths)."""
        return ", ".join(
            f"{m.path.rsplit('/', 1)[-1]} {m.set_file().standing}" for m in self.members
        )


def paths_of(versions: Sequence[FileVersion]) -> list[str]:
    """The distinct paths of `versions`, in the order they were first recorded."""
    return list(dict.fromkeys(v.path for v in sorted(versions, key=lambda v: v.event_id)))


class Standing(Word):
    """Where the change a command is about stands on one host: every file of it (a single file
    is a set of one) read together, with the server that runs it. A closed set: every goal of
    the decision table has an action for each (a test fails when one is added without)."""

    NOTHING_RECORDED = "nothing-recorded"
    """The ledger holds no change of this host's file(s) that the command is about."""
    ALL_OLD = "all-old"
    """Every file is at its pre-image (never changed, or restored)."""
    PARTLY_NEW = "partly-new"
    """Some files are new and the rest old: a run stopped between two files' swaps."""
    NEW_STALE = "new-stale"
    """Every file is new, and the running server started before the write: staged."""
    NEW_PROVEN = "new-proven"
    """Every file is new and proven, and the running server started after the write."""
    NEW_PROVEN_NO_SERVER = "new-proven-no-server"
    """Every file is new and proven, and no server process runs."""
    NEW_UNPROVEN = "new-unproven"
    """Every file is new, the running server started after the write, no passing smoke since."""
    NEW_UNPROVEN_NO_SERVER = "new-unproven-no-server"
    """Every file is new, never proven, and no server process runs."""
    PATCHED_FURTHER = "patched-further"
    """A file is a recorded change patched further by later recorded changes (none changed)."""
    CHANGED = "changed"
    """A file is none of the bytes the ledger holds for it: someone else changed it."""


class ServerAge(Word):
    """The running server against the write (the first file's last change)."""

    OLDER = "older"
    """It started before the file changed, so it runs older code."""
    NEWER = "newer"
    """It started after the file changed (or its start time is not known)."""
    NONE = "none"
    """No server process runs."""


def server_age(server: ServerProcess | None, file: RemoteFile) -> ServerAge:
    """The running server (None: none found) against `file`'s last change."""
    if server is None:
        return ServerAge.NONE
    return ServerAge.OLDER if server.predates(file) else ServerAge.NEWER


ALL_NEW = frozenset(
    {
        Standing.NEW_STALE,
        Standing.NEW_PROVEN,
        Standing.NEW_PROVEN_NO_SERVER,
        Standing.NEW_UNPROVEN,
        Standing.NEW_UNPROVEN_NO_SERVER,
    }
)
"""The standings whose every file is the post-image its run wrote."""


def members_of(located: Sequence[Located], live: Sequence[str]) -> SetOnHost:
    """The set as `lineage.locate` found each of its files (in order), with their live bytes."""
    return SetOnHost(
        tuple(Member(where.version, sha) for where, sha in zip(located, live, strict=True))
    )


def judge(located: Sequence[Located | None], *, server: ServerAge, proven: bool) -> Standing:
    """The standing of a change from each file's place in its lineage (None: the ledger holds
    no change of it), the server's age against the write, and whether every file's bytes were
    proven (read only when all are new). Pure."""
    if not located or any(where is None for where in located):
        return Standing.NOTHING_RECORDED
    if any(isinstance(where, ChangedSince) for where in located):
        return Standing.CHANGED
    if any(isinstance(where, PatchedFurther) for where in located):
        return Standing.PATCHED_FURTHER
    if all(isinstance(where, AtPreImage) for where in located):
        return Standing.ALL_OLD
    if not all(isinstance(where, AtPostImage) for where in located):
        return Standing.PARTLY_NEW
    if server == ServerAge.OLDER:
        return Standing.NEW_STALE
    if server == ServerAge.NONE:
        return Standing.NEW_PROVEN_NO_SERVER if proven else Standing.NEW_UNPROVEN_NO_SERVER
    return Standing.NEW_PROVEN if proven else Standing.NEW_UNPROVEN
