"""The container transport: every command runs inside the engine's container, through the host."""

from __future__ import annotations

import json
import re
from typing import Any

from opspatch.core.host import ContainerRuntime, ContainerSettings
from opspatch.core.reasons import Reason
from opspatch.errors import ContainerError
from opspatch.hosts.containers import ContainerIdentity as ContainerIdentity  # its old home
from opspatch.hosts.transport.base import ClosesOnExit, Command, CommandResult, Transport

INSPECT_TIMEOUT = 60.0
"""Seconds for one `container inspect` (the runtime answers in well under a second)."""

_MISSING_WORDS = ("no such container", "no such object", "no container with name or id")
_NOT_RUNNING_WORDS = (
    "container state improper",
    "is not running",
    "can only create exec sessions on running containers",
)
_PERMISSION_WORDS = ("permission denied", "access denied", "operation not permitted")
_NO_RUNTIME_STATUS = 127


def inspect_command(container: ContainerSettings) -> Command:
    """`<runtime> container inspect <name>`: one JSON array holding the container."""
    return Command((container.runtime, "container", "inspect", container.name))


def exec_command(container: ContainerSettings, target: str, command: Command) -> Command:
    """`command` run inside the container `target` (its id): its environment is passed by name
    (`--env NAME`) from the runtime's own, which the rendered command sets."""
    names: list[str] = []
    for name in sorted(command.env):
        names += ["--env", name]
    argv = (container.runtime, "exec", "-i", *names, target, *command.argv)
    return Command(argv, env=dict(command.env))


def restart_command(container: ContainerSettings, target: str, stop_timeout: float) -> Command:
    """`<runtime> restart --time N <id>`: stop (TERM, then KILL after N seconds) and start the
    same container, its writable layer kept."""
    seconds = str(max(0, round(stop_timeout)))
    return Command((container.runtime, "restart", "--time", seconds, target))


def stop_command(container: ContainerSettings, target: str, stop_timeout: float) -> Command:
    """`<runtime> stop --time N <id>`: TERM, then KILL after N seconds; the container kept."""
    seconds = str(max(0, round(stop_timeout)))
    return Command((container.runtime, "stop", "--time", seconds, target))


def start_command(container: ContainerSettings, target: str) -> Command:
    """`<runtime> start <id>`: the same container started again, its writable layer kept."""
    return Command((container.runtime, "start", target))


def parse_inspect(container: ContainerSettings, stdout: bytes) -> ContainerIdentity:
    """The identity `container inspect` printed (pure).

    Raises:
        ValueError: the output is not one container's inspect document.
    """
    data = json.loads(stdout.decode("utf-8"))
    if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], dict):
        raise ValueError("expected a JSON array with one container")
    found: dict[str, Any] = data[0]
    state = _table(found, "State")
    config = _table(found, "Config")
    image = found.get("ImageName") or config.get("Image") or found.get("Image") or ""
    return ContainerIdentity(
        runtime=container.runtime,
        name=container.name,
        id=str(found["Id"]),
        created=str(found.get("Created") or ""),
        image=str(image),
        running=bool(state.get("Running")),
        status=str(state.get("Status") or ""),
        labels={str(k): str(v) for k, v in (config.get("Labels") or {}).items()},
    )


def _table(found: dict[str, Any], key: str) -> dict[str, Any]:
    value = found.get(key)
    return value if isinstance(value, dict) else {}


