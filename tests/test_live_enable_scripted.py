"""`live enable` / `live disable`, fast: the scripted hosts of tests/scriptedkit.py, whose
`live_site` answers a temporary site-packages (the engine's environment) while `install_files`
and `remove_files` run the real agent on it.

Each test names what the commands must do: write the distribution (entry point with SGLang's
plugin framework, `.pth` start without), staged until the next restart, recorded; answer a second
enable `already enabled`; refuse without `live = true`, over a file that is not ours, or (disable)
over a file changed since, each naming it with nothing changed; say when SGLANG_PLUGINS keeps the
plugin out; disable remove exactly what enable wrote.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from typing import Any

import pytest

from opspatch import __version__
from opspatch.core.reasons import Reason
from opspatch.errors import LiveRefused
from opspatch.hosts.livedist import live_distribution, plugin_sources
from opspatch.hosts.transport.scripted import agent_operation
from opspatch.runs.commands.live import disable_live, enable_live
from opspatch.runs.commands.restart import restart_hosts
from opspatch.runs.report import RunReport
from tests.livekit import PLAYBOOK, files_under, run, scripted_site, site_of
from tests.scriptedkit import FAKE_PID, FakeHost, Fleet, Units, fleet, units

pytestmark = pytest.mark.scripted

__all__ = ["fleet", "units"]  # the fixtures, used by name

DIST_INFO = f"opspatch_live-{__version__}.dist-info"


def test_enable_writes_the_entry_point_distribution_staged_until_a_restart_and_recorded(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    scripted_site(fleet)
    report = run(fleet, enable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "staged", outcome
    assert "next restarts" in (outcome.note or "")
    assert report.exit_code == 0
    site = site_of(fleet)
    expected = live_distribution(__version__, plugin_sources(), "entry-point")
    for relative, data in expected.items():
        assert (site / relative).read_bytes() == data, relative
    assert (site / DIST_INFO / "entry_points.txt").exists()
    assert not (site / "opspatch_live.pth").exists()
    record = expected[f"{DIST_INFO}/RECORD"]
    assert outcome.file is not None
    assert outcome.file.path == f"{site}/{DIST_INFO}/RECORD"
    assert outcome.file.sha256_before is None  # new files: no pre-image
    assert outcome.file.sha256_after == hashlib.sha256(record).hexdigest()
    (listed,) = fleet.ledger.list_runs()
    assert listed.command == "live-enable"
    enable_step = [s for s in outcome.steps if s.step == "live-enable"][-1]
    assert f"RECORD sha256 {hashlib.sha256(record).hexdigest()}" in enable_step.detail
    assert not any(s.step in ("restart", "drain") for s in outcome.steps)


def test_a_second_enable_answers_already_enabled_and_writes_nothing(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    scripted_site(fleet)
    run(fleet, enable_live)
    before = {p: (site_of(fleet) / p).stat().st_mtime_ns for p in files_under(site_of(fleet))}
    report = run(fleet, enable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "already-applied", outcome
    assert (outcome.note or "").startswith("already enabled")
    assert report.exit_code == 0
    after = {p: (site_of(fleet) / p).stat().st_mtime_ns for p in files_under(site_of(fleet))}
    assert after == before


def test_without_the_plugin_framework_the_pth_start_is_written(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    scripted_site(fleet, framework=False)
    (outcome,) = run(fleet, enable_live).hosts
    assert outcome.outcome == "staged", outcome
    site = site_of(fleet)
    assert (site / "opspatch_live.pth").read_text().startswith("import opspatch_live.plugin")
    assert not (site / DIST_INFO / "entry_points.txt").exists()
    assert "pth start" in (outcome.note or "")


def test_enable_is_refused_without_live_true_before_any_host_is_asked(fleet: Fleet) -> None:
    asked = scripted_site(fleet)
    with pytest.raises(LiveRefused) as caught:
        run(fleet, enable_live, live=False)
    assert caught.value.exit_code == 2
    assert "live = true" in caught.value.message
    assert asked == []
    assert fleet.ledger.list_runs() == []
    assert files_under(site_of(fleet)) == {"other_package.py"}


def test_sglang_plugins_without_the_plugin_is_said_not_ignored(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    why = "SGLANG_PLUGINS=other restricts the engine's plugins to other, so opspatch_live ..."
    scripted_site(fleet, filtered=why)
    (outcome,) = run(fleet, enable_live).hosts
    assert outcome.outcome == "staged", outcome
    assert "SGLANG_PLUGINS=other" in (outcome.note or "")


def test_enable_refuses_a_file_already_there_with_other_bytes_naming_it(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    scripted_site(fleet)
    foreign = site_of(fleet) / "opspatch_live" / "wire.py"
    foreign.parent.mkdir()
    foreign.write_text("# someone else's\n")
    report = run(fleet, enable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "skipped" and outcome.reason == Reason.CHANGED_SINCE, outcome
    assert str(foreign) in (outcome.error or "")
    assert report.exit_code == 2
    assert files_under(site_of(fleet)) == {"other_package.py", "opspatch_live/wire.py"}


def test_enable_refuses_where_another_version_of_the_plugin_is_installed(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    scripted_site(fleet)
    older = site_of(fleet) / "opspatch_live-0.0.1.dist-info"
    older.mkdir()
    (older / "RECORD").write_text("opspatch_live-0.0.1.dist-info/RECORD,,\n")
    report = run(fleet, enable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "skipped" and outcome.reason == Reason.OTHER_VERSION, outcome
    assert "`opspatch live disable --hosts h1` first" in (outcome.error or "")
    assert report.exit_code == 2
    assert files_under(site_of(fleet)) == {
        "other_package.py",
        "opspatch_live-0.0.1.dist-info/RECORD",
    }


def test_disable_removes_exactly_what_enable_wrote(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    scripted_site(fleet)
    run(fleet, enable_live)
    cache = site_of(fleet) / "opspatch_live" / "__pycache__"
    cache.mkdir()
    (cache / "wire.cpython-311.pyc").write_bytes(b"bytecode the engine wrote")
    report = run(fleet, disable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "staged-back", outcome
    assert report.exit_code == 0
    assert files_under(site_of(fleet)) == {"other_package.py"}
    assert not (site_of(fleet) / "opspatch_live").exists()
    assert outcome.file is not None and outcome.file.sha256_after is None
    assert [r.command for r in fleet.ledger.list_runs()] == ["live-disable", "live-enable"]


def test_disable_refuses_a_file_changed_since_naming_it_and_removes_nothing(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    scripted_site(fleet)
    run(fleet, enable_live)
    installed = files_under(site_of(fleet))
    changed = site_of(fleet) / "opspatch_live" / "plugin.py"
    changed.write_text(changed.read_text() + "# edited on the host\n")
    report = run(fleet, disable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "skipped", outcome
    assert outcome.reason == Reason.CHANGED_SINCE, outcome
    assert str(changed) in (outcome.error or "")
    assert report.exit_code == 2
    assert files_under(site_of(fleet)) == installed


def test_a_lock_taken_away_before_the_enable_fails_as_lock_lost_and_writes_nothing(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    host = fleet.hosts[0]
    scripted_site(fleet)
    site_answer = host.fault
    assert site_answer is not None

    def steal_the_lock(op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        if op == "install_files":
            lock = host.state / "lock.json"
            holder = json.loads(lock.read_text())
            lock.write_text(json.dumps({**holder, "run_id": "20260101T000000Z-other0"}))
        return site_answer(op, args)

    host.fault = steal_the_lock
    report = run(fleet, enable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "failed" and outcome.reason == Reason.LOCK_LOST, outcome
    assert files_under(site_of(fleet)) == {"other_package.py"}


def test_disable_where_nothing_is_installed_says_so(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    scripted_site(fleet)
    report = run(fleet, disable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "skipped" and outcome.reason == Reason.NOTHING_TO_DO, outcome
    assert "not installed" in (outcome.note or "")  # nothing-to-do's wording
    assert report.exit_code == 0


def engine_after_enable(fleet: Fleet, *, listening: bool = True) -> list[str]:
    """Each host's engine as `restart` meets it after an enable: its server (started an hour
    ago, before the install) found beside the RECORD, and after a restart every process
    answering `list` on its live socket (`listening`); returns the ops asked."""
    asked = scripted_site(fleet)
    plugin_at_start: dict[str, bool] = {}
    for fake in fleet.hosts:
        site_answer = fake.fault
        assert site_answer is not None

        def answer(
            op: str, args: dict[str, Any], fake: FakeHost = fake, site_answer: Any = site_answer
        ) -> dict[str, Any] | None:
            if op == "live":
                process = {"role": "main", "rank": None, "pid": 100}
                reply = {"ok": True, "took": [], "process": process}
                said = {"socket": "main.sock", "reply": reply, "error": None}
                loaded = (
                    listening
                    and fake.started_at is not None
                    and fake.started_at > time.time() - 60
                    and plugin_at_start.get(fake.name, True)
                )
                return {
                    "server_pid": 100,
                    "folder": "/tmp/x/100" if loaded else None,
                    "missing": None if loaded else "no process listens for live fixes",
                    "answers": [said] if loaded else [],
                }
            if op in ("restart", "start"):  # the engine loads the plugin installed then
                site = fake.root / "engine-site"
                plugin_at_start[fake.name] = any(site.glob("opspatch_live-*.dist-info"))
            if op == "inspect" and str(args.get("path") or "").endswith("/RECORD"):
                found = agent_operation(op, args)
                assert isinstance(found, dict)
                found["server"] = {"pid": FAKE_PID, "started_at": fake.started_at}
                return found
            return site_answer(op, args)  # type: ignore[no-any-return]

        fake.fault = answer
    return asked


def restart(fleet: Fleet) -> RunReport:
    hosts = [replace(h.host(), live=True) for h in fleet.hosts]
    return restart_hosts(ledger=fleet.ledger, hosts=hosts, factory=fleet.factory, playbook=PLAYBOOK)


def test_restart_finishes_an_enable_restarting_into_the_plugin_and_proving_it_listens(
    fleet: Fleet,
) -> None:
    """Issue 42, 5: a staged plugin is a staged change. Before, `restart` left the host alone
    ("the ledger holds no change on this host") and `live enable` had no way to finish."""
    fleet.hosts = fleet.hosts[:1]
    engine_after_enable(fleet)
    (enabled,) = run(fleet, enable_live).hosts
    assert enabled.outcome == "staged", enabled
    report = restart(fleet)
    (outcome,) = report.hosts
    assert outcome.outcome == "applied", outcome
    assert report.exit_code == 0
    steps = [str(s.step) for s in outcome.steps]
    assert steps[-4:] == ["restart", "ready", "smoke", "live"], steps
    assert outcome.note == (
        f"restarted host h1 as one into the live plugin {DIST_INFO} (`live enable`) and proven: "
        "every process of every node listens"
    )
    assert outcome.file == enabled.file  # the RECORD, as enable recorded it
    (again,) = restart(fleet).hosts  # the engine now started after it: nothing staged
    assert again.outcome == "skipped" and "restart" not in [s.step for s in again.steps], again
    assert again.reason == Reason.NOTHING_TO_DO, again


def test_a_restart_into_the_plugin_whose_proof_fails_removes_it_and_restarts_without(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine_after_enable(fleet, listening=False)
    run(fleet, enable_live)
    site = site_of(fleet)
    report = restart(fleet)
    (outcome,) = report.hosts
    assert outcome.outcome == "rolled-back", outcome
    assert outcome.reason == "step-failed", outcome
    assert "the live plugin is not loaded after the restart" in (outcome.error or "")  # wording
    assert report.exit_code == 1
    steps = [str(s.step) for s in outcome.steps]
    assert "live-disable" in steps and steps.index("live-disable") < steps.index(
        "restart-after-restore"
    ), steps
    assert files_under(site) == {"other_package.py"}  # every file of the plugin removed
    assert outcome.file is not None and outcome.file.sha256_after is None


def test_a_unit_with_the_plugin_staged_on_every_node_is_restarted_as_one_into_it(
    units: Units,
) -> None:
    """A unit's nodes, each enabled: one restart of the unit, proven through the head, then
    every node's processes answering on their sockets; each node `applied`."""
    nodes = Fleet([units.fakes["h1"], units.fakes["h2"]], units.ledger, units.patch)
    engine_after_enable(nodes)
    hosts = [replace(h, live=True) for h in units.hosts("h1", "h2")]
    enabled = enable_live(
        ledger=units.ledger, hosts=hosts, factory=nodes.factory, playbook=PLAYBOOK
    )
    assert [o.outcome for o in enabled.hosts] == ["staged", "staged"]
    report = restart_hosts(
        ledger=units.ledger, hosts=hosts, factory=nodes.factory, playbook=PLAYBOOK
    )
    assert {o.host: o.outcome for o in report.hosts} == {"h1": "applied", "h2": "applied"}
    for outcome in report.hosts:
        steps = [str(s.step) for s in outcome.steps]
        assert "start" in steps and steps.count("live") == 1, (outcome.host, steps)
        assert "restarted unit u1 as one into the live plugin" in (outcome.note or "")


