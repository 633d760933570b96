"""`sandbox up --restart-seconds S`: every engine start takes S more seconds, as a real model's
weight loading and CUDA graph capture do, so rollouts can be measured as on a real fleet.

Planned (pure): the manifest keeps S for later `up`s, the inventories put it into every engine's
environment (so restarts by a rollout take it too), `up` waits that much longer, bad values and
containers are refused. On a real stand-in (engine): the weight load takes at least S.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.errors import InputError
from opspatch.sandbox.layout import STANDIN_LOAD_ENV, SandboxLayout, sandbox_playbook
from opspatch.sandbox.manifest import HostRecord, Manifest, render_inventory
from opspatch.sandbox.plan import UpRequest, planned_manifest
from tests.standin import make_host, running_engine

LAYOUT = SandboxLayout(Path("/state"))
SANDBOX = Manifest((HostRecord("sandbox-01", 30000), HostRecord("sandbox-02", 30001)))


@pytest.mark.pure
def test_every_engines_environment_carries_the_delay_and_a_sandbox_without_one_none() -> None:
    slow = Manifest(SANDBOX.hosts, restart_seconds=60.0)
    inventory = parse_inventory(render_inventory(LAYOUT, slow, over_ssh=False), "sandbox.toml")
    for name in ("sandbox-01", "sandbox-02"):
        assert inventory.host(name).engine.env[STANDIN_LOAD_ENV] == "60"
    plain = parse_inventory(render_inventory(LAYOUT, SANDBOX, over_ssh=False), "sandbox.toml")
    assert STANDIN_LOAD_ENV not in plain.host("sandbox-01").engine.env


@pytest.mark.pure
def test_the_manifest_keeps_the_delay_for_later_ups_and_up_waits_for_it() -> None:
    slow, _ = planned_manifest(None, UpRequest(count=2, restart_seconds=60.0))
    assert slow.restart_seconds == 60.0
    assert Manifest.from_json(slow.to_json(), Path("/m")) == slow
    kept, _ = planned_manifest(slow, UpRequest())
    assert kept.restart_seconds == 60.0
    changed, _ = planned_manifest(slow, UpRequest(restart_seconds=0.0))
    assert changed.restart_seconds == 0.0
    older = SANDBOX.to_json()
    del older["restart_seconds"]  # a manifest written before the delay was recorded
    assert Manifest.from_json(older, Path("/m")).restart_seconds == 0.0
    assert sandbox_playbook(60.0).timeouts.ready == sandbox_playbook().timeouts.ready + 60.0


@pytest.mark.pure
@pytest.mark.parametrize(
    ("seconds", "containers", "said"),
    [
        (-1.0, None, "--restart-seconds must be between 0 and 3600 (got -1)"),
        (float("nan"), None, "--restart-seconds must be between 0 and 3600"),
        (5.0, True, "--restart-seconds does not go with --containers yet"),
    ],
)
def test_a_bad_delay_or_one_with_containers_is_refused(
    seconds: float, containers: bool | None, said: str
) -> None:
    with pytest.raises(InputError) as caught:
        planned_manifest(None, UpRequest(1, containers=containers, restart_seconds=seconds))
    assert said in caught.value.message


@pytest.mark.engine
def test_the_standins_weight_load_takes_the_delay(tmp_path: Path) -> None:
    host = make_host(tmp_path / "host")
    env = {STANDIN_LOAD_ENV: "2"}
    with running_engine(host, ("--disable-cuda-graph",), env=env) as engine:
        loads = re.findall(
            r"Load weight end\. type=Tiny\w+.*elapsed=([0-9.]+) s", engine.log_text()
        )
    # the target model's load waits; the draft model's does not
    assert len(loads) == 2 and float(loads[0]) >= 2.0 and float(loads[1]) < 2.0, loads
