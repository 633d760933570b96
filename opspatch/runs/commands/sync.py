"""A fleet's desired patches against what is there: `plan --fleet`, `sync`, `sync --check`, `drift`.

What is there is `status`'s answer (`runs.commands.status.fleet_status`: the same inspection, the same
ledger reading); what is desired is the fleet file (`config.fleet`). Between them one pure
function, `decide`, says per host and patch what `sync` does (`SyncAction`), from one table
keyed by the status word, and `drift_cause` says why a file is not what the ledger and the fleet
file expect (`DriftCause`). `sync_fleet` applies through `runs.commands.apply.apply_to_hosts` (the apply
pipeline and rollout: canary, batches, drain, prove, roll back), one recorded `sync` run per
patch over the hosts that need it, then reads the fleet again so that what it reports is what is
there afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opspatch.config.fleet import DesiredPatch, DesiredState
from opspatch.core.host import Host
from opspatch.core.jsonrecord import JsonRecord, json_field
from opspatch.core.policy import Playbook
from opspatch.core.remedy import CliCommand, remedy_text
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import (
    Command,
    Detected,
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
from opspatch.runs.commands.apply import apply_to_hosts, units_refused
from opspatch.runs.commands.status import PatchStatus, fleet_status
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.fleetrun import FleetRun
from opspatch.runs.fleet.recorded import recorded_run
from opspatch.runs.fleet.session import HostSession, NoProgress, Progress
from opspatch.runs.judgments.approval import require_approval
from opspatch.runs.judgments.units import unit_refusal
from opspatch.runs.report import HostOutcome, RunReport

# ---------------------------------------------------------------------------------------------
# desired against actual (pure)

ACTION_BY_STATE: Mapping[PatchState, SyncAction] = {
    PatchState.APPLIED: SyncAction.NOTHING,
    PatchState.STAGED: SyncAction.RESTART,
    PatchState.NOT_APPLIED: SyncAction.APPLY,
    PatchState.NOT_APPLICABLE: SyncAction.NEEDS_PORT,
    PatchState.PARTIAL: SyncAction.BY_HAND,
    PatchState.UNKNOWN: SyncAction.NEEDS_PORT,
    PatchState.UNREACHABLE: SyncAction.UNREACHABLE,
    PatchState.FIXED_UPSTREAM: SyncAction.FIXED_UPSTREAM,
}
"""What sync does about a desired patch, by what `status` says of it: the one table. A
`drifted` file (the ledger no longer explains it) is decided by what it carries instead."""

ACTION_BY_CARRIED: Mapping[Detected, SyncAction] = {
    Detected.APPLIED: SyncAction.NOTHING,
    Detected.NOT_APPLIED: SyncAction.APPLY,
    Detected.PARTIAL: SyncAction.BY_HAND,
    Detected.UNKNOWN: SyncAction.NEEDS_PORT,
}


@dataclass(frozen=True)
class SyncRow(JsonRecord):
    """One host and one patch: desired or not, what is there, what sync does, what fixes it."""

    host: str
    patch: str
    desired: bool
    release: str | None
    state: PatchState
    """`status`'s word for the patch on the host."""
    action: SyncAction
    detail: str
    command: str | None = None
    """The command that brings the host to its desired state (None: nothing to do)."""
    cause: DriftCause | None = json_field(default=None, omit_none=True)
    """Why the file is not what the ledger and the fleet file expect (None: it is)."""


