"""`status` on a host whose engine runs in a container, over scripted hosts (tests/scriptedkit.py)
whose transport pins a container as the container transport does: on its first exec, not
before. A fix written in one container is lost when the container is recreated from its image,
and `status` says so (tests/test_containers.py proves the same on real podman)."""

from __future__ import annotations

import pytest

from opspatch.hosts.containers import ContainerIdentity
from opspatch.runs.commands.status import PatchStatus, fleet_status
from tests.scriptedkit import PRISTINE, STANDIN, FakeHost, Fleet, fleet, sha

__all__ = ["fleet"]  # the fixture, used by name

pytestmark = pytest.mark.scripted


def container(id_: str, created: str) -> ContainerIdentity:
    return ContainerIdentity(
        "podman", "sglang-0", id_, created, "lmsysorg/sglang:v0.5.23", True, "running"
    )


def status(fleet: Fleet, host: FakeHost) -> PatchStatus:
    (said,) = fleet_status([host.host()], [fleet.patch], fleet.factory, fleet.ledger)
    return said


def test_status_reads_the_container_its_first_command_pinned(fleet: Fleet) -> None:
    host = fleet.hosts[0]
    fleet.hosts = [host]
    host.container = container("a" * 64, "2026-12-06 10:00:00")
    (applied,) = fleet.apply().hosts
    assert applied.outcome == "applied", applied
    said = status(fleet, host)
    assert (said.state, said.recreated) == ("applied", None), said

    # recreated from its image: a new id, and the fix went with the old writable layer
    host.container = container("b" * 64, "2026-12-06 11:00:00")
    host.file.write_bytes((STANDIN / "eagle_worker_v2.py").read_bytes())
    assert sha(host.file.read_bytes()) == PRISTINE
    said = status(fleet, host)
    assert (said.state, said.recreated) == ("not-applied", True), said
    assert "b" * 12 in said.detail  # the container it reads now, named
