"""A run's transport factory, with its host-key policy (SSH libraries load with the first SSH host)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from opspatch.core.host import Host
from opspatch.hosts.become import BecomePasswords
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.hosts.transport.base import Transport

TransportFactory = Callable[[Host], Transport]
"""Opens (lazily: nothing connects before the first command) the transport of one host."""


@dataclass(frozen=True)
class Connector:
    """A `TransportFactory` with the run's host-key policy and the run's sudo passwords."""

    accept_new_host_keys: bool = False
    passwords: BecomePasswords = field(default_factory=BecomePasswords)

    def __call__(self, host: Host) -> Transport:
        return open_transport(host, accept_new_host_keys=self.accept_new_host_keys)


def transport_factory(
    *, accept_new_host_keys: bool = False, passwords: BecomePasswords | None = None
) -> Connector:
    """`passwords`: the run's sudo password sources (default: environment variables only, no
    prompt)."""
    return Connector(accept_new_host_keys, passwords or BecomePasswords())


def become_passwords(factory: TransportFactory) -> BecomePasswords:
    """The sudo passwords of the run `factory` belongs to (environment only for a plain one)."""
    return factory.passwords if isinstance(factory, Connector) else BecomePasswords()


@contextmanager
def opened(factory: TransportFactory, host: Host) -> Iterator[HostOperations]:
    """One host's operations over a transport of its own, closed after (a reading command's)."""
    transport = factory(host)
    try:
        yield HostOperations(transport, host)
    finally:
        transport.close()
