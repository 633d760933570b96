"""What is applied where: each host's live file checked against the ledger and the patch.

Per host and patch: `applied` (the file is the bytes opspatch wrote, or carries the patch
structurally), `staged` (so, but the running server started before the file changed: it still
runs the old code), `not-applied`, `drifted` (the file changed since opspatch wrote it, e.g. sglang was
reinstalled: no post-image the ledger recorded leads to what is there; a patch that later recorded
patches were stacked on is not drifted, its detail names them), `not-applicable` (the module does not
resolve on the host, or its version is outside the patch's range), `fixed-upstream` (the patch is
not there, and not needed: the file is its release's pristine file, as pip's RECORD says, and it
already passes the patch's proof of the fix, `analysis/upstream.py`), or `unreachable`; and whether
the host's server is running (a file that is right on disk serves nothing while it is down). One
exec per host and target module; nothing is locked or changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from opspatch.analysis.upstream import UpstreamVerdict, part_verdict
from opspatch.core.edit import Detection, detect, misfits
from opspatch.core.host import Host
from opspatch.core.jsonrecord import JsonRecord, json_field, record_to_json
from opspatch.core.policy import StepTimeouts
from opspatch.core.remedy import CliCommand, remedy_text
from opspatch.core.spec import LoadedPatch, PatchSpec
from opspatch.core.vocabulary import Detected, FileAction, PatchState, Rotation
from opspatch.errors import EXIT_HOST_FAILED, EXIT_OK, OpspatchError, TargetError
from opspatch.hosts.containers import ContainerIdentity
from opspatch.hosts.image import BakedLabels, baked_history
from opspatch.hosts.live import LiveFix, ask_engine
from opspatch.hosts.operations import HostInspection, HostOperations
from opspatch.ledger.lineage import (
    AtPostImage,
    AtPreImage,
    ChangedSince,
    PatchedFurther,
    applied_versions,
    locate,
)
from opspatch.ledger.store import FileVersion, Ledger, Machine
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.executor import map_hosts
from opspatch.runs.fleet.pipeline import gate_inspection
from opspatch.runs.fleet.rotation import rotation_of
from opspatch.runs.judgments.live import HeldFix, drift, held_fixes
from opspatch.runs.judgments.patchset import ServerAge, Standing, judge, server_age
from opspatch.runs.judgments.proof import change_proof, describe
from opspatch.runs.judgments.who import RunWho, who_ran


@dataclass(frozen=True)
class LiveInMemory(JsonRecord):
    """One live fix one engine process holds (its `list`), and whether the file on disk is the
    one it was taken from (`drift`: why not; the next restart then loses the fix)."""

    process: str
    pid: int | None
    fix_id: str
    definitions: tuple[str, ...]
    drift: str | None = None


@dataclass(frozen=True)
class PatchStatus(JsonRecord):
    host: str
    patch: str
    state: PatchState
    path: str | None
    sha256: str | None
    detail: str
    server_running: bool | None = None
    """Whether the host's engine is running (None: the host was not inspected)."""
    files: tuple[PatchStatus, ...] = ()
    """A patch set's files, each with its own state (the set's state is theirs together)."""
    rotation: Rotation | None = None
    """Behind a router: whether the router lists its worker healthy (None: no router, or the
    router could not be asked)."""
    release: str | None = json_field(default=None, omit_none=True)
    """The version of the distribution that provides the file (None: not inspected, unknown)."""
    carried: Detected | None = json_field(default=None, omit_none=True)
    """What the file carries of the patch, structurally, whatever the ledger says (None: the
    file was not read): what `sync` decides from for a file the ledger no longer explains."""
    recreated: bool | None = json_field(default=None, omit_none=True)
    """True: the engine's container was recreated since this patch was written in it."""
    written_by: RunWho | None = json_field(default=None, omit_none=True)
    """The run that wrote the bytes the file is: its operator, controller, approvers."""
    node_state: PatchState | None = json_field(default=None, omit_none=True)
    """The host's own word, when it is a node of a unit whose nodes' words differ: `state` is
    then `partial` (`unit_agreement`); None otherwise."""
    live: tuple[LiveInMemory, ...] | None = json_field(default=None, omit_none=True)
    """On a host with `live = true`: the patch's live fixes each engine process holds in memory
    (None: live fixes are off there, or no process that answered holds one of this patch's)."""
    live_unread: str | None = json_field(default=None, omit_none=True)
    """On a host with `live = true`: why what the engine holds in memory is not known (its
    processes could not be asked, or some did not answer); None when every process answered
    (or live fixes are off there). `live` then says only what the processes that answered
    hold."""

    def to_json(self) -> dict[str, Any]:
        data = record_to_json(self)
        if not self.files:  # only a patch set has files of its own
            del data["files"]
        return data


