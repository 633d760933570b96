"""`live enable` / `live disable`: the live plugin written into the engine's environment and
removed again; no engine restarts, so no host is drained."""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opspatch import __version__
from opspatch.core.host import Host
from opspatch.core.policy import Playbook, StepTimeouts
from opspatch.core.reasons import Reason
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command, Outcome, Step
from opspatch.errors import LiveRefused, OpspatchError, RemoteOperationError
from opspatch.hosts.agent.protocol import RemoveFilesReply
from opspatch.hosts.live import LiveEngineReply, LiveFix, ask_engine
from opspatch.hosts.livedist import LIVE_DIST_NAME, live_distribution, plugin_sources
from opspatch.hosts.liveinstall import (
    InstalledLive,
    LiveSite,
    install,
    read_hashes,
    read_site,
    remove,
)
from opspatch.hosts.operations import HostInspection, HostOperations
from opspatch.ledger.store import Ledger
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.fleetrun import per_node
from opspatch.runs.fleet.recorded import run_recorded
from opspatch.runs.fleet.restore import AS_APPLY, run_in_batches
from opspatch.runs.fleet.session import (
    HostFailed,
    HostSession,
    Progress,
    describe_error,
    refusal_reason,
)
from opspatch.runs.fleet.standing import begin
from opspatch.runs.judgments.live import HeldFix, held_fixes, unanswered
from opspatch.runs.judgments.patchset import ServerAge, server_age
from opspatch.runs.report import FileChange, HostOutcome, RunReport

REFUSALS = frozenset({"file-exists", "file-changed"})
"""Refused before anything was written: the host is refused (exit 2)."""
NOTHING_RAN = frozenset({"lock-lost", "lock-held"})
"""The fence stopped the exec before any of it ran: `failed`."""


def enable_live(
    *,
    ledger: Ledger,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    progress: Progress | None = None,
) -> RunReport:
    off = [host.name for host in hosts if not host.live]
    if off:  # apply --live's refusal says to enable first; here the order is the other way
        raise LiveRefused(
            f"live fixes are off on {', '.join(off)}: the inventory does not say live = true",
            hint="set live = true for these hosts (defaults, a group or the host), then "
            f"`{remedy_text(Command.LIVE_ENABLE, hosts=','.join(off))}` again",
        )
    return _run(Command.LIVE_ENABLE, ledger, hosts, factory, playbook, progress, _enable)


def disable_live(
    *,
    ledger: Ledger,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    progress: Progress | None = None,
) -> RunReport:
    return _run(Command.LIVE_DISABLE, ledger, hosts, factory, playbook, progress, _disable)


def _run(
    command: Command,
    ledger: Ledger,
    hosts: Sequence[Host],
    factory: TransportFactory,
    playbook: Playbook,
    progress: Progress | None,
    change: Callable[[HostSession, LiveSite], HostOutcome],
) -> RunReport:
    def one(session: HostSession) -> HostOutcome:
        site = _site(session)  # locked, and its engine environment read
        return site if isinstance(site, HostOutcome) else change(session, site)

    return run_recorded(
        command,
        lambda fleet: run_in_batches(fleet, per_node(one), AS_APPLY),
        ledger=ledger,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        progress=progress,
    )


def list_fixes(ops: HostOperations, timeout: float = StepTimeouts().smoke) -> LiveEngineReply:
    """One `list` to every process of the engine."""
    return ask_engine(ops, LiveFix("list"), timeout=float(timeout), step=Step.LIVE)


def of_patch(fix_id: str, patch_id: str) -> bool:
    """A patch set's fixes are `PATCH:MODULE`."""
    return fix_id == patch_id or fix_id.startswith(f"{patch_id}:")


def patch_fixes(session: HostSession, patch_id: str) -> tuple[list[HeldFix], LiveEngineReply]:
    """The patch's live fixes the engine's processes hold, and the reply."""
    reply = list_fixes(session.ops, session.playbook.timeouts.smoke)
    return [h for h in held_fixes(reply) if of_patch(h.fix_id, patch_id)], reply


def _site(session: HostSession) -> LiveSite | HostOutcome:
    timeouts = session.playbook.timeouts
    try:
        _lock(session)
        with session.step(Step.INSPECT) as note:
            site = read_site(session.ops, timeout=timeouts.inspect, step=Step.INSPECT)
            start = "entry point" if site.plugin_framework else ".pth start (no plugin framework)"
            found = ", ".join(i.dist_info for i in site.installed) or "nothing installed"
            note["detail"] = f"{site.purelib}: {start}; {found}"
    except OpspatchError as error:
        return session.refused(error)
    return site


