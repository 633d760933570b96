"""Drain and admit: a host behind a router leaves rotation before its engine restarts and comes
back only once its server is proven (docs/runs.md, "Drain and admit")."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opspatch.core.host import Host, RouterSettings
from opspatch.core.policy import Playbook
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command, Step, StepStatus
from opspatch.core.vocabulary import Rotation as RotationWord
from opspatch.errors import OpspatchError, RouterError, RouterRefused
from opspatch.ledger.records import StepRecord
from opspatch.runs.fleet.session import HostSession, describe_error
from opspatch.runs.judgments.units import recover_remedy
from opspatch.runs.report import HostOutcome

if TYPE_CHECKING:  # a router's client is imported where a host is behind one
    from opspatch.hosts.router import RouterClient, RouterWorker, SharedListing

DRAIN_POLL_SECONDS = 0.1

DRAIN_SETTLE_SECONDS = 0.5
"""A request the router sent just before the removal may still be on its way into the queue."""

ADMIT_POLL_SECONDS = 0.1
"""One read serves every host of the run waiting on that router."""

ROTATION_STEPS = (Step.DRAIN, Step.ADMIT)


@dataclass
class RouterGate:
    """One router of a run: its client, its shared `/workers`, the permits of workers it may lose."""

    client: RouterClient
    permits: threading.Semaphore
    capacity: int
    listing: SharedListing


class HostRotation:
    """One host's place behind its router during a run: drained, admitted, or neither yet."""

    def __init__(
        self, gate: RouterGate, worker_url: str, *, usable: bool, out_since: str | None = None
    ) -> None:
        self.gate = gate
        self.worker_url = worker_url
        self.drained = False
        self.admitted = False
        self.usable_at_start = usable
        """One that was not is already counted unavailable: its drain takes no room, its admit adds
        some."""
        self.out_since = out_since
        """Taken out by this run of the ledger (`taken_out_by`), for the drain's detail."""
        self._holding = False
        self.why_out: str | None = None
        """Why it was not put back (a failed admit, a smoke that failed before one), for the note."""

    @property
    def router_url(self) -> str:
        return self.gate.client.url

    @property
    def out(self) -> bool:
        return (self.drained or not self.usable_at_start) and not self.admitted

    @property
    def word(self) -> RotationWord:
        return RotationWord.OUT_OF_ROTATION if self.out else RotationWord.IN_ROTATION

    def take_permit(self, bound: float) -> float:
        """Seconds waited; `RouterError` when no room within `bound`."""
        started = time.monotonic()
        if not self.gate.permits.acquire(timeout=bound):
            raise RouterError(
                f"router {self.router_url}: no room under max_unavailable "
                f"({self.gate.capacity} at once) within {bound:.0f}s"
            )
        self._holding = True
        return time.monotonic() - started

    def give_permit(self) -> None:
        """A worker that was out before the run began adds room (one more healthy worker)."""
        if self._holding or not self.usable_at_start:
            self._holding = False
            self.gate.permits.release()

    def out_note(self, host: Host) -> str:
        why = f" ({self.why_out})" if self.why_out else ""
        return (
            f"out of rotation: router {self.router_url} sends {self.worker_url} nothing{why}; "
            f"`{recover_remedy(host)}` re-admits it once its server is "
            "proven"
        )