def decide(entry: DesiredPatch | None, status: PatchStatus) -> SyncRow | None:
    """What sync does about `status` (one host, one patch): `entry` is the fleet file's entry
    when the patch is desired there. None: a patch not desired and not there (nothing to say);
    a host that could not be inspected is always a row (`unreachable`), desired or not.

    Raises nothing: an unknown release or state is `by-hand`, never a guess."""
    # Long because: one decision table for a host and patch, read top to bottom, each case a return
    host, patch = status.host, status.patch

    def row(action: SyncAction, detail: str, command: str | None = None) -> SyncRow:
        return SyncRow(
            host,
            patch,
            entry is not None,
            status.release,
            status.state,
            action,
            detail,
            command,
        )

    carried = status.carried
    if status.state == PatchState.UNREACHABLE:
        # whether desired or not: a host not inspected is unknown, never "as desired" or
        # "no drift" (a row dropped here made `plan --fleet --hosts H` and `drift` pass on it)
        return row(
            SyncAction.UNREACHABLE, status.detail, remedy_text(CliCommand.DIAGNOSE, hosts=host)
        )
    if entry is None:
        present = status.state in (PatchState.APPLIED, PatchState.STAGED) or (
            status.state == PatchState.DRIFTED and carried == Detected.APPLIED
        )
        if not present:
            return None
        return row(
            SyncAction.EXTRA,
            "on the host, but the fleet file does not want it there; sync leaves it",
            remedy_text(CliCommand.ROLLBACK, patch, hosts=host),
        )
    if entry.releases:
        if status.release is None:
            return row(
                SyncAction.BY_HAND,
                f"cannot tell which release the host runs, so not whether {entry.releases} "
                f"({entry.location}) covers it",
                remedy_text(CliCommand.DIAGNOSE, hosts=host),
            )
        try:
            covered = entry.covers(status.release)
        except InputError as exc:
            return row(
                SyncAction.BY_HAND, exc.message, remedy_text(CliCommand.DIAGNOSE, hosts=host)
            )
        if not covered:
            return row(
                SyncAction.OUTSIDE_RANGE,
                f"release {status.release} is outside {entry.releases} ({entry.location})",
            )
    if status.state == PatchState.DRIFTED and carried is not None:
        action = ACTION_BY_CARRIED[carried]
    else:
        action = ACTION_BY_STATE.get(status.state, SyncAction.BY_HAND)
    detail = status.detail
    unserved = not_serving(status) if action in _FIX_THERE else ""
    if unserved:  # the goal is a fix that is served, not only one on disk
        said = f" ({detail})" if detail else ""
        if status.state == PatchState.APPLIED:  # opspatch's own write: recover finishes it
            return row(
                SyncAction.RECOVER,
                f"the fix is there, but {unserved}: "
                f"`{remedy_text(CliCommand.RECOVER, hosts=host)}` "
                "starts "
                f"the server and re-admits it once its smoke decode passes; sync writes nothing "
                f"there{said}",
                remedy_text(CliCommand.RECOVER, hosts=host),
            )
        # upstream's fix, or a file the ledger does not explain: recover leaves those alone
        whose = "the release's own" if action == SyncAction.FIXED_UPSTREAM else "not opspatch's"
        return row(
            SyncAction.RECOVER,
            f"the fix is there ({whose} file), but {unserved}: start the server by its own "
            f"means (recover finishes only what opspatch wrote); "
            f"`{remedy_text(CliCommand.DIAGNOSE, hosts=host)}` says what it finds there; "
            f"sync writes nothing there{said}",
            remedy_text(CliCommand.DIAGNOSE, hosts=host),
        )
    command = {
        SyncAction.APPLY: remedy_text(CliCommand.SYNC, hosts=host),
        SyncAction.RESTART: remedy_text(CliCommand.RESTART, hosts=host),
        SyncAction.NEEDS_PORT: remedy_text(CliCommand.PLAN, patch, hosts=host),
        SyncAction.BY_HAND: remedy_text(CliCommand.DIAGNOSE, hosts=host),
    }.get(action)
    if action == SyncAction.NEEDS_PORT:
        detail = (
            f"the patch no longer fits release {status.release or '(unknown)'}: {detail}; "
            "port it (alternatives, docs/formats.md); nothing is written there"
        )
    elif action == SyncAction.APPLY and not detail:
        detail = "not on the host; sync applies it"
    elif action == SyncAction.FIXED_UPSTREAM:
        detail = f"redundant here: {detail}" if detail else "redundant here"
    return row(action, detail, command)


