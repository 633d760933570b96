"""Opening a host's transport: the one place a run turns an inventory host into a connection.

The SSH transport (paramiko and fabric, about 150 ms to import) is imported only when a host
that uses it is opened, so `opspatch --version`, `check`, `schema` and local-file commands never
pay for it.
"""

from __future__ import annotations

from collections.abc import Callable

from opspatch.core.host import Host
from opspatch.hosts.transport.base import Transport
from opspatch.hosts.transport.local import LocalTransport

TransportFactory = Callable[[Host], Transport]
"""Opens (lazily: nothing connects before the first command) the transport of one host."""


def open_transport(host: Host, *, accept_new_host_keys: bool = False) -> Transport:
    """The transport the inventory says this host uses (nothing is connected yet)."""
    if host.transport == "local":
        return LocalTransport(host.name)
    from opspatch.hosts.transport.ssh import SSHTransport  # noqa: PLC0415 - see module docstring

    return SSHTransport(host, accept_new_host_keys=accept_new_host_keys)


def transport_factory(*, accept_new_host_keys: bool = False) -> TransportFactory:
    """A factory opening each host's transport with the run's host-key policy."""

    def make(host: Host) -> Transport:
        return open_transport(host, accept_new_host_keys=accept_new_host_keys)

    return make