class Rotation:
    def __init__(self, hosts: Mapping[str, HostRotation]) -> None:
        self._hosts = dict(hosts)

    def of(self, host: str) -> HostRotation | None:
        return self._hosts.get(host)

    @classmethod
    def open(
        cls,
        hosts: Sequence[Host],
        playbook: Playbook,
        *,
        allow_unregistered: bool,
        taken_out: Callable[[Host], str | None] = lambda host: None,
        restarting: Collection[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Rotation | None:
        """None when no host has a router. `taken_out(host)`: the run that took an unlisted worker
        out. Raises `RouterRefused` before any change."""
        # Long because: one pass per router (list, refuse, size the gate), each refusal said in full
        env = os.environ if environ is None else environ
        behind: dict[str, list[Host]] = {}
        settings: dict[str, RouterSettings] = {}
        for host in hosts:
            if host.router is not None:
                behind.setdefault(host.router.url, []).append(host)
                settings.setdefault(host.router.url, host.router)
        if not behind:
            return None
        from opspatch.hosts.router import RouterClient, SharedListing

        rotations: dict[str, HostRotation] = {}
        for url, routed in behind.items():
            client = RouterClient(settings[url], _admin_key(settings[url], env))
            try:
                listed = client.workers()
            except RouterError as exc:
                raise RouterRefused(
                    f"{exc.detail}; nothing was changed", hint=exc.hint or _UNREACHABLE_HINT
                ) from None
            urls = {w.url for w in listed}
            # not listed: out of rotation by opspatch's own drain (a run left it out, or died in
            # it), or a URL the router never registered (a wrong router.worker_url)
            out_since = {
                h.name: taken_out(h)
                for h in routed
                if h.router is not None and h.router.worker_url not in urls
            }
            unknown = [h for h in routed if h.name in out_since and out_since[h.name] is None]
            if unknown and not allow_unregistered:
                host = unknown[0]
                assert host.router is not None
                raise RouterRefused(
                    f"router {url} does not know worker {host.router.worker_url} (host "
                    f"{host.name}); it lists: {', '.join(sorted(urls)) or 'no worker'}; the "
                    "ledger shows no run of opspatch taking that worker out of rotation; "
                    "nothing was changed",
                    hint="set router.worker_url to the URL the router registered (URLs compare "
                    "as exact strings); a worker taken out by hand, or by a run another ledger "
                    f"recorded, is re-admitted by `{recover_remedy(host)}` once its server is "
                    "proven",
                )
            # recover re-admits workers first-hand out of rotation, which costs no room; a host
            # it must drain as well waits for room (one re-admitted gives one back)
            capacity = drain_room(
                url,
                listed,
                routed,
                playbook,
                refuse=not allow_unregistered,
                draining=[h for h in routed if restarting is None or h.name in restarting],
            )
            gate = RouterGate(
                client,
                threading.Semaphore(capacity),
                capacity,
                SharedListing(client.workers, ADMIT_POLL_SECONDS),
            )
            usable = usable_workers(listed)
            for host in routed:
                assert host.router is not None
                rotations[host.name] = HostRotation(
                    gate,
                    host.router.worker_url,
                    usable=host.router.worker_url in usable,
                    out_since=out_since.get(host.name),
                )
        return cls(rotations)


_UNREACHABLE_HINT = "check the inventory's router url and that the router runs"


def _admin_key(router: RouterSettings, env: Mapping[str, str]) -> str | None:
    if router.admin_key_env is None:
        return None
    key = env.get(router.admin_key_env)
    if not key:
        raise RouterRefused(
            f"router {router.url}: the admin key's variable ${router.admin_key_env} is not set; "
            "nothing was changed",
            hint=f"export {router.admin_key_env} with the router's admin key on this controller",
        )
    return key


def removal_detail(worker_url: str, router_url: str) -> str:
    return f"removed {worker_url} from router {router_url}"


def taken_out_by(steps: Sequence[tuple[str, StepRecord]], router: RouterSettings) -> str | None:
    """The run that took the worker out and none put back since (None: not opspatch's to put back).
    A drain that failed or never ended may have removed it."""
    ended: set[tuple[str, str]] = set()
    for run_id, step in steps:
        if step.status == StepStatus.STARTED:
            if step.step == Step.DRAIN and (run_id, Step.DRAIN) not in ended:
                return run_id
            continue
        ended.add((run_id, step.step))
        if step.step == Step.ADMIT:
            if step.status == StepStatus.OK:
                return None
        elif step.status != StepStatus.OK or step.detail.startswith(
            removal_detail(router.worker_url, router.url)
        ):
            return run_id
    return None


def usable_workers(listed: Sequence[RouterWorker]) -> frozenset[str]:
    return frozenset(w.url for w in listed if w.healthy)


def drain_room(
    url: str,
    listed: Sequence[RouterWorker],
    routed: Sequence[Host],
    playbook: Playbook,
    *,
    refuse: bool,
    draining: Sequence[Host] | None = None,
) -> int:
    """How many more workers may leave rotation at once (0 or less without `refuse`). A worker the
    router cannot use now already counts against `max_unavailable`: draining it costs no room."""
    rotation = playbook.rotation
    workers = {w.url for w in listed}
    for host in routed:
        if host.router is not None:
            workers |= {host.router.worker_url, *host.router.peers}
    usable = usable_workers(listed)
    unavailable = len(workers - usable)
    allowed = rotation.max_unavailable.hosts_per_batch(len(workers))
    room = min(allowed - unavailable, len(usable) - 1)
    if rotation.fleet_down:
        return max(1, allowed - unavailable)
    if room >= 1:
        return room
    # a run whose workers here are all out already takes nothing from the router (the broken
    # host an incident patches, the host a rollback left out): no room is needed, and each one
    # back adds some
    draining = routed if draining is None else draining
    takes_room = any(h.router is not None and h.router.worker_url in usable for h in draining)
    if not refuse or not takes_room:
        return 0
    coming_back = sorted(
        h.name for h in draining if h.router is not None and h.router.worker_url not in usable
    )
    raise RouterRefused(
        f"router {url} has {len(usable)} healthy of {len(workers)} workers: draining one "
        + (
            "would leave it no healthy worker"
            if len(usable) <= 1
            else f"would take more than max_unavailable = {rotation.max_unavailable} "
            f"out of rotation ({unavailable} already unavailable: "
            f"{', '.join(sorted(workers - usable))})"
        )
        + "; nothing was changed",
        hint=(
            f"run {', '.join(coming_back)} alone first (--hosts): each host it brings back "
            "into rotation gives room back; or "
            if coming_back
            else ""
        )
        + "raise [rotation] max_unavailable in the playbook, bring the unhealthy workers "
        "back, or, if the fleet is already down, use a playbook with fleet_down = true "
        "(--playbook incident)",
    )


# ---------------------------------------------------------------------------------------------
# the steps


def drain_step(session: HostSession) -> None:
    """Once per session: a permit, the worker removed, waited until idle."""
    rotation = session.rotation
    if rotation is None or rotation.drained:
        return
    timeouts = session.playbook.timeouts
    try:
        with session.failing_step(Step.DRAIN) as note:
            t = timeouts
            # a worker already out of rotation at the start takes no more room
            waited = (
                rotation.take_permit(t.drain + t.restart + t.ready + t.smoke + t.admit)
                if rotation.usable_at_start
                else 0.0
            )
            client = rotation.gate.client
            shared = rotation.gate.listing
            removed = shared.after(shared.mark()).of(rotation.worker_url)
            for worker in removed:
                client.remove(worker.id)
            _wait_unlisted(rotation.gate, rotation.worker_url, timeouts.admit)
            from opspatch.hosts.engine import describe_drained

            # on the host, at the engine URL its readiness and smoke use (docs/runs.md)
            idle = describe_drained(
                session.engine.wait_drained(settle=DRAIN_SETTLE_SECONDS, poll=DRAIN_POLL_SECONDS)
            )
            since = (
                f" (out of rotation since run {rotation.out_since})" if rotation.out_since else ""
            )
            how = (
                removal_detail(rotation.worker_url, client.url)
                if removed
                else f"router {client.url} did not list it{since}"
            )
            wait = (
                f" (waited {waited:.1f}s for room under max_unavailable)" if waited > 0.05 else ""
            )
            note["detail"] = f"{how}{wait}; {idle}"
    finally:
        # Tried once per session: a failed drain leaves the worker removed or its router gone,
        # so the restore's restart that follows goes ahead, and the outcome says out of rotation.
        rotation.drained = True


def admit_step(session: HostSession) -> None:
    """A failure leaves the host out of rotation (its outcome says so) and the change proven."""
    rotation = session.rotation
    if rotation is None or not rotation.out:
        return
    client = rotation.gate.client
    try:
        with session.step(Step.ADMIT) as note:
            seconds = _register(rotation.gate, rotation.worker_url, session.playbook.timeouts.admit)
            rotation.admitted = True
            note["detail"] = (
                f"router {client.url} lists {rotation.worker_url} healthy after {seconds:.1f}s "
                "(proven by the smoke decode sent to it directly)"
            )
    except OpspatchError as exc:
        rotation.why_out = f"its admit failed: {describe_error(exc)}"
    finally:
        if rotation.admitted:
            rotation.give_permit()


def halt_on_out_of_rotation(outcomes: Mapping[str, HostOutcome]) -> str | None:
    """The next drain would take capacity the router no longer has (and the cause, often the router
    itself, hits every host)."""
    out = sorted(n for n, o in outcomes.items() if o.rotation == RotationWord.OUT_OF_ROTATION)
    if not out:
        return None
    recover = remedy_text(Command.RECOVER)
    return f"{', '.join(out)} left out of rotation; `{recover}` re-admits proven hosts"


def rotation_of(
    hosts: Sequence[Host], environ: Mapping[str, str] | None = None
) -> dict[str, tuple[RotationWord | None, str]]:
    """For `status`, best effort: a router that cannot be asked gives None and says why."""
    from opspatch.hosts.router import RouterClient

    env = os.environ if environ is None else environ
    found: dict[str, tuple[RotationWord | None, str]] = {}
    listed: dict[str, tuple[RouterWorker, ...] | str] = {}
    for host in hosts:
        router = host.router
        if router is None:
            continue
        if router.url not in listed:
            try:
                listed[router.url] = RouterClient(router, _admin_key(router, env)).workers()
            except (RouterError, RouterRefused) as exc:
                listed[router.url] = exc.message
        workers = listed[router.url]
        if isinstance(workers, str):
            found[host.name] = (None, f"rotation unknown: {workers}")
            continue
        mine = [w for w in workers if w.url == router.worker_url]
        if mine and all(w.healthy for w in mine):
            found[host.name] = (RotationWord.IN_ROTATION, "")
        else:
            why = "lists it unhealthy" if mine else "does not list it"
            found[host.name] = (
                RotationWord.OUT_OF_ROTATION,
                f"out of rotation: router {router.url} {why} ({router.worker_url}); "
                f"`{recover_remedy(host)}` re-admits it once its server is proven",
            )
    return found


# ---------------------------------------------------------------------------------------------
# waiting


def _wait_unlisted(gate: RouterGate, worker_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    listing = gate.listing.after(gate.listing.mark())
    while listing.of(worker_url):
        if time.monotonic() > deadline:
            raise RouterError(
                f"router {gate.client.url} still lists {worker_url} after {timeout:.0f}s"
            )
        time.sleep(ADMIT_POLL_SECONDS)
        listing = gate.listing.after(listing.number)


def _register(gate: RouterGate, worker_url: str, timeout: float) -> float:
    """One lost reply must not leave a proven host out of rotation: asked again until `timeout`; a
    registration the router gave up is final. Its job is asked about after each listing that does
    not list the worker healthy (one that does: the job did not fail), not at the add: a router
    lists a worker healthy at its first look after the add, or takes seconds of health checks."""
    client = gate.client
    started = time.monotonic()
    seen = gate.listing.mark()
    worker_id: str | None = None
    last: RouterError | None = None
    while True:
        failure = None
        try:
            listing = gate.listing.after(seen)
            seen = listing.number
            mine = listing.of(worker_url)
            if any(w.healthy for w in mine):
                return time.monotonic() - started
            if worker_id is None:
                # listed unhealthy: registered afresh (a new health check and circuit breaker)
                # rather than waiting on the router's checker; two of one URL would be two workers
                for stale in mine:
                    client.remove(stale.id)
                worker_id = client.add(worker_url)
                seen = gate.listing.mark()  # no listing older than the add says it is healthy
            else:
                failure = client.job_failure(worker_id)
        except RouterError as exc:
            last = exc
        if failure is not None:
            raise RouterError(f"router {client.url} did not register {worker_url}: {failure}")
        if time.monotonic() - started > timeout:
            raise RouterError(
                f"router {client.url} did not list {worker_url} healthy within {timeout:.0f}s "
                "(timeouts.admit)" + (f"; last: {last.detail}" if last is not None else "")
            )
        time.sleep(ADMIT_POLL_SECONDS)
