"""The two-node unit the engine tests of units share: one server over two sandbox hosts, TP=2
on each (the stand-in's real gloo group of four ranks, each node its own process tree), reached
over sshd, in an isolated HOME; `sandbox down --purge` and any leftover process ended after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.faultkit import end_leftovers, isolated_home
from tests.fleetkit import SandboxFleet, require_sshd

HEAD, NODE = "sandbox-01", "sandbox-02"


@contextmanager
def two_node_unit(factory: pytest.TempPathFactory) -> Iterator[SandboxFleet]:
    """The unit `unit-01` (HEAD, NODE) up and serving (skipped where sshd is missing)."""
    require_sshd()
    with isolated_home(factory.mktemp("unit-home")):
        fleet = SandboxFleet(factory.mktemp("unit"), 2, ssh=True, nodes=2, tp=2).up()
        try:
            yield fleet
        finally:
            fleet.close()
            end_leftovers(fleet.root)
