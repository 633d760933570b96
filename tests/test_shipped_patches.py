"""Every patch the repository ships passes its own `check --releases` (every real release in its
range, listed from PyPI) and plans on the sandbox's stand-in engine, whose files every sandbox
host carries (issue 42, item 21: `scheduler-report-partial-init` applied to neither, and every
`sandbox status` listed it `unknown`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch
from opspatch.core.gate import version_gate
from opspatch.sandbox.dist import DIST_NAME, STANDIN_VERSION, engine_source_dir
from tests.clirunner import opspatch
from tests.sglang_wheels import CACHE

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted(path.stem for path in (REPO / "patches").glob("*.toml"))


@pytest.mark.pure
def test_the_repository_ships_patches() -> None:
    assert {"eagle-init-guard", "scheduler-report-partial-init"} <= set(SHIPPED)


@pytest.mark.pure
@pytest.mark.parametrize("patch_id", SHIPPED)
def test_every_shipped_patch_plans_on_the_sandbox(patch_id: str) -> None:
    """Each file of the patch, as a sandbox host has it (the stand-in's source, release
    `STANDIN_VERSION`): inside the patch's range, and the patch applies (not `unknown`)."""
    loaded = load_patch(REPO / "patches" / f"{patch_id}.toml")
    for part in loaded.parts:
        path = next(
            engine_source_dir() / relpath
            for relpath in part.target.module_relpaths()
            if (engine_source_dir() / relpath).is_file()
        )
        gate = version_gate(
            part.target,
            str(path),
            owner=DIST_NAME,
            owner_version=STANDIN_VERSION,
            installed_version=STANDIN_VERSION,
        )
        assert gate is None, gate
        planned = apply_patch(path.read_bytes(), part)
        assert isinstance(planned, Applied), getattr(planned, "reason", planned)


@pytest.mark.network
@pytest.mark.process  # the console script, and pip fetching the releases the cache lacks
@pytest.mark.parametrize("patch_id", SHIPPED)
def test_every_shipped_patch_passes_its_own_check_releases(patch_id: str) -> None:
    """`opspatch check PATCH --releases` as an operator runs it, its range listed from the
    index; the releases are cached across runs (the tests' persistent cache)."""
    run = opspatch(
        "check",
        patch_id,
        "--releases",
        "--json",
        env={"OPSPATCH_CACHE": str(CACHE / "releases")},
        timeout=1800,
    )
    matrices = run.json()["matrices"]  # a patch set: one per file
    for matrix in matrices:
        if matrix["listed_from"] != "index":
            pytest.skip(
                f"PyPI not reachable: the releases were listed from {matrix['listed_from']}"
            )
        assert matrix["unchecked"] == [], matrix["unchecked"]
        assert matrix["ok"], [r for r in matrix["results"] if r["verdict"] != "ok"]
        assert matrix["results"], "no release checked"
    assert run.code == 0, run.stderr