def _lock(session: HostSession) -> None:
    with session.step(Step.LOCK) as note:
        session.lock.take()
        note["detail"] = "taken"


@dataclass(frozen=True)
class _FileChange:
    """One install or removal; `wanted`: each file's sha256; `present`: there or gone after."""

    step: Step
    what: str
    wanted: dict[str, str]
    present: bool
    send: Callable[[], tuple[str, bool]]
    """The step's detail and whether a file changed."""


def _change(
    session: HostSession, root: str, change: _FileChange, *, done_before: int = 0
) -> bool | HostOutcome:
    """Whether a file changed, or the outcome: a refusal, or (effect unknown) what the files
    read back say."""
    try:
        with session.step(change.step) as note:
            note["detail"], changed = change.send()
        return changed
    except OpspatchError as error:
        refused = _refused(session, error)
        if refused is not None and not done_before:
            return refused
        if refused is not None:  # an earlier installation is gone already: not as it was
            return session.outcome(
                Outcome.NEEDS_ATTENTION,
                f"{refused.error}; {done_before} other installation(s) removed before it",
                reason=Reason.PART_WAY,
            )
        why = f"{change.what} did not finish: {describe_error(error)}"
    try:
        with session.step(Step.RECONCILE) as note:
            found = read_hashes(
                session.ops,
                root,
                list(change.wanted),
                timeout=session.playbook.timeouts.inspect,
                step=Step.RECONCILE,
            )
            there = [p for p, digest in change.wanted.items() if found.get(p) == digest]
            note["detail"] = f"{len(there)} of its {len(change.wanted)} file(s) there"
    except OpspatchError as again:
        return session.outcome(
            Outcome.NEEDS_ATTENTION,
            f"{why}; the files could not be read back ({describe_error(again)})",
            reason=Reason.PART_WAY,
        )
    done = len(there) if change.present else len(change.wanted) - len(there)
    if done == len(change.wanted):
        return True
    if done == 0 and not done_before:
        text = f"{why}; read back: nothing was changed"
        return session.outcome(Outcome.FAILED, text, reason=Reason.HOST_ERROR)
    finish = Command.LIVE_ENABLE if change.present else Command.LIVE_DISABLE
    return session.outcome(
        Outcome.NEEDS_ATTENTION,
        f"{why}; read back: {len(there)} of its {len(change.wanted)} files are there "
        f"(`{remedy_text(finish, hosts=session.name)}` again finishes it)",
        reason=Reason.PART_WAY,
    )


def _record_change(site: LiveSite, dist_info: str, record: bytes, *, enabled: bool) -> FileChange:
    path = posixpath.join(site.purelib, dist_info, "RECORD")
    digest = hashlib.sha256(record).hexdigest()
    return FileChange(path, None if enabled else digest, digest if enabled else None)


def _enable(session: HostSession, site: LiveSite) -> HostOutcome:
    files = live_distribution(__version__, plugin_sources(), site.start)
    dist_info = f"{LIVE_DIST_NAME}-{__version__}.dist-info"
    record = files[f"{dist_info}/RECORD"]
    others = [i.dist_info for i in site.installed if i.dist_info != dist_info]
    if others:
        disable = remedy_text(Command.LIVE_DISABLE, hosts=session.name)
        return session.outcome(
            Outcome.SKIPPED,
            f"refused: {', '.join(others)} is installed in {site.purelib}; `{disable}` first",
            reason=Reason.OTHER_VERSION,
        )

    def send() -> tuple[str, bool]:
        result = install(
            session.ops,
            site.purelib,
            files,
            lock_run_id=session.lock.run_id,
            timeout=session.playbook.timeouts.swap,
            step=Step.LIVE_ENABLE,
        )
        return (
            f"wrote {len(result['written'])} file(s) of {dist_info} ({site.start} start) into "
            f"{site.purelib}, {len(result['already'])} already there; RECORD sha256 "
            f"{hashlib.sha256(record).hexdigest()}"
        ), bool(result["written"])

    wanted = {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}
    install_them = _FileChange(Step.LIVE_ENABLE, "the install", wanted, True, send)
    written = _change(session, site.purelib, install_them)
    if isinstance(written, HostOutcome):
        return written
    warning = f"; but {site.filtered}" if site.filtered else ""
    change = _record_change(site, dist_info, record, enabled=True)
    if not written:
        return session.outcome(
            Outcome.ALREADY_APPLIED,
            file=change,
            note=f"already enabled: {dist_info} is installed in {site.purelib}{warning}",
        )
    return session.outcome(
        Outcome.STAGED,
        file=change,
        note=f"enabled ({site.start} start), staged: the plugin loads when the engine next "
        f"restarts (`opspatch restart` restarts into it, or the operator's restart){warning}",
    )