def runtime_words(result: CommandResult) -> str:
    """The runtime's own message: its last non-empty stderr line (else stdout's)."""
    text = (result.stderr or result.stdout).decode("utf-8", errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else f"exit {result.exit_code}, no output"


_RLIMIT_NAMES = (
    "CPU", "FSIZE", "DATA", "STACK", "CORE", "RSS", "NPROC", "NOFILE", "MEMLOCK", "AS", "LOCKS",
    "SIGPENDING", "MSGQUEUE", "NICE", "RTPRIO", "RTTIME",
)  # fmt: skip
"""Linux's resource limits in their numbering (runc names a limit by its number)."""
_RLIMIT_TYPE = re.compile(r"rlimit type (\d+)", re.IGNORECASE)
_RLIMIT_NAME = re.compile(r"\bRLIMIT_([A-Z]+)")


def refused_rlimit(words: str) -> str | None:
    """The resource limit the runtime could not give a container (`RLIMIT_NOFILE`), or None
    when `words` are not that refusal (pure). A runtime's default ulimits above this machine's
    hard limits read as a permission error: runc says "error setting rlimit type 7: operation
    not permitted: OCI permission denied", crun "setrlimit `RLIMIT_NOFILE`: Operation not
    permitted", to root as to anyone."""
    if "rlimit" not in words.lower():
        return None
    number = _RLIMIT_TYPE.search(words)
    if number is not None and int(number.group(1)) < len(_RLIMIT_NAMES):
        return f"RLIMIT_{_RLIMIT_NAMES[int(number.group(1))]}"
    name = _RLIMIT_NAME.search(words)
    return f"RLIMIT_{name.group(1)}" if name is not None else "a resource limit"


def rlimit_hint(runtime: ContainerRuntime) -> str:
    """How to give `runtime` container limits this machine allows (docs/containers.md)."""
    if runtime == "docker":
        return (
            'set limits this machine allows: dockerd\'s "default-ulimits" in daemon.json (or '
            "--ulimit nofile=N:N per container, N at most `ulimit -Hn`); see docs/containers.md"
        )
    return (
        "give podman limits this machine allows: a containers.conf with `[containers] "
        'default_ulimits = ["nofile=N:N", "nproc=M:M"]` (N at most `ulimit -Hn`, M at most '
        "`ulimit -Hu`), passed as CONTAINERS_CONF=FILE; see docs/containers.md"
    )


def _has(words: str, needles: tuple[str, ...]) -> bool:
    lowered = words.lower()
    return any(needle in lowered for needle in needles)


class ContainerTransport(ClosesOnExit):
    """Runs each command inside one container, through the host's own transport.

    `identity` is the container as first inspected (None until the first command), which
    `container` says on the transport's protocol. `exec_count`
    counts the commands run inside the container (an inspect or a restart is not one).
    """

    def __init__(self, inner: Transport, container: ContainerSettings) -> None:
        self.inner = inner
        self.settings = container
        """The inventory's `container = {runtime, name}`: the name this transport pins."""
        self.host = inner.host
        self.exec_count = 0
        self.identity: ContainerIdentity | None = None

    @property
    def container(self) -> ContainerIdentity | None:
        """The container this transport's commands run in (`identity`), as the protocol says it
        (`Transport.container`): None until the first command pinned it."""
        return self.identity

    def describe(self) -> str:
        return f"container {self.settings.name} ({self.settings.runtime})"

    def pin(self, *, timeout: float = INSPECT_TIMEOUT) -> ContainerIdentity:
        """The container this transport runs in, inspected on first use and kept.

        Raises:
            ContainerError: it does not exist or is not running, or the runtime is missing or
                not allowed.
        """
        if self.identity is None:
            found = self.inspect(timeout=timeout)
            if not found.running:
                raise self._error(
                    f"is not running (status {found.status or 'unknown'}, id {found.id[:12]})",
                    reason=Reason.CONTAINER_NOT_RUNNING,
                    hint=f"start it (`{self.settings.runtime} start {self.settings.name}`) "
                    "and run this again",
                )
            self.identity = found
        return self.identity

    def inspect(self, *, timeout: float = INSPECT_TIMEOUT) -> ContainerIdentity:
        """The container the name stands for now (not pinned).

        Raises:
            ContainerError: there is none, or the runtime is missing or not allowed.
        """
        result = self.inner.run(inspect_command(self.settings), timeout=timeout)
        if not result.ok:
            raise self._runtime_refusal(result)
        try:
            return parse_inspect(self.settings, result.stdout)
        except (ValueError, KeyError) as exc:
            raise self._error(
                f"could not be read from `{inspect_command(self.settings).render()}`: {exc}",
                reason=Reason.RUNTIME_FAILED,
            ) from None

    def run(self, command: Command, *, stdin: bytes = b"", timeout: float) -> CommandResult:
        """Run `command` inside the pinned container.

        Raises:
            ContainerError: the container cannot be used, or is no longer the pinned one.
            TransportError, CommandTimeout: as the host's own transport raises them.
        """
        pinned = self.pin()
        self.exec_count += 1
        result = self.inner.run(
            exec_command(self.settings, pinned.id, command), stdin=stdin, timeout=timeout
        )
        if not result.ok:
            words = runtime_words(result)
            if _has(words, _MISSING_WORDS + _NOT_RUNNING_WORDS):
                raise self._gone(pinned, words)
        return result

    def restart(self, stop_timeout: float, *, timeout: float) -> ContainerIdentity:
        """Restart the pinned container with the runtime (the writable layer kept); the
        container inspected afterwards.

        Raises:
            ContainerError: the runtime refused, or the container is no longer the pinned one.
        """
        pinned = self.pin()
        command = restart_command(self.settings, pinned.id, stop_timeout)
        return self._lifecycle(command, pinned, "restart", timeout)

    def stop(self, stop_timeout: float, *, timeout: float) -> ContainerIdentity:
        """Stop the pinned container with the runtime (kept, to be started again); the
        container inspected afterwards.

        Raises:
            ContainerError: the runtime refused, or the container is no longer the pinned one.
        """
        pinned = self.pin()
        command = stop_command(self.settings, pinned.id, stop_timeout)
        return self._lifecycle(command, pinned, "stop", timeout)

    def start(self, *, timeout: float) -> ContainerIdentity:
        """Start the container again: the pinned one (stopped by `stop`), or, when none was
        pinned yet, the one the name stands for now; the container inspected afterwards.

        Raises:
            ContainerError: the runtime refused, or the container is no longer the pinned one.
        """
        target = self.identity or self.inspect(timeout=INSPECT_TIMEOUT)
        found = self._lifecycle(start_command(self.settings, target.id), target, "start", timeout)
        if self.identity is None and found.running:
            self.identity = found
        return found

    def _lifecycle(
        self, command: Command, pinned: ContainerIdentity, verb: str, timeout: float
    ) -> ContainerIdentity:
        """The runtime's `verb` of the container run on the host; the container inspected."""
        result = self.inner.run(command, timeout=timeout)
        if not result.ok:
            words = runtime_words(result)
            if _has(words, _MISSING_WORDS):
                raise self._gone(pinned, words)
            raise self._error(f"did not {verb}: {words}", reason=Reason.RUNTIME_FAILED)
        return self.inspect(timeout=INSPECT_TIMEOUT)

    def close(self) -> None:
        self.inner.close()

    # -- what went wrong, in the runtime's words ---------------------------------------------

    def _gone(self, pinned: ContainerIdentity, words: str) -> ContainerError:
        """The pinned container cannot run the command: recreated, stopped or removed."""
        try:
            now = self.inspect()
        except ContainerError:
            return self._error(
                f"(id {pinned.id[:12]}) is gone: {words}; nothing was run in it",
                reason=Reason.CONTAINER_MISSING,
            )
        if now.id != pinned.id:
            return self._error(
                f"was recreated since this run first reached it (id {pinned.id[:12]}, created "
                f"{pinned.created}; now id {now.id[:12]}, created {now.created}); nothing was "
                "run in the new one",
                reason=Reason.CONTAINER_RECREATED,
                hint="run the command again: it plans against the new container's files",
            )
        return self._error(
            f"(id {pinned.id[:12]}) is not running (status {now.status or 'unknown'}): {words}; "
            "nothing was run in it",
            reason=Reason.CONTAINER_NOT_RUNNING,
        )

    def _runtime_refusal(self, result: CommandResult) -> ContainerError:
        words = runtime_words(result)
        runtime = self.settings.runtime
        if result.exit_code == _NO_RUNTIME_STATUS or (
            "not found" in words and runtime in words and "container" not in words.lower()
        ):
            return self._error(
                f"cannot be reached: {runtime} is not installed on the host ({words})",
                reason=Reason.RUNTIME_MISSING,
                hint=f"install {runtime} on the host, or fix the inventory's container.runtime",
            )
        if _has(words, _MISSING_WORDS):
            return self._error(
                f"does not exist on the host ({runtime} says: {words})",
                reason=Reason.CONTAINER_MISSING,
                hint=f"check `{runtime} ps -a` on the host and the inventory's container.name",
            )
        limit = refused_rlimit(words)
        if limit is not None:
            return self._error(
                f"cannot be reached: {runtime} could not set {limit} for it, higher than the "
                f"host allows ({words})",
                reason=Reason.RUNTIME_RLIMIT,
                hint=f"on the host, {rlimit_hint(runtime)}",
            )
        if _has(words, _PERMISSION_WORDS):
            return self._error(
                f"cannot be reached: the login user may not use {runtime} ({words})",
                reason=Reason.RUNTIME_NOT_ALLOWED,
                hint=f"log in as a user allowed to run {runtime} (root for rootful podman, the "
                "docker group for docker)",
            )
        return self._error(
            f"cannot be inspected: {runtime} says: {words}", reason=Reason.RUNTIME_FAILED
        )

    def _error(self, what: str, *, reason: Reason, hint: str | None = None) -> ContainerError:
        return ContainerError(
            f"container {self.settings.name} ({self.settings.runtime}) {what}",
            host=self.host,
            step="container",
            hint=hint,
            reason=reason,
        )