_FIX_THERE = frozenset({SyncAction.NOTHING, SyncAction.FIXED_UPSTREAM})
"""Actions that find the fix on disk: at goal only while the host also serves it."""


def not_serving(status: PatchStatus) -> str:
    """Why a host whose file carries the patch does not serve it ('' when it does, or when
    that is not known: a host not inspected, no router or one that could not be asked)."""
    why = []
    if status.server_running is False:
        why.append("its server is not running")
    if status.rotation == Rotation.OUT_OF_ROTATION:
        why.append("its router does not list its worker healthy (out of rotation)")
    return " and ".join(why)


@dataclass(frozen=True)
class WrittenBefore:
    """What the ledger knows of the last time opspatch wrote a patch into a host's file."""

    run_id: str
    action: str
    """`patch`, or `restore` (a rollback took it out since)."""
    sha256_before: str
    release: str | None
    """The release the host ran then, from that run's recorded facts."""


def drift_cause(
    row: SyncRow, status: PatchStatus, written: WrittenBefore | None
) -> DriftCause | None:
    """Why the host's file is not what the ledger and the fleet file expect, or None when it is
    (or the difference is not in the file: a staged change, a release the entry is not for, a
    server that is down or a worker out of rotation: `recover`, whose file is right). A file
    that drifted keeps its cause whether or not its server runs: drift is about files."""
    if row.action == SyncAction.EXTRA:
        return DriftCause.PATCH_EXTRA
    if status.node_state is not None:  # a node of a unit that differs: its own file's drift
        status = replace(status, state=status.node_state, node_state=None)
        row = replace(row, action=ACTION_BY_STATE.get(status.state, SyncAction.BY_HAND))
    lacking = row.action in (SyncAction.APPLY, SyncAction.NEEDS_PORT, SyncAction.BY_HAND)
    changed = status.state == PatchState.DRIFTED
    if not (lacking or changed) or row.action == SyncAction.UNREACHABLE:
        return None
    if status.recreated:
        return DriftCause.RECREATED_CONTAINER
    if written is None or written.action != FileAction.PATCH:
        return DriftCause.PATCH_MISSING  # never written here, or rolled back since
    if written.release is not None and status.release not in (None, written.release):
        return DriftCause.UPGRADED
    if status.sha256 == written.sha256_before:
        return DriftCause.REINSTALLED
    return DriftCause.HAND_EDIT


# ---------------------------------------------------------------------------------------------
# reading the fleet


@dataclass(frozen=True)
class FleetPlan(JsonRecord):
    """Every selected host's desired patches, what is there, and what sync would do."""

    fleet_file: str
    hosts: tuple[str, ...]
    rows: tuple[SyncRow, ...]

    @property
    def differing(self) -> tuple[SyncRow, ...]:
        """The rows where a host is not as the fleet file wants it."""
        return tuple(r for r in self.rows if not r.action.at_goal)

    @property
    def redundant(self) -> tuple[SyncRow, ...]:
        """Desired patches whose fix the host's release already has (drop them there)."""
        return tuple(r for r in self.rows if r.action == SyncAction.FIXED_UPSTREAM)

    @property
    def unreachable(self) -> tuple[SyncRow, ...]:
        """The rows of hosts that could not be inspected: unknown, so never at goal and never
        "no drift" (`plan --fleet`, `sync --check` and `drift` exit 1 naming them)."""
        return tuple(r for r in self.rows if r.action == SyncAction.UNREACHABLE)

    @property
    def exit_code(self) -> int:
        """`sync --check`: 0 when every host is as desired, else 1."""
        return EXIT_HOST_FAILED if self.differing else EXIT_OK


