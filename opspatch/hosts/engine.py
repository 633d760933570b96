"""The engine on a host: restart it, wait until it is ready, prove it decodes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opspatch.core.codec import NOT_WRITTEN, Record, json_field
from opspatch.core.host import ContainerRestart, Host
from opspatch.core.policy import JudgeSettings, Playbook
from opspatch.errors import ContainerError, EngineError, RemoteOperationError
from opspatch.hosts.agent.engine import op_smoke, op_wait_drained, op_wait_ready
from opspatch.hosts.agent.protocol import (
    DrainedReply,
    GroupCheck,
    ReadyReply,
    RestartRequest,
    SmokeReply,
    SmokeRequest,
    StopRequest,
    WaitDrainedRequest,
    WaitReadyRequest,
)
from opspatch.hosts.agent.protocol import (
    RestartReply as RestartReply,  # what a restart or start did, for runs
)
from opspatch.hosts.agent.protocol import (
    StopReply as StopReply,
)
from opspatch.hosts.agent.restarts import op_restart, op_start, op_stop
from opspatch.hosts.become import RunsAs
from opspatch.hosts.measure import MEASURE, Measurement, measure_args
from opspatch.hosts.operations import HostOperations, R, Rep, Req
from opspatch.hosts.results import Operation
from opspatch.hosts.transport.container import ContainerTransport

# Seconds added to a host-side deadline for the exec itself (interpreter start, transfer).
EXEC_MARGIN = 30.0


@dataclass(frozen=True)
class ServerGroup:
    """The group a multi-node server's head holds once every rank joined: `nnodes` nodes and
    `tp_size` tensor-parallel ranks in all (SGLang's `--nnodes`, `--tp-size`)."""

    nnodes: int
    tp_size: int | None = None
    """None: not checked (an inventory's unit names its nodes, not its ranks; the head's port
    opens only once every rank joined, whatever their number)."""

    def check(self) -> GroupCheck:
        return {"nnodes": self.nnodes, "tp_size": self.tp_size}


READY_SLICE_SECONDS = 30.0
"""How long one `wait_ready` exec waits on the host before it answers that it is still waiting:
a readiness wait (up to the playbook's `ready`, 20 minutes by default) is a series of such
execs, and between two of them the controller says what it awaits and until when
(`StillWaiting`), so a wrong engine URL is not a silent 20 minutes."""


LOOK_SECONDS = 1.0
"""How long `still_running` looks at a node: long enough for one /health poll."""


@dataclass(frozen=True)
class Readiness(Record):
    seconds: float
    polls: int


@dataclass(frozen=True)
class StillWaiting:
    """A readiness wait still going on, as the controller says it between two parts: the URL
    awaited, the last answer, the seconds waited so far and the whole wait's deadline (seconds,
    and the wall-clock time it gives up at, epoch seconds)."""

    url: str
    last: str
    waited: float
    timeout: float
    gives_up_at: float


def describe_drained(drained: DrainedReply) -> str:
    """A drained engine in words: how long until it read idle, in how many reads of
    `/v1/loads`, or that it did not answer at all (a server that does not answer runs nothing)."""
    if not drained["answered"]:
        return "its server does not answer: nothing runs there"
    seconds, polls = drained["seconds"], drained["polls"]
    return f"idle after {seconds:.1f}s ({polls} reads of /v1/loads on the host)"


@dataclass(frozen=True)
class PromptResult(Record):
    prompt: str
    ok: bool
    text: str | None = None
    completion_tokens: int | None = None
    spec_verify_ct: int | None = None
    problem: str | None = None


@dataclass(frozen=True, kw_only=True)
class SmokeResult(Record):
    """A smoke decode: every prompt's result, every failure, and log lines that matched; on a
    failure, the exceptions the server logged (grouped: type, message, count, times, frame) and
    its last relevant log lines."""

    ok: bool
    failures: tuple[str, ...] = ()
    log_hits: tuple[str, ...] = ()
    prompts: tuple[PromptResult, ...] = ()
    exceptions: tuple[dict[str, Any], ...] = ()
    log_tail: str | None = None
    lock_released: bool = field(default=False, metadata=NOT_WRITTEN)
    """The smoke passed and released the run's lock on the host in the same exec."""
    log_offset: int | None = json_field(default=None, written=False)
    """Where the log scan began (the reply's; never printed)."""
    exception: dict[str, Any] | None = json_field(default=None, written=False)
    """The last exception the log records, on a failure (the reply's; never printed)."""

    @property
    def texts(self) -> tuple[str | None, ...]:
        """Each prompt's completion (a baseline for the next smoke)."""
        return tuple(p.text for p in self.prompts)

    def summary(self) -> str:
        if self.ok:
            verified = [p.spec_verify_ct for p in self.prompts if p.spec_verify_ct]
            tokens = sum(p.completion_tokens or 0 for p in self.prompts)
            return f"{len(self.prompts)} prompt(s), {tokens} tokens" + (
                f", spec_verify_ct {sum(verified)}" if verified else ""
            )
        return "; ".join(self.failures)


RESTART = Operation(
    "restart", RestartRequest, RestartReply, RestartReply, op_restart, runs_as=RunsAs.RESTART
)
STOP = Operation("stop", StopRequest, StopReply, StopReply, op_stop, runs_as=RunsAs.RESTART)
START = Operation(
    "start", RestartRequest, RestartReply, RestartReply, op_start, runs_as=RunsAs.RESTART
)
WAIT_READY = Operation(
    "wait_ready", WaitReadyRequest, ReadyReply, ReadyReply, op_wait_ready, runs_as=RunsAs.READ
)
WAIT_DRAINED = Operation(
    "wait_drained",
    WaitDrainedRequest,
    DrainedReply,
    DrainedReply,
    op_wait_drained,
    runs_as=RunsAs.READ,
)
SMOKE = Operation(
    "smoke",
    SmokeRequest,
    SmokeReply,
    SmokeResult,
    op_smoke,
    runs_as=RunsAs.READ,
    renamed={"results": "prompts"},
)


def restart_args(host: Host, *, timeout: float) -> RestartRequest:
    """The agent's `restart` arguments for a host, from its inventory engine settings."""
    restart = host.engine.restart
    if restart is None:
        raise EngineError(
            "the inventory sets no engine.restart for this host",
            host=host.name,
            step="restart",
            hint="set engine.restart = { kind = 'systemd', unit = '...' } (or supervisor/command)",
        )
    settings = {k: v for k, v in vars(restart).items() if v is not None}
    return RestartRequest(
        restart=settings, log_file=host.engine.log_file, env=dict(host.engine.env), timeout=timeout
    )


def smoke_args(
    host: Host,
    playbook: Playbook,
    *,
    log_offset: int | None,
    baseline: Sequence[str | None] | None = None,
    checks: bool = True,
    pid: int | None = None,
) -> SmokeRequest:
    """The agent's `smoke` arguments for a host: the playbook's prompts and checks, the host's
    URL, log and pid file (also sent inside `diagnose --decode`)."""
    smoke = playbook.smoke
    return {
        "url": host.engine.url,
        "prompts": [{"text": p.text, "expect": p.expect} for p in smoke.prompts],
        "max_new_tokens": smoke.max_new_tokens,
        "require_spec_verify": bool(smoke.require_spec_verify and host.engine.speculative),
        "baseline": list(baseline) if baseline is not None else None,
        "log_file": host.engine.log_file if checks else None,
        "log_offset": log_offset,
        "fail_patterns": list(playbook.log.fail_patterns) if checks else [],
        "ignore_patterns": list(playbook.log.ignore_patterns) if checks else [],
        "checks": checks,
        "timeout": float(playbook.timeouts.smoke),
        "pid": pid,
        "pid_file": getattr(host.engine.restart, "pid_file", None),
    }


class EngineControl:
    """Restart, readiness and smoke decode for one host, through its `HostOperations`."""

    def __init__(self, ops: HostOperations, host: Host, playbook: Playbook) -> None:
        self.ops = ops
        self.host = host
        self.playbook = playbook

    def _run(
        self, operation: Operation[Req, Rep, R], request: Req, *, timeout: float, step: str
    ) -> R:
        """One engine step: its refusals as the engine's errors, its reply read as its record
        (a reply of the wrong shape stays `agent-bad-reply`)."""
        with self._engine_errors(step):
            return self.ops.run(operation, request, timeout=timeout + EXEC_MARGIN, step=step)

    @contextlib.contextmanager
    def _engine_errors(self, step: str) -> Iterator[None]:
        """The agent's refusals of an engine step, as the engine's errors (a reply of the
        wrong shape stays `agent-bad-reply`, as for every operation)."""
        try:
            yield
        except RemoteOperationError as exc:
            if exc.code == "agent-bad-reply":
                raise
            raise EngineError(
                exc.detail, host=self.host.name, step=step, data=exc.data, hint=exc.hint
            ) from exc

    def restart(self, *, step: str = "restart") -> RestartReply:
        """Restart the engine with the host's strategy.

        Raises:
            EngineError: the strategy failed (the unit is not active, the start command died...).
            TransportError: the host could not be reached in time.
        """
        timeout = float(self.playbook.timeouts.restart)
        noted = self._run(
            RESTART, restart_args(self.host, timeout=timeout), timeout=timeout, step=step
        )
        if isinstance(self.host.engine.restart, ContainerRestart):
            return self._restart_container(self.host.engine.restart, noted, timeout, step)
        return noted

    def stop(self, *, step: str = "stop") -> StopReply:
        """Only stop the engine, and wait until it is gone (command: its whole process tree,
        KILLed after `stop_timeout`; a service: until systemd or supervisor says it stopped; a
        container: the runtime's stop). An engine that does not run stops nothing. The first
        half of a restart, for a server of several nodes: every node is stopped before any is
        started (`start`), never one node restarted alone.

        Raises:
            EngineError: the strategy failed (a process survived SIGKILL, the unit is still
                active...).
            TransportError: the host could not be reached in time.
        """
        timeout = float(self.playbook.timeouts.restart)
        restart = restart_args(self.host, timeout=timeout)
        request = StopRequest(
            restart=restart["restart"], log_file=restart["log_file"], timeout=timeout
        )
        stopped = self._run(STOP, request, timeout=timeout, step=step)
        if isinstance(self.host.engine.restart, ContainerRestart):
            seconds = self.host.engine.restart.stop_timeout
            with self._container_errors(step) as transport:
                after = transport.stop(seconds, timeout=timeout + EXEC_MARGIN)
            detail = f"{transport.describe()} stopped (id {after.id[:12]}, {after.status})"
            return {**stopped, "detail": detail}
        return stopped

    def start(self, *, step: str = "start", stopped: StopReply | None = None) -> RestartReply:
        """Only start the engine (the second half of a restart: after `stop`); refused while it
        still runs. A container is started by its runtime (nothing runs in a stopped one to
        note its log first): its log is scanned from where `stopped` (its stop) left it.

        Raises:
            EngineError: the strategy failed or the engine still runs (`engine-running`).
            TransportError: the host could not be reached in time.
        """
        timeout = float(self.playbook.timeouts.restart)
        if isinstance(self.host.engine.restart, ContainerRestart):
            with self._container_errors(step) as transport:
                after = transport.start(timeout=timeout + EXEC_MARGIN)
            return RestartReply(
                strategy="container",
                pid=None,
                log_offset=stopped.get("log_offset") if stopped is not None else None,
                detail=f"{transport.describe()} started (id {after.id[:12]}, {after.status})",
            )
        return self._run(
            START, restart_args(self.host, timeout=timeout), timeout=timeout, step=step
        )

    @contextlib.contextmanager
    def _container_errors(self, step: str) -> Iterator[ContainerTransport]:
        """The host's container transport, and the runtime's refusals as the engine's errors."""
        transport = self.ops.transport
        if not isinstance(transport, ContainerTransport):
            raise EngineError(
                "restart kind container needs the host's container",
                host=self.host.name,
                step=step,
                hint='set container = { runtime = "podman", name = "..." } in the inventory',
            )
        try:
            yield transport
        except ContainerError as exc:
            raise EngineError(exc.detail, host=self.host.name, step=step, hint=exc.hint) from exc

    def _restart_container(
        self, restart: ContainerRestart, noted: RestartReply, timeout: float, step: str
    ) -> RestartReply:
        """The runtime's restart of the engine's container, after the agent noted the log's
        size inside it (`noted`): the same container, its writable layer kept."""
        with self._container_errors(step) as transport:
            after = transport.restart(restart.stop_timeout, timeout=timeout + EXEC_MARGIN)
        return RestartReply(
            strategy="container",
            pid=None,
            log_offset=noted.get("log_offset"),
            detail=f"{transport.describe()} restarted (id {after.id[:12]}, {after.status})",
        )

    def wait_ready(
        self,
        restart: RestartReply | None = None,
        *,
        step: str = "ready",
        timeout: float | None = None,
        on_waiting: Callable[[StillWaiting], None] | None = None,
        group: ServerGroup | None = None,
        slice_seconds: float | None = None,
    ) -> Readiness:
        """Poll the server's /health on the host until it answers 200, within `timeout` seconds
        (default: the playbook's `ready`); with `group`, the head's `/server_info` too (the
        agent's `op_wait_ready` says how). The wait is a series of fenced execs of at most
        `READY_SLICE_SECONDS` (each renews the run's lock); after each that ran out, `on_waiting`
        is told what is awaited and until when (why: docs/runs.md, "A long readiness wait").

        Raises:
            EngineError: the deadline passed, the started process exited, or (no `restart`) the
                pid file names no running process (`data`: the log tail and the exception the
                engine logged, if any).
        """
        timeout = float(self.playbook.timeouts.ready if timeout is None else timeout)
        slice_seconds = READY_SLICE_SECONDS if slice_seconds is None else slice_seconds
        request = WaitReadyRequest(
            url=self.host.engine.url,
            timeout=timeout,
            pid=restart.get("pid") if restart else None,
            pid_file=getattr(self.host.engine.restart, "pid_file", None),
            log_file=self.host.engine.log_file,
            log_offset=restart.get("log_offset") if restart else None,
            total=timeout,
            slice=False,
            group=group.check() if group is not None else None,
        )
        started = time.monotonic()
        gives_up_at = time.time() + timeout
        waited, polls = 0.0, 0
        while True:
            remaining = timeout - (time.monotonic() - started)
            last_part = remaining <= slice_seconds
            part = max(remaining, 0.001) if last_part else slice_seconds
            request["timeout"], request["slice"] = part, not last_part
            answer = self._run(WAIT_READY, request, timeout=part, step=step)
            still = answer.get("waiting")
            if still is None:
                seconds = waited + answer.get("seconds", 0.0)
                return Readiness(round(seconds, 3), polls + answer.get("polls", 0))
            waited, polls = waited + still["seconds"], polls + still["polls"]
            if on_waiting is not None:
                on_waiting(
                    StillWaiting(
                        self.host.engine.url,
                        still["last"],
                        time.monotonic() - started,
                        timeout,
                        gives_up_at,
                    )
                )

    def still_running(self, started: RestartReply, *, step: str = "ready") -> None:
        """One short look (an exec of about a second) that the engine `started` launched is
        still running: a unit's other nodes, watched while the head is awaited (their dummy
        `/health` proves only that). Returns when its process lives (or the strategy names no
        pid to watch: a service, a container).

        Raises:
            EngineError: the process exited (`engine-exited`, with its log's evidence).
        """
        request = WaitReadyRequest(
            url=self.host.engine.url,
            timeout=LOOK_SECONDS,
            pid=started.get("pid"),
            pid_file=None,
            log_file=self.host.engine.log_file,
            log_offset=started.get("log_offset"),
            total=LOOK_SECONDS,
            slice=True,
            group=None,
        )
        self._run(WAIT_READY, request, timeout=LOOK_SECONDS, step=step)

    def wait_drained(
        self, *, settle: float, poll: float, step: str = "drain", timeout: float | None = None
    ) -> DrainedReply:
        """Wait on the host until the engine reports nothing running or waiting for `settle`
        seconds (its `GET /v1/loads`, read every `poll` seconds), within `timeout` (default: the
        playbook's `drain`).

        Raises:
            EngineError: it still had requests at the deadline, or answered no load report.
        """
        timeout = float(self.playbook.timeouts.drain if timeout is None else timeout)
        args = WaitDrainedRequest(
            url=self.host.engine.url, timeout=timeout, settle=settle, poll=poll
        )
        return self._run(WAIT_DRAINED, args, timeout=timeout, step=step)

    def measure(self, settings: JudgeSettings, *, step: str = "judge") -> Measurement:
        """Decode the judge's prompts on the host, timed (`opspatch.hosts.measure`). A failed
        request is a sample with its problem, not an error.

        Raises:
            EngineError: the agent refused the measurement.
            TransportError: the host could not be reached in time.
        """
        request = measure_args(self.host, settings)
        return self._run(MEASURE, request, timeout=settings.timeout, step=step)

    def smoke(
        self,
        *,
        log_offset: int | None,
        baseline: Sequence[str | None] | None = None,
        checks: bool = True,
        pid: int | None = None,
        step: str = "smoke",
        release_lock: str | None = None,
    ) -> SmokeResult:
        """Run the playbook's smoke decode and log scan on the host.

        With `checks=False` it only decodes (used to take a pre-patch baseline). With
        `release_lock` (a run id), a smoke that passes also releases that run's lock on the
        host in the same exec (`HostOperations.then_unlock`): it is a host's last step, and one
        exec fewer per host.
        A failed check is a value (`ok=False`), not an exception. `pid` (the restart's) is the
        server whose liveness tells a decode that timed out from a crash; without it, the pid
        file (command strategy) or whoever listens on the engine's port is asked.
        """
        timeout = float(self.playbook.timeouts.smoke)
        args = smoke_args(
            self.host,
            self.playbook,
            log_offset=log_offset,
            baseline=baseline,
            checks=checks,
            pid=pid,
        )
        if release_lock is None:
            return self._run(SMOKE, args, timeout=timeout, step=step)
        with self._engine_errors(step):
            smoke, released = self.ops.then_unlock(
                SMOKE,
                args,
                run_id=release_lock,
                gate=True,  # a failed smoke keeps the lock: the rollback still needs it
                timeout=timeout + EXEC_MARGIN,
                step=step,
            )
        return replace(smoke, lock_released=released)
