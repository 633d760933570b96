"""The transport interface every host operation goes through."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, TypeVar, runtime_checkable

from opspatch.hosts.containers import ContainerIdentity

_SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "KEY")


@dataclass(frozen=True)
class Command:
    """A command as data: argv and extra environment, quoted only when rendered.

    `env` values whose names look secret (TOKEN, SECRET, PASSWORD, KEY) are masked by `masked()`,
    which is what logs and the ledger record.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("a Command needs at least one argv element")
        for name in self.env:
            if not name.replace("_", "a").isalnum() or name[0].isdigit():
                raise ValueError(f"invalid environment variable name: {name!r}")

    def render(self) -> str:
        """The one shell string this command becomes; every piece is quoted here."""
        parts = [f"{name}={shlex.quote(value)}" for name, value in sorted(self.env.items())]
        if parts:
            parts.insert(0, "env")
        parts.extend(shlex.quote(arg) for arg in self.argv)
        return " ".join(parts)

    def masked(self) -> str:
        """`render()` with secret-looking environment values replaced by `***`."""
        env = {
            k: ("***" if any(m in k.upper() for m in _SECRET_MARKERS) else v)
            for k, v in self.env.items()
        }
        return Command(self.argv, env).render()

    def describe(self, longest: int = 60) -> str:
        """`masked()` for a one-line message: an argument longer than `longest` characters (the
        host agent's `-c` program, say) is named by its size instead of quoted whole."""
        argv = tuple(
            arg if len(arg) <= longest else f"<{len(arg)} characters>" for arg in self.argv
        )
        return Command(argv, self.env).masked()


@dataclass(frozen=True)
class CommandResult:
    """What a command did: its exit status, its whole output, and how long it took."""

    command: str
    exit_code: int
    stdout: bytes
    stderr: bytes
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@runtime_checkable
class Transport(Protocol):
    """One host's command channel. Implementations keep one connection per host per run.

    `host` is the inventory name used in messages; `exec_count` counts `run` calls, so tests can
    check the round trips the design promises. `container` says which container the commands
    run in (the container transport's pinned identity), None where they run on the host itself:
    identity belongs to the connection, so nothing above asks which transport it holds.
    """

    host: str
    exec_count: int

    @property
    def container(self) -> ContainerIdentity | None:
        """The container the commands ran in (None: the host itself, or not pinned yet)."""
        ...

    @property
    def on_controller(self) -> bool:
        """Whether the commands run on the controller itself, as the controller's own user (the
        local transport), so an agent request may be answered in the controller's own process
        (`resident.open_endpoint`)."""
        ...

    def run(self, command: Command, *, stdin: bytes = b"", timeout: float) -> CommandResult:
        """Run `command` with `stdin`, wait at most `timeout` seconds, return its result.

        Raises `CommandTimeout` (after ending the remote process group) when the deadline passes
        and `TransportError` when the host cannot be reached. A non-zero exit is not an error
        here: it is in the result, for the caller to interpret.
        """
        ...

    def close(self) -> None:
        """Release the connection; safe to call twice."""
        ...

    def __enter__(self) -> Transport:
        """The transport itself; `close` runs on the way out of the `with` block."""
        ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...


class Process(Protocol):
    """A command that keeps running on the host (`StartsProcesses.start_process`): its stdin written and its
    stdout read line by line, its stderr kept, in its own process group as every command is."""

    @property
    def ended(self) -> bool:
        """Whether it can take no more input: its stdout ended or its channel is gone."""
        ...

    @property
    def lost(self) -> bool:
        """Whether the connection to it went: if it still runs, and what it did, is unknown."""
        ...

    def send(self, data: bytes, *, deadline: float) -> int | None:
        """Write `data` to its stdin, draining its outputs meanwhile (one request: counted in
        the transport's `exec_count`): how many of its bytes left for the host, all of them
        unless it ended or its connection went first (the rest is dropped, for `read_line` to
        tell); None if the deadline (monotonic) passed first. 0 is certain: none of `data`
        reached the host."""
        ...

    def read_line(self, *, deadline: float) -> bytes | None:
        """Its next stdout line; `b""` once its stdout ended; None if the deadline passed."""
        ...

    def exit_status(self, *, deadline: float) -> int | None:
        """Its exit status once its stdout ended (waiting for it until `deadline`); None when it
        cannot be known (the connection went)."""
        ...

    def take_stderr(self) -> bytes:
        """What it wrote to stderr since the last call."""
        ...

    def end(self) -> str:
        """End its process group (TERM, then KILL) and release it; says what happened."""
        ...

    def close(self) -> None:
        """Close its stdin (it ends at end of input) and release it; safe to call twice."""
        ...


@runtime_checkable
class StartsProcesses(Protocol):
    """A transport that can keep a command running for a run (SSH, local)."""

    def start_process(self, command: Command) -> Process:
        """`command` started, in its own process group, its stdin left open.

        Raises:
            TransportError: the host cannot be reached, or the command cannot be started.
        """
        ...


_Self = TypeVar("_Self", bound="ClosesOnExit")


class ClosesOnExit:
    """Mixin making a transport a context manager that calls its `close()` on exit; its commands
    run on the host itself (`container` None), not on the controller (`on_controller` False),
    unless the transport says otherwise."""

    @property
    def container(self) -> ContainerIdentity | None:
        return None

    @property
    def on_controller(self) -> bool:
        return False

    def close(self) -> None:  # pragma: no cover - every transport defines its own
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
