"""What the restore runs (`rollback`, `recover`, `unlock`) share: putting files back, the stale
server's restart, the body of the recorded run they go through (`run_in_batches`; `restart` and
`live enable` and `disable` go through it too, halted as an apply)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from opspatch.core.policy import Playbook, plan_rollout
from opspatch.core.vocabulary import Outcome
from opspatch.hosts.operations import HostInspection
from opspatch.ledger.store import FileVersion
from opspatch.runs.fleet.executor import HaltPolicy, halt_as_apply, halt_on_attention, one_batch
from opspatch.runs.fleet.fleetrun import FleetRun, NotStarted, PerGroup
from opspatch.runs.fleet.group import Nodes, prove_or_undo, refuse, undo
from opspatch.runs.fleet.host_leases import host_identity
from opspatch.runs.fleet.session import HostSession
from opspatch.runs.fleet.standing import HostStanding
from opspatch.runs.fleet.steps import (
    AFTER_RESTORE,
    RestoreSteps,
    restore_pre_image,
)
from opspatch.runs.judgments.patchset import SetOnHost
from opspatch.runs.report import FileChange, HostOutcome, RunReport


@dataclass(frozen=True)
class Examined:
    """What a restore run found on a host before changing it: an outcome decided there, or the
    restore to make (`put_back`; `found`: the files before)."""

    inspection: HostInspection | None
    decided: HostOutcome | None = None
    put_back: Callable[[], FileChange] | None = None
    found: FileChange | None = None
    note: str | None = None
    restore_failed: Callable[[str], str] | None = None


def restore_recorded(session: HostSession, version: FileVersion) -> FileChange:
    restored = restore_pre_image(
        session,
        path=version.path,
        pre_sha256=version.sha256_before,
        post_sha256=version.sha256_after,
        timeout=session.playbook.timeouts.restore,
        mode=version.mode,
        owner=version.owner,
    )
    return FileChange(version.path, restored["sha256_before"], restored["sha256_after"])


def restore_set(session: HostSession, found: SetOnHost) -> FileChange:
    """The last swapped first; the set as it then is (all-old)."""
    for member in reversed(found.new):
        restore_recorded(session, member.version)
    return found.all_old()


def not_served(outcomes: Mapping[str, HostOutcome], why: str = "") -> str | None:
    """The halt reason naming the hosts whose restored file their server does not serve: the same
    restore elsewhere would take those servers down too (None: none)."""
    down = sorted(n for n, o in outcomes.items() if o.outcome == Outcome.RESTORED_NOT_SERVING)
    if not down:
        return None
    return (
        f"the restored file is not served on {', '.join(down)} (its smoke decode failed){why}; "
        "the other hosts were left as they are"
    )


def halt_on_attention_or_not_serving(outcomes: Mapping[str, HostOutcome]) -> str | None:
    return halt_on_attention(outcomes) or not_served(outcomes)


def halt_under_playbook(playbook: Playbook, canaries: Collection[str]) -> HaltPolicy:
    """A rollback halts as an apply does (`restored-not-serving` counts as failed)."""

    as_apply = halt_as_apply(playbook, canaries)

    def halt(outcomes: Mapping[str, HostOutcome]) -> str | None:
        reason = as_apply(outcomes)
        if reason is None or halt_on_attention(outcomes):
            return reason
        return not_served(outcomes, f": {reason}") or reason

    return halt


@dataclass(frozen=True)
class RunTakeover:
    """What a `recover --run` takes over from the runs it recovers: its hosts' lease identities
    as the ledger holds them, the runs whose leases it may take, and how a host it never starts
    is reported (those runs stay interrupted). Empty: nothing taken over."""

    identities: Mapping[str, str] = field(default_factory=dict)
    runs: Collection[str] = ()
    not_started: NotStarted | None = None


@dataclass(frozen=True)
class BatchPolicy:
    """What a command decides of its `run_in_batches`."""

    rollout: Callable[[Playbook, Collection[str]], HaltPolicy] | None = None
    """Rolled out as an apply: the playbook's canaries and batches, halted by
    `rollout(playbook, canaries)`. None: one batch, halted by a host that needs attention or
    does not serve its restored file."""
    preflight: Callable[[HostSession], Examined] | None = None
    """Every host examined first (a rollback): one decided there is leased, never started."""
    takeover: RunTakeover = RunTakeover()


ONE_BATCH = BatchPolicy()
AS_APPLY = BatchPolicy(rollout=halt_as_apply)


def run_in_batches(
    fleet: FleetRun, per_group: PerGroup, policy: BatchPolicy = ONE_BATCH
) -> RunReport:
    """A recorded run's body (`run_recorded`): the fleet leased, then `per_group` over its
    groups as `policy` says. Whether a host's router is drained follows from the command
    (`FleetRun.traits`: live enable and disable restart nothing)."""
    known = dict(policy.takeover.identities)
    decided: dict[str, HostOutcome] = {}
    if policy.preflight is not None:
        examined = fleet.preflight(policy.preflight)
        if examined is None:
            return fleet.cancelled_report()
        for name, seen in examined.items():
            if seen.decided is not None:
                decided[name] = seen.decided
            if seen.inspection is not None:  # a decided host too: the lease check comes first
                known[name] = host_identity(fleet.sessions[name].host, seen.inspection.facts)
        decided = units_decided(fleet, decided)
        fleet.decide(decided)
    names = [name for name in fleet.names if name not in decided]
    refused = fleet.lease(known, taking_over=policy.takeover.runs, restarting=names)
    if refused is not None:
        return refused
    halt_by: HaltPolicy = halt_on_attention_or_not_serving
    items = fleet.items(names)
    if policy.rollout is not None:
        plan = plan_rollout(fleet.playbook, items)
        batches = plan.batches
        halt_by = policy.rollout(fleet.playbook, plan.canaries)
    else:
        batches = one_batch(items, fleet.playbook.max_in_flight)

    def halt(outcomes: Mapping[str, HostOutcome]) -> str | None:
        # what the preflight decided changed nothing: it stops no restore elsewhere
        return halt_by({n: o for n, o in outcomes.items() if n not in decided})

    outcomes, halted = fleet.execute(
        per_group, batches=batches, halt=halt, not_started=policy.takeover.not_started
    )
    return fleet.report(outcomes, halted=halted)


def units_decided(fleet: FleetRun, decided: Mapping[str, HostOutcome]) -> dict[str, HostOutcome]:
    """A unit is restored whole or not at all: a node refused decides every node (`skipped`); a node
    with nothing to restore beside one with something is left to the unit's run."""
    made = dict(decided)
    for unit in fleet.units:
        mine = [name for name in unit.hosts if name in decided]
        if not mine or len(mine) == len(unit.hosts):
            continue
        refused = {name: decided[name] for name in mine if decided[name].error is not None}
        if refused:
            nodes = fleet.group(unit.head)
            made.update((o.host, o) for o in refuse(nodes, refused, "was refused"))
        else:
            for name in mine:
                del made[name]
    return made


