"""Apply across a fleet: preflight every selected host, refuse or roll out under the playbook."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, PlanOutcome
from opspatch.core.host import Host, Unit
from opspatch.core.policy import Playbook, plan_rollout
from opspatch.core.reasons import BECOME_REFUSALS, CONTAINER_REFUSALS, Reason
from opspatch.core.remedy import remedy_text
from opspatch.core.spec import LoadedPatch
from opspatch.core.tomlsource import parse_field_path
from opspatch.core.vocabulary import Command, HaltAction, Outcome, RestartPolicy
from opspatch.errors import (
    LiveRefused,
    Location,
    LockHeld,
    OpspatchError,
    SpecError,
)
from opspatch.ledger.records import LeaseHolder
from opspatch.ledger.store import Ledger, operator_identity
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.executor import halt_as_apply
from opspatch.runs.fleet.fleetrun import FleetRun
from opspatch.runs.fleet.group import Nodes
from opspatch.runs.fleet.host_leases import host_identity, lease_held, live_holders, refusal
from opspatch.runs.fleet.pipeline import ApplyPipeline, Prepared, PreparedFile
from opspatch.runs.fleet.recorded import run_recorded, unrecorded_run
from opspatch.runs.fleet.session import (
    HostSession,
    NoProgress,
    Progress,
    describe_error,
    refusal_reason,
)
from opspatch.runs.judgments.approval import require_approval
from opspatch.runs.judgments.units import (
    NodeReading,
    NotUniform,
    judge_unit,
    require_whole_units,
)
from opspatch.runs.report import HostOutcome, RunReport

if TYPE_CHECKING:  # the live strategy by `--live` only (`_live_apply`), the judge by a judged run
    from opspatch.runs.fleet.judging import JudgePlan
    from opspatch.runs.fleet.liveapply import LiveApply, LiveFormer


@dataclass(frozen=True)
class LocalFiles:
    """`--file`/`--root`: no server, so a swapped host is `applied`."""

    paths: tuple[str, ...]
    version: str | None
    plans: tuple[PlanOutcome, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """Why one host refuses an apply (`prepared`: a misfit's plan, its unit compared on it)."""

    reason: Reason
    outcome: HostOutcome
    holders: tuple[LeaseHolder, ...] = ()
    prepared: Prepared | None = None

    @property
    def host(self) -> str:
        return self.outcome.host


def _read(item: Prepared | Refusal | None) -> Prepared | None:
    return item.prepared if isinstance(item, Refusal) else item


def refused_because(refusals: Sequence[Refusal]) -> list[str]:
    """A clause per kind of refusal, in the order an operator fixes them."""
    said: set[Reason] = set()

    def names(*reasons: Reason) -> list[str]:
        said.update(reasons)
        return [r.host for r in refusals if r.reason in reasons]

    clauses = []
    if misfits := names(Reason.NOT_APPLICABLE):
        clauses.append(
            f"{', '.join(sorted(misfits))} cannot take the patch: it does not fit there, or "
            "the host's settings are refused (see each host's error)"
        )
    if unreached := names(Reason.HOST_ERROR, Reason.LOCK_HELD, *CONTAINER_REFUSALS):
        clauses.append(
            f"{', '.join(unreached)} could not be begun (unreachable, locked by another run, "
            "or its container unusable: see each host's error); fix that or leave the host "
            "out of --hosts"
        )
    if keys := names(Reason.HOST_KEY_UNKNOWN, Reason.HOST_KEY_CHANGED):
        clauses.append(
            f"{', '.join(sorted(keys))} could not be reached safely (SSH host key "
            + (
                "unknown; check its fingerprint, then re-run with --accept-new-host-keys)"
                if any(r.reason == Reason.HOST_KEY_UNKNOWN for r in refusals)
                else "changed; it is never accepted by a flag)"
            )
        )
    if become := names(*BECOME_REFUSALS):
        hosts = ", ".join(sorted(become))
        clauses.append(f"privileges cannot be raised on {hosts} (sudo; see each host's error)")
    if holders := [h for r in refusals for h in r.holders]:
        said.add(Reason.LEASE_HELD)
        clauses.append(refusal(holders))
    if not_listening := names(Reason.NOT_LISTENING):
        hosts = ", ".join(sorted(not_listening))
        clauses.append(f"{hosts} do not listen for live fixes (see each host's error)")
    if kept_out := names(Reason.PEER_NOT_ALLOWED):
        hosts = ", ".join(sorted(kept_out))
        clauses.append(
            f"the live plugin on {hosts} refuses this user (run the agent as root or as the "
            "engine's user: `become`)"
        )
    if not_live := names(Reason.NOT_TAKEN_LIVE):
        clauses.append(
            f"the change cannot be taken live on {', '.join(sorted(not_live))} (see each "
            "host's error); apply without --live to apply it with a restart"
        )
    if other := [r.host for r in refusals if r.reason not in said]:
        clauses.append(f"{', '.join(other)} refused (see each host's error)")
    return clauses


def apply_to_hosts(
    patch: LoadedPatch,
    hosts: Sequence[Host],
    playbook: Playbook,
    *,
    factory: TransportFactory,
    ledger: Ledger | None,
    progress: Progress | None = None,
    dry_run: bool = False,
    command: Command = Command.APPLY,
    local: LocalFiles | None = None,
    live: LiveFormer | None = None,
) -> RunReport:
    """Apply `patch` across `hosts` (a dry run locks and records nothing); `command`: the
    run's name in the ledger (`sync` applies through this run)."""
    progress = progress or NoProgress()
    taking = None if live is None else _live_apply(patch, hosts, playbook, live)
    if local is None:
        what = f"an apply of {patch.reference}" if dry_run else command
        require_whole_units(hosts, what, whole_apply(patch.reference, planned=dry_run))
    fleet_apply = _FleetApply(patch, playbook, dry_run, command, local, taking)
    if dry_run:
        with unrecorded_run(
            command,
            patch_id=patch.spec.id,
            hosts=hosts,
            factory=factory,
            playbook=playbook,
            progress=progress,
        ) as fleet:
            return fleet_apply.run(fleet)
    if ledger is None:
        raise ValueError("an apply that changes hosts is recorded: pass the ledger")
    approved = require_approval(ledger, patch, playbook.team, operator=operator_identity())
    return run_recorded(
        command,
        fleet_apply.run,
        ledger=ledger,
        hosts=hosts,
        factory=factory,
        playbook=playbook,
        progress=progress,
        patch=patch,
        approved_by=approved.principals if approved is not None else None,
        summary=f"{patch.spec.id} on {len(hosts)} host(s), playbook {playbook.name}",
    )


def _live_apply(
    patch: LoadedPatch, hosts: Sequence[Host], playbook: Playbook, former: LiveFormer
) -> LiveApply:
    from opspatch.runs.fleet.liveapply import LiveApply, refuse_unless_live

    refuse_unless_live(hosts)
    if playbook.restart == RestartPolicy.NEVER:
        raise LiveRefused(
            "--live takes the fix into the running server, --restart never (or the playbook's "
            "restart = never) stages it for a later restart: choose one",
        )
    return LiveApply(patch.spec.id, former, timeout=float(playbook.timeouts.smoke))


def whole_apply(patch: str, *, planned: bool = False) -> Callable[[Unit], str]:
    """The remedy of a unit split by the selection: its plan or apply whole."""
    return lambda unit: remedy_text(
        Command.PLAN if planned else Command.APPLY, patch, hosts=unit.name
    )


def _unlike(unlike: Sequence[NotUniform]) -> str:
    return (
        "the nodes of a unit must run the same release and hold the same pre-image of every "
        "target file (else its server would run two versions of its code): "
        + "; ".join(
            f"unit {u.unit}: " + "; ".join(d.describe() for d in u.differences) for u in unlike
        )
    )


def _odd_node(outcome: HostOutcome, unlike: Sequence[NotUniform]) -> HostOutcome:
    odd = [d.describe() for u in unlike for d in u.differences if d.node == outcome.host]
    if not odd or outcome.error:
        return outcome
    return replace(
        outcome,
        error="its unit's nodes are not alike: " + "; ".join(odd),
        reason=Reason.UNIT_NOT_ALIKE,
    )


def not_applicable_error(
    loaded: LoadedPatch, target: str, outcome: NotApplicable, *, part: int = 0
) -> SpecError:
    """A misfit naming the patch file, line and field, and the target (`part` of a set)."""
    reason = f"{target}: {outcome.reason}"
    if loaded.is_set:
        reason = f"{loaded.parts[part].target.module} ({reason})"
    if outcome.candidates:
        reason += "\n" + "\n".join(f"    {c}" for c in outcome.candidates)
    if outcome.field:
        field: Sequence[str | int] = parse_field_path(outcome.field)
        if loaded.is_set:
            inside = field[1:] if field[0] == "target" else field
            field = loaded.target_field(part, *inside)
        return SpecError(loaded.location(field), reason)
    if loaded.is_set:
        return SpecError(loaded.location(loaded.target_field(part)), reason)
    return SpecError(Location(loaded.path), reason)


def misfit_reason(patch: LoadedPatch, item: PreparedFile) -> str:
    if item.version_problem is not None:
        problem = item.version_problem
        if patch.is_set:
            where = patch.location(patch.target_field(item.index, "versions"))
            problem = f"{where}: {item.part.target.module}: {problem}"
        return problem
    assert isinstance(item.plan, NotApplicable)
    return not_applicable_error(patch, item.path, item.plan, part=item.index).render()


@dataclass
class _FleetApply:
    patch: LoadedPatch
    playbook: Playbook
    dry_run: bool
    command: Command = Command.APPLY
    local: LocalFiles | None = None
    live: LiveApply | None = None

    def run(self, fleet: FleetRun) -> RunReport:
        local = self.local  # local files: no server to restart, so swapped is applied
        self.pipeline = ApplyPipeline(
            self.patch,
            self.playbook,
            restart_engine=local is None and self.playbook.restart != RestartPolicy.NEVER,
            unrestarted=Outcome.STAGED if local is None else Outcome.APPLIED,
            live=self.live,
        )
        for index, plan in enumerate(local.plans if local is not None else ()):
            if isinstance(plan, Applied):
                self.pipeline.reuse(plan, index)
        self.fleet = fleet
        self.sessions = fleet.sessions
        prepared = fleet.preflight(self._prepare)
        if prepared is None:
            return fleet.cancelled_report()
        refused = self._refusals(prepared)
        if refused is not None:
            return refused
        ready = {n: p for n, p in prepared.items() if isinstance(p, Prepared)}  # every host
        if self.dry_run:
            return self._would_apply(ready)
        leased = fleet.lease(
            {n: host_identity(self.sessions[n].host, p.inspection.facts) for n, p in ready.items()},
            # only a host with a change to make is drained: one already right needs no room
            restarting={n for n, p in ready.items() if p.pending},
        )
        return leased if leased is not None else self._roll_out(ready)

    def _prepare(self, session: HostSession) -> Prepared | Refusal:
        try:
            if self.local is not None:
                prepared = self.pipeline.prepare(
                    session,
                    lock=not self.dry_run,
                    paths=self.local.paths,
                    installed_version=self.local.version,
                )
            else:
                prepared = self.pipeline.prepare(session, lock=not self.dry_run)
                if self.live is not None and prepared.pending:
                    self.live.check(session, prepared)
        except OpspatchError as exc:  # a host key, sudo, a lock, live, the patch or the host
            # a lock held by a run with a live lease: refused naming its operator, machine
            holders = live_holders(self.fleet.recorder, exc) if isinstance(exc, LockHeld) else []
            if holders:
                exc = lease_held(holders, what=f"{session.name} is locked")
            return Refusal(refusal_reason(exc), session.refused(exc), tuple(holders))
        if prepared.misfit is None:
            return prepared
        problem = f"not applicable: {misfit_reason(self.patch, prepared.misfit)}"
        skipped = session.outcome(Outcome.SKIPPED, problem, reason=Reason.NOT_APPLICABLE)
        return Refusal(Reason.NOT_APPLICABLE, skipped, prepared=prepared)

    def _refusals(self, prepared: Mapping[str, Prepared | Refusal]) -> RunReport | None:
        """Some host refuses, or a unit's nodes are not alike: refused before any change."""
        refusals = [r for h in self.fleet.hosts if isinstance(r := prepared[h.name], Refusal)]
        unlike = self._units_not_alike(prepared)
        if not refusals and not unlike:
            return None
        reasons = refused_because(refusals) + ([_unlike(unlike)] if unlike else [])
        decided = {r.host: r.outcome for r in refusals}
        outcomes = [
            _odd_node(
                decided.get(host.name)
                or self.sessions[host.name].outcome(Outcome.SKIPPED, reason=Reason.NOT_STARTED),
                unlike,
            )
            for host in self.fleet.hosts
        ]
        halted = "refused before any change: " + "; ".join(reasons)
        if self.dry_run:  # nothing to record, no lock taken
            by_host = {o.host: o for o in outcomes}
            return self.fleet.report(by_host, halted=halted, refused=True, dry_run=True)
        return self.fleet.refuse(outcomes, halted=halted)

    def _units_not_alike(self, prepared: Mapping[str, Prepared | Refusal]) -> list[NotUniform]:
        """Units whose nodes differ in release or a pre-image (a node not read differs too)."""
        found = []
        units = {(h.inventory, h.unit.name): h.unit for h in self.fleet.hosts if h.unit is not None}
        for unit in units.values():
            readings = {
                node: NodeReading.read(
                    node, {f.part.target.module: f.inspection for f in item.files}
                )
                for node in unit.hosts
                if isinstance(item := _read(prepared.get(node)), Prepared)
            }
            judged = judge_unit(unit, readings)
            if isinstance(judged, NotUniform):
                found.append(judged)
        return found

    def _would_apply(self, prepared: Mapping[str, Prepared]) -> RunReport:
        outcomes = []
        for host in self.fleet.hosts:
            session, item = self.sessions[host.name], prepared[host.name]
            if item.pending:
                outcomes.append(
                    session.outcome(Outcome.WOULD_APPLY, file=item.change(), diff=item.diff())
                )
            else:
                reasons = [f.plan.reason for f in item.files if isinstance(f.plan, AlreadyApplied)]
                outcomes.append(
                    session.outcome(Outcome.ALREADY_APPLIED, "; ".join(reasons), file=item.change())
                )
        return self.fleet.report({o.host: o for o in outcomes}, halted=None, dry_run=True)

    def _roll_out(self, ready: Mapping[str, Prepared]) -> RunReport:
        plan = plan_rollout(self.playbook, self.fleet.items())
        if self.playbook.judge is not None:
            self.pipeline.judges = self._judge_plan(ready, plan.canaries)
        outcomes, halted = self.fleet.execute(
            lambda nodes: self.pipeline.apply(nodes, ready),
            batches=plan.batches,
            halt=halt_as_apply(self.playbook, plan.canaries),
        )
        if halted and self.playbook.on_halt == HaltAction.ROLLBACK_RUN:
            halted = self._roll_back_run(ready, outcomes, halted)
        return self.fleet.report(outcomes, halted=halted)

    def _judge_plan(self, ready: Mapping[str, Prepared], canaries: Sequence[str]) -> JudgePlan:
        from opspatch.runs.fleet.judging import JudgePlan

        assert self.playbook.judge is not None
        changing = {n: p for n, p in ready.items() if p.pending}
        return JudgePlan(
            self.playbook.judge,
            canaries=canaries,
            changing=[n for n in self.fleet.names if n in changing],
            builds={
                name: (item.inspection.facts.sglang_version, item.inspection.file.sha256)
                for name, item in changing.items()
            },
            sessions=self.sessions,
            units={h.name: h.unit for h in self.fleet.hosts if h.unit is not None},
        )

    def _roll_back_run(
        self,
        prepared: Mapping[str, Prepared],
        outcomes: dict[str, HostOutcome],
        halted: str,
    ) -> str:
        """`on_halt = "rollback-run"`: a follow-up run restores every host this run applied."""
        names = [
            name
            for name in self.fleet.names
            if outcomes[name].outcome == Outcome.APPLIED
            and name in prepared
            and prepared[name].pending
            and outcomes[name].file is not None
        ]
        if not names:
            return halted

        def one(nodes: Nodes) -> Sequence[HostOutcome]:
            try:
                for session in nodes.sessions:
                    session.lock.take()
            except OpspatchError as exc:
                what = "the host" if nodes.alone else "the unit's nodes"
                return [
                    session.outcome(
                        Outcome.NEEDS_ATTENTION,
                        f"on_halt = rollback-run could not lock {what}: {describe_error(exc)}",
                        file=outcomes[session.name].file,
                        reason=Reason.UNDO_FAILED,
                    )
                    for session in nodes.sessions
                ]
            return self.pipeline.roll_back(
                nodes, prepared, "the rollout halted (on_halt = rollback-run)", reason=Reason.HALTED
            )

        def left(session: HostSession, why: str) -> HostOutcome:
            kept = outcomes[session.name]
            said = f"on_halt = rollback-run did not roll it back: {why}"
            return replace(kept, note=f"{kept.note}; {said}" if kept.note else said)

        with self.fleet.follow_up(names) as rollback:
            rollback.keep_leases(left)
            rolled, stopped = rollback.execute(
                one,
                batches=plan_rollout(self.playbook, rollback.items()).batches,
                halt=lambda _: None,
                not_started=left,
            )
        outcomes.update(rolled)
        return (
            f"{halted}; the rollback (on_halt = rollback-run) stopped: {stopped}"
            if stopped
            else halted
        )
