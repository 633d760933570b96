"""The router's settings and the drain capacity, as table cases (the behaviour against the real
router binary is in test_router_rollout.py)."""

from __future__ import annotations

import textwrap
from decimal import Decimal

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.core.host import canonical_url
from opspatch.core.policy import BatchSize, Playbook, RotationSettings
from opspatch.core.vocabulary import Outcome, Rotation
from opspatch.errors import RouterRefused, SpecError
from opspatch.hosts.router import RouterWorker
from opspatch.runs.fleet.rotation import drain_room, halt_on_out_of_rotation
from opspatch.runs.report import HostOutcome

pytestmark = pytest.mark.pure


def inventory(text: str) -> str:
    return textwrap.dedent(text)


def test_the_router_is_merged_key_by_key_and_the_worker_url_defaults_to_the_engine_url() -> None:
    hosts = parse_inventory(
        inventory(
            """
            [defaults]
            transport = "local"
            router = { url = "http://Router:8000/", admin_key_env = "ROUTER_KEY" }
            [hosts.a.engine]
            url = "http://10.0.0.1:30000/"
            [hosts.b]
            router = { worker_url = "http://gpu-b.internal:30000" }
            [hosts.c]
            """
        ),
        "/ws/inventories/fleet.toml",
    ).hosts
    routers = {h.name: h.router for h in hosts}
    assert routers["a"] is not None and routers["b"] is not None and routers["c"] is not None
    assert routers["a"].url == "http://router:8000"
    assert routers["a"].worker_url == "http://10.0.0.1:30000"
    assert routers["a"].admin_key_env == "ROUTER_KEY"
    assert routers["b"].worker_url == "http://gpu-b.internal:30000"
    assert routers["b"].url == "http://router:8000"
    assert routers["c"].worker_url == "http://127.0.0.1:30000"


