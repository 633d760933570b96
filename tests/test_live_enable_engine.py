"""`live enable` / `live disable` on a real stand-in host (its own interpreter, SGLang's plugin
framework in its `sglang`): enable writes the plugin's distribution into that interpreter's
site-packages through the agent on the local transport, the engine started after it (the
restart enable stages) loads it in every process and each socket answers `list`; disable then
removes every file enable wrote, the bytecode the engine compiled with them.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from opspatch import __version__
from opspatch.core.host import EngineSettings, Host
from opspatch.core.policy import BatchSize, Playbook
from opspatch.hosts.live import LiveFix, ask_engine
from opspatch.hosts.liveplugin import socket_paths, wire
from opspatch.hosts.operations import open_transport
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.live import disable_live, enable_live
from tests.enginekit import HOST, running_live_host, wait_for_sockets
from tests.standin import StandinHost, make_host, running_engine

pytestmark = pytest.mark.engine

PLAYBOOK = Playbook(canary=0, batch=BatchSize(count=1), max_failures=1)
TP1_SOCKETS = {"main.sock", "detokenizer.sock", "scheduler-tp0.sock"}


@pytest.fixture
def live_dir() -> Iterator[Path]:
    """The engine's socket base (`OPSPATCH_LIVE_DIR`), short: a socket path has 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="ol", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def inventory_host(host: StandinHost, live_dir: Path) -> Host:
    local = Host.local(
        "gpu-01",
        str(host.host_dir / "state"),
        EngineSettings(python=str(host.python), env={socket_paths.LIVE_DIR_ENV: str(live_dir)}),
    )
    return replace(local, live=True)


def test_enable_then_a_restart_loads_the_plugin_and_disable_removes_its_files(
    tmp_path: Path, live_dir: Path
) -> None:
    host = make_host(tmp_path / "host")
    site = host.site_packages
    before = {p for p in site.rglob("*") if p.is_file()}
    inventory = inventory_host(host, live_dir)
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        report = enable_live(
            ledger=ledger, hosts=[inventory], factory=open_transport, playbook=PLAYBOOK
        )
        (outcome,) = report.hosts
        assert outcome.outcome == "staged", (outcome.error, outcome.steps)
        dist_info = site / f"opspatch_live-{__version__}.dist-info"
        assert (dist_info / "entry_points.txt").exists()  # the stand-in has the framework
        assert not (site / "opspatch_live.pth").exists()

        env = {socket_paths.LIVE_DIR_ENV: str(live_dir)}
        with running_engine(host, ("--disable-cuda-graph",), env=env) as engine:
            sockets = wait_for_sockets(live_dir, engine, TP1_SOCKETS)
            for name in sorted(TP1_SOCKETS):
                reply = wire.ask(str(sockets[name]), {"op": "list"})
                assert isinstance(reply.get("process"), dict), (name, reply)

        report = disable_live(
            ledger=ledger, hosts=[inventory], factory=open_transport, playbook=PLAYBOOK
        )
        (outcome,) = report.hosts
        assert outcome.outcome == "staged-back", (outcome.error, outcome.steps)
        after = {p for p in site.rglob("*") if p.is_file()}
        assert after == before, sorted(str(p) for p in after ^ before)
        assert not (site / "opspatch_live").exists() and not dist_info.exists()


def test_live_enable_then_opspatch_restart_loads_the_plugin_in_every_process(
    tmp_path: Path,
) -> None:
    """Issue 42, 5: the CLI's way, on a TP=2 engine the inventory's command restarts: `live
    enable` stages the plugin, `opspatch restart` restarts into it and proves it (the smoke,
    then every process answering on its live socket). Before, restart left the host alone and
    the operator had to restart the engine outside opspatch."""
    with running_live_host(tmp_path, plugin=False, args=("--disable-cuda-graph",)) as host:
        pid = host.pid()
        enabled = host.opspatch("live", "enable", "--hosts", HOST, "--yes", "--json")
        assert enabled.code == 0, enabled.stdout + enabled.stderr
        assert [o["outcome"] for o in enabled.json()["hosts"]] == ["staged"]
        assert host.pid() == pid  # enable restarts nothing
        run = host.opspatch("restart", "--hosts", HOST, "--yes", "--json")
        assert run.code == 0, run.stdout + run.stderr
        (outcome,) = run.json()["hosts"]
        assert outcome["outcome"] == "applied", outcome
        assert "into the live plugin" in outcome["note"], outcome
        assert host.pid() != pid
        listed = ask_engine(host.engine().ops, LiveFix("list"), timeout=30).processes()
        assert sorted(p.process for p in listed if p.ok) == [
            "detokenizer", "main", "scheduler-tp0", "scheduler-tp1"
        ], listed  # fmt: skip
        again = host.opspatch("restart", "--hosts", HOST, "--yes", "--json")
        assert again.code == 0 and again.json()["hosts"][0]["outcome"] == "skipped", again.stdout

        # live disable removes the files; the running engine still holds the plugin, and
        # `opspatch restart` restarts it out of it (before: "the ledger holds no change")
        loaded = host.pid()
        disabled = host.opspatch("live", "disable", "--hosts", HOST, "--yes", "--json")
        assert disabled.code == 0, disabled.stdout + disabled.stderr
        assert [o["outcome"] for o in disabled.json()["hosts"]] == ["staged-back"]
        out = host.opspatch("restart", "--hosts", HOST, "--yes", "--json")
        assert out.code == 0, out.stdout + out.stderr
        (outcome,) = out.json()["hosts"]
        assert outcome["outcome"] == "restored", outcome
        assert "without the live plugin" in outcome["note"], outcome
        assert host.pid() != loaded
        gone = ask_engine(host.engine().ops, LiveFix("list"), timeout=30)
        assert not gone.processes(), gone  # no process listens: the plugin is not loaded
