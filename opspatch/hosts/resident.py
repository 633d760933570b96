"""The resident host agent, controller side: one agent process per host and user for a run."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, replace
from typing import cast

from opspatch.core.host import Host
from opspatch.errors import CommandTimeout, TransportError
from opspatch.hosts.agent.protocol import AgentReply, AgentRequest
from opspatch.hosts.become import Sudo
from opspatch.hosts.channel import (
    RESIDENT,
    AgentAnswer,
    AgentEndpoint,
    BootstrapEndpoint,
    OwnProcessEndpoint,
    encode_request,
    is_this_interpreter,
    request_modules,
)
from opspatch.hosts.results import changes_host
from opspatch.hosts.transport.base import (
    Command,
    CommandResult,
    Process,
    StartsProcesses,
    Transport,
)


def open_endpoint(transport: Transport, host: Host, sudo: Sudo) -> AgentEndpoint:
    """Who answers `host`'s agent requests over `transport` (see the module docstring)."""
    if isinstance(transport, AgentEndpoint):
        return transport
    endpoint: AgentEndpoint
    if host.agent == "resident" and isinstance(transport, StartsProcesses):
        endpoint = ResidentEndpoint(transport, host, sudo)
    else:
        endpoint = BootstrapEndpoint(transport, host, sudo)
    engine = host.engine
    if (
        transport.on_controller
        and engine.python is not None
        and is_this_interpreter(engine.python)
        and not engine.env
    ):
        return OwnProcessEndpoint(endpoint)
    return endpoint


@dataclass
class _Agent:
    """One running resident agent: its process, its last request number, the modules it has."""

    process: Process
    seq: int = 0
    loaded: frozenset[str] = frozenset()


def _as(user: str | None) -> str:
    return f" (as {user})" if user is not None else ""