def restore_standing(session: HostSession, standing: HostStanding) -> FileChange:
    if standing.is_set:
        return restore_set(session, standing.found)
    return restore_recorded(session, standing.version)


def prove_standings(
    nodes: Nodes, standings: Mapping[str, HostStanding], note: str
) -> list[HostOutcome]:
    """The recorded change proven on the group, its files put back if the proof fails."""
    return prove_or_undo(
        nodes,
        changes={n: st.change() for n, st in standings.items()},
        restore=lambda session: restore_standing(session, standings[session.name]),
        note=note,
    )


def stale_servers(standings: Mapping[str, HostStanding]) -> list[str]:
    """Servers running code other than their file's bytes: a `rollback --restart never`, or a
    rollback killed after its swap, with no restart since."""
    return sorted(name for name, standing in standings.items() if standing.stale_server)


def stale_note(path: str, stale: Sequence[str] = ()) -> str:
    where = f" on {', '.join(stale)}" if stale else ""
    return (
        f"the server{where} started before {path} was last written, so it still ran the code "
        "that write replaced: restarted and smoke-tested"
    )


def restart_stale(
    nodes: Nodes,
    standings: Mapping[str, HostStanding],
    files: Mapping[str, FileChange | None],
    *,
    steps: RestoreSteps = AFTER_RESTORE,
) -> list[HostOutcome]:
    """Nothing to put back but a stale server: the group restarted and smoke-tested, `restored`."""
    stale = stale_servers(standings)
    path = standings[stale[0]].unchanged().path
    return undo(
        nodes,
        stale_note(path, () if nodes.alone else stale),
        restore=lambda session: files[session.name],
        changes=files,
        outcome=Outcome.RESTORED,
        steps=steps,
    )
