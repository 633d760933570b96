"""Reading a host's standing: begin, then every file of the change, judged together."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import Step
from opspatch.errors import LockHeld, OpspatchError
from opspatch.hosts.containers import ContainerIdentity
from opspatch.hosts.operations import HostInspection
from opspatch.ledger.lineage import applied_versions
from opspatch.ledger.store import FileVersion, Ledger, Machine
from opspatch.runs.fleet.group import Nodes
from opspatch.runs.fleet.pipeline import gate_inspection
from opspatch.runs.fleet.session import HostSession
from opspatch.runs.judgments.patchset import (
    FileStanding,
    Place,
    SetOnHost,
    Standing,
    baked_in,
    judge,
    members_of,
    paths_of,
    read_file,
    recreated_since,
    server_age,
)
from opspatch.runs.judgments.proof import ChangeProof, change_proof
from opspatch.runs.judgments.running import SERVER_STEPS, stale
from opspatch.runs.report import FileChange

Takeover = Callable[[LockHeld], "tuple[str, bool] | None"]
"""Whether a held lock may be taken over: (its run, once idle) or None (re-raise)."""

Lineage = Callable[[str, HostInspection], "tuple[Sequence[FileVersion], Sequence[FileVersion]]"]
"""One path's (history, candidates), both newest first, once the host is inspected."""


def begin(
    session: HostSession,
    *,
    module: str | None = None,
    path: str | None = None,
    lock: bool = True,
    takeover: Takeover | None = None,
) -> HostInspection:
    """Lock and inspect in one exec (`lock=False`: a plain `inspect`, its facts recorded so another
    inventory's lookups find the run); `takeover` (recover) may take a held lock over."""
    timeouts = session.playbook.timeouts
    if not lock:
        with session.step(Step.INSPECT) as note:
            inspection = session.ops.inspect(module, path=path, timeout=timeouts.inspect)
            note["detail"] = f"{inspection.file.realpath} is {inspection.file.sha256[:12]}"
        session.recorder.facts(session.name, inspection.facts)
        return inspection
    with session.step(Step.BEGIN) as note:
        inspection, note["detail"] = taking_lock(
            session,
            takeover,
            lambda run_id, holder, idle: session.ops.begin(
                module,
                path=path,
                run_id=run_id,
                takeover_run=holder,
                takeover_idle=idle,
                timeout=timeouts.lock + timeouts.inspect,
            )[1],
        )
        note["detail"] += f"{inspection.file.realpath} is {inspection.file.sha256[:12]}"
    return inspection


T = TypeVar("T")


def taking_lock(
    session: HostSession,
    takeover: Takeover | None,
    take: Callable[[str, str | None, bool], T],
) -> tuple[T, str]:
    run_id = session.lock.taking()
    try:
        return take(run_id, None, False), ""
    except LockHeld as held:
        taken = takeover(held) if takeover is not None else None
        if taken is None:
            raise
        holder, idle = taken
        idly = " (no command of it still running here)" if idle else ""
        return take(run_id, holder, idle), f"took the lock over from run {holder}{idly}; "


def read_live(
    session: HostSession, paths: Sequence[str], known: Mapping[str, str]
) -> dict[str, str]:
    """Those in `known` as given, the others read in one `read-set` step."""
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


@dataclass(frozen=True)
class HostStanding:
    """A host's standing against a change: the word, the files as recorded and as read, the proofs."""

    standing: Standing
    found: SetOnHost
    files: tuple[FileStanding, ...] = ()
    inspection: HostInspection | None = None
    proofs: tuple[ChangeProof, ...] = ()
    stale_server: bool = False
    """A file put back with no restart since, unless a live fix was reverted (or taken) since."""
    history: tuple[FileVersion, ...] = ()
    """The file's changes, newest first (`read_inspected`'s: drift reads the last write)."""

    @property
    def is_set(self) -> bool:
        """A patch set (two or more files), reported with every file of it."""
        return len(self.found.members) > 1

    @property
    def version(self) -> FileVersion:
        """The first file's recorded change (a single file's only one)."""
        return self.found.members[0].version

    @property
    def live(self) -> str:
        """The first file's bytes as found."""
        assert self.inspection is not None
        return self.inspection.file.sha256

    def unchanged(self) -> FileChange:
        """The file(s) as found, reported by a host left as it is."""
        if self.is_set:
            return self.found.change()
        assert self.inspection is not None
        path = self.found.members[0].path if self.found.members else self.inspection.file.realpath
        return FileChange(path, self.live, self.live)

    def change(self) -> FileChange:
        """The recorded change itself (pre-image to post-image), as a proof or undo reports it."""
        if self.is_set:
            return self.found.change()
        version = self.version
        return FileChange(version.path, version.sha256_before, version.sha256_after)


@dataclass(frozen=True)
class Change:
    """What a command is about on one host: one path's or a set's recorded changes; no versions: the
    file `module` resolves to."""

    versions: Sequence[FileVersion] = ()
    module: str | None = None
    lineage: Lineage | None = None
    paths: Sequence[str] | None = None
    begin_at: str | None = None


