"""A fleet's desired patches against what is there: `plan --fleet`, `sync [--check]`, `drift`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opspatch.config.fleet import DesiredPatch, DesiredState
from opspatch.core.codec import Record, json_field
from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.reasons import Reason
from opspatch.core.remedy import remedy_text
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import (
    Command,
    DriftCause,
    FileAction,
    Outcome,
    PatchState,
    Rotation,
    SyncAction,
)
from opspatch.errors import (
    EXIT_BAD_INPUT,
    EXIT_HOST_FAILED,
    EXIT_NEEDS_ATTENTION,
    EXIT_OK,
    InputError,
)
from opspatch.ledger.store import Ledger, operator_identity
from opspatch.runs.commands.apply import apply_to_hosts, whole_apply
from opspatch.runs.commands.status import PatchStatus, read_fleet
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.fleetrun import FleetRun, per_node
from opspatch.runs.fleet.recorded import run_recorded
from opspatch.runs.fleet.session import HostSession, NoProgress, Progress
from opspatch.runs.fleet.standing import HostStanding
from opspatch.runs.judgments.approval import require_approval
from opspatch.runs.judgments.units import recover_remedy, require_whole_units, target_of
from opspatch.runs.judgments.views import DRIFT, SYNC, Coverage, Written, set_word, status_word
from opspatch.runs.report import HostOutcome, RunReport


@dataclass(frozen=True)
class SyncRow(Record):
    host: str
    patch: str
    desired: bool
    release: str | None
    state: PatchState
    action: SyncAction
    detail: str
    command: str | None = None
    cause: DriftCause | None = json_field(default=None, omit_none=True)


def decide(
    entry: DesiredPatch | None,
    status: PatchStatus,
    host: Host,
    read: Sequence[HostStanding | None] = (),
) -> SyncRow | None:
    """What sync does about one patch on `host` (`views.SYNC`); None: not desired and not
    there. `read`: its files, one per part (none: `status`'s word)."""
    coverage, unreadable = _coverage(entry, status.release)
    unserved = not_serving(status)
    live = status.live or ()
    held = bool(live) and not status.live_unread and not any(m.drift for m in live)
    word = status.node_state or status.state  # a part not read: live fixes changed nothing
    if read and None not in read:
        word = set_word([status_word(s.files[0]) for s in read if s is not None])
    disagrees = status.node_state is not None
    action = SYNC(word, status.carried, held, disagrees, entry is not None, coverage, not unserved)
    if action is None:
        return None
    why = unreadable if coverage == Coverage.UNREADABLE else unserved
    detail, command = _said(action, status, host, entry, coverage, why)
    return SyncRow(
        status.host,
        status.patch,
        entry is not None,
        status.release,
        status.state,
        action,
        detail,
        command,
    )


def _coverage(entry: DesiredPatch | None, release: str | None) -> tuple[Coverage, str]:
    if entry is None or not entry.releases:
        return Coverage.ALL, ""
    if release is None:
        return Coverage.UNKNOWN, ""
    try:
        return (Coverage.COVERED if entry.covers(release) else Coverage.OUTSIDE), ""
    except InputError as exc:
        return Coverage.UNREADABLE, exc.message


def _said(
    action: SyncAction,
    status: PatchStatus,
    host: Host,
    entry: DesiredPatch | None,
    coverage: Coverage,
    why: str,
) -> tuple[str, str | None]:
    patch, detail, target = status.patch, status.detail, target_of(host)
    diagnose = remedy_text(Command.DIAGNOSE, hosts=host.name)
    match action:
        case SyncAction.UNREACHABLE:
            return detail, diagnose
        case SyncAction.EXTRA:
            return (
                "on the host, but the fleet file does not want it there; sync leaves it",
                remedy_text(Command.ROLLBACK, patch, hosts=target),
            )
        case SyncAction.OUTSIDE_RANGE:
            assert entry is not None
            return f"release {status.release} is outside {entry.releases} ({entry.location})", None
        case SyncAction.BY_HAND if coverage == Coverage.UNREADABLE:
            return why, diagnose
        case SyncAction.BY_HAND if coverage == Coverage.UNKNOWN:
            assert entry is not None
            return (
                f"cannot tell which release the host runs, so not whether {entry.releases} "
                f"({entry.location}) covers it",
                diagnose,
            )
        case SyncAction.RECOVER if status.state == PatchState.APPLIED:
            # opspatch's own write: recover finishes it
            recover = recover_remedy(host)
            return (
                f"the fix is there, but {why}: `{recover}` starts the server and re-admits it "
                f"once its smoke decode passes; sync writes nothing there{_in_brackets(detail)}",
                recover,
            )
        case SyncAction.RECOVER:
            # upstream's fix, or a file the ledger does not explain: recover leaves those alone
            whose = (
                "the release's own"
                if status.state == PatchState.FIXED_UPSTREAM
                else "not opspatch's"
            )
            return (
                f"the fix is there ({whose} file), but {why}: start the server by its own "
                f"means (recover finishes only what opspatch wrote); `{diagnose}` says what it "
                f"finds there; sync writes nothing there{_in_brackets(detail)}",
                diagnose,
            )
        case SyncAction.APPLY:
            return detail or "not on the host; sync applies it", remedy_text(
                Command.SYNC, hosts=target
            )
        case SyncAction.RESTART:
            return detail, remedy_text(Command.RESTART, hosts=target)
        case SyncAction.NEEDS_PORT:
            return (
                f"the patch no longer fits release {status.release or '(unknown)'}: {detail}; "
                "port it (alternatives, docs/formats.md); nothing is written there",
                remedy_text(Command.PLAN, patch, hosts=target),
            )
        case SyncAction.BY_HAND:
            return detail, diagnose
        case SyncAction.FIXED_UPSTREAM:
            return (f"redundant here: {detail}" if detail else "redundant here"), None
        case SyncAction.NOTHING:
            return detail, None


def _in_brackets(detail: str) -> str:
    return f" ({detail})" if detail else ""


def not_serving(status: PatchStatus) -> str:
    """Why a host whose file carries the patch does not serve it ('' when it does or it is
    not known)."""
    why = []
    if status.server_running is False:
        why.append("its server is not running")
    if status.rotation == Rotation.OUT_OF_ROTATION:
        why.append("its router does not list its worker healthy (out of rotation)")
    return " and ".join(why)


@dataclass(frozen=True)
class WrittenBefore:
    """The last time opspatch wrote a patch into a host's file (`action`: `restore` when a
    rollback took it out since; `release`: what the host ran then)."""

    run_id: str
    action: str
    sha256_before: str
    release: str | None


def drift_cause(
    row: SyncRow, status: PatchStatus, written: WrittenBefore | None
) -> DriftCause | None:
    """Why the host's file is not what the ledger and the fleet file expect (`views.DRIFT`),
    whether or not its server runs: drift is about files."""
    action = row.action
    if status.node_state is not None and action != SyncAction.EXTRA:
        # a node of a unit that differs: its own file's drift, within the row's range
        status = replace(status, state=status.node_state, node_state=None)
        outside = action == SyncAction.OUTSIDE_RANGE
        coverage = Coverage.OUTSIDE if outside else Coverage.ALL
        action = SYNC(status.state, None, False, False, True, coverage, True) or SyncAction.BY_HAND
    drifted, recreated = status.state == PatchState.DRIFTED, bool(status.recreated)
    if written is None:
        return DRIFT(action, drifted, recreated, Written.NEVER, False, False)
    last = Written.PATCHED if written.action == FileAction.PATCH else Written.RESTORED
    upgraded = written.release is not None and status.release not in (None, written.release)
    at_pre_image = status.sha256 == written.sha256_before
    return DRIFT(action, drifted, recreated, last, upgraded, at_pre_image)


@dataclass(frozen=True)
class FleetPlan(Record):
    fleet_file: str
    hosts: tuple[str, ...]
    rows: tuple[SyncRow, ...]

    @property
    def differing(self) -> tuple[SyncRow, ...]:
        return tuple(r for r in self.rows if not r.action.at_goal)

    @property
    def redundant(self) -> tuple[SyncRow, ...]:
        """Desired patches whose fix the host's release already has (drop them there)."""
        return tuple(r for r in self.rows if r.action == SyncAction.FIXED_UPSTREAM)

    @property
    def unreachable(self) -> tuple[SyncRow, ...]:
        """Hosts not inspected: never at goal, never "no drift"."""
        return tuple(r for r in self.rows if r.action == SyncAction.UNREACHABLE)

    @property
    def exit_code(self) -> int:
        return EXIT_HOST_FAILED if self.differing else EXIT_OK


def select_hosts(desired: DesiredState, chosen: Sequence[Host] | None) -> tuple[Host, ...]:
    """`chosen`, else every host the fleet file names; a file that lists no patch is refused
    (a truncated file must fail a timer, not pass having checked nothing)."""
    if not desired.entries:
        raise InputError(
            f"{desired.path} lists no patch, so it selects no host: there is nothing to plan, "
            "check or sync",
            hint="add a [[patches]] entry with id, hosts and releases (docs/fleet.md)",
        )
    return tuple(chosen) if chosen is not None else tuple(desired.hosts.values())


def plan_fleet(
    desired: DesiredState,
    hosts: Sequence[Host],
    others: Sequence[LoadedPatch],
    factory: TransportFactory,
    ledger: Ledger | None,
) -> FleetPlan:
    """Read every host as `status` does, and decide; `others`: patches the fleet file does
    not list (`extra` where found)."""
    listed = {e.patch.spec.id for e in desired.entries}
    patches = [e.patch for e in desired.entries] + [p for p in others if p.spec.id not in listed]
    statuses, read = read_fleet(hosts, patches, factory, ledger) if hosts and patches else ([], {})
    by_key = {(s.host, s.patch): s for s in statuses}
    rows: list[SyncRow] = []
    for host in hosts:
        wanted = {e.patch.spec.id: e for e in desired.desired_on(host.name)}
        for patch in patches:
            status = by_key.get((host.name, patch.spec.id))
            if status is None:
                continue
            files = read[host.name, patch.spec.id]
            row = decide(wanted.get(patch.spec.id), status, host, files)
            if row is None:
                continue
            written = _written_before(ledger, patch.spec.id, files)
            cause = drift_cause(row, status, written)
            # a file that drifted with the fix still in it has no sync command: diagnose says how
            fix = row.command or (remedy_text(Command.DIAGNOSE, hosts=host.name) if cause else None)
            rows.append(replace(row, cause=cause, command=fix))
    return FleetPlan(desired.path, tuple(h.name for h in hosts), tuple(rows))


def _written_before(
    ledger: Ledger | None, patch: str, read: Sequence[HostStanding | None]
) -> WrittenBefore | None:
    """From the history status read (a set's first file's, under any name of the machine)."""
    if ledger is None or read[0] is None:
        return None
    history = [v for v in read[0].history if v.patch_id == patch or v.action == FileAction.RESTORE]
    last_patch = next((v for v in history if v.action == FileAction.PATCH), None)
    if last_patch is None:
        return None
    newest = history[0]
    try:
        facts = ledger.get_run(last_patch.run_id).host(last_patch.host).facts or {}
    except KeyError:
        facts = {}
    release = facts.get("sglang_version")
    return WrittenBefore(
        run_id=newest.run_id,
        action=newest.action,
        sha256_before=last_patch.sha256_before,
        release=release if isinstance(release, str) else None,
    )


@dataclass(frozen=True)
class SyncReport(Record):
    """The apply runs (one per patch applied), per patch the run recording the differing hosts
    left alone (`skipped`, with why), and the fleet afterwards."""

    runs: tuple[RunReport, ...]
    left_alone: tuple[RunReport, ...]
    after: FleetPlan
    exit_code: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "exit_code", _sync_exit(self.runs, self.after))

    def to_json(self) -> dict[str, Any]:
        return {
            "fleet_file": self.after.fleet_file,
            "hosts": list(self.after.hosts),
            "runs": [r.to_json() for r in self.runs],
            "left_alone": [r.to_json() for r in self.left_alone],
            "rows": [r.to_json() for r in self.after.rows],
            "redundant": [f"{r.host}: {r.patch}" for r in self.after.redundant],
            "exit_code": self.exit_code,
        }


