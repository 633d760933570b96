"""The local transport: run a command on this machine, the same way the SSH transport does remotely.

Used for inventory hosts with `transport = "local"` (the sandbox fleet, or a controller that is
itself a GPU host). The command is `Command.render()` run by `/bin/sh -c`, so quoting is exactly
what a remote shell sees. Each command runs in a new session (its own process group): on a
deadline the whole group is ended (TERM, a short grace, then KILL), not just the shell, so a
hung child cannot outlive the run.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time

from opspatch.errors import CommandTimeout, TransportError
from opspatch.hosts.transport.base import ClosesOnExit, Command, CommandResult

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024 * 1024
"""Output kept per stream; a command that floods past this is still drained, the rest dropped."""

_CHUNK = 64 * 1024


class CappedBuffer:
    """Collects one output stream, keeping at most `limit` bytes and counting what it drops.

    Draining must continue even when nothing more is kept: a writer blocked on a full pipe would
    otherwise hang until its deadline.
    """

    def __init__(self, limit: int = DEFAULT_MAX_OUTPUT_BYTES) -> None:
        self._chunks: list[bytes] = []
        self._kept = 0
        self._limit = limit
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self._limit - self._kept
        if room > 0:
            self._chunks.append(data[:room])
            self._kept += min(room, len(data))
        self.dropped += max(0, len(data) - max(room, 0))

    def value(self) -> bytes:
        """The kept bytes; a note at the end says how much was dropped, if anything was."""
        data = b"".join(self._chunks)
        if self.dropped:
            data += f"\n[opspatch: {self.dropped} more bytes of output dropped]\n".encode()
        return data

    def peek(self) -> bytes:
        return b"".join(self._chunks)


def exit_status(returncode: int) -> int:
    """Shell-style exit status: a process killed by signal N reports 128 + N (as `sh` does)."""
    return 128 - returncode if returncode < 0 else returncode


class LocalTransport(ClosesOnExit):
    """Runs commands on this machine through `/bin/sh -c`, each in its own process group.

    `host` is the inventory name used in messages. Not thread-safe: one transport per host,
    used by one worker at a time (as for SSH).
    """

    def __init__(
        self,
        host: str = "local",
        *,
        kill_grace_seconds: float = 2.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        self.host = host
        self.exec_count = 0
        self._kill_grace = kill_grace_seconds
        self._max_output = max_output_bytes

    @property
    def on_controller(self) -> bool:
        """This machine is the controller, and the commands run as this process's user."""
        return True

    def run(self, command: Command, *, stdin: bytes = b"", timeout: float) -> CommandResult:
        """Run `command` with `stdin`, draining stdout and stderr, within `timeout` seconds.

        Raises:
            CommandTimeout: the deadline passed; the command's process group was ended.
            TransportError: `/bin/sh` could not be started.
        """
        self.exec_count += 1
        started = time.monotonic()
        deadline = started + timeout
        try:
            process = subprocess.Popen(
                ["/bin/sh", "-c", command.render()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise TransportError(
                f"cannot start /bin/sh: {exc.strerror}", host=self.host, step="exec"
            ) from None
        stdout = CappedBuffer(self._max_output)
        stderr = CappedBuffer(self._max_output)
        try:
            finished = _pump(process, stdin, stdout, stderr, deadline)
        except BaseException:
            _end_process_group(process, self._kill_grace)
            raise
        if not finished:
            _end_process_group(process, self._kill_grace)
            raise CommandTimeout(
                f"`{command.describe()}` ran past its {timeout:g}s deadline; "
                "its process group was ended",
                host=self.host,
                step="exec",
            )
        return CommandResult(
            command=command.masked(),
            exit_code=exit_status(process.returncode),
            stdout=stdout.value(),
            stderr=stderr.value(),
            seconds=time.monotonic() - started,
        )

    def close(self) -> None:
        """Nothing to release (each command is its own process); safe to call twice."""


def _pump(
    process: subprocess.Popen[bytes],
    stdin: bytes,
    stdout: CappedBuffer,
    stderr: CappedBuffer,
    deadline: float,
) -> bool:
    """Feed stdin and drain both outputs until the process exits; False if the deadline passed."""
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    selector = selectors.DefaultSelector()
    sinks = {process.stdout.fileno(): stdout, process.stderr.fileno(): stderr}
    for fd in sinks:
        selector.register(fd, selectors.EVENT_READ)
    stdin_fd = process.stdin.fileno()
    view = memoryview(stdin)
    offset = 0
    if stdin:
        os.set_blocking(stdin_fd, False)
        selector.register(stdin_fd, selectors.EVENT_WRITE)
    else:
        process.stdin.close()
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            for key, _ in selector.select(min(remaining, 0.5)):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        offset += os.write(fd, view[offset : offset + _CHUNK])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        offset = len(view)  # the command stopped reading; not an error here
                    if offset >= len(view):
                        selector.unregister(fd)
                        process.stdin.close()
                    continue
                data = os.read(fd, _CHUNK)
                if data:
                    sinks[fd].add(data)
                else:
                    selector.unregister(fd)
        # Both outputs are closed; the process may still be running (it closed them itself).
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        return True
    finally:
        selector.close()
        for stream in (process.stdin, process.stdout, process.stderr):
            if not stream.closed:
                stream.close()


def _end_process_group(process: subprocess.Popen[bytes], grace: float) -> None:
    """TERM the command's process group, give it `grace` seconds, then KILL what is left."""
    pgid = process.pid  # start_new_session: the shell leads its own group
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):  # the whole group may be gone already
            os.killpg(pgid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