def server_stale(
    ledger: Ledger,
    host: str,
    inspection: HostInspection,
    history: Sequence[FileVersion] | None = None,
) -> bool:
    """The history and the engine's steps are read only when the server started before the file last
    changed."""
    server, file = inspection.server, inspection.file
    if server is None or not server.predates(file):
        return False
    if history is None:
        history = _history(ledger, host, inspection)
    return stale(server, file, history, ledger.host_steps(host, SERVER_STEPS))


def _history(ledger: Ledger, host: str, inspection: HostInspection) -> list[FileVersion]:
    """The inspected file's changes, newest first, the host's under any name its machine had."""
    machine = Machine.of(inspection.facts.machine_id, inspection.facts.hostname)
    return ledger.file_history(host, inspection.file.realpath, machine=machine)


def read_host(
    session: HostSession,
    change: Change,
    *,
    ledger: Ledger | None = None,
    prove: bool = False,
    lock: bool = True,
    takeover: Takeover | None = None,
) -> HostStanding:
    """`begin`, the set's other files in one `read-set`, each placed, then judged together; with
    `ledger`, whether the server is stale, with `prove` the proofs of an all-new change."""
    versions = change.versions
    paths = list(change.paths) if change.paths is not None else paths_of(versions)
    if not paths and change.module is None:
        return HostStanding(Standing.NOTHING_RECORDED, SetOnHost(()))
    inspection = begin(
        session,
        module=None if paths else change.module,
        path=change.begin_at or (paths[0] if paths else None),
        lock=lock,
        takeover=takeover,
    )
    if not paths:
        paths = [inspection.file.realpath]
    live = read_live(session, paths, {inspection.file.realpath: inspection.file.sha256})
    age = server_age(inspection.server, inspection.file)
    files: list[FileStanding] = []
    for path in paths:
        if change.lineage is not None:
            history, candidates = change.lineage(path, inspection)
        else:
            mine = sorted((v for v in versions if v.path == path), key=lambda v: -v.event_id)
            history = candidates = mine
        files.append(read_file(path, live[path], history, candidates, server=age))
    stale = ledger is not None and server_stale(ledger, session.name, inspection)
    return _judged(session.name, files, inspection, ledger, prove=prove, stale=stale)


def _judged(
    host: str,
    files: Sequence[FileStanding],
    inspection: HostInspection,
    ledger: Ledger | None,
    *,
    prove: bool,
    stale: bool,
    history: tuple[FileVersion, ...] = (),
) -> HostStanding:
    located = [f.located for f in files if f.located is not None]
    if len(located) < len(files):
        nothing = SetOnHost(())
        return HostStanding(
            Standing.NOTHING_RECORDED, nothing, tuple(files), inspection, (), stale, history
        )
    members = members_of(located, [f.sha256 for f in files])
    proofs: tuple[ChangeProof, ...] = ()
    if ledger is not None and prove and all(m.is_new for m in members.members):
        proofs = tuple(change_proof(ledger, host, m.version) for m in members.members)
    age = server_age(inspection.server, inspection.file)
    standing = judge(located, server=age, proven=bool(proofs) and all(p.proven for p in proofs))
    return HostStanding(standing, members, tuple(files), inspection, proofs, stale, history)


def read_inspected(
    host: str,
    inspection: HostInspection,
    ledger: Ledger | None,
    patch: LoadedPatch,
    *,
    part: int = 0,
    container: ContainerIdentity | None = None,
) -> HostStanding:
    """`read_host` on a file `status` inspected: also what it carries, its gate, its release's
    pristine file and bake. Raises `LedgerError`."""
    spec, file, module = patch.parts[part], inspection.file, inspection.module
    history = _history(ledger, host, inspection) if ledger is not None else []
    age = server_age(inspection.server, file)
    placed = read_file(
        file.realpath,
        file.sha256,
        history,
        applied_versions(history, patch.spec.id),
        change=patch.spec.id,
        content=file.content,
        part=spec,
        gate=gate_inspection(spec.target, inspection),
        pristine=module["record_sha256"] if module is not None else None,
        release=module["distribution_version"] if module is not None else None,
        baked=baked_in(container, file.realpath, file.sha256),
        recreated=recreated_since(history, patch.spec.id, container),
        server=age,
    )
    stale = (  # put back: does its server still run the fix?
        placed.place == Place.OLD
        and ledger is not None
        and server_stale(ledger, host, inspection, history)
    )
    return _judged(
        host, [placed], inspection, ledger, prove=True, stale=stale, history=tuple(history)
    )


class Unread(Exception):
    """A node of a group could not be read (`error`); no node after it was."""

    def __init__(self, session: HostSession, error: OpspatchError) -> None:
        super().__init__(error.message)
        self.session = session
        self.error = error


def read(
    nodes: Nodes,
    change: Callable[[HostSession], Change],
    *,
    ledger: Ledger | None = None,
    prove: bool = False,
    lock: bool = True,
    takeover: Takeover | None = None,
) -> dict[str, HostStanding]:
    """What the commands that change hosts decide from; `Unread` for the first node not read."""
    standings: dict[str, HostStanding] = {}
    for session in nodes.sessions:
        try:
            standings[session.name] = read_host(
                session,
                change(session),
                ledger=ledger,
                prove=prove,
                lock=lock,
                takeover=takeover,
            )
        except OpspatchError as error:
            raise Unread(session, error) from error
    return standings