def _sync_exit(runs: Sequence[RunReport], after: FleetPlan) -> int:
    codes = [r.exit_code for r in runs]
    if EXIT_NEEDS_ATTENTION in codes:
        return EXIT_NEEDS_ATTENTION
    if codes and all(c == EXIT_BAD_INPUT for c in codes):
        return EXIT_BAD_INPUT
    if not after.differing and all(c == EXIT_OK for c in codes):
        return EXIT_OK
    return EXIT_HOST_FAILED


def sync_fleet(
    desired: DesiredState,
    hosts: Sequence[Host],
    others: Sequence[LoadedPatch],
    playbook: Playbook,
    *,
    factory: TransportFactory,
    ledger: Ledger,
    progress: Progress | None = None,
    before: FleetPlan | None = None,
) -> SyncReport:
    """Per patch, one recorded apply run over the hosts where it is `apply`. A run that misses
    its goal stops the sync (the next patch would pile onto a fleet in trouble): later hosts
    are recorded as left alone. Every refusal is checked for every patch before any run."""
    progress = progress or NoProgress()
    playbook = desired.governing(playbook)  # the fleet file's [team] approval, if it asks
    require_whole_units(hosts, Command.SYNC)
    before = before or plan_fleet(desired, hosts, others, factory, ledger)
    by_name = {h.name: h for h in hosts}
    _refuse_before_any_run(desired, before, by_name, playbook, ledger)
    runs: list[RunReport] = []
    left_alone: list[RunReport] = []
    stopped: RunReport | None = None
    for entry in desired.entries:
        rows = _desired_rows(before, entry)
        names = [r.host for r in rows if r.action == SyncAction.APPLY]
        left = [
            (r, _why_left(r, by_name[r.host], stopped))
            for r in rows
            if not r.action.at_goal and (r.action != SyncAction.APPLY or stopped is not None)
        ]
        if left:
            left_alone.append(_record_left_alone(entry, left, by_name, playbook, ledger, factory))
        if not names or stopped is not None:
            continue
        report = apply_to_hosts(
            entry.patch,
            [by_name[n] for n in names],
            playbook,
            factory=factory,
            ledger=ledger,
            progress=progress,
            command=Command.SYNC,
        )
        runs.append(report)
        if report.exit_code != EXIT_OK:
            stopped = report
    after = plan_fleet(desired, hosts, others, factory, ledger) if runs else before
    return SyncReport(tuple(runs), tuple(left_alone), after)


