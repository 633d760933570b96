"""Plain `opspatch check` warns when a patch's range covers releases `check --releases` has not
proven it on; run as the real console script over a real release cache of real SGLang wheels."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clirunner import opspatch
from tests.sglang_wheels import WheelUnavailable, seed_release_cache

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parent.parent
GUARD = REPO / "patches" / "eagle-init-guard.toml"
SET_ID = "eagle-draft-positions-after-forward"


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A release cache holding the wheels of 0.5.4, 0.5.10 and 0.5.23 (offline)."""
    try:
        return seed_release_cache(tmp_path / "cache")
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang wheels not available (offline?): {exc}")


def _workspace_patch(tmp_path: Path, patch_id: str, text: str) -> Path:
    ws = tmp_path / "ws"
    (ws / "patches").mkdir(parents=True, exist_ok=True)
    (ws / "patches" / f"{patch_id}.toml").write_text(text, encoding="utf-8")
    return ws


def test_check_warns_until_check_releases_has_proven_the_range(cache: Path) -> None:
    env = {"OPSPATCH_CACHE": str(cache)}
    before = opspatch("check", "eagle-init-guard", env=env)
    assert before.code == 0, before.stderr  # a warning, not a failure
    assert (
        "warning  eagle-init-guard: versions '>=0.5.4' is not proven on any release: "
        "run `opspatch check eagle-init-guard --releases`"
    ) in before.stderr

    proved = opspatch("check", "eagle-init-guard", "--releases", "--offline", env=env)
    assert proved.code == 0, proved.stdout + proved.stderr

    after = opspatch("check", "eagle-init-guard", "--json", env=env)
    assert after.code == 0, after.stderr
    (doc,) = after.json()["patches"]
    assert doc["releases"]["proven"] == ["0.5.4", "0.5.10", "0.5.23"]
    assert doc["releases"]["unproven"] == []
    # offline, the releases came from the cache: the range may hold others, and check says so
    assert doc["releases"]["listed_in_full"] is False
    assert "not listed in full from the index" in doc["releases"]["warning"]


def test_check_names_the_releases_in_range_a_patch_failed_on(cache: Path, tmp_path: Path) -> None:
    # anchored on EAGLEWorkerV2.clear_cache_pool, which 0.5.23 no longer has
    text = (
        GUARD.read_text(encoding="utf-8")
        .replace('id = "eagle-init-guard"', 'id = "pool-guard"')
        .replace('scope = "EAGLEWorkerV2.__init__"', 'scope = "EAGLEWorkerV2.clear_cache_pool"')
    )
    ws = _workspace_patch(tmp_path, "pool-guard", text)
    env = {"OPSPATCH_CACHE": str(cache)}
    matrix = opspatch("check", "pool-guard", "--releases", "--offline", env=env, cwd=ws)
    assert matrix.code == 1, matrix.stdout + matrix.stderr
    assert "FAILED in range: 0.5.23" in matrix.stdout

    run = opspatch("check", "pool-guard", env=env, cwd=ws)
    assert run.code == 0, run.stderr
    assert (
        "warning  pool-guard: versions '>=0.5.4' covers releases it is not proven on: 0.5.23: "
        "run `opspatch check pool-guard --releases`"
    ) in run.stderr

    # narrowing the range to what was proven leaves no release named
    narrowed = text.replace('versions = ">=0.5.4"', 'versions = ">=0.5.4,<0.5.23"')
    (ws / "patches" / "pool-guard.toml").write_text(narrowed, encoding="utf-8")
    run = opspatch("check", "pool-guard", "--json", env=env, cwd=ws)
    (doc,) = run.json()["patches"]
    assert (doc["releases"]["proven"], doc["releases"]["unproven"]) == (["0.5.4", "0.5.10"], [])

    # rewording the rationale keeps them; changing an edit voids them
    reworded = narrowed.replace('rationale = """', 'rationale = """Reworded. ', 1)
    assert reworded != narrowed
    (ws / "patches" / "pool-guard.toml").write_text(reworded, encoding="utf-8")
    run = opspatch("check", "pool-guard", "--json", env=env, cwd=ws)
    (doc,) = run.json()["patches"]
    assert doc["releases"]["proven"] == ["0.5.4", "0.5.10"]

    changed = narrowed.replace(
        "\nself.spec_disable_batch_threshold = 0\n", "\nself.spec_disable_batch_threshold = 1\n"
    )
    assert changed != narrowed
    (ws / "patches" / "pool-guard.toml").write_text(changed, encoding="utf-8")
    run = opspatch("check", "pool-guard", env=env, cwd=ws)
    assert "is not proven on any release" in run.stderr


def test_a_patch_set_is_checked_on_every_release_file_by_file(cache: Path, tmp_path: Path) -> None:
    """`check --releases` on a patch set gives one matrix per target module; plain `check` then
    counts a release proven where every file of the set passed on it."""
    backport = REPO / "tests" / "data" / "backports" / "eagle-draft-positions-after-forward.toml"
    ws = _workspace_patch(tmp_path, SET_ID, backport.read_text(encoding="utf-8"))
    env = {"OPSPATCH_CACHE": str(cache)}
    before = opspatch("check", SET_ID, "--json", env=env, cwd=ws)
    assert before.code == 0, before.stderr
    (doc,) = before.json()["patches"]
    assert doc["releases"]["proven"] == []

    matrix = opspatch("check", SET_ID, "--releases", "--offline", "--json", env=env, cwd=ws)
    assert matrix.code == 0, matrix.stdout + matrix.stderr
    matrices = matrix.json()["matrices"]
    modules = [m["module"] for m in matrices]
    assert len(modules) == len(set(modules)) >= 2, modules
    for each in matrices:  # 0.5.10 is the one cached release in the set's range
        assert [r["version"] for r in each["results"] if r["in_range"]] == ["0.5.10"], each
        assert each["ok"] and each["failed"] == [], each

    after = opspatch("check", SET_ID, "--json", env=env, cwd=ws)
    (doc,) = after.json()["patches"]
    assert doc["releases"]["proven"] == ["0.5.10"]