def with_server(status: PatchStatus, host: Host, inspection: HostInspection) -> PatchStatus:
    """`status` saying whether the host's server runs: a file that is right on disk serves
    nothing while no server runs it (a restore whose decode crashed the engine, say)."""
    running = inspection.server is not None
    detail = status.detail
    if not running:
        down = (
            f"the server is not running (no live process in its pid file, nothing listening at "
            f"{host.engine.url}): `{remedy_text(CliCommand.DIAGNOSE, hosts=host.name)}` says why"
        )
        detail = f"{detail}; {down}" if detail else down
    return replace(status, detail=detail, server_running=running)


def classify(
    patch: LoadedPatch,
    host: str,
    inspection: HostInspection,
    ledger: Ledger | None,
    container: ContainerIdentity | None = None,
    *,
    part: int = 0,
) -> PatchStatus:
    """The state of one patch (`part`: one target of a patch set) in one live file (pure
    apart from reading the ledger).

    `container` is the container the file was read in, for an engine in one: a container other
    than the one the patch was written in (recreated from its image) is said to be so. A file
    that is its release's pristine file and already has the fix is `fixed-upstream`, whatever the
    ledger says opspatch once wrote there (an upgrade replaced it)."""
    upstream = upstream_on_pristine(patch.parts[part], inspection)
    if upstream is not None and upstream.fixed:
        file = inspection.file
        detail = f"{_release_of(inspection)} ships the fix ({upstream.reason}): the patch is not needed here"
        if upstream.disagreement:
            detail += f"; {upstream.disagreement}"
        return PatchStatus(
            host,
            patch.spec.id,
            PatchState.FIXED_UPSTREAM,
            file.realpath,
            file.sha256,
            detail,
            release=module_release(inspection),
            carried=detect(file.content, patch.parts[part]).state,
        )
    said = _classify_file(patch, host, inspection, ledger, container, part=part)
    if upstream is not None and upstream.disagreement:
        detail = f"{said.detail}; {upstream.disagreement}" if said.detail else upstream.disagreement
        said = replace(said, detail=detail)
    return said


def upstream_on_pristine(spec: PatchSpec, inspection: HostInspection) -> UpstreamVerdict | None:
    """The upstream verdict of one patch part on the host's file when that file is the pristine
    file of its installed release (its sha256 is the one pip's RECORD holds); None otherwise:
    a file someone changed, or one without a RECORD (a source checkout), says nothing about
    what the release ships."""
    module = inspection.module
    if module is None or module.record_sha256 != inspection.file.sha256:
        return None
    return part_verdict(spec, inspection.file.content, module.distribution_version)


def _release_of(inspection: HostInspection) -> str:
    module = inspection.module
    if module is None or module.distribution is None:
        return "the installed release"
    return f"{module.distribution} {module.distribution_version or '(version unknown)'}"


def _classify_file(
    patch: LoadedPatch,
    host: str,
    inspection: HostInspection,
    ledger: Ledger | None,
    container: ContainerIdentity | None,
    *,
    part: int,
) -> PatchStatus:
    """`classify` for a file that is not fixed upstream: the ledger and the patch decide."""
    spec = patch.parts[part]
    structural = detect(inspection.file.content, spec)
    said = _classify(patch, host, inspection, ledger, container, spec=spec, structural=structural)
    return replace(said, release=module_release(inspection), carried=structural.state)


