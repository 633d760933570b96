"""`sandbox up --engine standin|sglang`, `--tp` for single servers and `--live`, planned (pure):
the manifest records the engine, TP and live and keeps them; the inventories start real SGLang
with its model, CPU flags and environment, or the stand-in as before; what real SGLang cannot do
in the sandbox is refused with the reason; a real host of 0.5.23 is an incident host (the
incident's build as its base patch, the build's switch and flags in its start)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.errors import InputError
from opspatch.sandbox.incident import INCIDENT_BUILD, INCIDENT_ENV, INCIDENT_SERVER_FLAGS
from opspatch.sandbox.layout import REAL_ENGINE_STOP_TIMEOUT, SandboxLayout, sandbox_playbook
from opspatch.sandbox.manifest import Manifest, RealEngineRecord, render_inventory
from opspatch.sandbox.plan import UpRequest, planned_manifest
from opspatch.sandbox.real.basepatches import base_patches_for
from opspatch.sandbox.real.release import STANDIN, EngineChoice
from opspatch.sandbox.units import UnitShape

pytestmark = pytest.mark.pure

LAYOUT = SandboxLayout(Path("/state"))
REAL = EngineChoice("sglang", "0.5.23")
PARTS = RealEngineRecord("/cache/base", "/cache/sglang.whl", "/cache/m/target", "/cache/m/draft")


def _inventory(manifest: Manifest):  # type: ignore[no-untyped-def]
    return parse_inventory(render_inventory(LAYOUT, manifest, over_ssh=False), "sandbox.toml")


def test_a_new_sandbox_runs_the_standin_and_keeps_what_it_was_built_with() -> None:
    plain, _ = planned_manifest(None, UpRequest(count=1))
    assert plain.engine == STANDIN and plain.tp == 1 and not plain.live
    real, _ = planned_manifest(None, UpRequest(count=2, engine=REAL, tp=2, live=True))
    assert (real.engine, real.tp, real.live) == (REAL, 2, True)
    kept, _ = planned_manifest(real, UpRequest())
    assert (kept.engine, kept.tp, kept.live) == (REAL, 2, True)
    off, _ = planned_manifest(real, UpRequest(live=False))
    assert not off.live
    recorded = Manifest.from_json(real.to_json(), Path("/m"))
    assert recorded == real
    older = plain.to_json()
    for key in ("engine", "real", "tp", "live"):
        del older[key]  # a manifest written before engines were recorded
    assert Manifest.from_json(older, Path("/m")) == plain


@pytest.mark.parametrize(
    ("current", "asked", "said"),
    [
        (None, UpRequest(engine=REAL, install="editable"), "--install editable does not go"),
        (None, UpRequest(engine=REAL, containers=True), "--containers does not go with --engine"),
        (None, UpRequest(containers=True, live=True), "--live does not go with --containers yet"),
        ("live", UpRequest(containers=True), "the sandbox's engines run without containers"),
        ("standin", UpRequest(engine=REAL), "the sandbox runs standin; `up --engine sglang=="),
        ("real", UpRequest(engine=STANDIN), "the sandbox runs sglang==0.5.23; `up --engine"),
        ("real", UpRequest(tp=3), "the sandbox's servers run 1 TP rank(s); `up --tp 3`"),
        (None, UpRequest(tp=0), "--tp must be at least 1"),
    ],
)
def test_what_cannot_be_is_refused_with_the_reason(
    current: str | None, asked: UpRequest, said: str
) -> None:
    built = {
        None: None,
        "standin": planned_manifest(None, UpRequest(count=1))[0],
        "real": planned_manifest(None, UpRequest(count=1, engine=REAL))[0],
        "live": planned_manifest(None, UpRequest(count=1, live=True))[0],
    }[current]
    with pytest.raises(InputError) as caught:
        planned_manifest(built, asked)
    assert said in caught.value.message


def test_the_inventory_starts_real_sglang_with_its_model_flags_and_environment() -> None:
    manifest, _ = planned_manifest(None, UpRequest(count=2, engine=REAL, tp=2, live=True))
    manifest = Manifest(
        manifest.hosts, engine=REAL, real=PARTS, tp=2, live=True
    )  # ports as up chooses them
    inventory = _inventory(manifest)
    host = inventory.host("sandbox-01")
    start = host.engine.restart.start  # type: ignore[union-attr]
    assert (
        " -m sglang.launch_server --host 127.0.0.1 --port 0 --model-path /cache/m/target " in start
    )
    assert "--attention-backend intel_amx" in start and "--sleep-on-idle" in start
    assert "--speculative-draft-model-path /cache/m/draft" in start
    assert start.endswith("--tp-size 2 --skip-server-warmup")  # the incident host's flag
    assert host.engine.restart.stop_timeout == REAL_ENGINE_STOP_TIMEOUT  # type: ignore[union-attr]
    env = host.engine.env
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["TRITON_INTERPRET"] == "1"
    assert env["SGLANG_CPU_OMP_THREADS_BIND"].count("|") == 1
    assert host.live is True
    assert "real SGLang 0.5.23" in render_inventory(LAYOUT, manifest, over_ssh=False)


def test_a_real_units_nodes_bind_their_ranks_to_cores_of_their_own() -> None:
    planned, _ = planned_manifest(None, UpRequest(engine=REAL, units=UnitShape(1, 2, tp=1)))
    manifest = Manifest(planned.hosts, engine=REAL, real=PARTS, units=planned.units)
    inventory = _inventory(manifest)
    cores = sorted(os.sched_getaffinity(0))
    for index, name in enumerate(("sandbox-01", "sandbox-02")):
        bind = inventory.host(name).engine.env["SGLANG_CPU_OMP_THREADS_BIND"]
        assert bind == str(cores[index % len(cores)])  # node 1 on the next core
    for name, rank in (("sandbox-01", "0"), ("sandbox-02", "1")):
        start = inventory.host(name).engine.restart.start  # type: ignore[union-attr]
        assert "--model-path /cache/m/target" in start and f"--node-rank {rank}" in start
        assert "--tp-size 2 --nnodes 2" in start and start.count("--tp-size") == 1


def test_the_standin_gets_tp_and_live_too_and_is_otherwise_as_before() -> None:
    manifest = Manifest(planned_manifest(None, UpRequest(count=1))[0].hosts, tp=2, live=True)
    host = _inventory(manifest).host("sandbox-01")
    start = host.engine.restart.start  # type: ignore[union-attr]
    assert start.endswith("--speculative-algorithm EAGLE3 --tp-size 2")
    assert "SGLANG_USE_CPU_ENGINE" not in host.engine.env and host.live is True
    plain = _inventory(Manifest(manifest.hosts)).host("sandbox-01")
    assert plain.engine.restart.start.endswith("--speculative-algorithm EAGLE3")  # type: ignore[union-attr]
    assert plain.live is False


def test_real_sglang_is_given_minutes_to_start() -> None:
    assert sandbox_playbook(real=True).timeouts.ready >= 600
    assert (
        sandbox_playbook(30.0, real=True).timeouts.ready
        == sandbox_playbook(real=True).timeouts.ready + 30
    )


def test_a_real_host_of_the_incidents_release_is_an_incident_host() -> None:
    assert [patch.spec.id for patch in base_patches_for(REAL)] == [INCIDENT_BUILD]
    assert base_patches_for(STANDIN) == ()  # the stand-in carries the incident in its own code
    planned, _ = planned_manifest(None, UpRequest(engine=REAL, units=UnitShape(1, 2, tp=1)))
    manifest = Manifest(planned.hosts, engine=REAL, real=PARTS, units=planned.units)
    inventory = _inventory(manifest)
    for name in ("sandbox-01", "sandbox-02"):
        engine = inventory.host(name).engine
        assert INCIDENT_ENV.items() <= engine.env.items()
        start = engine.restart.start  # type: ignore[union-attr]
        assert start.count(" ".join(INCIDENT_SERVER_FLAGS)) == 1
    standin = _inventory(Manifest(planned_manifest(None, UpRequest(count=1))[0].hosts))
    assert not INCIDENT_ENV.keys() & standin.host("sandbox-01").engine.env.keys()
