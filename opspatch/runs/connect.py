"""How a run opens its hosts' transports: a factory with the run's host-key policy, passed to
every session (one transport per host per run). The transports themselves are opened by
`opspatch.hosts.operations.open_transport`, which imports the SSH libraries only for the first
SSH host, so commands that reach no host over SSH start without them.
"""

from __future__ import annotations

from collections.abc import Callable

from opspatch.core.host import Host
from opspatch.hosts.operations import open_transport
from opspatch.hosts.transport.base import Transport

TransportFactory = Callable[[Host], Transport]
"""Opens (lazily: nothing connects before the first command) the transport of one host."""


def transport_factory(*, accept_new_host_keys: bool = False) -> TransportFactory:
    """A factory opening each host's transport with the run's host-key policy."""

    def make(host: Host) -> Transport:
        return open_transport(host, accept_new_host_keys=accept_new_host_keys)

    return make
