"""`apply --live` over real processes: the incident's TP=2 stand-in server (CUDA graph capture
failed, the worker kept half-built: its first decode would crash it), with opspatch's plugin
installed, gets eagle-init-guard through `apply_to_hosts(live=...)` on the local transport: the
file is swapped, the fix taken by both scheduler ranks at one boundary through the agent's `live`
operation, and the smoke decode passes, no pid changed. A rank that fails to apply: every rank
reverted, the file restored, the host rolled back, still no restart.

Both run the real fix runtime (`liveplugin/fixes.py`) and the real live form of the patch
(`core/live.py`: the class default and `__init__`). A rank that fails is made by a fault written
into that test's installed runtime: the rank the engine's environment names refuses every take.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.policy import BatchSize, Playbook
from opspatch.hosts import livedist
from opspatch.hosts.liveplugin import socket_paths, wire
from opspatch.hosts.operations import open_transport
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.fleet.liveapply import live_former
from tests.enginekit import (
    ALL_SOCKETS,
    TP2,
    host,
    inventory_host,
    live_dir,
    tree_of,
    wait_for_sockets,
)
from tests.standin import EngineProcess, StandinHost, running_engine

__all__ = ["host", "live_dir"]  # the fixtures, used by name

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parent.parent
THRESHOLD = "EAGLEWorkerV2.spec_disable_batch_threshold"
DEFINITIONS = [(THRESHOLD, "class-attribute"), ("EAGLEWorkerV2.__init__", "method")]
REFUSE_RANK_ENV = "OPSPATCH_TEST_REFUSE_RANK"
INSTALLED_RUNTIME = "opspatch_live/fixes.py"
TAKE = "def take(request: dict[str, Any]) -> dict[str, Any]:\n"


def refusing_runtime() -> bytes:
    """The real runtime with a fault: the rank named by the engine's environment refuses every
    take (its boundary knows its rank)."""
    real = livedist.plugin_sources()[INSTALLED_RUNTIME].decode()
    assert TAKE in real
    return real.replace(
        TAKE,
        TAKE + "    import os\n"
        "    from . import boundary\n"
        f"    if os.environ.get({REFUSE_RANK_ENV!r}) == str(boundary.STATE.rank):\n"
        '        return _refused(TAKE_FAILED, "this rank was told to refuse")\n',
        1,
    ).encode()


def apply_live(host: StandinHost, engine: EngineProcess, live_dir: Path, ledger: Ledger):  # type: ignore[no-untyped-def]
    return apply_to_hosts(
        load_patch(REPO / "patches" / "eagle-init-guard.toml"),
        [inventory_host(host, engine, live_dir)],
        Playbook(canary=0, batch=BatchSize(count=1), max_failures=1),
        factory=open_transport,
        ledger=ledger,
        live=live_former,
    )


def test_the_incidents_tp2_server_is_fixed_live_and_decodes_with_no_pid_changed(
    host: StandinHost, live_dir: Path, tmp_path: Path
) -> None:
    pristine = host.eagle_worker_file.read_bytes()
    env = {socket_paths.LIVE_DIR_ENV: str(live_dir)}
    ledger = Ledger.open(tmp_path / "ledger.sqlite3")
    try:
        with running_engine(host, TP2, env=env, log_name="incident.log") as engine:
            assert "CUDA graph capture failed" in engine.log_text()
            sockets = wait_for_sockets(live_dir, engine, ALL_SOCKETS)
            pids = set(tree_of(engine.pid))
            report = apply_live(host, engine, live_dir, ledger)
            (outcome,) = report.hosts
            assert outcome.outcome == "applied", (outcome, engine.log_text())
            steps = [str(s.step) for s in outcome.steps]
            assert "restart" not in steps and steps[-2:] == ["live", "smoke"], steps
            detail = [s.detail for s in outcome.steps if s.step == "live"][-1]
            assert "scheduler-tp0" in detail and "scheduler-tp1" in detail, detail
            assert set(tree_of(engine.pid)) == pids  # no process restarted
            assert "Scheduler hit an exception" not in engine.log_text()
            for name in ("scheduler-tp0.sock", "scheduler-tp1.sock"):
                held = wire.ask(str(sockets[name]), {"op": "list"})["took"]
                assert [(e["name"], e["kind"]) for e in held] == DEFINITIONS, name
                assert held[0]["value"] == "0" and held[1]["code_sha256"], held
            on_disk = host.eagle_worker_file.read_bytes()
            assert on_disk != pristine  # the next restart keeps the fix through the file
            assert outcome.file is not None
            assert outcome.file.sha256_after == hashlib.sha256(on_disk).hexdigest()
    finally:
        ledger.close()
        host.eagle_worker_file.write_bytes(pristine)


def test_a_rank_that_fails_to_apply_reverts_every_rank_and_restores_the_file(
    host: StandinHost, live_dir: Path, tmp_path: Path
) -> None:
    pristine = host.eagle_worker_file.read_bytes()
    env = {socket_paths.LIVE_DIR_ENV: str(live_dir), REFUSE_RANK_ENV: "1"}
    runtime = host.site_packages / INSTALLED_RUNTIME
    real = runtime.read_bytes()
    runtime.write_bytes(refusing_runtime())
    ledger = Ledger.open(tmp_path / "ledger.sqlite3")
    try:
        with running_engine(
            host, (*TP2, "--disable-cuda-graph"), env=env, log_name="r.log"
        ) as engine:
            sockets = wait_for_sockets(live_dir, engine, ALL_SOCKETS)
            pids = set(tree_of(engine.pid))
            report = apply_live(host, engine, live_dir, ledger)
            (outcome,) = report.hosts
            assert (outcome.outcome, outcome.reason) == ("rolled-back", "step-failed"), (
                outcome.error,
                outcome.steps,
            )
            assert "this rank was told to refuse" in (outcome.error or "")  # the rank's words
            assert host.eagle_worker_file.read_bytes() == pristine
            steps = [str(s.step) for s in outcome.steps]
            assert "live-revert" in steps and "restart-after-restore" not in steps, steps
            assert set(tree_of(engine.pid)) == pids
            for name in ("scheduler-tp0.sock", "scheduler-tp1.sock"):
                assert wire.ask(str(sockets[name]), {"op": "list"})["took"] == [], name
            assert report.exit_code == 1
    finally:
        ledger.close()
        host.eagle_worker_file.write_bytes(pristine)
        runtime.write_bytes(real)
