"""What is applied where: each host's live file checked against the ledger and the patch.

Per host and patch: `applied` (the file is the bytes opspatch wrote, or carries the patch
structurally), `staged` (so, but the running server started before the file changed: it still
runs the old code), `not-applied`, `drifted` (the file changed since opspatch wrote it, e.g. sglang was
reinstalled: no post-image the ledger recorded leads to what is there; a patch that later recorded
patches were stacked on is not drifted, its detail names them), `not-applicable` (the module does not
resolve on the host, or its version is outside the patch's range), or `unreachable`; and whether
the host's server is running (a file that is right on disk serves nothing while it is down). One
exec per host and target module; nothing is locked or changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from opspatch.core.edit import detect
from opspatch.core.host import Host
from opspatch.core.policy import StepTimeouts
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import PatchState, Rotation
from opspatch.errors import OpspatchError, TargetError
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
from opspatch.runs.connect import TransportFactory
from opspatch.runs.executor import map_hosts
from opspatch.runs.pipeline import gate_inspection
from opspatch.runs.proof import change_proof, describe
from opspatch.runs.rotation import rotation_of


@dataclass(frozen=True)
class PatchStatus:
    host: str
    patch: str
    state: PatchState
    path: str | None
    sha256: str | None
    detail: str
    server_running: bool | None = None
    """Whether the host's engine is running (None: the host was not inspected)."""
    rotation: Rotation | None = None
    """Behind a router: whether the router lists its worker healthy (None: no router, or the
    router could not be asked)."""

    def to_json(self) -> dict[str, Any]:
        data = {**self.__dict__, "state": str(self.state)}
        data["rotation"] = None if self.rotation is None else str(self.rotation)
        return data


def with_server(status: PatchStatus, host: Host, inspection: HostInspection) -> PatchStatus:
    """`status` saying whether the host's server runs: a file that is right on disk serves
    nothing while no server runs it (a restore whose decode crashed the engine, say)."""
    running = inspection.server is not None
    detail = status.detail
    if not running:
        down = (
            f"the server is not running (no live process in its pid file, nothing listening at "
            f"{host.engine.url}): `opspatch diagnose --hosts {host.name}` says why"
        )
        detail = f"{detail}; {down}" if detail else down
    return replace(status, detail=detail, server_running=running)


def classify(
    patch: LoadedPatch, host: str, inspection: HostInspection, ledger: Ledger | None
) -> PatchStatus:
    """The state of one patch in one live file (pure apart from reading the ledger)."""
    file = inspection.file
    gate = gate_inspection(patch.spec.target, inspection)
    structural = detect(file.content, patch.spec)
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
    base: dict[str, Any] = {
        "host": host,
        "patch": patch.spec.id,
        "path": file.realpath,
        "sha256": file.sha256,
    }
    server = inspection.server
    stale = server is not None and server.predates(file)
    if isinstance(standing, AtPostImage):
        assert ledger is not None
        written = _written(ledger, host, file.realpath, standing.version)
        if stale:
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
        return PatchStatus(
            **base,
            state=PatchState.NOT_APPLIED,
            detail=f"back at the pre-image of run {standing.version.run_id}",
        )
    if isinstance(standing, ChangedSince):
        version = standing.version
        return PatchStatus(
            **base,
            state=PatchState.DRIFTED,
            detail=f"changed since run {version.run_id} wrote {version.sha256_after[:12]}; "
            f"the patch is {structural.state} here",
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
    detail = structural.reason
    if structural.state == "partial":
        detail += (
            f"; `opspatch rollback {patch.spec.id} --hosts {host}` restores the original where "
            "opspatch wrote it, or finish the change by hand"
        )
    return PatchStatus(**base, state=PatchState(structural.state), detail=detail)


def _written(ledger: Ledger, host: str, path: str, version: FileVersion) -> str:
    """Where a file that is the bytes a run wrote stands: proven or not (`runs.proof`, the
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
            modules: dict[str, list[LoadedPatch]] = {}
            for patch in patches:
                modules.setdefault(patch.spec.target.module, []).append(patch)
            for module, group in modules.items():
                try:
                    inspection = ops.inspect(module, timeout=StepTimeouts().inspect)
                except TargetError as exc:
                    results += [
                        PatchStatus(
                            host.name, p.spec.id, PatchState.NOT_APPLICABLE, None, None, exc.message
                        )
                        for p in group
                    ]
                    continue
                except OpspatchError as exc:
                    results += [
                        PatchStatus(
                            host.name, p.spec.id, PatchState.UNREACHABLE, None, None, exc.message
                        )
                        for p in group
                    ]
                    continue
                for patch in group:
                    found = classify(patch, host.name, inspection, ledger)
                    results.append(with_server(found, host, inspection))
        finally:
            transport.close()
        return results

    by_name = {h.name: h for h in hosts}
    found = map_hosts(lambda name: one(by_name[name]), list(by_name), limit=16)
    rotations = rotation_of(hosts)
    return [
        _with_rotation(status, *rotations[status.host]) if status.host in rotations else status
        for statuses in found.values()
        for status in statuses
    ]


def _with_rotation(status: PatchStatus, rotation: Rotation | None, why: str) -> PatchStatus:
    detail = f"{status.detail}; {why}" if why and status.detail else (why or status.detail)
    return replace(status, rotation=rotation, detail=detail)
