"""One fleet run, written once: the sessions, the preflight, the executor, the records, Ctrl-C."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import ExitStack, suppress
from dataclasses import replace
from typing import TypeVar

from opspatch.core.host import Host, Unit
from opspatch.core.policy import Batch, Playbook
from opspatch.core.reasons import Reason
from opspatch.core.vocabulary import FAILED_OUTCOMES, Command, Outcome
from opspatch.core.vocabulary import Rotation as RotationWord
from opspatch.errors import (
    BecomeError,
    HostKeyError,
    LedgerError,
    LockHeld,
    OpspatchError,
    RouterRefused,
    RunInterrupted,
)
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.executor import (
    CANCELLED,
    Cancellation,
    GaveUpWaiting,
    HaltPolicy,
    map_cancellable,
    run_fleet,
)
from opspatch.runs.fleet.group import Nodes
from opspatch.runs.fleet.host_leases import Heartbeat, held_by, host_identity, refusal
from opspatch.runs.fleet.recorder import Recorder
from opspatch.runs.fleet.rotation import (
    ROTATION_STEPS,
    Rotation,
    halt_on_out_of_rotation,
    taken_out_by,
)
from opspatch.runs.fleet.session import HostFailed, HostSession, Progress, describe_error
from opspatch.runs.judgments.decisions import traits_of
from opspatch.runs.judgments.units import selected_units
from opspatch.runs.report import HostOutcome, RunReport

T = TypeVar("T")

PerGroup = Callable[[Nodes], Sequence[HostOutcome]]
"""What is done to a node group (a unit's nodes as one, a host by itself): every node's outcome."""

NotStarted = Callable[[HostSession, str], HostOutcome]
"""The outcome of a host a run did not start, given why (default: `skipped`, "not started: ...")."""

PREFLIGHT_IN_FLIGHT = 16
"""Hosts inspected at once in a preflight (read-only and short: more than a rollout's batch)."""

CANCELLED_IN_PREFLIGHT = (
    "cancelled by the operator (Ctrl-C) during the preflight: nothing was changed on any host "
    "and every lock taken was given back"
)


class FleetRun:
    """One command over a fleet; closing it closes the sessions and restores the SIGINT handler."""

    def __init__(
        self,
        *,
        command: Command,
        patch_id: str | None,
        hosts: Sequence[Host],
        factory: TransportFactory,
        playbook: Playbook,
        recorder: Recorder,
        progress: Progress,
        cancellation: Cancellation | None = None,
    ) -> None:
        self.command = command
        self.traits = traits_of(command)
        """What the command's actions need: leases, routers looked at, workers re-admitted."""
        self.patch_id = patch_id
        self.hosts = tuple(hosts)
        self.names = [h.name for h in hosts]
        self.playbook = playbook
        self.recorder = recorder
        self.progress = progress
        self.cancellation = cancellation or Cancellation()
        self._factory = factory
        self._stack = ExitStack()
        self._heartbeat: Heartbeat | None = None
        self._leased = False
        self._unleased: dict[str, HostOutcome] = {}
        self._identities: dict[str, str] = {}
        self._first: FleetRun | None = None
        self.sessions: dict[str, HostSession] = {}
        self._unit_of = {  # a unit partly selected is refused before a run (`unit_refusal`)
            name: s.unit for s in selected_units(self.hosts) if s.whole for name in s.taken
        }

    def __enter__(self) -> FleetRun:
        if self._first is not None:
            self.sessions = {name: self._first.sessions[name] for name in self.names}
            self._identities = {
                name: self._first._identities[name]
                for name in self.names
                if name in self._first._identities
            }
            self._heartbeat = self._first._heartbeat
            self._stack.enter_context(self.cancellation.armed())
            return self
        with ExitStack() as stack:
            for host in self.hosts:
                self.sessions[host.name] = stack.enter_context(
                    HostSession(
                        host,
                        self._factory,
                        self.playbook,
                        recorder=self.recorder,
                        progress=self.progress,
                    )
                )
            stack.enter_context(self.cancellation.armed())
            self._stack = stack.pop_all()
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if self._first is not None:  # the sessions and the leases are the first run's to end
            self._stack.close()
            return
        try:
            self._end_leases(
                abandoned=kind is RunInterrupted or kind is KeyboardInterrupt,
                failing=kind is not None,
            )
        finally:
            self._stack.close()

    @property
    def cancelled(self) -> bool:
        return self.cancellation.requested

    def follow_up(self, names: Sequence[str]) -> FleetRun:
        """A run inside this one (an apply's on-halt rollback): its sessions, recorder and leases, a
        Ctrl-C of its own."""
        second = FleetRun(
            command=self.command,
            patch_id=self.patch_id,
            hosts=[self.sessions[name].host for name in names],
            factory=self._factory,
            playbook=self.playbook,
            recorder=self.recorder,
            progress=self.progress,
        )
        second._first = self
        return second

    def keep_leases(self, held: NotStarted) -> None:
        """A follow-up's leases taken again; a host another live run took over is `held(session,
        why)`."""
        self._leased = True
        if not self.traits.leases or self.recorder.reported_run_id is None:
            return
        known = dict(self._identities)
        while known:
            grant = self.recorder.take_leases(known, self.playbook.team.lease_expiry, ())
            if not grant.refused:
                return
            for name, identity in list(known.items()):
                holders = [h for h in grant.refused if h.identity == identity]
                if holders:
                    self._unleased[name] = held(self.sessions[name], held_by(holders))
                    del known[name]

    def visit(self, work: Callable[[HostSession], T], *, limit: int) -> dict[str, T]:
        """For a run that changes nothing: the results of the hosts started before the first Ctrl-C."""
        return map_cancellable(
            lambda name: work(self.sessions[name]),
            self.names,
            limit=limit,
            cancellation=self.cancellation,
            on_cancel=self._announce,
        )

    def items(self, names: Sequence[str] | None = None) -> list[str]:
        """The groups, each named by its head: canaries, batches and the halt policy count servers."""
        chosen = self.names if names is None else names
        return list(dict.fromkeys(self._item(name) for name in chosen))

    def _item(self, name: str) -> str:
        unit = self._unit_of.get(name)
        return name if unit is None else unit.head

    @property
    def units(self) -> list[Unit]:
        return list(dict.fromkeys(self._unit_of.values()))

    def members(self, item: str) -> tuple[str, ...]:
        unit = self._unit_of.get(item)
        return unit.hosts if unit is not None and unit.head == item else (item,)

    def counted(self, outcomes: Mapping[str, HostOutcome]) -> dict[str, HostOutcome]:
        """One outcome per group for `max_failures`: the node's that says most, under the head's
        name."""
        counted: dict[str, HostOutcome] = {}
        for name, outcome in outcomes.items():
            item = self._item(name)
            if item not in counted or _weight(outcome) > _weight(counted[item]):
                counted[item] = outcome
        return counted

    def group(self, item: str) -> Nodes:
        head, *others = (self.sessions[name] for name in self.members(item))
        return Nodes(head, tuple(others))

    # -- the two phases -------------------------------------------------------------------

    def preflight(self, work: Callable[[HostSession], T]) -> dict[str, T] | None:
        """Before anything changes; None when cancelled (the locks given back)."""
        try:
            done = self.visit(work, limit=PREFLIGHT_IN_FLIGHT)
        except KeyboardInterrupt as stop:
            raise RunInterrupted(self.recorder.reported_run_id, _in_flight(stop)) from None
        if self.cancelled:
            self.release_all()
            return None
        return done

    def decide(self, outcomes: Mapping[str, HostOutcome]) -> None:
        """Hosts a preflight decided are never started and keep their outcome (unless another run
        holds them: what was read may be that run's change). A unit is decided whole."""
        for unit in self.units:
            taken = [name for name in unit.hosts if name in outcomes]
            if taken and len(taken) != unit.nodes:
                raise ValueError(f"unit {unit.name} decided on {', '.join(taken)} only")
        self._unleased.update(outcomes)

    def execute(
        self,
        per_group: PerGroup,
        *,
        batches: Sequence[Batch],
        halt: HaltPolicy,
        not_started: NotStarted | None = None,
    ) -> tuple[dict[str, HostOutcome], str | None]:
        """Every group of `batches` under `halt`, each outcome recorded as decided; hosts never
        started `skipped` (or `not_started`), their locks given back."""
        starts = any(batch.hosts for batch in batches)
        if self.traits.leases and starts and not self._leased:
            raise RuntimeError(f"{self.command} changes hosts only under their leases: lease()")
        skip = not_started or _skipped
        already = dict(self._unleased)
        for outcome in already.values():
            self.record(outcome)

        def one(item: str) -> Sequence[HostOutcome]:
            nodes = self.group(item)
            lost = self._lease_lost()  # another operator may be changing it now
            if lost:
                work: PerGroup = per_node(lambda session: skip(session, lost))
            else:
                work = per_group
            return [
                lock_left(o, self.sessions[o.host].lock.release())
                for o in guarded(nodes.sessions, lambda: work(nodes))
            ]

        def halt_or_out_of_rotation(outcomes: Mapping[str, HostOutcome]) -> str | None:
            counted = self.counted(outcomes)
            return halt(counted) or halt_on_out_of_rotation(counted) or self._lease_lost()

        try:
            result = run_fleet(
                batches,
                one,
                halt=halt_or_out_of_rotation,
                on_outcome=self.record,
                already=already,
                cancellation=self.cancellation,
                on_cancel=self._announce,
            )
        except KeyboardInterrupt as stop:
            raise RunInterrupted(self.recorder.reported_run_id, _in_flight(stop)) from None
        outcomes = {**already, **result.outcomes}
        for name in (name for item in result.not_started for name in self.members(item)):
            self.sessions[name].lock.release()
            why = "the operator cancelled" if result.halted == CANCELLED else "the run halted"
            outcomes[name] = skip(self.sessions[name], f"{why} ({result.halted})")
            self.record(outcomes[name])
        return outcomes, result.halted

    # -- leases ---------------------------------------------------------------------------

    def lease(
        self,
        identities: Mapping[str, str] | None = None,
        *,
        taking_over: Collection[str] = (),
        restarting: Collection[str] | None = None,
    ) -> RunReport | None:
        """None when leased (with a heartbeat), else the refused run's report. The routers are
        checked after the leases (`restarting`: the hosts the run may drain, None: all)."""
        self._leased = True
        if not self.traits.leases or self.recorder.reported_run_id is None:
            return None  # unlock and dry runs keep no one off the hosts
        known = dict(identities or {})
        missing = [name for name in self.names if name not in known and name not in self._unleased]
        if missing:
            read = self._read_identities(missing)
            if read is None:
                return self.cancelled_report()
            known.update(read)
        self._identities = known
        grant = self.recorder.take_leases(known, self.playbook.team.lease_expiry, taking_over)
        if grant.refused:  # before the routers: the refusal names the run that holds the hosts
            self.release_all()
            reason = f"refused before any change: {refusal(grant.refused)}"
            held = {holder.host for holder in grant.refused}
            outcomes = [  # a held host's preflight reading may be the holder's change in flight
                (None if name in held else self._unleased.get(name))
                or _skipped(session, held_by(grant.refused), Reason.LEASE_HELD)
                for name, session in self.sessions.items()
            ]
            return self._refused(outcomes, halted=reason)
        for holder in grant.taken_over:
            self.progress.notice(f"{holder.host}: took over the lease of {holder.describe()}")
        try:
            self._open_rotation(restarting)
        except RouterRefused:
            self.release_all()
            self.recorder.give_back_leases()
            raise
        if known:
            self._heartbeat = Heartbeat(
                self.recorder,
                self.playbook.team.lease_expiry,
                self.progress,
                held=len(set(known.values())),  # one machine by two inventory names: one lease
            ).start()
        return None

    def _open_rotation(self, restarting: Collection[str] | None) -> None:
        """After the leases (a held host is refused naming its run, not by its router), before any
        change."""
        if not self.traits.restarts:  # no drain, no admit: its routers are not its business
            return

        def taken_out(host: Host) -> str | None:
            router = host.router
            assert router is not None
            return taken_out_by(self.recorder.host_steps(host.name, ROTATION_STEPS), router)

        rotation = Rotation.open(
            self.hosts,
            self.playbook,
            allow_unregistered=self.traits.readmits,
            taken_out=taken_out,
            restarting=restarting,
        )
        if rotation is not None:
            for name, session in self.sessions.items():
                session.rotation = rotation.of(name)

    def _lease_lost(self) -> str | None:
        lost = self._heartbeat.lost if self._heartbeat is not None else None
        return f"{lost}; no more hosts are started" if lost else None

    def _read_identities(self, names: Sequence[str]) -> dict[str, str] | None:
        wanted = set(names)

        def identity(session: HostSession) -> str | None:
            if session.name not in wanted:
                return None
            try:
                facts = session.ops.facts(timeout=session.playbook.timeouts.inspect)
            except OpspatchError as exc:
                self._unleased[session.name] = session.refused(exc)
                return None
            return host_identity(session.host, facts)

        read = self.preflight(identity)
        if read is None:
            return None
        return {name: found for name, found in read.items() if found is not None}

    def _end_leases(self, *, abandoned: bool, failing: bool) -> None:
        """Leases of a run abandoned with hosts in flight are left to expire (`recover --run` takes
        them)."""
        if self._heartbeat is None:
            return
        self._heartbeat.stop()
        self._heartbeat = None
        if abandoned:
            return
        if failing:  # the error already on its way says more than a second one would
            with suppress(LedgerError):
                self.recorder.give_back_leases()
        else:
            self.recorder.give_back_leases()

    # -- ending ---------------------------------------------------------------------------

    def release_all(self) -> None:
        for session in self.sessions.values():
            session.lock.release()

    def record(self, outcome: HostOutcome) -> None:
        self.recorder.outcome(outcome)

    def report(
        self,
        outcomes: Mapping[str, HostOutcome],
        *,
        halted: str | None,
        refused: bool = False,
        dry_run: bool = False,
    ) -> RunReport:
        return RunReport(
            self.recorder.reported_run_id,
            self.command,
            self.patch_id,
            hosts=tuple(outcomes[n] for n in self.names),
            halted=halted,
            dry_run=dry_run,
            refused=refused,
        )

    def refuse(self, outcomes: Sequence[HostOutcome], *, halted: str) -> RunReport:
        self.release_all()
        return self._refused(outcomes, halted=halted)

    def _refused(self, outcomes: Sequence[HostOutcome], *, halted: str) -> RunReport:
        for outcome in outcomes:
            self.record(outcome)
        return self.report({o.host: o for o in outcomes}, halted=halted, refused=True)

    def cancelled_report(self) -> RunReport:
        outcomes = [
            self._unleased.get(name) or _skipped(session, CANCELLED_IN_PREFLIGHT)
            for name, session in self.sessions.items()
        ]
        return self._refused(outcomes, halted=CANCELLED_IN_PREFLIGHT)

    def _announce(self, in_flight: Sequence[str]) -> None:
        """The first Ctrl-C: each host still awaited, with what it waits for (a readiness wait is
        long)."""

        def host(name: str) -> str:
            awaiting = self.sessions[name].awaiting if name in self.sessions else None
            return f"{name} ({awaiting})" if awaiting else name

        after = self.progress.after_stop(self.recorder.reported_run_id)
        waiting = (
            f"waiting for {', '.join(host(n) for n in in_flight)} to finish; Ctrl-C again "
            f"stops waiting{f', then {after}' if after else ''}"
            if in_flight
            else "no host is in flight"
        )
        self.progress.notice(f"Ctrl-C: no more hosts will be started; {waiting}")


def lock_left(outcome: HostOutcome, left: str | None) -> HostOutcome:
    """A lock left behind is said: else the next command there is refused without a word why."""
    if left is None:
        return outcome
    return replace(outcome, note=f"{outcome.note}; {left}" if outcome.note else left)


def guarded(
    sessions: Sequence[HostSession], work: Callable[[], Sequence[HostOutcome]]
) -> Sequence[HostOutcome]:
    """The one place a group's exception becomes outcomes (one per session: a group is one server);
    a Ctrl-C gives every lock back on its way out."""
    try:
        return work()
    except (LockHeld, BecomeError, HostKeyError) as exc:  # nothing changed there
        return [session.refused(exc) for session in sessions]
    except (OpspatchError, HostFailed) as exc:
        text = describe_error(exc)
        return [s.outcome(Outcome.NEEDS_ATTENTION, text, reason=Reason.PART_WAY) for s in sessions]
    except Exception as exc:  # a bug must not lose the other hosts' outcomes
        text = f"internal error: {describe_error(exc)}"
        return [
            s.outcome(Outcome.NEEDS_ATTENTION, text, reason=Reason.INTERNAL_ERROR) for s in sessions
        ]
    except BaseException:
        for session in sessions:
            session.lock.release()
        raise


def per_node(per_host: Callable[[HostSession], HostOutcome]) -> PerGroup:
    """For a command that restarts no engine: each node by itself, its failure its own."""

    def each(nodes: Nodes) -> list[HostOutcome]:
        return [
            outcome
            for session in nodes.sessions
            for outcome in guarded((session,), lambda: (per_host(session),))  # noqa: B023 - called at once
        ]

    return each


def _weight(outcome: HostOutcome) -> tuple[bool, bool, bool]:
    return (
        outcome.outcome == Outcome.NEEDS_ATTENTION,
        outcome.outcome in FAILED_OUTCOMES,
        outcome.rotation == RotationWord.OUT_OF_ROTATION,
    )


def _skipped(session: HostSession, why: str, reason: Reason = Reason.NOT_STARTED) -> HostOutcome:
    return session.outcome(Outcome.SKIPPED, f"not started: {why}", reason=reason)


def _in_flight(stop: KeyboardInterrupt) -> tuple[str, ...]:
    return stop.in_flight if isinstance(stop, GaveUpWaiting) else ()