def module_release(inspection: HostInspection) -> str | None:
    """The version of the distribution that provides the file, else the engine's own."""
    module = inspection.module
    if module is not None and module.distribution_version:
        return module.distribution_version
    return inspection.facts.sglang_version


def _classify(
    patch: LoadedPatch,
    host: str,
    inspection: HostInspection,
    ledger: Ledger | None,
    container: ContainerIdentity | None,
    *,
    spec: PatchSpec,
    structural: Detection,
) -> PatchStatus:
    # Long because: one table over the file's standing, each case a return in decided order
    file = inspection.file
    gate = gate_inspection(spec.target, inspection)
    history = (
        ledger.file_history(
            host,
            file.realpath,
            machine=Machine.of(inspection.facts.machine_id, inspection.facts.hostname),
        )
        if ledger
        else []
    )
    standing = locate(history, applied_versions(history, patch.spec.id), file.sha256)
    baked = baked_in(container, file.realpath, file.sha256)
    if baked is not None and baked.patch_id == patch.spec.id and container is not None:
        return PatchStatus(
            host=host,
            patch=patch.spec.id,
            state=PatchState.APPLIED,
            path=file.realpath,
            sha256=file.sha256,
            detail=describe_baked(baked, container),
        )

    def lacking(status: PatchStatus) -> PatchStatus:
        # the patch is not in the file and its own versions do not cover the host: it cannot
        # be put back there (needs-port), whatever wiped it
        if gate is None or structural.state == "applied":
            return status
        return replace(status, state=PatchState.NOT_APPLICABLE, detail=f"{gate}; {status.detail}")

    recreated = recreated_since(history, patch.spec.id, container)
    if recreated is not None and not isinstance(standing, AtPostImage | PatchedFurther):
        return lacking(
            PatchStatus(
                host=host,
                patch=patch.spec.id,
                state=PatchState(structural.state)
                if structural.state != "applied"
                else PatchState.APPLIED,
                path=file.realpath,
                sha256=file.sha256,
                detail=recreated,
                recreated=True,
            )
        )
    base: dict[str, Any] = {
        "host": host,
        "patch": patch.spec.id,
        "path": file.realpath,
        "sha256": file.sha256,
    }
    server = inspection.server
    stale = server_age(server, file) == ServerAge.OLDER
    if isinstance(standing, AtPostImage):
        assert ledger is not None
        written = _written(ledger, host, file.realpath, standing.version)
        base["written_by"] = who_ran(ledger, standing.version.run_id)
        # the one judgment of a file's standing (restart, recover, rollback read it too);
        # status does not read the proof: staged or applied is the server's age alone
        if judge((standing,), server=server_age(server, file), proven=False) == (
            Standing.NEW_STALE
        ):
            assert server is not None
            return PatchStatus(
                **base,
                state=PatchState.STAGED,
                detail=f"{written}; the running server (pid {server.pid}) started before "
                "the file changed, so it still runs the old code",
            )
        return PatchStatus(**base, state=PatchState.APPLIED, detail=written)
    if isinstance(standing, PatchedFurther):
        # Not drifted: opspatch made every change since, and rolling them back in order works.
        state = (
            PatchState(structural.state)
            if structural.state != "applied"
            else (PatchState.STAGED if stale else PatchState.APPLIED)
        )
        return PatchStatus(
            **base,
            state=state,
            detail=f"written by run {standing.version.run_id}, {standing.advice()}",
        )
    if isinstance(standing, AtPreImage):
        return lacking(
            PatchStatus(
                **base,
                state=PatchState.NOT_APPLIED,
                detail=f"back at the pre-image of run {standing.version.run_id}",
            )
        )
    if isinstance(standing, ChangedSince):
        version = standing.version
        return lacking(
            PatchStatus(
                **base,
                state=PatchState.DRIFTED,
                detail=f"changed since run {version.run_id} wrote {version.sha256_after[:12]}; "
                f"the patch is {structural.state} here"
                + (f": {why_unknown(spec, structural)}" if structural.state == "unknown" else ""),
            )
        )
    if structural.state == "applied":
        return PatchStatus(
            **base,
            state=PatchState.STAGED if stale else PatchState.APPLIED,
            detail="present, but not written by opspatch (no ledger record)"
            + ("; the running server started before it" if stale else ""),
        )
    if gate is not None:
        return PatchStatus(**base, state=PatchState.NOT_APPLICABLE, detail=gate)
    if structural.state == "not-applied":
        return PatchStatus(**base, state=PatchState.NOT_APPLIED, detail="")
    detail = why_unknown(spec, structural) if structural.state == "unknown" else structural.reason
    if structural.state == "partial":
        detail += (
            f"; `{remedy_text(CliCommand.ROLLBACK, patch.reference, hosts=host)}` restores the "
            "original where "
            "opspatch wrote it, or finish the change by hand"
        )
    return PatchStatus(**base, state=PatchState(structural.state), detail=detail)


