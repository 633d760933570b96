"""A latency relay: one TCP proxy per host that delays each direction and counts connections.

`tc netem` is not available on these machines, so a remote data centre is modelled here: the
controller connects to `127.0.0.1:<relay port>`, the relay connects on to the host's sshd, and
every chunk read from either side is written to the other side `delay` seconds after it
arrived (RTT/2 each way, so a request and its answer cost one RTT). Chunks keep their order and
are not throttled: only latency is added, no bandwidth limit, as on a fast long link.

All relays of a benchmark run on one asyncio loop in a daemon thread of the harness, so their
CPU is never counted as a tool's (the tools are measured as separate processes). The delay can
be changed between runs (`set_rtt`); ports stay the same, so one inventory serves every RTT.

Counters per relay (read with `snapshot`): connections accepted, bytes each way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

CHUNK = 64 * 1024


@dataclass(frozen=True)
class RelayCounts:
    """What one relay has carried since it started."""

    connections: int
    bytes_up: int  # controller -> host
    bytes_down: int  # host -> controller


class _Counter:
    def __init__(self) -> None:
        self.connections = 0
        self.bytes_up = 0
        self.bytes_down = 0


class RelaySet:
    """Relays for several upstream addresses, each on its own port of `listen_address`.

    Use as a context manager, or call `start` and `stop`. `ports[i]` is where upstream `i` is
    reached.
    """

    def __init__(
        self, upstreams: Sequence[tuple[str, int]], listen_address: str = "127.0.0.1"
    ) -> None:
        self._upstreams = list(upstreams)
        self._listen = listen_address
        self._delay = 0.0
        self._counters = [_Counter() for _ in self._upstreams]
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.base_events.Server] = []
        self._thread = threading.Thread(target=self._run, name="bench-relay", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.ports: list[int] = []

    # lifecycle -----------------------------------------------------------------------------

    def start(self) -> RelaySet:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError(f"relay did not start: {self._error}") from self._error
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
        with contextlib.suppress(Exception):
            future.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> RelaySet:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # settings and counters ---------------------------------------------------------------------

    def set_rtt(self, rtt_ms: float) -> None:
        """Delay each direction by half of `rtt_ms` from now on (new chunks only)."""
        self._delay = max(0.0, rtt_ms) / 2000.0

    def snapshot(self) -> list[RelayCounts]:
        return [RelayCounts(c.connections, c.bytes_up, c.bytes_down) for c in self._counters]

    # the loop ------------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._open())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    async def _open(self) -> None:
        for index in range(len(self._upstreams)):
            server = await asyncio.start_server(
                functools.partial(self._serve, index), self._listen, 0, backlog=256
            )
            self._servers.append(server)
            self.ports.append(int(server.sockets[0].getsockname()[1]))

    async def _close(self) -> None:
        for server in self._servers:
            server.close()
        for task in asyncio.all_tasks(self._loop):
            if task is not asyncio.current_task():
                task.cancel()

    async def _serve(
        self, index: int, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        counter = self._counters[index]
        counter.connections += 1
        host, port = self._upstreams[index]
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(
                self._pump(client_reader, upstream_writer, counter, up=True),
                self._pump(upstream_reader, client_writer, counter, up=False),
            )
        except asyncio.CancelledError:
            pass  # the relay is stopping: a cancelled connection is not an error to report
        finally:
            for writer in (client_writer, upstream_writer):
                writer.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        counter: _Counter,
        *,
        up: bool,
    ) -> None:
        """Copy one direction; each chunk leaves `delay` seconds after it arrived."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    with contextlib.suppress(OSError):
                        if writer.can_write_eof():
                            writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while True:
                try:
                    data = await reader.read(CHUNK)
                except (ConnectionError, OSError):
                    data = b""
                if up:
                    counter.bytes_up += len(data)
                else:
                    counter.bytes_down += len(data)
                queue.put_nowait((loop.time() + self._delay, data))
                if not data:
                    break
            await sender
        except (ConnectionError, OSError):
            sender.cancel()