def test_a_host_without_a_router_has_none() -> None:
    (host,) = parse_inventory('[hosts.a]\ntransport = "local"\n', "/ws/inventories/x.toml").hosts
    assert host.router is None


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        (
            '[hosts.a]\ntransport = "local"\nrouter = { url = "http://r:1", admin_key = "s3cret" }\n',
            "x.toml:3: hosts.a.router.admin_key",
            "a router key does not belong in an inventory",
        ),
        (
            '[hosts.a]\ntransport = "local"\nrouter = { worker_url = "http://w:1" }\n',
            "x.toml:3: hosts.a.router",
            "the router has no url",
        ),
        (
            '[hosts.a]\ntransport = "local"\nrouter = { url = "router:1" }\n',
            "x.toml:3: hosts.a.router.url",
            "is not a server URL",
        ),
    ],
)
def test_a_bad_router_table_is_refused_at_its_line(text: str, where: str, says: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_inventory(text, "/ws/inventories/x.toml")
    rendered = caught.value.render()
    assert where in rendered and says in rendered
    assert "s3cret" not in rendered


def test_canonical_url_drops_the_trailing_slash_and_lowercases_scheme_and_host() -> None:
    assert canonical_url("HTTP://GPU-1:30000/") == "http://gpu-1:30000"
    assert canonical_url("http://h:1/v1/") == "http://h:1/v1"


def _hosts(count: int) -> list:
    text = '[defaults]\ntransport = "local"\nrouter = { url = "http://r:1" }\n' + "".join(
        f'[hosts.h{i}.engine]\nurl = "http://w{i}:1"\n' for i in range(count)
    )
    return list(parse_inventory(text, "/ws/inventories/x.toml").hosts)


def _book(max_unavailable: BatchSize, fleet_down: bool = False) -> Playbook:
    return Playbook(rotation=RotationSettings(max_unavailable, fleet_down))


@pytest.mark.parametrize(
    ("healthy", "unhealthy", "limit", "fleet_down", "room"),
    [
        (3, 0, BatchSize(count=1), False, 1),
        (10, 0, BatchSize(percent=Decimal(10)), False, 1),
        (10, 0, BatchSize(percent=Decimal(30)), False, 3),
        (3, 0, BatchSize(percent=Decimal(100)), False, 2),  # never the last healthy worker
        (3, 1, BatchSize(count=2), False, 1),  # a failing worker counts as unavailable
        (1, 2, BatchSize(percent=Decimal(100)), True, 1),  # the fleet is down: go on
    ],
)
def test_drain_room(
    healthy: int, unhealthy: int, limit: BatchSize, fleet_down: bool, room: int
) -> None:
    hosts = _hosts(healthy + unhealthy)
    listed = [
        RouterWorker(f"id{i}", f"http://w{i}:1", healthy=i < healthy)
        for i in range(healthy + unhealthy)
    ]
    assert drain_room("http://r:1", listed, hosts, _book(limit, fleet_down), refuse=True) == room


@pytest.mark.parametrize(
    ("healthy", "unhealthy", "limit", "says"),
    [
        (1, 0, BatchSize(percent=Decimal(100)), "would leave it no healthy worker"),
        (2, 1, BatchSize(count=1), "would take more than max_unavailable = 1"),
    ],
)
def test_a_drain_without_room_is_refused(
    healthy: int, unhealthy: int, limit: BatchSize, says: str
) -> None:
    hosts = _hosts(healthy + unhealthy)
    listed = [
        RouterWorker(f"id{i}", f"http://w{i}:1", healthy=i < healthy)
        for i in range(healthy + unhealthy)
    ]
    with pytest.raises(RouterRefused) as caught:
        drain_room("http://r:1", listed, hosts, _book(limit), refuse=True)
    assert says in caught.value.message and "nothing was changed" in caught.value.message
    assert drain_room("http://r:1", listed, hosts, _book(limit), refuse=False) == 0


def test_a_worker_registered_nowhere_counts_as_unavailable() -> None:
    hosts = _hosts(3)
    listed = [RouterWorker("id0", "http://w0:1", True), RouterWorker("id1", "http://w1:1", True)]
    with pytest.raises(RouterRefused, match="1 already unavailable"):
        drain_room("http://r:1", listed, hosts, _book(BatchSize(count=1)), refuse=True)


def test_a_host_left_out_of_rotation_halts_the_run() -> None:
    outcomes = {
        "a": HostOutcome("a", Outcome.APPLIED, rotation=Rotation.IN_ROTATION),
        "b": HostOutcome("b", Outcome.APPLIED, rotation=Rotation.OUT_OF_ROTATION),
    }
    assert "b left out of rotation" in (halt_on_out_of_rotation(outcomes) or "")
    assert halt_on_out_of_rotation({"a": outcomes["a"]}) is None
    assert HostOutcome("a", Outcome.APPLIED).to_json().get("rotation") is None
    assert outcomes["b"].to_json()["rotation"] == "out-of-rotation"


def test_every_host_of_the_inventory_behind_a_router_is_one_of_its_peers() -> None:
    hosts = _hosts(3)
    expected = ("http://w0:1", "http://w1:1", "http://w2:1")
    assert all(h.router is not None and h.router.peers == expected for h in hosts)


def test_a_worker_outside_the_run_that_the_router_no_longer_lists_counts_as_unavailable() -> None:
    """Only h0 is in the run; w2 (the inventory's) was removed from the router by hand."""
    (canary, *_) = _hosts(3)
    listed = [RouterWorker("id0", "http://w0:1", True), RouterWorker("id1", "http://w1:1", True)]
    with pytest.raises(RouterRefused, match=r"1 already unavailable: http://w2:1\)"):
        drain_room("http://r:1", listed, [canary], _book(BatchSize(count=1)), refuse=True)
    assert drain_room("http://r:1", listed, [canary], _book(BatchSize(count=2)), refuse=True) == 1


def test_a_worker_outside_the_run_that_the_router_lists_unhealthy_counts_as_unavailable() -> None:
    (canary, *_) = _hosts(3)
    listed = [
        RouterWorker("id0", "http://w0:1", True),
        RouterWorker("id1", "http://w1:1", True),
        RouterWorker("id2", "http://w2:1", False),
    ]
    with pytest.raises(RouterRefused, match="1 already unavailable"):
        drain_room("http://r:1", listed, [canary], _book(BatchSize(count=1)), refuse=True)


def test_one_server_listed_twice_is_one_healthy_worker() -> None:
    """Two registrations of one URL are one server: never counted as two healthy workers, so
    the drain of the other one is refused (it would leave the router none but that server)."""
    hosts = _hosts(2)
    listed = [
        RouterWorker("id0", "http://w0:1", True),
        RouterWorker("id0b", "http://w0:1", True),
        RouterWorker("id1", "http://w1:1", False),
    ]
    with pytest.raises(RouterRefused, match="has 1 healthy of 2 workers"):
        drain_room("http://r:1", listed, hosts, _book(BatchSize(percent=Decimal(100))), refuse=True)


def test_a_run_of_workers_the_router_already_cannot_use_needs_no_room() -> None:
    """h2 is down (the host an incident patches) and max_unavailable = 1 is spent on it: its
    drain takes nothing from the router, so it goes ahead; h0 with it would not."""
    hosts = _hosts(3)
    listed = [
        RouterWorker("id0", "http://w0:1", True),
        RouterWorker("id1", "http://w1:1", True),
        RouterWorker("id2", "http://w2:1", False),
    ]
    assert drain_room("http://r:1", listed, [hosts[2]], _book(BatchSize(count=1)), refuse=True) == 0
    with pytest.raises(RouterRefused, match="1 already unavailable: http://w2:1"):
        drain_room(
            "http://r:1", listed, [hosts[0], hosts[2]], _book(BatchSize(count=1)), refuse=True
        )
