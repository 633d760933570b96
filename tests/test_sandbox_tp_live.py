"""`sandbox up --tp T --live` on the stand-in: a single server of T scheduler ranks (before, `--tp`
was refused without `--units`), `live = true` in the inventories (before, every `up` dropped
it), both kept by a later `up`; another TP on a built sandbox is refused; the live plugin
installed before the engine's first start, so a live fix is taken at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.config.inventory import load_inventory
from opspatch.sandbox.processes import proc_text
from tests.fleetkit import SandboxFleet

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxFleet]:
    sandbox = SandboxFleet(tmp_path_factory.mktemp("tp-live"), 1, tp=2, extra=("--live",))
    try:
        yield sandbox.up()
    finally:
        sandbox.close()


def _ranks(fleet: SandboxFleet) -> list[str]:
    names = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and str(fleet.host_dir("sandbox-01")) in (
            proc_text(int(entry.name), "cmdline") or ""
        ):
            names.append((proc_text(int(entry.name), "comm") or "").strip())
    return sorted(n for n in names if n.startswith("sglang::sch"))


def test_a_single_server_runs_t_ranks_and_the_inventories_say_live(fleet: SandboxFleet) -> None:
    assert _ranks(fleet) == ["sglang::sch_TP0", "sglang::sch_TP1"]
    status = fleet.opspatch("sandbox", "status", "--json").json()
    assert (status["engine"], status["tp"], status["live"]) == ("standin", 2, True)
    assert fleet.hosts["sandbox-01"].live is True
    again = fleet.opspatch("sandbox", "up", timeout=240)
    assert again.code == 0, again.stderr
    kept = load_inventory(fleet.state / "inventories" / "sandbox.toml").host("sandbox-01")
    assert kept.live is True and kept.engine.restart.start.endswith("--tp-size 2")  # type: ignore[union-attr]
    other = fleet.opspatch("sandbox", "up", "--tp", "3")
    assert other.code == 2 and "`up --tp 3` would not restart them" in other.stderr


def test_up_live_starts_each_engine_with_the_live_plugin_loaded(fleet: SandboxFleet) -> None:
    """`up --live` installs the plugin (`live enable`, recorded) before the engine's first start,
    so a live fix is taken at once, no pid changed. Before, it only wrote `live = true`: a live
    fix needed `live enable` and a second start (minutes each on real SGLang)."""
    listed = fleet.opspatch("ledger", "list", "--json")
    assert listed.code == 0, listed.stderr
    enabled = [r for r in listed.json()["runs"] if r["command"] == "live-enable"]
    assert [(r["outcome"], r["hosts"]) for r in enabled] == [("ok", ["sandbox-01"])], enabled
    pid = fleet.pid("sandbox-01")
    applied = fleet.opspatch(
        "apply", "eagle-init-guard", "--hosts", "sandbox", "--live", "--yes", "--json"
    )
    assert applied.code == 0, applied.stdout + applied.stderr
    (host,) = applied.json()["hosts"]
    assert host["outcome"] == "applied" and host["smoke"]["ok"], host
    assert "restart" not in [step["step"] for step in host["steps"]], host
    assert fleet.pid("sandbox-01") == pid
