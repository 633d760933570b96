"""The local transport: run a command on this machine, as the SSH transport does remotely."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time

from opspatch.errors import CommandTimeout, TransportError
from opspatch.hosts.transport.base import ClosesOnExit, Command, CommandResult, Process

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
        self._processes: list[LocalProcess] = []

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

    def start_process(self, command: Command) -> Process:
        """`command` kept running through `/bin/sh -c`, in its own process group, its stdin
        open (`LocalProcess`); ended when this transport closes.

        Raises:
            TransportError: `/bin/sh` could not be started.
        """
        process = LocalProcess(self, command)
        self._processes.append(process)
        return process

    def close(self) -> None:
        """End the commands kept running (`start_process`); safe to call twice."""
        processes, self._processes = self._processes, []
        for process in processes:
            process.close()


class LocalProcess:
    """A command kept running on this machine (`LocalTransport.start_process`): lines in and out."""

    def __init__(self, owner: LocalTransport, command: Command) -> None:
        self._owner = owner
        try:
            self._process = subprocess.Popen(
                ["/bin/sh", "-c", command.render()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise TransportError(
                f"cannot start /bin/sh: {exc.strerror}", host=owner.host, step="exec"
            ) from None
        assert self._process.stdin and self._process.stdout and self._process.stderr
        self._stdin = self._process.stdin.fileno()
        self._stdout = self._process.stdout.fileno()
        self._stderr = self._process.stderr.fileno()
        for fd in (self._stdin, self._stdout, self._stderr):
            os.set_blocking(fd, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._stdout, selectors.EVENT_READ)
        self._selector.register(self._stderr, selectors.EVENT_READ)
        self._out = bytearray()
        self._err = bytearray()
        self._eof = False
        self._released = False

    @property
    def ended(self) -> bool:
        return self._eof or self._released or self._process.poll() is not None

    @property
    def lost(self) -> bool:
        return False  # nothing between this process and the controller can break

    def _wait(self, seconds: float, *, writing: bool = False) -> bool:
        """Take the output that comes within `seconds`; whether stdin has room (`writing`)."""
        if writing:
            self._selector.register(self._stdin, selectors.EVENT_WRITE)
        try:
            ready = self._selector.select(seconds) if self._selector.get_map() else []
        finally:
            if writing:
                self._selector.unregister(self._stdin)
        room = False
        for key, _ in ready:
            if key.fd == self._stdin:
                room = True
                continue
            data = os.read(key.fd, _CHUNK)
            if key.fd == self._stdout:
                self._out += data
            elif len(self._err) < self._owner._max_output:
                self._err += data[: self._owner._max_output - len(self._err)]
            if not data:
                self._selector.unregister(key.fd)
                self._eof = self._eof or key.fd == self._stdout
        return room

    def send(self, data: bytes, *, deadline: float) -> int | None:
        self._owner.exec_count += 1
        view = memoryview(data)
        offset = 0
        while offset < len(view) and not self.ended:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if self._wait(min(remaining, 0.5), writing=True):
                try:
                    offset += os.write(self._stdin, view[offset : offset + _CHUNK])
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    break  # it ended: `read_line` tells whether it took anything
        return offset

    def read_line(self, *, deadline: float) -> bytes | None:
        while True:
            end = self._out.find(b"\n")
            if end >= 0:
                line = bytes(self._out[: end + 1])
                del self._out[: end + 1]
                return line
            if self._eof or self._released:
                rest = bytes(self._out)
                self._out.clear()
                return rest
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._wait(min(remaining, 0.5))

    def exit_status(self, *, deadline: float) -> int | None:
        try:
            code = self._process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
        return exit_status(code)

    def take_stderr(self) -> bytes:
        while not self._released and self._selector.get_map():
            before = len(self._out) + len(self._err)
            self._wait(0)
            if len(self._out) + len(self._err) == before:
                break
        taken = bytes(self._err)
        self._err.clear()
        return taken

    def end(self) -> str:
        _end_process_group(self._process, self._owner._kill_grace)
        self._release()
        return "its process group was ended"

    def close(self) -> None:
        if self._released:
            return
        with contextlib.suppress(OSError):
            self._process.stdin.close()  # type: ignore[union-attr]
        try:
            self._process.wait(timeout=self._owner._kill_grace)
        except subprocess.TimeoutExpired:  # still answering a request nobody waits for
            _end_process_group(self._process, self._owner._kill_grace)
        self._release()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        self._selector.close()
        for stream in (self._process.stdin, self._process.stdout, self._process.stderr):
            if stream is not None and not stream.closed:
                stream.close()
        with contextlib.suppress(ValueError):
            self._owner._processes.remove(self)


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
