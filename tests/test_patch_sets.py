"""Patch sets (issue 19): one patch, several modules, changed together on a host.

The format's bad inputs are table cases (file, line, field, what to do). The rest runs on the
sandbox fleet with real stand-in engines: planned together (a target that does not fit refuses
the run, nothing written anywhere), swapped, proven (one restart, one smoke) and rolled back
together (byte-identical), and over real sshd, a controller killed between the two files'
swaps (status says the set is partial, never applied; `recover` makes it whole: all-old) and a
connection cut after the first swap (the run itself puts the set back).
"""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.spec import PatchSetSpec, PatchSpec, parse_patch_file
from opspatch.core.tomlsource import parse_toml
from opspatch.errors import InputError, SpecError
from opspatch.ledger.store import Ledger
from opspatch.sandbox.sshd import find_sshd
from tests.faultkit import FaultFleet, FleetSlot, isolated_home
from tests.fleetkit import EAGLE, HEADER, SCHEDULER, SET_ID, TARGET_A, TARGET_B, SandboxFleet

pytestmark = pytest.mark.pure


# The second target's edit anchors on a function the stand-in's scheduler does not define.
TARGET_B_MISFIT = f'''
[[targets]]
module = "{SCHEDULER}"
[[targets.edits]]
kind = "insert"
scope = "no_such_function"
position = "start"
code = "_OPSPATCH_SET_B = 2"
'''


def _parse(text: str) -> PatchSpec | PatchSetSpec:
    return parse_patch_file(parse_toml(textwrap.dedent(text), "set.toml"))


# ---------------------------------------------------------------------------------------------
# the format


def test_a_set_loads_as_one_part_per_target(tmp_path: Path) -> None:
    path = tmp_path / f"{SET_ID}.toml"
    path.write_text(HEADER + TARGET_A + TARGET_B)
    loaded = load_patch(path)
    assert loaded.is_set
    assert [p.target.module for p in loaded.parts] == [EAGLE, SCHEDULER]
    assert [p.target.versions for p in loaded.parts] == [">=0.5.4", ""]
    assert {p.id for p in loaded.parts} == {SET_ID}  # one marker for the whole set
    assert loaded.spec is loaded.parts[0]
    assert loaded.edit_field(1, 0, "code") == ("targets", 1, "edits", 0, "code")
    assert (
        loaded.location(loaded.edit_field(1, 0, "code")).line
        == (HEADER + TARGET_A + TARGET_B).splitlines().index('code = "_OPSPATCH_SET_B = 2"') + 1
    )


def test_a_single_target_patch_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "one.toml"
    path.write_text(
        HEADER.replace(SET_ID, "one")
        + f'[target]\nmodule = "{EAGLE}"\n'
        + '[[edits]]\nkind = "insert"\nscope = "<module>"\ncode = "X = 1"\n'
    )
    loaded = load_patch(path)
    assert not loaded.is_set
    assert loaded.parts == (loaded.spec,)
    assert loaded.target_field(0, "module") == ("target", "module")


BAD_SETS = {
    "module-twice": (
        TARGET_A + TARGET_A,
        "targets[1].module",
        f"'{EAGLE}' is already targets[0]",
        "put all of that module's edits under one [[targets]] table",
    ),
    "one-target": (
        TARGET_A,
        "targets",
        "",
        "",
    ),
    "target-beside-targets": (
        TARGET_A + TARGET_B + f'[target]\nmodule = "{EAGLE}"\n',
        "target",
        "keeps each file's target inside its [[targets]] table",
        "move [target] into the [[targets]] table it belongs to",
    ),
    "edits-beside-targets": (
        TARGET_A + TARGET_B + '[[edits]]\nkind = "insert"\nscope = "<module>"\ncode = "X = 1"\n',
        "edits",
        "keeps each file's edits inside its [[targets]] table",
        "[[targets.edits]]",
    ),
    "target-without-edits": (
        TARGET_A + f'[[targets]]\nmodule = "{SCHEDULER}"\n',
        "targets[1].edits",
        "missing",
        "",
    ),
    "bad-versions": (
        TARGET_A
        + TARGET_B.replace(
            f'module = "{SCHEDULER}"', f'module = "{SCHEDULER}"\nversions = "0.5.x"'
        ),
        "targets[1].versions",
        "is not a version range",
        "",
    ),
    "unknown-key": (
        TARGET_A + TARGET_B.replace("position =", "postion ="),
        "targets[1].edits[0].postion",
        "unknown key",
        "did you mean 'position'?",
    ),
    "snippet-does-not-parse": (
        TARGET_A + TARGET_B.replace("_OPSPATCH_SET_B = 2", "_OPSPATCH_SET_B = ("),
        "targets[1].edits[0].code",
        "does not parse",
        "",
    ),
}


