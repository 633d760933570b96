"""What is applied where: each host's live file checked against the ledger and the patch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from opspatch.core.codec import Record, dump, json_field
from opspatch.core.edit import Detection, misfits
from opspatch.core.host import Host
from opspatch.core.policy import StepTimeouts
from opspatch.core.remedy import remedy_text
from opspatch.core.spec import LoadedPatch, PatchSpec
from opspatch.core.vocabulary import Command, Detected, PatchState, Rotation
from opspatch.errors import EXIT_HOST_FAILED, EXIT_OK, OpspatchError, TargetError
from opspatch.hosts.containers import ContainerIdentity
from opspatch.hosts.image import BakedLabels
from opspatch.hosts.operations import HostOperations
from opspatch.ledger.lineage import PatchedFurther
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.live import list_fixes, of_patch
from opspatch.runs.fleet.connect import TransportFactory, opened
from opspatch.runs.fleet.executor import map_hosts
from opspatch.runs.fleet.rotation import rotation_of
from opspatch.runs.fleet.standing import HostStanding, read_inspected
from opspatch.runs.judgments.live import HeldFix, drift, held_fixes
from opspatch.runs.judgments.patchset import FileStanding, Place
from opspatch.runs.judgments.proof import describe
from opspatch.runs.judgments.units import recover_remedy, target_of
from opspatch.runs.judgments.views import (
    LIVE,
    set_carried,
    set_word,
    status_word,
    unit_words,
    unread_word,
)
from opspatch.runs.judgments.who import RunWho, who_ran


@dataclass(frozen=True)
class LiveInMemory(Record):
    """One live fix one process holds; `drift`: why the file is not the one it was taken from."""

    process: str
    pid: int | None
    fix_id: str
    definitions: tuple[str, ...]
    drift: str | None = None


@dataclass(frozen=True)
class PatchStatus(Record):
    host: str
    patch: str
    state: PatchState
    path: str | None
    sha256: str | None
    detail: str
    server_running: bool | None = None
    files: tuple[PatchStatus, ...] = ()
    """A patch set's files, each with its own state."""
    rotation: Rotation | None = None
    release: str | None = json_field(default=None, omit_none=True)
    carried: Detected | None = json_field(default=None, omit_none=True)
    """What the file carries structurally, whatever the ledger says: what `sync` decides from
    for a file the ledger no longer explains."""
    recreated: bool | None = json_field(default=None, omit_none=True)
    written_by: RunWho | None = json_field(default=None, omit_none=True)
    node_state: PatchState | None = json_field(default=None, omit_none=True)
    """A node's own word when its unit's nodes differ (`state` is then `partial`)."""
    live: tuple[LiveInMemory, ...] | None = json_field(default=None, omit_none=True)
    live_unread: str | None = json_field(default=None, omit_none=True)
    """Why what the engine holds in memory is not known; `live` then says only what the
    processes that answered hold."""

    def to_json(self) -> dict[str, Any]:
        data = dump(self)
        if not self.files:  # only a patch set has files of its own
            del data["files"]
        return data


def classify(
    found: HostStanding,
    patch: LoadedPatch,
    host: Host,
    ledger: Ledger | None,
    container: ContainerIdentity | None = None,
    *,
    part: int = 0,
) -> PatchStatus:
    """One patch (`part` of a set) in one file: its word from `views.STATUS`, the sentence
    here. A file right on disk serves nothing while no server runs it: said so."""
    inspection = found.inspection
    assert inspection is not None
    file, state, written_by = found.files[0], status_word(found.files[0]), None
    module = inspection.module  # its distribution's version, else the engine's own
    release = module["distribution_version"] if module is not None else None
    detail = _said(found, state, patch, part, host, container)
    if file.place == Place.NEW:
        assert ledger is not None
        written_by = who_ran(ledger, found.version.run_id)
    if file.upstream is not None and file.upstream.disagreement:
        detail = _joined(detail, file.upstream.disagreement)
    if inspection.server is None:
        detail = _joined(
            detail,
            f"the server is not running (no live process in its pid file, nothing listening at "
            f"{host.engine.url}): `{remedy_text(Command.DIAGNOSE, hosts=host.name)}` says why",
        )
    return PatchStatus(
        host.name,
        patch.spec.id,
        state,
        file.path,
        file.sha256,
        detail,
        server_running=inspection.server is not None,
        release=release or inspection.facts.sglang_version,
        carried=file.carried.state if file.carried is not None else None,
        recreated=True if file.place == Place.RECREATED else None,
        written_by=written_by,
    )


