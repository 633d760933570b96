"""Where a change stands on one host: each file placed once, a patch set's files read together."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opspatch.core.edit import Detection, detect
from opspatch.core.spec import PatchSpec
from opspatch.core.vocabulary import FileAction, Word
from opspatch.hosts.containers import ContainerIdentity
from opspatch.hosts.results import RemoteFile, ServerProcess
from opspatch.ledger.lineage import (
    AtPostImage,
    AtPreImage,
    ChangedSince,
    Located,
    PatchedFurther,
    locate,
)
from opspatch.ledger.store import FileVersion
from opspatch.runs.report import FileChange, SetFile

if TYPE_CHECKING:  # imported where a pristine file or a baked image is read: not by `apply`
    from opspatch.analysis.upstream import UpstreamVerdict
    from opspatch.hosts.image import BakedLabels


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

    def set_file(self, live_sha256: str | None = None) -> SetFile:
        live = self.live_sha256 if live_sha256 is None else live_sha256
        return SetFile(self.path, self.version.sha256_before, self.version.sha256_after, live)


@dataclass(frozen=True)
class SetOnHost:
    """Every file of a set on one host, in the order they were recorded (swapped)."""

    members: tuple[Member, ...]

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
    """A closed set: every goal of the decision table has an action for each (a test fails when one
    is added without)."""

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
    """From each file's place (None: nothing recorded), the server's age and the proof (read only
    when all are new). Pure."""
    places = {place_of(where) for where in located}
    if not places or Place.UNRECORDED in places:
        return Standing.NOTHING_RECORDED
    if Place.CHANGED in places:
        return Standing.CHANGED
    if Place.PATCHED_FURTHER in places:
        return Standing.PATCHED_FURTHER
    if places == {Place.OLD}:
        return Standing.ALL_OLD
    if places != {Place.NEW}:
        return Standing.PARTLY_NEW
    return _ALL_NEW[server, proven]


_ALL_NEW: Mapping[tuple[ServerAge, bool], Standing] = {
    (ServerAge.OLDER, True): Standing.NEW_STALE,
    (ServerAge.OLDER, False): Standing.NEW_STALE,
    (ServerAge.NEWER, True): Standing.NEW_PROVEN,
    (ServerAge.NEWER, False): Standing.NEW_UNPROVEN,
    (ServerAge.NONE, True): Standing.NEW_PROVEN_NO_SERVER,
    (ServerAge.NONE, False): Standing.NEW_UNPROVEN_NO_SERVER,
}
"""A change whose every file is new, by the server's age and whether it was proven."""


class Place(Word):
    """Where one file stands against a change: the first of these that holds, in this order."""

    FIXED_UPSTREAM = "fixed-upstream"
    """Its release's pristine file, which already carries the fix (`analysis.upstream`)."""
    BAKED = "baked"
    """The bytes the container's image was baked with (`opspatch bake`)."""
    NEW = "new"
    """The post-image a recorded change wrote."""
    PATCHED_FURTHER = "patched-further"
    """A recorded change's post-image, patched further by later recorded changes."""
    RECREATED = "recreated"
    """Not that: the change was written in a container since recreated from its image."""
    OLD = "old"
    """A recorded change's pre-image: the change is not (or no longer) there."""
    CHANGED = "changed"
    """None of the bytes the ledger holds for it: someone else changed it since."""
    UNRECORDED = "unrecorded"
    """The ledger holds no change of it."""


def place_of(
    located: Located | None,
    *,
    fixed_upstream: bool = False,
    baked: bool = False,
    recreated: bool = False,
) -> Place:
    """The one classification of a file: its lineage place, unless its release ships the fix, its
    image baked it, or its container lost the change."""
    if fixed_upstream:
        return Place.FIXED_UPSTREAM
    if baked:
        return Place.BAKED
    if isinstance(located, AtPostImage):
        return Place.NEW
    if isinstance(located, PatchedFurther):
        return Place.PATCHED_FURTHER
    if recreated:
        return Place.RECREATED
    if isinstance(located, AtPreImage):
        return Place.OLD
    if isinstance(located, ChangedSince):
        return Place.CHANGED
    return Place.UNRECORDED


class Reference(Word):
    MATCHES = "matches"
    DIFFERS = "differs"
    NONE = "none"
    """No RECORD entry and no checkout to compare it with."""


@dataclass(frozen=True)
class FileStanding:
    """One file against a change: the facts read about it and the one place they give it."""

    place: Place
    path: str
    sha256: str
    located: Located | None = None
    """Where its bytes are among the change's recorded versions (None: it has none)."""
    carried: Detection | None = None
    """What it carries of the patch, structurally (None: no patch was asked about)."""
    gate: str | None = None
    """Why the patch's own versions do not cover the host (None: they do, or no patch)."""
    upstream: UpstreamVerdict | None = None
    """The patch judged on the file, when it is its release's pristine file."""
    reference: Reference = Reference.NONE
    baked: BakedLabels | None = None
    """The bake of the container's image whose bytes the file is (any patch's)."""
    recreated: str | None = None
    """Why the change went with the container it was written in (None: it did not)."""
    server: ServerAge | None = None
    """The running server against the file's last change (None: not read)."""


def read_file(
    path: str,
    sha256: str,
    history: Sequence[FileVersion],
    candidates: Sequence[FileVersion],
    *,
    change: str | None = None,
    content: bytes | None = None,
    part: PatchSpec | None = None,
    gate: str | None = None,
    pristine: str | None = None,
    release: str | None = None,
    baked: BakedLabels | None = None,
    recreated: str | None = None,
    server: ServerAge | None = None,
) -> FileStanding:
    """`change`: its patch id (None: any); `pristine`: the sha256 its installation says it has.
    Pure."""
    located = locate(history, candidates, sha256)
    carried = upstream = None
    if part is not None and content is not None:
        carried = detect(content, part)
        if pristine == sha256:
            from opspatch.analysis.upstream import part_verdict

            upstream = part_verdict(part, content, release)
    reference = (
        Reference.NONE
        if pristine is None
        else (Reference.MATCHES if pristine == sha256 else Reference.DIFFERS)
    )
    place = place_of(
        located,
        fixed_upstream=upstream is not None and upstream.fixed,
        baked=baked is not None and change in (None, baked.patch_id),
        recreated=recreated is not None,
    )
    return FileStanding(
        place, path, sha256, located, carried, gate, upstream, reference, baked, recreated, server
    )


def baked_in(container: ContainerIdentity | None, path: str, sha256: str) -> BakedLabels | None:
    """A file that came with the image: no recreate loses it."""
    from opspatch.hosts.image import baked_history

    history = baked_history(container.labels) if container is not None else ()
    wrote = next((bake for bake in history if bake.post_image_of(path) is not None), None)
    if wrote is None or wrote.post_image_of(path) != sha256:
        return None
    return wrote


def recreated_since(
    history: Sequence[FileVersion], patch_id: str | None, container: ContainerIdentity | None
) -> str | None:
    """The fix went with the old container's writable layer. None when it is the same container or
    none was recorded."""
    if container is None:
        return None
    written = history[0] if history else None  # newest first: a later restore says nothing
    if (
        written is None
        or written.action != FileAction.PATCH
        or (patch_id is not None and written.patch_id != patch_id)
        or written.container is None
        or written.container.id == container.id
    ):
        return None
    return (
        f"the container was recreated since run {written.run_id} patched it (created at "
        f"{written.container.created}; now {container.id[:12]}, created at {container.created}): "
        "the fix is no longer there"
    )