@pytest.mark.parametrize("case", list(BAD_SETS))
def test_a_bad_set_names_file_line_and_field(case: str) -> None:
    body, field, problem, hint = BAD_SETS[case]
    text = HEADER + body
    with pytest.raises(SpecError) as caught:
        _parse(text)
    error = caught.value
    assert error.location.file == "set.toml"
    assert error.location.line > 0, error.render()
    assert error.render().startswith(f"set.toml:{error.location.line}: {field}"), error.render()
    assert problem in error.message, error.render()
    assert hint in (error.hint or ""), error.render()


def test_a_set_of_one_target_is_told_to_use_target() -> None:
    with pytest.raises(SpecError) as caught:
        _parse(HEADER + TARGET_A)
    assert "targets" in caught.value.message
    assert "at least 2" in caught.value.render(), caught.value.render()


def test_commands_about_one_file_refuse_a_set(tmp_path: Path) -> None:
    path = tmp_path / f"{SET_ID}.toml"
    path.write_text(HEADER + TARGET_A + TARGET_B)
    with pytest.raises(InputError) as caught:
        load_patch(path).only_target("export")
    assert caught.value.message.endswith(
        f"{SET_ID} is a patch set ({EAGLE}, {SCHEDULER}); export takes a patch with one [target]"
    ), caught.value.message
    assert "--hosts" in (caught.value.hint or "")


# ---------------------------------------------------------------------------------------------
# on a local tree (--root): planned, applied, re-applied and rolled back together


@pytest.mark.process
def test_a_set_is_planned_applied_and_rolled_back_on_a_local_tree(tmp_path: Path) -> None:
    """Issue 31, item 20: before, a set could not be applied to local files at all (`apply SET
    --file F`: "takes a patch with one [target]", nothing else). `--root DIR` finds each
    target's module under the tree; plan, apply, re-apply and rollback go as for one file, and
    `rollback --run R --file F` on one file of the set names the set and the way to roll it
    back (item 21) instead of "the ledger has no change by run R to F"."""
    from opspatch.sandbox.install import install_standin
    from tests.clirunner import opspatch

    site = tmp_path / "site-packages"
    site.mkdir()
    install_standin(site)
    workspace = tmp_path / "ws"
    (workspace / "patches").mkdir(parents=True)
    (workspace / "patches" / f"{SET_ID}.toml").write_text(HEADER + TARGET_A + TARGET_B)
    eagle = site / (EAGLE.replace(".", "/") + ".py")
    scheduler = site / (SCHEDULER.replace(".", "/") + ".py")
    before = (eagle.read_bytes(), scheduler.read_bytes())
    env = {"OPSPATCH_STATE_DIR": str(tmp_path / "state")}

    def cli(*args: str) -> Any:
        return opspatch(*args, cwd=workspace, env=env)

    one_file = cli("apply", SET_ID, "--file", str(eagle), "--yes")
    assert one_file.code == 2, one_file.stdout + one_file.stderr
    assert "--root DIR" in one_file.stderr, one_file.stderr

    plan = cli("plan", SET_ID, "--root", str(site), "--json")
    assert plan.code == 0, plan.stdout + plan.stderr
    planned = plan.json()
    assert [(f["module"], f["outcome"]) for f in planned["files"]] == [
        (EAGLE, "applicable"),
        (SCHEDULER, "applicable"),
    ], planned
    assert planned["version"] == "0.5.23"
    assert (eagle.read_bytes(), scheduler.read_bytes()) == before

    run = cli("apply", SET_ID, "--root", str(site), "--yes", "--json")
    assert run.code == 0, run.stdout + run.stderr
    (host,) = run.json()["hosts"]
    assert host["outcome"] == "applied", host
    assert host["file"]["set"]["state"] == "all-new", host["file"]
    assert [s["step"] for s in host["steps"]] == ["begin", "plan", "backup", "swap", "swap"]
    assert eagle.read_bytes().endswith(b"_OPSPATCH_SET_A = 1\n")
    assert scheduler.read_bytes().endswith(b"_OPSPATCH_SET_B = 2\n")
    run_id = run.json()["run_id"]

    again = cli("apply", SET_ID, "--root", str(site), "--yes", "--json")
    assert again.code == 0, again.stdout + again.stderr
    assert [h["outcome"] for h in again.json()["hosts"]] == ["already-applied"], again.stdout

    member = cli("rollback", "--run", run_id, "--file", str(scheduler))  # refused before asking
    assert member.code == 2, member.stdout + member.stderr
    said = " ".join(member.stderr.split())
    assert f"is one file of the patch set {SET_ID} that run {run_id} changed" in said, said
    assert f"opspatch rollback --run {run_id} --root {site}`" in said, said
    assert scheduler.read_bytes().endswith(b"_OPSPATCH_SET_B = 2\n")  # nothing restored

    back = cli("rollback", SET_ID, "--root", str(site), "--yes", "--json")
    assert back.code == 0, back.stdout + back.stderr
    (host,) = back.json()["hosts"]
    assert host["outcome"] == "restored", host
    assert host["file"]["set"]["state"] == "all-old", host["file"]
    assert (eagle.read_bytes(), scheduler.read_bytes()) == before  # byte-identical

    # by run, too: apply again, roll that run back
    run = cli("apply", SET_ID, "--root", str(site), "--yes", "--json")
    assert run.code == 0, run.stdout + run.stderr
    by_run = cli("rollback", "--run", run.json()["run_id"], "--root", str(site), "--yes", "--json")
    assert by_run.code == 0, by_run.stdout + by_run.stderr
    assert [h["outcome"] for h in by_run.json()["hosts"]] == ["restored"], by_run.stdout
    assert (eagle.read_bytes(), scheduler.read_bytes()) == before
    assert cli("ledger", "verify").code == 0


