"""pytest plugin: a fleet of real OpenSSH servers on 127.0.0.2, 127.0.0.3 and 127.0.0.4.

The servers (`opspatch.sandbox.sshd`) run for the whole session with generated host and user keys and a
pinned known_hosts file in a temporary folder; the user's own `~/.ssh` is never read or written.
Tests that need them are skipped, with the reason shown, when OpenSSH's sshd is not installed.

Fixtures:
- `ssh_fleet`: the running fleet (`opspatch.sandbox.sshd.SshFleet`).
- `remote_target`: parametrised over the two transports (`local`, `ssh`), with the resident host
  agent (the default), and over SSH with one interpreter per request (`ssh-per-exec`, the
  inventory's `agent = "per-exec"`): a resolved inventory `Host` whose engine interpreter is
  this Python, its transport, and `HostOperations` on it. Every host-side operation test takes
  it, so each runs over both transports and both ways of running the agent.
- `make_inventory_host`: `inventory_host(...)`, which builds a local or SSH host through the real
  inventory parser (a fixture, so test modules need not import this plugin module).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.core.host import Host
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.hosts.transport.base import Transport
from opspatch.sandbox.sshd import SshdError, SshFleet, find_sshd, start_ssh_fleet, stop_ssh_fleet

FLEET_ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


@pytest.fixture(scope="session")
def ssh_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshFleet]:
    """Three real sshd servers on loopback; stopped by pid at the end of the session."""
    if find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")
    try:
        fleet = start_ssh_fleet(tmp_path_factory.mktemp("sshfleet"), FLEET_ADDRESSES)
    except SshdError as exc:
        pytest.fail(f"sshd is installed but the test fleet did not start: {exc}")
    try:
        yield fleet
    finally:
        stop_ssh_fleet(fleet)


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def inventory_host(
    kind: str,
    *,
    state_dir: Path,
    fleet: SshFleet | None = None,
    index: int = 0,
    name: str | None = None,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    known_hosts: Path | None = None,
    jump_index: int | None = None,
    agent: str | None = None,
) -> Host:
    """A host of kind `local` or `ssh` (server `index` of the fleet), parsed from TOML text."""
    name = name or f"{kind}-{index + 1}"
    lines = [f"[hosts.{_toml(name)}]", f"transport = {_toml(kind)}"]
    lines.append(f"state_dir = {_toml(str(state_dir))}")
    if agent is not None:
        lines.append(f"agent = {_toml(agent)}")

    def connection(server_index: int) -> list[str]:
        assert fleet is not None, "ssh hosts need the ssh_fleet fixture"
        server = fleet.servers[server_index]
        return [
            f"address = {_toml(server.address)}",
            f"port = {server.port}",
            f"user = {_toml(fleet.user)}",
            f"identity_file = {_toml(str(fleet.user_key.private_key))}",
            f"known_hosts = {_toml(str(known_hosts or fleet.known_hosts))}",
        ]

    if kind == "ssh":
        lines.extend(connection(index))
        if jump_index is not None:
            lines.append('jump = "jump-host"')
    lines.append(f"engine = {{ python = {_toml(python)}, env = {{ {_env(env)} }} }}")
    if jump_index is not None:
        lines.append("[hosts.jump-host]")
        lines.extend(connection(jump_index))
    inventory = parse_inventory("\n".join(lines) + "\n", str(state_dir.parent / "test.toml"))
    return inventory.host(name)


def _env(env: Mapping[str, str] | None) -> str:
    return ", ".join(f"{key} = {_toml(value)}" for key, value in (env or {}).items())


@dataclass
class Target:
    """One host under test: its inventory entry, its transport and host operations on it."""

    kind: str
    host: Host
    transport: Transport
    ops: HostOperations
    fleet: SshFleet | None

    def with_host(self, host: Host) -> HostOperations:
        """Host operations for another inventory entry over the same transport."""
        return HostOperations(self.transport, host)


HostMaker = Callable[..., Host]


@pytest.fixture
def make_inventory_host() -> HostMaker:
    """`inventory_host`, for tests that build their own hosts."""
    return inventory_host


@pytest.fixture(
    params=[
        "local",
        pytest.param("ssh", marks=pytest.mark.ssh),
        pytest.param("ssh-per-exec", marks=pytest.mark.ssh),
    ]
)
def remote_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    kind, _, agent = str(request.param).partition("-")
    fleet: SshFleet | None = request.getfixturevalue("ssh_fleet") if kind == "ssh" else None
    host = inventory_host(kind, fleet=fleet, state_dir=tmp_path / "host-state", agent=agent or None)
    transport = open_transport(host)
    try:
        yield Target(kind, host, transport, HostOperations(transport, host), fleet)
    finally:
        transport.close()