def test_restart_finishes_a_disable_restarting_out_of_the_plugin_it_still_held(
    fleet: Fleet,
) -> None:
    """`live disable` removes the files while the running engine keeps the plugin loaded (and
    any live fix in memory): a staged change, restart's goal. Restart restarts out of it, proves
    the engine by the smoke and says `restored`; then nothing is staged. Before, restart left
    the host alone ("the ledger holds no change on this host") with the plugin still loaded."""
    fleet.hosts = fleet.hosts[:1]
    engine_after_enable(fleet)
    run(fleet, enable_live)
    assert restart(fleet).exit_code == 0  # the engine restarted into the plugin
    (disabled,) = run(fleet, disable_live).hosts
    assert disabled.outcome == "staged-back", disabled
    assert "`opspatch restart` restarts out of it" in (disabled.note or "")

    report = restart(fleet)
    (outcome,) = report.hosts
    assert outcome.outcome == "restored", outcome
    assert report.exit_code == 0
    steps = [str(s.step) for s in outcome.steps]
    assert steps[-3:] == ["restart", "ready", "smoke"], steps
    assert "main still held it" in (outcome.note or ""), outcome.note
    assert (outcome.note or "").startswith(
        "restarted host h1 as one into the engine without the live plugin"
    )
    assert outcome.file == disabled.file  # the RECORD's removal, as disable recorded it
    assert fleet.ledger.get_run(report.run_id or "").hosts[0].outcome == "restored"
    (again,) = restart(fleet).hosts  # the engine now started without it: nothing staged
    assert again.outcome == "skipped" and "restart" not in [s.step for s in again.steps], again