def _said(
    found: HostStanding,
    state: PatchState,
    patch: LoadedPatch,
    part: int,
    host: Host,
    container: ContainerIdentity | None,
) -> str:
    standing, inspection = found.files[0], found.inspection
    assert inspection is not None
    module = inspection.module
    located, carried = standing.located, standing.carried
    assert carried is not None
    match standing.place:
        case Place.FIXED_UPSTREAM:  # read against its release's pristine file: a module
            assert standing.upstream is not None and module is not None
            name, shipped = module["distribution"], module["distribution_version"]
            release = (
                "the installed release"
                if name is None
                else f"{name} {shipped or '(version unknown)'}"
            )
            why = standing.upstream.reason
            return f"{release} ships the fix ({why}): the patch is not needed here"
        case Place.BAKED:
            assert standing.baked is not None and container is not None
            return describe_baked(standing.baked, container)
        case Place.NEW:  # proven or not, the sentence `recover` says (`runs.judgments.proof`)
            said = describe(found.proofs[0], host)
            if state != PatchState.STAGED:
                return said
            assert inspection.server is not None  # "applied" would say the server runs it
            return (
                f"{said}; the running server (pid {inspection.server.pid}) started before the "
                "file changed, so it still runs the old code"
            )
        case Place.PATCHED_FURTHER:
            assert isinstance(located, PatchedFurther)
            return f"written by run {located.version.run_id}, {located.advice()}"
        case Place.RECREATED:
            said = standing.recreated or ""
        case Place.OLD:
            assert located is not None
            said = f"back at the pre-image of run {located.version.run_id}"
            if found.stale_server:  # put back with no restart after (nor a live revert)
                assert inspection.server is not None
                restart = remedy_text(Command.RESTART, hosts=target_of(host))
                said += (
                    f"; the running server (pid {inspection.server.pid}) started before it was "
                    f"put back, so it still runs the patched code: `{restart}` restarts it "
                    "into the file"
                )
        case Place.CHANGED:
            assert located is not None
            version = located.version
            said = (
                f"changed since run {version.run_id} wrote {version.sha256_after[:12]}; "
                f"the patch is {carried.state} here"
            )
            if carried.state == Detected.UNKNOWN:
                said += f": {why_unknown(patch.parts[part], carried)}"
        case Place.UNRECORDED:
            return _unrecorded(standing, state, patch, part, host)
    if state == PatchState.NOT_APPLICABLE:  # the fix is gone and cannot be put back here
        return f"{standing.gate}; {said}"
    return said


def _unrecorded(
    standing: FileStanding, state: PatchState, patch: LoadedPatch, part: int, host: Host
) -> str:
    carried = standing.carried
    assert carried is not None
    if carried.state == Detected.APPLIED:
        stale = "; the running server started before it" if state == PatchState.STAGED else ""
        return f"present, but not written by opspatch (no ledger record){stale}"
    if state == PatchState.NOT_APPLICABLE:
        return standing.gate or ""
    if carried.state == Detected.NOT_APPLIED:
        return ""
    if carried.state == Detected.UNKNOWN:
        return why_unknown(patch.parts[part], carried)
    return (
        f"{carried.reason}; `{remedy_text(Command.ROLLBACK, patch.reference, hosts=target_of(host))}` "
        "restores the original where opspatch wrote it, or finish the change by hand"
    )


def why_unknown(spec: PatchSpec, structural: Detection) -> str:
    """Each edit that no longer fits (what `needs-port` says), else why the file does not parse."""
    return misfits(spec, structural) or structural.reason


