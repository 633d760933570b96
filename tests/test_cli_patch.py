"""The patch commands on local files, run as the real console script."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from tests.clirunner import opspatch

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "opspatch" / "sandbox" / "engine_src"
EAGLE = "sglang/srt/speculative/eagle_worker_v2.py"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    """A site-packages holding the stand-in engine and a dist-info saying 0.5.23."""
    from opspatch.sandbox.install import install_standin

    site = tmp_path / "site-packages"
    site.mkdir()
    install_standin(site)
    return site


@pytest.fixture()
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "patches").mkdir(parents=True)
    return ws


def test_schema_prints_json_schema() -> None:
    run = opspatch("schema")
    assert run.code == 0
    assert run.json()["title"] == "opspatch patch file"


def test_check_bundled_patches_from_any_directory(tmp_path: Path) -> None:
    run = opspatch("check", "--json", cwd=tmp_path)
    assert run.code == 0, run.stderr
    ids = {p["patch"] for p in run.json()["patches"]}
    assert {"eagle-init-guard", "scheduler-report-partial-init"} <= ids


def test_check_reports_bad_patch_with_file_line_field(workspace: Path) -> None:
    bad = workspace / "patches" / "broken.toml"
    text = (
        (REPO / "patches" / "eagle-init-guard.toml")
        .read_text()
        .replace('id = "eagle-init-guard"', 'id = "broken"')
        .replace('position = "start"\ncomment = "set', 'position = "middle"\ncomment = "set')
    )
    bad.write_text(text)
    line = text.splitlines().index('position = "middle"') + 1
    run = opspatch("check", "broken", cwd=workspace)
    assert run.code == 2
    assert f"broken.toml:{line}: edits[1].position" in run.stderr  # errors go to stderr


def test_plan_shows_diff_and_changes_nothing(site: Path) -> None:
    target = site / EAGLE
    before = sha(target)
    run = opspatch("plan", "eagle-init-guard", "--file", str(target))
    assert run.code == 0, run.stderr
    assert "+    spec_disable_batch_threshold: int = 0" in run.stdout
    assert "+        self.spec_disable_batch_threshold = 0" in run.stdout
    assert sha(target) == before
    doc = opspatch("plan", "eagle-init-guard", "--file", str(target), "--json").json()
    assert doc["outcome"] == "applicable"
    assert doc["version"] == "0.5.23"
    assert doc["sha256_before"] == before


def test_plan_refuses_a_file_that_is_not_the_target_module(site: Path, tmp_path: Path) -> None:
    other = tmp_path / "copy.py"
    shutil.copy(site / EAGLE, other)
    run = opspatch("plan", "eagle-init-guard", "--file", str(other))
    assert run.code == 2
    assert "eagle-init-guard.toml:" in run.stderr
    assert "target.module" in run.stderr
    assert "is not sglang.srt.speculative.eagle_worker_v2" in run.stderr


def test_plan_refuses_a_version_outside_the_range(site: Path) -> None:
    run = opspatch(
        "plan",
        "scheduler-report-partial-init",
        "--file",
        str(site / "sglang/srt/managers/scheduler.py"),
        "--target-version",
        "0.5.22",
    )
    assert run.code == 2
    assert "target.versions" in run.stderr and "0.5.22 is outside" in run.stderr


def test_plan_anchor_miss_names_patch_line_and_nearest(site: Path, workspace: Path) -> None:
    text = (
        (REPO / "patches" / "eagle-init-guard.toml")
        .read_text()
        .replace(
            'scope = "EAGLEWorkerV2.__init__"\nposition',
            'scope = "EAGLEWorkerV2.__int__"\nposition',
        )
    )
    (workspace / "patches" / "eagle-init-guard.toml").write_text(text)
    line = text.splitlines().index('scope = "EAGLEWorkerV2.__int__"') + 1
    run = opspatch("plan", "eagle-init-guard", "--file", str(site / EAGLE), cwd=workspace)
    assert run.code == 2
    assert f"eagle-init-guard.toml:{line}: edits[1].scope" in run.stderr
    assert "EAGLEWorkerV2.__init__" in run.stderr  # the nearest candidate


def test_unknown_patch_suggests_near_names(tmp_path: Path) -> None:
    run = opspatch("plan", "eagle-init-gaurd", "--file", "x.py", cwd=tmp_path)
    assert run.code == 2
    assert "did you mean eagle-init-guard" in run.stderr


# ---------------------------------------------------------------------------------------------
# apply / rollback on a local file (the same host agent and ledger as a fleet)


def test_apply_file_then_rollback_is_byte_identical_and_recorded(
    site: Path, tmp_path: Path
) -> None:
    target = site / EAGLE
    target.chmod(0o640)
    before = target.read_bytes()
    env = {"OPSPATCH_STATE_DIR": str(tmp_path / "state")}

    dry = opspatch("apply", "eagle-init-guard", "--file", str(target), "--dry-run", env=env)
    assert dry.code == 0 and target.read_bytes() == before

    refused = opspatch("apply", "eagle-init-guard", "--file", str(target), env=env)
    assert refused.code == 2 and "--yes" in refused.stderr
    assert target.read_bytes() == before

    run = opspatch("apply", "eagle-init-guard", "--file", str(target), "--yes", "--json", env=env)
    assert run.code == 0, run.stdout + run.stderr
    host = run.json()["hosts"][0]
    assert host["outcome"] == "applied"
    assert b"self.spec_disable_batch_threshold = 0" in target.read_bytes()
    assert target.stat().st_mode & 0o777 == 0o640
    assert host["file"]["sha256_before"] == hashlib.sha256(before).hexdigest()

    again = opspatch("apply", "eagle-init-guard", "--file", str(target), "--yes", "--json", env=env)
    assert again.code == 0 and again.json()["hosts"][0]["outcome"] == "already-applied"

    back = opspatch(
        "rollback", "eagle-init-guard", "--file", str(target), "--yes", "--json", env=env
    )
    assert back.code == 0, back.stdout + back.stderr
    assert back.json()["hosts"][0]["outcome"] == "restored"
    assert target.read_bytes() == before
    assert target.stat().st_mode & 0o777 == 0o640

    runs = opspatch("ledger", "list", "--json", env=env).json()["runs"]
    assert [r["command"] for r in runs][:2] == ["rollback", "apply"]
    assert opspatch("ledger", "verify", env=env).code == 0


def test_rollback_file_without_a_record_is_refused(site: Path, tmp_path: Path) -> None:
    target = site / EAGLE
    before = target.read_bytes()
    run = opspatch(
        "rollback",
        "eagle-init-guard",
        "--file",
        str(target),
        "--yes",
        env={"OPSPATCH_STATE_DIR": str(tmp_path / "state")},
    )
    assert run.code == 2
    assert "the ledger has no change" in run.stderr
    assert target.read_bytes() == before