def why_unknown(spec: PatchSpec, structural: Detection) -> str:
    """Why the patch is unknown in a file: each edit that no longer fits, by its field, kind and
    scope (what `needs-port` says), else the file's own problem (it does not parse)."""
    return misfits(spec, structural) or structural.reason


_SET_PRECEDENCE = (
    PatchState.UNREACHABLE,
    PatchState.NOT_APPLICABLE,
    PatchState.DRIFTED,
    PatchState.UNKNOWN,
)
"""A set's state when one of its files is in one of these (the first found wins)."""


def combine_set(patch: LoadedPatch, host: str, files: Sequence[PatchStatus]) -> PatchStatus:
    """A patch set's state on a host from its files' states: `applied` (or `staged`) only when
    every file is, `not-applied` only when none is; a set with some files new and the rest old
    (a run stopped between two swaps) is `partial`, never `applied`."""
    states = [f.state for f in files]
    each = ", ".join(f"{(f.path or f.detail).rsplit('/', 1)[-1]} {f.state}" for f in files)
    new = {PatchState.APPLIED, PatchState.STAGED}
    first = files[0]
    if all(s == PatchState.FIXED_UPSTREAM for s in states):
        state, detail = PatchState.FIXED_UPSTREAM, f"every file of the set: {first.detail}"
    elif all(s in new for s in states):
        state = PatchState.STAGED if PatchState.STAGED in states else PatchState.APPLIED
        detail = f"every file of the set: {each}; {first.detail}"
    elif all(s == PatchState.NOT_APPLIED for s in states):
        state, detail = PatchState.NOT_APPLIED, ""
    else:
        state = next((s for s in _SET_PRECEDENCE if s in states), PatchState.PARTIAL)
        detail = f"the patch set is not whole ({each})"
        if state == PatchState.PARTIAL:
            detail += (
                f": `{remedy_text(CliCommand.RECOVER, hosts=host)}` makes it whole (puts the new "
                "files back), or "
                f"`{remedy_text(CliCommand.ROLLBACK, patch.reference, hosts=host)}`"
            )
    running = [f.server_running for f in files if f.server_running is not None]
    return PatchStatus(
        host,
        patch.spec.id,
        state,
        first.path,
        first.sha256,
        detail,
        server_running=running[0] if running else None,
        files=tuple(files),
        release=first.release,
        carried=_carried_by_set([f.carried for f in files]),
        recreated=True if any(f.recreated for f in files) else None,
    )


def _carried_by_set(carried: Sequence[Detected | None]) -> Detected | None:
    """What a set's files carry together: a file not read or not fitting decides first."""
    if None in carried:
        return None
    kinds = set(carried)
    if Detected.UNKNOWN in kinds:
        return Detected.UNKNOWN
    return kinds.pop() if len(kinds) == 1 else Detected.PARTIAL


def recreated_since(
    history: Sequence[FileVersion], patch_id: str | None, container: ContainerIdentity | None
) -> str | None:
    """What to say when the container the file was last patched in (by `patch_id`; None: by
    any patch) is not this one: it was recreated from its image, and the fix went with the old
    one's writable layer. None when it is the same container, or no container was recorded."""
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