def test_a_disable_whose_engine_was_restarted_by_hand_is_left_alone(fleet: Fleet) -> None:
    """The operator restarted the engine after the disable: no process holds the plugin, so
    restart has nothing to finish and restarts nothing."""
    fleet.hosts = fleet.hosts[:1]
    engine_after_enable(fleet)
    run(fleet, enable_live)
    assert restart(fleet).exit_code == 0
    run(fleet, disable_live)
    fleet.hosts[0].answer("restart", {})  # the operator's own restart, outside opspatch
    (outcome,) = restart(fleet).hosts
    assert outcome.outcome == "skipped", outcome
    assert "restart" not in [str(s.step) for s in outcome.steps]
    live = [s for s in outcome.steps if s.step == "live"]
    assert live and "the disable is in effect" in live[-1].detail, outcome.steps


def test_a_failed_smoke_after_restarting_out_of_the_plugin_is_restored_not_serving(
    fleet: Fleet,
) -> None:
    fleet.hosts = fleet.hosts[:1]
    engine_after_enable(fleet)
    run(fleet, enable_live)
    assert restart(fleet).exit_code == 0
    run(fleet, disable_live)
    fleet.hosts[0].smoke_ok = False
    report = restart(fleet)
    (outcome,) = report.hosts
    assert outcome.outcome == "restored-not-serving", outcome
    assert outcome.reason == "not-serving", outcome
    assert "nothing is put back" in (outcome.error or ""), outcome.error  # the wording, once
    assert report.exit_code == 1


def test_a_unit_whose_every_node_still_holds_a_disabled_plugin_is_restarted_out_as_one(
    units: Units,
) -> None:
    """Enabled, restarted into it, disabled on both nodes: one restart of the unit, proven
    through the head, each node `restored`."""
    nodes = Fleet([units.fakes["h1"], units.fakes["h2"]], units.ledger, units.patch)
    engine_after_enable(nodes)
    hosts = [replace(h, live=True) for h in units.hosts("h1", "h2")]

    def each(command: Any) -> RunReport:
        return command(ledger=units.ledger, hosts=hosts, factory=nodes.factory, playbook=PLAYBOOK)

    each(enable_live)
    assert each(restart_hosts).exit_code == 0
    assert [o.outcome for o in each(disable_live).hosts] == ["staged-back", "staged-back"]
    for fake in nodes.hosts:
        fake.requests.clear()
    report = each(restart_hosts)
    assert {o.host: o.outcome for o in report.hosts} == {"h1": "restored", "h2": "restored"}
    for outcome in report.hosts:
        assert "restarted unit u1 as one into the engine without" in (outcome.note or "")
    for fake in nodes.hosts:
        assert fake.requests.count("stop") == 1 and fake.requests.count("start") == 1
        assert "restart" not in fake.requests