def combine_set(patch: LoadedPatch, host: Host, files: Sequence[PatchStatus]) -> PatchStatus:
    state = set_word([f.state for f in files])
    each = ", ".join(f"{(f.path or f.detail).rsplit('/', 1)[-1]} {f.state}" for f in files)
    first = files[0]
    if state == PatchState.FIXED_UPSTREAM:
        detail = f"every file of the set: {first.detail}"
    elif state in (PatchState.APPLIED, PatchState.STAGED):
        detail = f"every file of the set: {each}; {first.detail}"
    elif state == PatchState.NOT_APPLIED:
        detail = ""
    else:
        detail = f"the patch set is not whole ({each})"
        if state == PatchState.PARTIAL:
            detail += (
                f": `{recover_remedy(host)}` makes it whole (puts the new "
                "files back), or "
                f"`{remedy_text(Command.ROLLBACK, patch.reference, hosts=target_of(host))}`"
            )
    running = [f.server_running for f in files if f.server_running is not None]
    return PatchStatus(
        host.name,
        patch.spec.id,
        state,
        first.path,
        first.sha256,
        detail,
        server_running=running[0] if running else None,
        files=tuple(files),
        release=first.release,
        carried=set_carried([f.carried for f in files]),
        recreated=True if any(f.recreated for f in files) else None,
    )


def describe_baked(baked: BakedLabels, container: ContainerIdentity) -> str:
    return (
        f"the fix came baked in: image {container.image} was built with {baked.patch_id} by "
        f"run {baked.run_id} (FROM {baked.base}), and the file is the bytes it baked"
    )


Standings = dict[tuple[str, str], tuple[HostStanding | None, ...]]


def fleet_status(
    hosts: Sequence[Host],
    patches: Sequence[LoadedPatch],
    factory: TransportFactory,
    ledger: Ledger | None,
) -> list[PatchStatus]:
    return read_fleet(hosts, patches, factory, ledger)[0]


def read_fleet(
    hosts: Sequence[Host],
    patches: Sequence[LoadedPatch],
    factory: TransportFactory,
    ledger: Ledger | None,
) -> tuple[list[PatchStatus], Standings]:
    """`fleet_status`, with the standings its words were read from (one per part)."""

    modules: dict[str, list[tuple[LoadedPatch, int]]] = {}
    for patch in patches:
        for index, part in enumerate(patch.parts):
            modules.setdefault(part.target.module, []).append((patch, index))

    def one(host: Host) -> tuple[list[PatchStatus], Standings]:
        read: Standings = {}
        found: dict[tuple[str, int], PatchStatus] = {}
        standings: dict[tuple[str, int], HostStanding] = {}
        with opened(factory, host) as ops:
            for module, group in modules.items():
                try:
                    inspection = ops.inspect(module, timeout=StepTimeouts().inspect)
                except OpspatchError as exc:
                    unread = unread_word(isinstance(exc, TargetError))
                    for p, i in group:
                        found[p.sha256, i] = PatchStatus(
                            host.name, p.spec.id, unread, None, None, exc.message
                        )
                    continue
                container = ops.transport.container  # pinned by the first command, not before
                for p, i in group:
                    standing = read_inspected(
                        host.name, inspection, ledger, p, part=i, container=container
                    )
                    standings[p.sha256, i] = standing
                    found[p.sha256, i] = classify(standing, p, host, ledger, container, part=i)
            results: list[PatchStatus] = []
            for patch in patches:
                parts = [(patch.sha256, i) for i in range(len(patch.parts))]
                read[host.name, patch.spec.id] = tuple(standings.get(k) for k in parts)
                files = [found[k] for k in parts]
                results.append(combine_set(patch, host, files) if patch.is_set else files[0])
            reached = any(r.state != PatchState.UNREACHABLE for r in results)
            if host.live and reached:  # one exec more, only where live fixes are on
                results = with_live_fixes(ops, patches, results)
        return results, read

    by_name = {h.name: h for h in hosts}
    found = map_hosts(lambda name: one(by_name[name]), list(by_name), limit=16)
    rotations, said, standings = rotation_of(hosts), [], {}
    for statuses, parts in found.values():
        standings.update(parts)
        for status in statuses:
            if status.host in rotations:
                rotation, why = rotations[status.host]
                detail = _joined(status.detail, why) if why else status.detail
                status = replace(status, rotation=rotation, detail=detail)
            said.append(status)
    return unit_agreement(hosts, said), standings


