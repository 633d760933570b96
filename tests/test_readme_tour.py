"""The README's tour runs as written: every command of its sandbox block, in order, on a fresh
state directory, with the exit code the README says (exit 1 where its comment says so, else 0)."""

from __future__ import annotations

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


def test_the_tour_block_is_found_and_names_its_failing_steps() -> None:
    commands = tour_commands()
    assert commands[0].startswith("export OPSPATCH_STATE_DIR=")
    assert any("exit 1" in line for line in commands)
    assert commands[-1].startswith("opspatch sandbox down")


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "100"}
    for line in tour_commands():
        words = shlex.split(line, comments=True)
        comment = line.partition(" #")[2]
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            env[name] = value.replace("$PWD", str(tmp_path))
            continue
        assert words[0] == "opspatch", line
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
        if words[1] == "apply":  # the lines the README shows of it
            said = done.stdout + done.stderr
            assert ": eagle-init-guard on 3 host(s), playbook default" in said, said
            assert "sandbox-01: smoke ok" in said and "outcome: ok (exit 0)" in said, said