def _disable(session: HostSession, site: LiveSite) -> HostOutcome:
    if not site.installed:
        return session.outcome(
            Outcome.SKIPPED,
            note=f"nothing to remove: {LIVE_DIST_NAME} is not installed",
            reason=Reason.NOTHING_TO_DO,
        )
    manifests: list[tuple[InstalledLive, dict[str, str]]] = []
    for found in site.installed:
        try:
            manifests.append((found, _manifest(found)))
        except ValueError as error:
            text = f"refused: {found.dist_info}: {error}"
            return session.outcome(Outcome.SKIPPED, text, reason=Reason.CHANGED_SINCE)
    changes: list[FileChange] = []
    for found, wanted in manifests:

        def send(found: InstalledLive = found, wanted: dict[str, str] = wanted) -> tuple[str, bool]:
            result = _remove(session, site, wanted)
            return (
                f"removed {len(result['removed'])} file(s) of {found.dist_info} from "
                f"{site.purelib} ({len(result['absent'])} already gone)"
            ), True

        removal = _FileChange(Step.LIVE_DISABLE, "the removal", wanted, False, send)
        removed = _change(session, site.purelib, removal, done_before=len(changes))
        if isinstance(removed, HostOutcome):
            return removed
        assert found.record is not None
        changes.append(
            _record_change(site, found.dist_info, found.record.encode("utf-8"), enabled=False)
        )
    return session.outcome(
        Outcome.STAGED_BACK,
        file=changes[0],
        note="disabled: the plugin's files are removed; a running engine keeps it loaded (and "
        "any live fix in memory) until it restarts (`opspatch restart` restarts out of it, or "
        "the operator's restart)",
    )


def _refused(session: HostSession, error: OpspatchError) -> HostOutcome | None:
    if isinstance(error, RemoteOperationError) and error.code in REFUSALS:
        text = f"refused: {error.message}"
        return session.outcome(Outcome.SKIPPED, text, reason=Reason.CHANGED_SINCE)
    if isinstance(error, RemoteOperationError) and error.code in NOTHING_RAN:
        return session.outcome(Outcome.FAILED, describe_error(error), reason=refusal_reason(error))
    return None


def _remove(session: HostSession, site: LiveSite, wanted: dict[str, str]) -> RemoveFilesReply:
    return remove(
        session.ops,
        site.purelib,
        wanted,
        lock_run_id=session.lock.run_id,
        timeout=session.playbook.timeouts.swap,
        step=Step.LIVE_DISABLE,
    )


def _manifest(found: InstalledLive) -> dict[str, str]:
    """Each file the RECORD lists with its sha256; ValueError: unhashed, or not the plugin's."""
    listed = found.files()
    assert found.record is not None
    own = f"{found.dist_info}/RECORD"
    wanted: dict[str, str] = {}
    for path, digest in listed.items():
        if path == own:
            wanted[path] = hashlib.sha256(found.record.encode("utf-8")).hexdigest()
        elif digest is None:
            raise ValueError(f"RECORD lists {path} without a hash")
        else:
            wanted[path] = digest
    ours = (f"{LIVE_DIST_NAME}/", f"{found.dist_info}/", f"{LIVE_DIST_NAME}.pth")
    outside = [p for p in wanted if not p.startswith(ours)]
    if outside:
        raise ValueError(f"RECORD lists files that are not the plugin's: {', '.join(outside)}")
    return wanted


# -- a staged plugin, which `restart` finishes ----------------------------------------------------