def select_hosts(desired: DesiredState, chosen: Sequence[Host] | None) -> tuple[Host, ...]:
    """The hosts a plan or sync covers: `chosen` (a `--hosts` selection), else every host the
    fleet file names.

    Raises:
        InputError: the fleet file lists no patch (only a `[team]` table, or nothing): it
            desires nothing anywhere, so "every host is as desired" would be a pass that
            checked nothing (a truncated file must fail a `sync --check` timer, not pass it).
    """
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
    """Read every host (as `status` does: nothing locked, changed or recorded) and decide.

    `others` are the workspace's patches the fleet file does not list: found on a host, each
    is `extra` there."""
    listed = {e.patch.spec.id for e in desired.entries}
    patches = [e.patch for e in desired.entries] + [p for p in others if p.spec.id not in listed]
    statuses = fleet_status(hosts, patches, factory, ledger) if hosts and patches else []
    by_key = {(s.host, s.patch): s for s in statuses}
    rows: list[SyncRow] = []
    for host in hosts:
        wanted = {e.patch.spec.id: e for e in desired.desired_on(host.name)}
        for patch in patches:
            status = by_key.get((host.name, patch.spec.id))
            if status is None:
                continue
            row = decide(wanted.get(patch.spec.id), status)
            if row is None:
                continue
            cause = drift_cause(row, status, _written_before(ledger, status))
            # a file that drifted with the fix still in it has no sync command: diagnose says how
            fix = row.command or (
                remedy_text(CliCommand.DIAGNOSE, hosts=host.name) if cause else None
            )
            rows.append(replace(row, cause=cause, command=fix))
    return FleetPlan(desired.path, tuple(h.name for h in hosts), tuple(rows))


def _written_before(ledger: Ledger | None, status: PatchStatus) -> WrittenBefore | None:
    """The newest record of opspatch writing `status.patch` into this file (None: never)."""
    if ledger is None or status.path is None:
        return None
    history = [
        v
        for v in ledger.file_history(status.host, status.path)
        if v.patch_id == status.patch or v.action == FileAction.RESTORE
    ]
    last_patch = next((v for v in history if v.action == FileAction.PATCH), None)
    if last_patch is None:
        return None
    newest = history[0]
    try:
        facts = ledger.get_run(last_patch.run_id).host(status.host).facts or {}
    except KeyError:
        facts = {}
    release = facts.get("sglang_version")
    return WrittenBefore(
        run_id=newest.run_id,
        action=newest.action,
        sha256_before=last_patch.sha256_before,
        release=release if isinstance(release, str) else None,
    )


# ---------------------------------------------------------------------------------------------
# sync