# ---------------------------------------------------------------------------------------------
# on the sandbox fleet (local transport): planned, applied, proven, rolled back together


def _scheduler(fleet: SandboxFleet, name: str) -> Path:
    return fleet.file(name).parents[1] / "managers" / "scheduler.py"


def _files(fleet: SandboxFleet, name: str) -> tuple[bytes, bytes]:
    return fleet.file(name).read_bytes(), _scheduler(fleet, name).read_bytes()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _locks(fleet: SandboxFleet) -> list[Path]:
    return [Path(h.state_dir) / "lock.json" for h in fleet.hosts.values()]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxFleet]:
    with isolated_home(tmp_path_factory.mktemp("sets-home")):
        sandbox = SandboxFleet(tmp_path_factory.mktemp("sets"), 2).up()
        try:
            run = sandbox.opspatch("apply", "eagle-init-guard", "--hosts", "sandbox", "--yes")
            assert run.code == 0, run.stdout + run.stderr
            yield sandbox
        finally:
            sandbox.close()


@pytest.mark.engine
def test_a_set_whose_second_target_does_not_fit_is_refused_and_nothing_is_written(
    fleet: SandboxFleet,
) -> None:
    before = {n: _files(fleet, n) for n in fleet.names}
    fleet.write_patch(SET_ID, HEADER + TARGET_A + TARGET_B_MISFIT)
    run = fleet.opspatch("apply", SET_ID, "--hosts", "sandbox", "--yes", "--json")
    assert run.code == 2, run.stdout + run.stderr
    doc = run.json()
    assert doc["outcome"] == "refused", doc
    line = (HEADER + TARGET_A + TARGET_B_MISFIT).splitlines().index('scope = "no_such_function"')
    for host in doc["hosts"]:
        assert host["outcome"] == "skipped", host
        error = host["error"]
        assert f"{SET_ID}.toml:{line + 1}: targets[1].edits[0].scope" in error, error
        assert SCHEDULER in error, error
        assert [s["step"] for s in host["steps"]] == ["begin", "plan"], host
    assert {n: _files(fleet, n) for n in fleet.names} == before  # neither file, on no host
    assert not [p for p in _locks(fleet) if p.exists()]


