"""docs/cli.md's reference is every command's own `--help`: regenerated here, it must equal the
committed doc, whatever width the terminal running the tests has."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from opspatch.cli import docgen

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[1]


def test_committed_reference_is_what_the_commands_help_says() -> None:
    committed = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert docgen.MARKER in committed, "docs/cli.md lost its generated section's marker"
    assert docgen.document(committed) == committed, (
        "docs/cli.md differs from the commands' --help: run `python -m opspatch.cli.docgen`"
    )


def test_reference_covers_every_command() -> None:
    reference = docgen.render_reference()
    for command in (
        "check",
        "plan",
        "apply",
        "rollback",
        "recover",
        "unlock",
        "restart",
        "status",
        "smoke",
        "lint-init",
        "export",
        "diagnose",
        "adopt",
        "schema",
        "ledger report",
        "sandbox up",
        "inventory show",
    ):
        assert f"### `opspatch {command}`" in reference


@pytest.mark.process
def test_check_mode_ignores_the_terminal_width() -> None:
    for columns in ("40", "300"):
        done = subprocess.run(
            [sys.executable, "-m", "opspatch.cli.docgen", "--check"],
            env={**os.environ, "COLUMNS": columns},
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr


def test_help_shows_words_for_option_values_not_python_types() -> None:
    reference = docgen.render_reference()
    options = [line for line in reference.splitlines() if line.lstrip().startswith("-")]
    assert not [line for line in options if "<str>" in line or "<int>" in line or "list[" in line]


def test_help_shows_arguments_by_their_name_not_their_python_type() -> None:
    reference = docgen.render_reference()
    assert "PATCH " in reference
    assert "<str>" not in reference and "<path>" not in reference and "<int>" not in reference