@dataclass(frozen=True)
class SyncReport(JsonRecord):
    """A sync: the runs it made (one per patch it applied), and the fleet as it is afterwards."""

    runs: tuple[RunReport, ...]
    """The apply runs, one per patch sync applied somewhere."""
    left_alone: tuple[RunReport, ...]
    """Per patch, the recorded run naming the hosts sync did not write to although they differ
    (needs-port, by-hand, staged, recover, unreachable, or an apply after a run that stopped the
    sync), each host `skipped` with its reason."""
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
    """3 when a run left a host needing attention; 2 when every run was refused and nothing
    changed (bad input); 0 when every host is as desired (and every run reached its goal);
    else 1 (a host is not: needs-port, a failed apply, an extra patch)."""
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
    """Bring `hosts` to their desired patches: per patch, one recorded `sync` run of the apply
    pipeline over the hosts where it is `apply`; hosts already right, outside the entry's range,
    fixed upstream, needing a port or a recover are not touched. A run that does not reach its
    goal stops the sync (the next patch would pile onto a fleet in trouble): every later
    patch's hosts, those it would have applied to included, are recorded as left alone, each
    with the run that stopped it.

    Raises:
        LedgerIntegrityError: the ledger's chain is broken (nothing begun).
        ApprovalRefused: the playbook requires approvals and a patch sync would apply has no
            valid one (checked for every patch before any run: nothing changed, nothing recorded).
        UnitRefused: the hosts take part of a unit, or a patch would be applied to part of a
            unit or, under a playbook that restarts, to a whole one (checked for every patch
            before any run, as approvals are).
    """
    progress = progress or NoProgress()
    playbook = desired.governing(playbook)  # the fleet file's [team] approval, if it asks
    split = unit_refusal(
        hosts,
        command="sync",
        whole=lambda unit: remedy_text(CliCommand.SYNC, hosts=unit.name),
    )
    if split is not None:
        raise split
    before = before or plan_fleet(desired, hosts, others, factory, ledger)
    by_name = {h.name: h for h in hosts}
    _refuse_before_any_run(desired, before, by_name, playbook, ledger)
    runs: list[RunReport] = []
    left_alone: list[RunReport] = []
    stopped: RunReport | None = None
    for entry in desired.entries:
        rows = [r for r in before.rows if r.patch == entry.patch.spec.id and r.desired]
        names = [r.host for r in rows if r.action == SyncAction.APPLY]
        # after a run that did not reach its goal, the hosts to apply are left alone too, and
        # recorded so: a later patch's hosts never go unapplied without the ledger saying why
        left = [
            (r, _why_left(r, stopped))
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


def _refuse_before_any_run(
    desired: DesiredState,
    before: FleetPlan,
    by_name: Mapping[str, Host],
    playbook: Playbook,
    ledger: Ledger,
) -> None:
    """Every patch's refusals before the first run: a patch that would go on part of a unit (or
    restart a whole one), and a missing approval. A refusal of the second patch must not follow
    a first one applied.

    Raises:
        UnitRefused: see `units_refused`.
        ApprovalRefused: see `require_approval`.
    """
    for entry in desired.entries:
        names = [
            r.host
            for r in before.rows
            if r.patch == entry.patch.spec.id and r.desired and r.action == SyncAction.APPLY
        ]
        refused = units_refused(
            entry.patch.reference, [by_name[n] for n in names], playbook, "sync"
        )
        if refused is not None:
            raise refused
    for entry in desired.entries:
        if any(
            r.patch == entry.patch.spec.id and r.action == SyncAction.APPLY for r in before.rows
        ):
            require_approval(ledger, entry.patch, playbook.team, operator=operator_identity())


def _why_left(row: SyncRow, stopped: RunReport | None) -> str:
    """Why sync did not write to `row`'s host: its action and reason, or, for a host it would
    have applied to, the run that stopped the sync first."""
    if row.action == SyncAction.APPLY and stopped is not None:
        return (
            f"not applied: sync stopped after run {stopped.run_id} ({stopped.patch}) did not "
            f"reach its goal (exit {stopped.exit_code}); "
            f"`{remedy_text(CliCommand.SYNC, hosts=row.host)}` "
            "once that is settled"
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
    """Record that sync did not write to these hosts, and why (a needs-port is never silently
    skipped): a `sync` run whose hosts are `skipped`, each with its reason, decided before the
    fleet run starts any (`FleetRun.decide`: it starts none, connects to none, leases none).
    Skipped concludes nothing about an earlier change's proof (`runs.judgments.proof`)."""
    hosts = [by_name[r.host] for r, _ in left]
    with (
        recorded_run(
            ledger, command=Command.SYNC, patch=entry.patch, hosts=hosts, playbook=playbook
        ) as run,
        FleetRun(
            command=Command.SYNC,
            patch_id=entry.patch.spec.id,
            hosts=hosts,
            factory=factory,
            playbook=playbook,
            recorder=run,
            progress=NoProgress(),
        ) as fleet,
    ):
        fleet.decide({r.host: HostOutcome(r.host, Outcome.SKIPPED, why) for r, why in left})
        outcomes, halted = fleet.execute(_never_started, batches=(), halt=lambda _: None)
        return run.finish(fleet.report(outcomes, halted=halted))


def _never_started(session: HostSession) -> HostOutcome:
    raise AssertionError(f"sync's left-alone run starts no host ({session.name})")
