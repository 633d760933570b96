"""The README's tour runs as written: every command of its sandbox block, in order, on a fresh
state directory, with the exit code the README says (exit 1 where its comment says so, else 0);
and as the README says it runs behind a router too (`sandbox up --router`), where its rollback
leaves sandbox-01 out of rotation and the apply after it brings the host back."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.pure, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[1]


def tour_commands() -> list[str]:
    """The lines of the first code block under the README's tour heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## A tour on the sandbox", 1)[1]
    block = section.split("```", 2)[1]
    return [line for line in block.splitlines() if line.strip()]


def readme_smoke_lines() -> list[str]:
    """The decodes the README shows a passing `smoke` print (the block after `and the smoke`)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("and the `smoke` after it", 1)[1].split("```", 2)[1]
    return [line.strip() for line in block.splitlines() if " -> " in line]


def test_the_tour_block_is_found_and_names_its_failing_steps() -> None:
    commands = tour_commands()
    assert commands[0].startswith("export OPSPATCH_STATE_DIR=")
    assert any("exit 1" in line for line in commands)
    assert commands[-1].startswith("opspatch sandbox down")
    assert len(readme_smoke_lines()) == 2


def test_the_tour_puts_the_fix_back_after_its_rollback_and_says_it_runs_behind_a_router() -> None:
    commands = tour_commands()
    rollback = next(i for i, line in enumerate(commands) if line.startswith("opspatch rollback"))
    assert commands[rollback + 1].startswith("opspatch apply eagle-init-guard --hosts sandbox")
    assert "`opspatch sandbox up --router` runs the same tour" in (ROOT / "README.md").read_text()


def rotations(env: dict[str, str], cwd: Path) -> dict[str, tuple[str, str | None]]:
    """`status --json` of the tour's patch: each host's state and rotation."""
    done = subprocess.run(
        [sys.executable, "-m", "opspatch.cli", "status", "--hosts", "sandbox"]
        + ["--patch", "eagle-init-guard", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)["status"]
    return {row["host"]: (row["state"], row.get("rotation")) for row in rows}


@pytest.mark.parametrize(
    "router",
    [False, pytest.param(True, marks=pytest.mark.router)],
    ids=["plain", "behind-a-router"],
)
def test_the_readme_tour_runs_as_written(tmp_path: Path, router: bool) -> None:
    env = {**os.environ, "COLUMNS": "100"}
    try:
        _run_the_tour(tmp_path, router, env)
    finally:  # a step that failed before the tour's own `sandbox down` must not leave servers
        subprocess.run(
            [sys.executable, "-m", "opspatch.cli", "sandbox", "down"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            timeout=600,
        )


def _run_the_tour(tmp_path: Path, router: bool, env: dict[str, str]) -> None:
    applies = 0
    for line in tour_commands():
        words = shlex.split(line, comments=True)
        comment = line.partition(" #")[2]
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            env[name] = value.replace("$PWD", str(tmp_path))
            continue
        assert words[0] == "opspatch", line
        if router and words[1:3] == ["sandbox", "up"]:
            words.append("--router")  # as the README says under the tour
        expected = 1 if "exit 1" in comment else 0
        done = subprocess.run(
            [sys.executable, "-m", "opspatch.cli", *words[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == expected, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        if words[1] == "smoke" and expected == 1:  # a crashed host: one short line each
            crashed = [ln for ln in done.stdout.splitlines() if ln.startswith("sandbox-0")]
            assert len(crashed) == 3, done.stdout
            for said in crashed:
                assert "AttributeError" in said and len(said) <= 200, said
                assert "/site-packages/" not in said, said  # the path cut to its file name
        if words[1] == "smoke" and expected == 0:  # the decodes the README shows
            for said in readme_smoke_lines():
                assert said in done.stdout, done.stdout
        if words[1] == "apply":  # the lines the README shows of it
            applies += 1
            said = done.stdout + done.stderr
            assert ": eagle-init-guard on 3 host(s), playbook default" in said, said
            assert "sandbox-01: smoke ok" in said and "outcome: ok (exit 0)" in said, said
        if router and words[1] == "rollback":  # the canary drained, its server crashed
            found = rotations(env, tmp_path)
            assert found["sandbox-01"] == ("not-applied", "out-of-rotation"), found
        if router and words[1] == "apply" and applies == 2:  # the way back: every host serves
            found = rotations(env, tmp_path)
            assert set(found.values()) == {("applied", "in-rotation")}, found
            assert len(found) == 3, found
    assert applies == 2