def with_live_fixes(
    ops: HostOperations, patches: Sequence[LoadedPatch], statuses: list[PatchStatus]
) -> list[PatchStatus]:
    """Each status with the patch's fixes in memory and whether the file agrees (else drift:
    the next restart loses it). A `staged` file every process holds live is `applied`; an
    engine not fully heard from is `live_unread`, and no `staged` is made `applied`."""
    try:
        reply = list_fixes(ops)
    except OpspatchError as exc:
        unread: str | None = f"live fixes could not be listed: {exc.message}"
        held: tuple[HeldFix, ...] = ()
    else:
        silent = [p.describe() for p in reply.processes() if not p.ok]
        unread = f"live fixes could not be listed in {'; '.join(silent)}" if silent else None
        if reply.unread:
            unread = f"live fixes could not be listed: {reply.missing}"
        held = held_fixes(reply)
    shown: list[PatchStatus] = []
    for patch, status in zip(patches, statuses, strict=True):
        status = replace(status, live_unread=unread)
        mine = [h for h in held if of_patch(h.fix_id, patch.spec.id)]
        if not mine:
            shown.append(_unread(status, unread) if unread else status)
            continue
        files = status.files or (status,)
        by_module = {
            part.target.module: f.sha256 for part, f in zip(patch.parts, files, strict=True)
        }
        memory = tuple(
            LiveInMemory(
                h.process,
                h.pid,
                h.fix_id,
                h.names,
                drift(h, by_module.get(h.module or "", status.sha256)),
            )
            for h in mine
        )
        drifted = [m.drift for m in memory if m.drift]
        holders = ", ".join(sorted({m.process for m in memory}))
        said = f"live fix in memory in {holders}" + (f"; {drifted[0]}" if drifted else "")
        word = LIVE(status.state, not drifted, bool(unread))
        if unread:  # the processes that did not answer may run the old code
            status = _unread(status, unread)
        elif word != status.state:  # staged, but the server holds the file's fix live
            written = status.detail.split("; the running server", 1)[0]
            status = replace(status, state=word, detail=written)
            said = f"taken live, no restart: {said}"
        shown.append(replace(status, live=memory, detail=_joined(status.detail, said)))
    return shown


def _unread(status: PatchStatus, unread: str) -> PatchStatus:
    """A `staged` file stays `staged` (sync restarts it) but no longer says the server runs the
    old code: it may hold the fix live."""
    if status.state != PatchState.STAGED:
        return replace(status, detail=_joined(status.detail, unread))
    written = status.detail.split("; the running server", 1)[0]
    said = (
        "the running server started before the file changed: it runs the old code unless it "
        f"holds the fix live, and {unread}"
    )
    return replace(status, detail=_joined(written, said))


def exit_code(statuses: Sequence[PatchStatus]) -> int:
    """1 when a host, or an engine's live fixes, could not be looked at."""
    unlooked = any(s.state == PatchState.UNREACHABLE or s.live_unread for s in statuses)
    return EXIT_HOST_FAILED if unlooked else EXIT_OK


def _joined(detail: str, more: str) -> str:
    return f"{detail}; {more}" if detail else more


def unit_agreement(hosts: Sequence[Host], statuses: Sequence[PatchStatus]) -> list[PatchStatus]:
    """A unit is one server: where its nodes' words differ each becomes `partial` (its own word
    in `node_state`), naming the nodes that differ from the most common word."""
    unit_of = {h.name: h.unit for h in hosts if h.unit is not None}
    groups: dict[tuple[str, str], list[PatchStatus]] = {}
    for status in statuses:
        unit = unit_of.get(status.host)
        if unit is not None:
            groups.setdefault((unit.name, status.patch), []).append(status)
    marked: dict[tuple[str, str], PatchStatus] = {}
    for (unit_name, _), group in groups.items():
        ranked = sorted(group, key=lambda s: unit_of[s.host].rank_of(s.host))
        reference, words = unit_words([s.state for s in ranked])
        if reference is None:
            continue
        agreeing = ", ".join(s.host for s in ranked if s.state == reference)
        odd = "; ".join(f"{s.host} is {s.state}" for s in ranked if s.state != reference)
        said = f"unit {unit_name}'s nodes differ ({odd}; the others ({agreeing}) {reference})"
        for status, word in zip(ranked, words, strict=True):
            if word == PatchState.UNREACHABLE:  # a node not read keeps its word
                continue
            own = f"; this node is {status.state}" + (f": {status.detail}" if status.detail else "")
            marked[status.host, status.patch] = replace(
                status, state=word, detail=said + own, node_state=status.state
            )
    return [marked.get((s.host, s.patch), s) for s in statuses]