def _desired_rows(plan: FleetPlan, entry: DesiredPatch) -> list[SyncRow]:
    return [r for r in plan.rows if r.patch == entry.patch.spec.id and r.desired]


def _refuse_before_any_run(
    desired: DesiredState,
    before: FleetPlan,
    by_name: Mapping[str, Host],
    playbook: Playbook,
    ledger: Ledger,
) -> None:
    """A refusal of the second patch must not follow a first one applied."""
    for entry in desired.entries:
        hosts = [
            by_name[r.host] for r in _desired_rows(before, entry) if r.action == SyncAction.APPLY
        ]
        require_whole_units(hosts, Command.SYNC, whole_apply(entry.patch.reference))
    for entry in desired.entries:
        if any(
            r.patch == entry.patch.spec.id and r.action == SyncAction.APPLY for r in before.rows
        ):
            require_approval(ledger, entry.patch, playbook.team, operator=operator_identity())


_LEFT_BECAUSE = {
    SyncAction.APPLY: Reason.NOT_STARTED,  # only when an earlier run stopped the sync
    SyncAction.RESTART: Reason.NOT_RESTARTED,
    SyncAction.RECOVER: Reason.NOT_SERVING,
    SyncAction.NEEDS_PORT: Reason.NOT_APPLICABLE,
    SyncAction.BY_HAND: Reason.BY_HAND,
    SyncAction.UNREACHABLE: Reason.HOST_ERROR,
    SyncAction.EXTRA: Reason.EXTRA,
}


