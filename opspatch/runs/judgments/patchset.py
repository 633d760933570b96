"""A patch set on one host: which recorded change each of its files is at, read together.

A set's files change as one. `apply` records every file's pre- and post-image in the ledger
before the first swap, so the ledger is the set's journal (docs/design.md, "Patch sets"):
whatever a run left behind, the ledger names every file of the set, and each file's bytes say
whether it is old (its pre-image) or new (its post-image). `recover`, `rollback` and `status`
read a set here and then act on all of its files or on none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opspatch.core.vocabulary import SetState, Step
from opspatch.ledger.store import FileVersion
from opspatch.runs.fleet.session import HostSession
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


def member_for(versions: Sequence[FileVersion], live_sha256: str) -> Member:
    """Which of one path's recorded changes (any order) its live bytes are about: the newest
    whose post-image they are, else the newest whose pre-image they are, else the newest."""
    newest_first = sorted(versions, key=lambda v: v.event_id, reverse=True)
    chosen = next(
        (v for v in newest_first if v.sha256_after == live_sha256),
        next((v for v in newest_first if v.sha256_before == live_sha256), newest_first[0]),
    )
    return Member(chosen, live_sha256)


def read_live(
    session: HostSession, paths: Sequence[str], known: Mapping[str, str]
) -> dict[str, str]:
    """The sha256 of each of `paths` on the host, by path: those in `known` as given, the
    others read in one recorded step (`read-set`).

    Raises:
        OpspatchError: a file could not be read.
    """
    live = dict(known)
    missing = [p for p in paths if p not in live]
    if missing:
        with session.step(Step.READ_SET) as note:
            for path in missing:
                live[path] = session.ops.read(
                    path, timeout=session.playbook.timeouts.inspect
                ).sha256
            note["detail"] = "; ".join(f"{p} is {live[p][:12]}" for p in missing)
    return live


def read_set(
    session: HostSession,
    versions: Sequence[FileVersion],
    known: Mapping[str, str],
) -> SetOnHost:
    """The set `versions` (changes of two or more paths) as its files are on the host now:
    the paths in `known` (path -> sha256, already read) are not read again; the others are
    read in one recorded step.

    Raises:
        OpspatchError: a file could not be read.
    """
    live = read_live(session, paths_of(versions), known)
    return SetOnHost(
        tuple(
            member_for([v for v in versions if v.path == path], live[path])
            for path in paths_of(versions)
        )
    )