def baked_in(container: ContainerIdentity | None, path: str, sha256: str) -> BakedLabels | None:
    """The bake a container's image carries for `path` (the newest that wrote it: an image
    baked onto a baked one carries both), when the file is the bytes it baked there (`opspatch
    bake`'s labels, which the runtime copies into each container); None otherwise. Such a file
    came with the image: no recreate of the container loses it."""
    history = baked_history(container.labels) if container is not None else ()
    wrote = next((bake for bake in history if bake.post_image_of(path) is not None), None)
    if wrote is None or wrote.post_image_of(path) != sha256:
        return None
    return wrote


def describe_baked(baked: BakedLabels, container: ContainerIdentity) -> str:
    return (
        f"the fix came baked in: image {container.image} was built with {baked.patch_id} by "
        f"run {baked.run_id} (FROM {baked.base}), and the file is the bytes it baked"
    )


def _written(ledger: Ledger, host: str, path: str, version: FileVersion) -> str:
    """Where a file that is the bytes a run wrote stands: proven or not (`runs.judgments.proof`, the
    same sentence `recover` says). Plain "applied" for an unproven change would say the fix is
    live while the server may still run the old code."""
    return describe(change_proof(ledger, host, version))


def fleet_status(
    hosts: Sequence[Host],
    patches: Sequence[LoadedPatch],
    factory: TransportFactory,
    ledger: Ledger | None,
) -> list[PatchStatus]:
    """Every (host, patch) state, hosts inspected in parallel."""

    def one(host: Host) -> list[PatchStatus]:
        transport = factory(host)
        ops = HostOperations(transport, host)
        results: list[PatchStatus] = []
        try:
            modules: dict[str, list[tuple[LoadedPatch, int]]] = {}
            for patch in patches:
                for index, part in enumerate(patch.parts):
                    modules.setdefault(part.target.module, []).append((patch, index))
            found: dict[tuple[str, int], PatchStatus] = {}
            for module, group in modules.items():
                try:
                    inspection = ops.inspect(module, timeout=StepTimeouts().inspect)
                except TargetError as exc:
                    for p, index in group:
                        found[p.sha256, index] = PatchStatus(
                            host.name, p.spec.id, PatchState.NOT_APPLICABLE, None, None, exc.message
                        )
                    continue
                except OpspatchError as exc:
                    for p, index in group:
                        found[p.sha256, index] = PatchStatus(
                            host.name, p.spec.id, PatchState.UNREACHABLE, None, None, exc.message
                        )
                    continue
                for patch, index in group:
                    said = classify(
                        patch, host.name, inspection, ledger, transport.container, part=index
                    )
                    found[patch.sha256, index] = with_server(said, host, inspection)
            for patch in patches:
                files = [found[patch.sha256, i] for i in range(len(patch.parts))]
                results.append(combine_set(patch, host.name, files) if patch.is_set else files[0])
            reached = any(r.state != PatchState.UNREACHABLE for r in results)
            if host.live and reached:  # one exec more, only where live fixes are on
                results = with_live_fixes(ops, patches, results)
        finally:
            transport.close()
        return results

    by_name = {h.name: h for h in hosts}
    found = map_hosts(lambda name: one(by_name[name]), list(by_name), limit=16)
    rotations = rotation_of(hosts)
    return unit_agreement(
        hosts,
        [
            _with_rotation(status, *rotations[status.host]) if status.host in rotations else status
            for statuses in found.values()
            for status in statuses
        ],
    )