class ResidentEndpoint:
    """One host's resident agents: one per user its requests run as (the login user, and each
    user sudo raises to, since a raised user is another process), started by the first request
    of that user (`RESIDENT` over the host's connection, through `Sudo` when raised) and fed
    every later request as a line, answered by a receipt and a reply line.

    A request keeps its deadline: past it, the agent's process group is ended (`CommandTimeout`,
    as for an exec) and the next request starts another. An agent that ended between requests
    (killed, crashed, its connection dropped) is started again, once per request, and the answer
    says so (`AgentAnswer.notice`): nothing is lost, since it had not taken the request (no
    receipt). One that ends after taking a request gave no reply: its effect is unknown, exactly
    as an exec's that gave none (`agent-no-reply`; a lost connection's `TransportError`), and the
    caller's reconcile reads the host back.

    A connection can drop while its agent is idle and the controller not know yet: the request
    then goes into the dead connection, and no receipt can tell whether the agent took it (the
    receipt may be what was lost). Sending it again is safe where none of it left the controller
    (`Process.send` said 0) or none of its operations changes the host (`RunsAs.changes`): the
    connection is opened again and the agent started again, once, as for one found ended. A
    change that left is lost mid-request, as above.
    """

    def __init__(self, transport: StartsProcesses, host: Host, sudo: Sudo) -> None:
        self.transport = transport
        self.host = host
        self._sudo = sudo
        self._agents: dict[str | None, _Agent] = {}
        self._lock = threading.Lock()

    def answer(self, request: AgentRequest, *, as_user: str | None, timeout: float) -> AgentAnswer:
        """One request, to `as_user`'s agent (started first if there is none, or it ended).

        Raises:
            TransportError, CommandTimeout: the host could not be reached or the deadline passed.
            BecomeError: `as_user` is set and sudo cannot run the agent.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            agent = self._agents.pop(as_user, None)
            notice = ""
            if agent is not None:
                if not agent.process.ended:
                    agent.process.take_stderr()  # what it said between requests is no request's
                    agent.seq += 1
                    line = self._line(request, as_user, agent.seq, agent.loaded)
                    answered = self._exchange(
                        agent, line, request, as_user, deadline, timeout, again=True
                    )
                    if answered is not None:
                        return answered
                notice = self._why_ended(agent, as_user)
            return replace(self._start(request, as_user, deadline, timeout), notice=notice)

    def _line(
        self, request: AgentRequest, as_user: str | None, seq: int, loaded: frozenset[str]
    ) -> bytes:
        """Request number `seq` as a line for an agent that has the modules `loaded`: the
        modules it lacks and (raised: sudo reset the environment it started with) the engine's
        environment, applied in the request's own fork, so it never reaches the next request.
        The login user's agent was started with that environment, as each exec is."""
        env = dict(self.host.engine.env) if as_user is not None else None
        return encode_request(request, env=env, loaded=loaded, seq=seq) + b"\n"

    def _exchange(
        self,
        agent: _Agent,
        data: bytes,
        request: AgentRequest,
        as_user: str | None,
        deadline: float,
        timeout: float,
        *,
        again: bool,
    ) -> AgentAnswer | None:
        """Send `data` (request number `agent.seq`) and read its receipt and reply; None when
        the agent ended without taking it (nothing of it ran), or (`again`: it may be sent
        again) its connection was lost before a receipt and sending it again is safe."""
        process = agent.process
        taken = False
        try:
            sent = process.send(data, deadline=deadline)
            if sent is None:
                raise self._timed_out(agent, request, timeout)
            while True:
                raw = process.read_line(deadline=deadline)
                if raw is None:
                    raise self._timed_out(agent, request, timeout)
                if not raw:
                    break
                said = _message(raw)
                if said is None:
                    continue
                if said.get("taken") == agent.seq:  # it has the request and its modules
                    taken = True
                    agent.loaded |= frozenset(request_modules(request))
                elif taken and isinstance(said.get("replies"), list):
                    self._agents[as_user] = agent
                    stderr = process.take_stderr().decode("utf-8", errors="replace").strip()
                    return AgentAnswer(reply=cast(AgentReply, said), stderr=stderr)
        except CommandTimeout:
            raise  # the agent was ended: the next request starts another, nothing to say
        except BaseException:
            process.close()
            raise
        resend = again and not taken and (sent == 0 or not changes_host(request["ops"]))
        return self._ended(agent, as_user, taken, deadline, resend=resend)

    def _ended(
        self, agent: _Agent, as_user: str | None, taken: bool, deadline: float, *, resend: bool
    ) -> AgentAnswer | None:
        """The answer of a request whose agent's output ended before its reply: None when it
        had not taken the request, or its connection was lost and it may be sent again
        (`resend`). An agent that ended with a request is kept as it is, for the next request
        to say why it starts another."""
        process = agent.process
        if process.lost:
            if resend:
                return None
            self._agents[as_user] = agent
            raise TransportError(
                "the connection was lost while the command ran (no exit status came back; "
                "what the command did is unknown)",
                host=self.host.name,
                step="exec",
            )
        if not taken:
            return None
        exit_code = process.exit_status(deadline=max(deadline, time.monotonic() + 5.0))
        stderr = process.take_stderr().decode("utf-8", errors="replace").strip()
        self._agents[as_user] = agent
        code = -1 if exit_code is None else exit_code
        return AgentAnswer(reply=None, exit_code=code, stderr=stderr)

    def _start(
        self, request: AgentRequest, as_user: str | None, deadline: float, timeout: float
    ) -> AgentAnswer:
        """A new agent for `as_user`, started by `request`: its answer (a start that fails
        answers no reply, with the exit status and stderr that say why, as an exec would)."""
        program = (str(self.host.engine.python), "-c", RESIDENT)
        started: list[AgentAnswer] = []

        def launch(command: Command, data: bytes) -> CommandResult:
            began = time.monotonic()
            agent = _Agent(self.transport.start_process(command), seq=1)
            answered = self._exchange(agent, data, request, as_user, deadline, timeout, again=False)
            if answered is None:  # it ended before it took the request: sudo, or no interpreter
                exit_code = agent.process.exit_status(deadline=time.monotonic() + 5.0)
                stderr = agent.process.take_stderr().decode("utf-8", errors="replace").strip()
                agent.process.close()
                answered = AgentAnswer(None, -1 if exit_code is None else exit_code, stderr)
            started.append(answered)
            return CommandResult(
                command=command.masked(),
                exit_code=answered.exit_code,
                stdout=b"",
                stderr=answered.stderr.encode("utf-8"),
                seconds=time.monotonic() - began,
            )

        line = self._line(request, as_user, 1, frozenset())
        if as_user is None:
            launch(Command(program, env=dict(self.host.engine.env)), line)
        else:
            self._sudo.run(as_user, program, line, send=launch, program_text=RESIDENT)
        return started[-1]

    def _why_ended(self, agent: _Agent, as_user: str | None) -> str:
        """The notice for an agent found ended (and now released) when a request came."""
        process = agent.process
        if process.lost:
            why = "its connection was lost"
        else:
            code = process.exit_status(deadline=time.monotonic() + 1.0)
            why = "it exited" if code is None else f"it exited with status {code}"
            tail = process.take_stderr().decode("utf-8", errors="replace").strip()
            if tail:
                why += f": {tail.splitlines()[-1][-200:]}"
        process.close()
        return f"the host agent{_as(as_user)} had ended ({why}); started again"

    def _timed_out(self, agent: _Agent, request: AgentRequest, timeout: float) -> CommandTimeout:
        """End the agent that ran past the request's deadline; the error that says so."""
        outcome = agent.process.end()
        ops = ", ".join(call["op"] for call in request["ops"])
        return CommandTimeout(
            f"the host agent's request ({ops}) ran past its {timeout:g}s deadline; {outcome}",
            host=self.host.name,
            step="exec",
        )


def _message(raw: bytes) -> dict[str, object] | None:
    """One line of a resident agent's stdout as a JSON object (None: not one)."""
    try:
        said = json.loads(raw)
    except ValueError:
        return None
    return said if isinstance(said, dict) else None