def _why_left(row: SyncRow, host: Host, stopped: RunReport | None) -> str:
    if row.action == SyncAction.APPLY and stopped is not None:
        again = remedy_text(Command.SYNC, hosts=target_of(host))
        return (
            f"not applied: sync stopped after run {stopped.run_id} ({stopped.patch}) did not "
            f"reach its goal (exit {stopped.exit_code}); `{again}` once that is settled"
        )
    return f"{row.action}: {row.detail}"


def _record_left_alone(
    entry: DesiredPatch,
    left: Sequence[tuple[SyncRow, str]],
    by_name: Mapping[str, Host],
    playbook: Playbook,
    ledger: Ledger,
    factory: TransportFactory,
) -> RunReport:
    """A needs-port is never silently skipped: a `sync` run whose hosts are all `skipped`."""
    hosts = [by_name[r.host] for r, _ in left]

    def left_alone(fleet: FleetRun) -> RunReport:
        fleet.decide(
            {
                r.host: HostOutcome(r.host, Outcome.SKIPPED, why, reason=_LEFT_BECAUSE[r.action])
                for r, why in left
            }
        )
        outcomes, halted = fleet.execute(per_node(_never_started), batches=(), halt=lambda _: None)
        return fleet.report(outcomes, halted=halted)

    return run_recorded(
        Command.SYNC,
        left_alone,
        ledger=ledger,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        patch=entry.patch,
    )


def _never_started(session: HostSession) -> HostOutcome:
    raise AssertionError(f"sync's left-alone run starts no host ({session.name})")
