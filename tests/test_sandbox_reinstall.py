"""`opspatch sandbox reinstall HOST [--version V] [--restart]` (issue 31, item 19): a reinstall or
an upgrade simulated on a real sandbox host, in both install shapes, and what `status`, `drift`
and `sync --check` then say. One fleet of one host per shape; each test runs its steps in
order: patched by a real apply, reinstalled (the fix gone, the engine left running; drift and
sync --check find it, sync puts the fix back), then upgraded to the release that ships the fix
and restarted onto it (serving)."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opspatch.sandbox.checkout import checkout_files
from opspatch.sandbox.dist import STANDIN_FIXED_IN, STANDIN_VERSION, standin_files
from tests.clirunner import opspatch
from tests.faultkit import isolated_home
from tests.fleetkit import EAGLE_RELPATH, SandboxFleet, copy_patch

pytestmark = pytest.mark.process

PATCH_ID = "eagle-init-guard"
HOST = "sandbox-01"
FLEET_TOML = f'[[patches]]\nid = "{PATCH_ID}"\nhosts = ["sandbox"]\nreleases = ">=0.5.4"\n'
PRISTINE = hashlib.sha256(standin_files(STANDIN_VERSION)[EAGLE_RELPATH]).hexdigest()
FIXED = hashlib.sha256(standin_files(STANDIN_FIXED_IN)[EAGLE_RELPATH]).hexdigest()


def test_reinstall_without_a_sandbox_is_refused(tmp_path: Path) -> None:
    env = {"OPSPATCH_STATE_DIR": str(tmp_path)}
    none = opspatch("sandbox", "reinstall", HOST, env=env)
    assert none.code == 2, none.stdout + none.stderr
    assert "no sandbox in" in none.stderr


@pytest.fixture(scope="module", params=["wheel", "editable"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    SandboxFleet
]:  # fmt: skip
    with isolated_home(tmp_path_factory.mktemp("reinstall-home")):
        sandbox = SandboxFleet(tmp_path_factory.mktemp("reinstall"), 1, install=request.param)
        sandbox.up()
        try:
            copy_patch(sandbox, PATCH_ID)
            (sandbox.workspace / "fleet.toml").write_text(FLEET_TOML)
            yield sandbox
        finally:
            sandbox.close()


def _status(fleet: SandboxFleet) -> dict[str, Any]:
    run = fleet.opspatch("status", "--hosts", HOST, "--patch", PATCH_ID, "--json")
    assert run.code == 0, run.stdout + run.stderr
    (status,) = run.json()["status"]
    assert isinstance(status, dict)
    return status


def _reinstall(fleet: SandboxFleet, *args: str) -> dict[str, Any]:
    run = fleet.opspatch("sandbox", "reinstall", HOST, *args, "--json", timeout=240)
    assert run.code == 0, run.stdout + run.stderr
    report: dict[str, Any] = run.json()
    return report


def _git(fleet: SandboxFleet, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(fleet.checkout(HOST)), *args], capture_output=True,
                          text=True, check=True)  # fmt: skip
    return done.stdout


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_a_reinstall_takes_the_fix_away_and_an_upgrade_brings_the_release_that_has_it(
    fleet: SandboxFleet,
) -> None:
    unknown = fleet.opspatch("sandbox", "reinstall", "sandbox-09")
    assert unknown.code == 2, unknown.stdout + unknown.stderr
    assert "the sandbox has no host 'sandbox-09'; nothing was changed" in unknown.stderr
    applied = fleet.opspatch("apply", PATCH_ID, "--hosts", "sandbox", "--yes", "--json")
    assert applied.code == 0, applied.stdout + applied.stderr
    assert _status(fleet)["state"] == "applied"
    pid = fleet.pid(HOST)

    # a reinstall of the same release: the release's bytes back, the engine left running
    report = _reinstall(fleet)
    assert report == {
        "host": HOST, "install": fleet.install, "version_before": STANDIN_VERSION,
        "version": STANDIN_VERSION, "restarted": False, "pid": report["pid"],
    }  # fmt: skip
    assert report["pid"] is not None and fleet.pid(HOST) == pid
    assert fleet.sha(HOST) == PRISTINE
    if fleet.install == "editable":  # git checkout of the release: clean, HEAD unchanged
        assert _git(fleet, "status", "--porcelain") == ""
        assert _git(fleet, "rev-list", "--count", "HEAD").strip() == "1"
    status = _status(fleet)
    assert status["state"] != "applied", status
    drift = fleet.opspatch("drift", "--json")
    assert drift.code == 1, drift.stdout + drift.stderr
    assert [(d["host"], d["cause"]) for d in drift.json()["drift"]] == [(HOST, "reinstalled")]
    check = fleet.opspatch("sync", "--check")
    assert check.code == 1, check.stdout + check.stderr
    assert check.stdout.startswith(f"{HOST}: {PATCH_ID}: apply: "), check.stdout
    synced = fleet.opspatch("sync", "--yes", "--json")
    assert synced.code == 0, synced.stdout + synced.stderr
    assert _status(fleet)["state"] == "applied"
    pid = fleet.pid(HOST)

    # an upgrade to the release that ships the fix, the engine restarted onto it
    report = _reinstall(fleet, "--version", STANDIN_FIXED_IN, "--restart")
    assert (report["version_before"], report["version"], report["restarted"]) == (
        STANDIN_VERSION, STANDIN_FIXED_IN, True,
    )  # fmt: skip
    assert fleet.pid(HOST) not in (None, pid)
    assert fleet.sha(HOST) == FIXED
    if fleet.install == "editable":  # the release committed, as a checkout of its tag
        assert _git(fleet, "status", "--porcelain") == ""
        assert _git(fleet, "log", "-1", "--format=%s").startswith(f"sglang {STANDIN_FIXED_IN}:")
        tree = checkout_files(STANDIN_FIXED_IN)
        assert (fleet.checkout(HOST) / "python" / "pyproject.toml").read_bytes() == tree[
            "python/pyproject.toml"
        ]
    upgraded = _status(fleet)
    if fleet.install == "wheel":  # RECORD proves the file is the release's own, with the fix
        assert upgraded["state"] == "fixed-upstream", upgraded
    else:  # a checkout has no RECORD: status cannot call it the release's file, only not ours
        assert (upgraded["state"], upgraded["carried"]) == ("drifted", "not-applied"), upgraded
    answer = fleet.generate(HOST)
    assert answer is not None and "text" in answer, answer  # the new release serves
    text = fleet.opspatch("sandbox", "reinstall", HOST)  # the text form, same release again
    assert text.code == 0, text.stdout + text.stderr
    assert text.stdout.startswith(f"{HOST}: reinstalled sglang {STANDIN_FIXED_IN} "), text.stdout
    assert "still runs the code it loaded: add --restart" in text.stdout