@pytest.mark.engine
def test_a_set_is_applied_proven_and_rolled_back_together(fleet: SandboxFleet) -> None:
    before = {n: _files(fleet, n) for n in fleet.names}
    fleet.write_patch(SET_ID, HEADER + TARGET_A + TARGET_B)
    run = fleet.opspatch("apply", SET_ID, "--hosts", "sandbox", "--yes", "--json")
    assert run.code == 0, run.stdout + run.stderr
    doc = run.json()
    for host in doc["hosts"]:
        assert host["outcome"] == "applied", host
        # both files swapped before one restart and one smoke prove them together
        assert [s["step"] for s in host["steps"]] == [
            "begin",
            "plan",
            "backup",
            "swap",
            "swap",
            "restart",
            "ready",
            "smoke",
        ], host["steps"]
        assert host["file"]["set"]["state"] == "all-new", host["file"]
    for name in fleet.names:
        eagle, scheduler = _files(fleet, name)
        assert eagle.endswith(b"_OPSPATCH_SET_A = 1\n") and b"# opspatch:two-modules" in eagle
        assert scheduler.endswith(b"_OPSPATCH_SET_B = 2\n")
        assert fleet.generate(name) is not None  # the engine serves the set

    # the ledger holds each file's pre- and post-image, per host
    with Ledger.open(fleet.ledger_path) as ledger:
        detail = ledger.get_run(doc["run_id"])
        for name in fleet.names:
            versions = {v.path: v for v in detail.host(name).file_versions}
            assert set(versions) == {str(fleet.file(name)), str(_scheduler(fleet, name))}
            for path, old in zip(
                (str(fleet.file(name)), str(_scheduler(fleet, name))), before[name], strict=True
            ):
                assert ledger.blob(versions[path].sha256_before) == old
                assert versions[path].sha256_after == _sha(Path(path).read_bytes())

    status = _status(fleet, "sandbox")
    for name in fleet.names:
        assert status[name]["state"] == "applied", status[name]
        assert [f["state"] for f in status[name]["files"]] == ["applied", "applied"]

    back = fleet.opspatch("rollback", SET_ID, "--hosts", "sandbox", "--yes", "--json")
    assert back.code == 0, back.stdout + back.stderr
    for host in back.json()["hosts"]:
        assert host["outcome"] == "restored", host
        assert host["file"]["set"]["state"] == "all-old", host["file"]
        assert [s["step"] for s in host["steps"]].count("restore") == 2, host["steps"]
        assert [s["step"] for s in host["steps"]].count("restart") == 1, host["steps"]
    assert {n: _files(fleet, n) for n in fleet.names} == before  # byte-identical, both files
    status = _status(fleet, "sandbox")
    assert {n: s["state"] for n, s in status.items()} == dict.fromkeys(fleet.names, "not-applied")


def _status(fleet: SandboxFleet, inventory: str) -> dict[str, dict[str, Any]]:
    run = fleet.opspatch("status", "--hosts", inventory, "--patch", SET_ID, "--json")
    assert run.code == 0, run.stdout + run.stderr
    return {s["host"]: s for s in run.json()["status"]}


# ---------------------------------------------------------------------------------------------
# over real sshd: a fault between the two files' swaps


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultFleet]:
    if find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")
    with isolated_home(tmp_path_factory.mktemp("set-faults-home")):
        slot = FleetSlot(tmp_path_factory, "set-faults")
        try:
            found = slot.ready()
            found.fleet.write_patch(SET_ID, HEADER + TARGET_A + TARGET_B)
            yield found
        finally:
            slot.close()


def _standing(faults: FaultFleet, name: str, pristine: tuple[bytes, bytes]) -> tuple[str, str]:
    """Each file of the set on a host: `old` (byte-identical to before) or `new`."""
    now = _files(faults.fleet, name)
    return tuple(  # type: ignore[return-value]
        "old" if data == old else "new" for data, old in zip(now, pristine, strict=True)
    )


@pytest.mark.engine
@pytest.mark.ssh
def test_controller_killed_between_the_swaps_then_recover_makes_the_set_whole(
    faults: FaultFleet,
) -> None:
    canary = faults.canary
    pristine = _files(faults.fleet, canary)
    faults.arm("swap", at="before", skip=1)  # the canary's second swap is held
    controller = faults.spawn("apply", SET_ID, "--hosts", f"faults:{canary}", "--yes", "--json")
    faults.kill_when_held(controller)
    assert _standing(faults, canary, pristine) == ("new", "old")

    said = _status(faults.fleet, "faults")[canary]
    assert said["state"] == "partial", said  # never "applied"
    assert "the patch set is not whole" in said["detail"], said
    assert f"opspatch recover --hosts {canary}" in said["detail"], said

    recovered = faults.cli("recover", "--yes", "--json")
    assert recovered.code == 0, recovered.stdout + recovered.stderr
    mine = {h["host"]: h for h in recovered.json()["hosts"]}[canary]
    assert mine["outcome"] == "restored", mine
    assert mine["file"]["set"]["state"] == "all-old", mine["file"]
    assert "partly applied" in mine["note"], mine
    assert _standing(faults, canary, pristine) == ("old", "old")
    faults.decodes_as_before(canary)
    assert not faults.lock_file(canary).exists()
    assert faults.cli("ledger", "verify").code == 0
    assert _status(faults.fleet, "faults")[canary]["state"] == "not-applied"