@dataclass(frozen=True)
class StagedPlugin:
    """A plugin `live enable` wrote that the running engine does not load yet: `restart`
    restarts into it, proves it, or removes it."""

    site: LiveSite
    found: InstalledLive
    record: str
    inspection: HostInspection
    """The RECORD, read under the lock, and the server that runs."""

    def change(self) -> FileChange:
        return FileChange(self.record, None, self.inspection.file.sha256)

    def what(self) -> str:
        return f"the live plugin {self.found.dist_info} (`live enable`)"

    def listens(self, session: HostSession) -> None:
        """After the smoke: every process answers on its live socket (HostFailed if not)."""
        with session.step(Step.LIVE) as note:
            reply = list_fixes(session.ops, session.playbook.timeouts.smoke)
            problem = unanswered(reply) or (
                None if reply.processes() else "no process of the engine answered"
            )
            if problem is not None:
                raise HostFailed(
                    Outcome.FAILED, f"the live plugin is not loaded after the restart: {problem}"
                )
            note["detail"] = "listening: " + ", ".join(p.process for p in reply.processes())

    def remove(self, session: HostSession) -> FileChange:
        with session.step(Step.LIVE_DISABLE) as note:
            result = _remove(session, self.site, _manifest(self.found))
            note["detail"] = f"removed {len(result['removed'])} file(s) of {self.found.dist_info}"
        return FileChange(self.record, self.inspection.file.sha256, None)


@dataclass(frozen=True)
class StagedDisable:
    """`live disable` done on disk while the engine keeps the plugin loaded (`listening`):
    `restart` finishes it."""

    disabled: FileChange
    listening: tuple[str, ...]

    def what(self) -> str:
        return (
            f"the live plugin's removal (`live disable`; {', '.join(self.listening)} still held it)"
        )


def staged_plugin(
    session: HostSession, ledger: Ledger, *, locked: bool
) -> StagedPlugin | StagedDisable | None:
    """The plugin change staged on a `live = true` host, read under the lock (taken here unless
    `locked`)."""
    if not session.host.live:
        return None
    timeouts = session.playbook.timeouts
    with session.step(Step.INSPECT) as note:
        site = read_site(session.ops, timeout=timeouts.inspect, step=Step.INSPECT)
        note["detail"] = f"{site.purelib}: " + (
            ", ".join(i.dist_info for i in site.installed) or "no live plugin installed"
        )
    if not site.installed:
        return _staged_disable(session, ledger, site, locked=locked)
    if len(site.installed) != 1 or site.filtered:
        return None
    (found,) = site.installed
    path = posixpath.join(site.purelib, found.dist_info, "RECORD")
    if locked:
        with session.step(Step.INSPECT) as note:
            inspection = session.ops.inspect(path=path, timeout=timeouts.inspect)
            note["detail"] = f"{path} is {inspection.file.sha256[:12]}"
    else:
        inspection = begin(session, path=path)
    if server_age(inspection.server, inspection.file) != ServerAge.OLDER:
        return None
    wrote = any(
        file is not None and file.path == path and file.sha256_after == inspection.file.sha256
        for _, _, file in ledger.outcomes_since([session.name], 0)
    )
    return StagedPlugin(site, found, path, inspection) if wrote else None


def _staged_disable(
    session: HostSession, ledger: Ledger, site: LiveSite, *, locked: bool
) -> StagedDisable | None:
    """The newest outcome about the plugin is a `live disable`, yet processes still listen."""
    about = [
        (outcome, file)
        for _, outcome, file in ledger.outcomes_since([session.name], 0)
        if file is not None and _is_plugin_record(site, file.path)
    ]
    if not about or about[-1][0] != Outcome.STAGED_BACK or about[-1][1] is None:
        return None
    disabled = about[-1][1]
    if disabled.sha256_after is not None:
        return None
    if not locked:
        _lock(session)
    with session.step(Step.LIVE) as note:
        reply = list_fixes(session.ops, session.playbook.timeouts.smoke)
        listening = tuple(p.process for p in reply.processes())
        note["detail"] = (
            "still listening after the disable: " + ", ".join(listening)
            if listening
            else f"no process holds the plugin ({reply.missing or 'none listens'}): the "
            "disable is in effect"
        )
    return StagedDisable(disabled, listening) if listening else None


def _is_plugin_record(site: LiveSite, path: str) -> bool:
    folder, name = posixpath.split(path)
    parent, dist_info = posixpath.split(folder)
    return (
        name == "RECORD"
        and parent == site.purelib
        and dist_info.startswith(f"{LIVE_DIST_NAME}-")
        and dist_info.endswith(".dist-info")
    )