def with_live_fixes(
    ops: HostOperations, patches: Sequence[LoadedPatch], statuses: list[PatchStatus]
) -> list[PatchStatus]:
    """Each patch's status with the live fixes of it the host's engine holds in memory (one
    `list` to every process) and, for each, whether the file agrees: a fix taken from bytes
    the file no longer has is drift (the next restart loses it). A `staged` file whose fix every
    process of the engine holds live, taken from these very bytes, is `applied`: the server runs
    it. An engine that cannot be asked, or a process that does not answer, is `live_unread`:
    what it holds is not known, so nothing is said absent and no `staged` is made `applied`."""
    try:
        reply = ask_engine(ops, LiveFix("list"), timeout=StepTimeouts().smoke, step="live")
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
        mine = [
            h for h in held if h.fix_id == patch.spec.id or h.fix_id.startswith(patch.spec.id + ":")
        ]
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
        if unread:  # the processes that did not answer may run the old code
            status = _unread(status, unread)
        elif status.state == PatchState.STAGED and not drifted:
            # the server started before the file, but holds the file's fix live: it runs it
            written = status.detail.split("; the running server", 1)[0]
            status = replace(status, state=PatchState.APPLIED, detail=written)
            said = f"taken live, no restart: {said}"
        shown.append(replace(status, live=memory, detail=_joined(status.detail, said)))
    return shown


def _unread(status: PatchStatus, unread: str) -> PatchStatus:
    """A status whose engine's live fixes could not be listed, saying so. A `staged` file (the
    server started before it) stays `staged` (a restart makes it certain: sync's word for it),
    but no longer says the server runs the old code: it may hold the fix live."""
    if status.state != PatchState.STAGED:
        return replace(status, detail=_joined(status.detail, unread))
    written = status.detail.split("; the running server", 1)[0]
    said = (
        "the running server started before the file changed: it runs the old code unless it "
        f"holds the fix live, and {unread}"
    )
    return replace(status, detail=_joined(written, said))


def exit_code(statuses: Sequence[PatchStatus]) -> int:
    """`status`'s exit: 1 when a host could not be looked at (unreachable), or the live fixes
    of an engine that takes them could not be listed; else 0."""
    unlooked = any(s.state == PatchState.UNREACHABLE or s.live_unread for s in statuses)
    return EXIT_HOST_FAILED if unlooked else EXIT_OK


def _joined(detail: str, more: str) -> str:
    return f"{detail}; {more}" if detail else more


def unit_agreement(hosts: Sequence[Host], statuses: Sequence[PatchStatus]) -> list[PatchStatus]:
    """The statuses, each node of a unit whose selected nodes' words for a patch differ made
    `partial` (its own word kept in `node_state`), the odd nodes named: a unit is one server,
    so one node restored and another not (or one reinstalled) is never `applied`. The odd node
    is one whose word differs from the most common one (on a tie the first node's in rank
    order, the head's when selected). A node not inspected keeps `unreachable`."""
    unit_of = {h.name: h.unit for h in hosts if h.unit is not None}
    groups: dict[tuple[str, str], list[PatchStatus]] = {}
    for status in statuses:
        unit = unit_of.get(status.host)
        if unit is not None:
            groups.setdefault((unit.name, status.patch), []).append(status)
    marked: dict[tuple[str, str], PatchStatus] = {}
    for (unit_name, _), group in groups.items():
        words = [s.state for s in group]
        if len(set(words)) < 2:
            continue
        ranked = sorted(group, key=lambda s: unit_of[s.host].rank_of(s.host))
        reference = max(words, key=lambda w: (words.count(w), -[s.state for s in ranked].index(w)))
        agreeing = ", ".join(s.host for s in ranked if s.state == reference)
        odd = "; ".join(f"{s.host} is {s.state}" for s in ranked if s.state != reference)
        said = f"unit {unit_name}'s nodes differ ({odd}; the others ({agreeing}) {reference})"
        for status in group:
            if status.state == PatchState.UNREACHABLE:
                continue
            own = f"; this node is {status.state}" + (f": {status.detail}" if status.detail else "")
            marked[status.host, status.patch] = replace(
                status, state=PatchState.PARTIAL, detail=said + own, node_state=status.state
            )
    return [marked.get((s.host, s.patch), s) for s in statuses]


def _with_rotation(status: PatchStatus, rotation: Rotation | None, why: str) -> PatchStatus:
    detail = f"{status.detail}; {why}" if why and status.detail else (why or status.detail)
    return replace(status, rotation=rotation, detail=detail)