@pytest.mark.engine
@pytest.mark.ssh
def test_connection_cut_after_the_first_swap_puts_the_set_back(faults: FaultFleet) -> None:
    canary = faults.canary
    pristine = _files(faults.fleet, canary)
    faults.arm("swap", cut="connection")  # the first swap happens, its reply never comes
    run = faults.cli("apply", SET_ID, "--hosts", f"faults:{canary}", "--yes", "--json")
    assert run.code == 1, run.stdout + run.stderr
    mine = {h["host"]: h for h in run.json()["hosts"]}[canary]
    assert (mine["outcome"], mine["reason"]) == ("rolled-back", "step-failed"), mine
    assert mine["file"]["set"]["state"] == "all-old", mine["file"]
    steps = [s["step"] for s in mine["steps"]]
    assert steps.count("swap") == 1 and "restore" in steps, steps  # the second never started
    assert _standing(faults, canary, pristine) == ("old", "old")
    faults.decodes_as_before(canary)
    assert not faults.lock_file(canary).exists()


@pytest.mark.engine
def test_a_staged_set_is_restarted_into_together(fleet: SandboxFleet) -> None:
    before = {n: _files(fleet, n) for n in fleet.names}
    fleet.write_patch(SET_ID, HEADER + TARGET_A + TARGET_B)
    run = fleet.opspatch(
        "apply", SET_ID, "--hosts", "sandbox", "--restart", "never", "--yes", "--json"
    )
    assert run.code == 0, run.stdout + run.stderr
    for host in run.json()["hosts"]:
        assert host["outcome"] == "staged", host
        assert host["file"]["set"]["state"] == "all-new", host["file"]
    status = _status(fleet, "sandbox")
    assert {n: s["state"] for n, s in status.items()} == dict.fromkeys(fleet.names, "staged")

    restarted = fleet.opspatch("restart", "--hosts", "sandbox", "--yes", "--json")
    assert restarted.code == 0, restarted.stdout + restarted.stderr
    for host in restarted.json()["hosts"]:
        assert host["outcome"] == "applied", host
        assert host["file"]["set"]["state"] == "all-new", host["file"]
        assert [s["step"] for s in host["steps"]].count("restart") == 1, host["steps"]
    status = _status(fleet, "sandbox")
    assert {n: s["state"] for n, s in status.items()} == dict.fromkeys(fleet.names, "applied")

    back = fleet.opspatch("rollback", SET_ID, "--hosts", "sandbox", "--yes", "--json")
    assert back.code == 0, back.stdout + back.stderr
    assert {n: _files(fleet, n) for n in fleet.names} == before


@pytest.mark.engine
def test_one_file_of_a_hosts_set_names_the_set_and_a_rollback_without_restart_is_staged_back(
    fleet: SandboxFleet,
) -> None:
    """Issue 31, item 21, on the sandbox: `rollback --run R --file F` with F one file of the
    set run R applied to a host said "the ledger has no change by run R to F"; it names the set
    and `rollback --run R --hosts H`. `rollback --restart never` restores every file byte for
    byte without a restart: `staged-back`, exit 0 (before: there was no such option)."""
    before = {n: _files(fleet, n) for n in fleet.names}
    fleet.write_patch(SET_ID, HEADER + TARGET_A + TARGET_B)
    run = fleet.opspatch("apply", SET_ID, "--hosts", "sandbox", "--yes", "--json")
    assert run.code == 0, run.stdout + run.stderr
    run_id = run.json()["run_id"]
    name = fleet.names[0]

    member = fleet.opspatch(
        "rollback", "--run", run_id, "--file", str(_scheduler(fleet, name))
    )  # refused before asking
    assert member.code == 2, member.stdout + member.stderr
    said = " ".join(member.stderr.split())
    assert f"one file of the patch set {SET_ID} that run {run_id} changed on {name}" in said, said
    assert f"opspatch rollback --run {run_id} --hosts {name}" in said, said

    pids = {n: fleet.pid(n) for n in fleet.names}
    back = fleet.opspatch(
        "rollback", SET_ID, "--hosts", "sandbox", "--restart", "never", "--yes", "--json"
    )
    assert back.code == 0, back.stdout + back.stderr
    assert back.json()["outcome"] == "ok"
    for host in back.json()["hosts"]:
        assert host["outcome"] == "staged-back", host
        assert host["file"]["set"]["state"] == "all-old", host["file"]
        steps = [s["step"] for s in host["steps"]]
        assert not {"restart", "ready", "smoke"} & set(steps), steps
    assert {n: _files(fleet, n) for n in fleet.names} == before  # byte-identical, both files
    assert {n: fleet.pid(n) for n in fleet.names} == pids  # no server was restarted
