"""`apply PATCH --file PATH --yes` without the typer app (issue 44): which arguments take that
path, and that it says and does what the typer app says and does for each of them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opspatch.cli.localapply import LocalApply, scripted_local_apply
from tests.clirunner import Run, opspatch

PLAIN = [
    (["apply", "p", "--file", "m.py", "--yes"], LocalApply("p", Path("m.py"))),
    (
        [
            "apply",
            "p.toml",
            "-f",
            "m.py",
            "-y",
            "--json",
            "--target-version",
            "1",
            "--python",
            "py",
        ],
        LocalApply("p.toml", Path("m.py"), "1", "py", as_json=True),
    ),
    (
        ["-w", "ws", "--ledger", "l.db", "apply", "p", "--yes", "--file", "m.py"],
        LocalApply("p", Path("m.py"), workspace=Path("ws"), ledger="l.db"),
    ),
]

TO_TYPER = [
    ["apply", "p", "--file", "m.py"],  # no --yes: a terminal may be asked
    ["apply", "p", "--yes"],  # no --file
    ["apply", "p", "--file", "m.py", "--yes", "--help"],
    ["apply", "p", "--file", "m.py", "--yes", "--dry-run"],
    ["apply", "p", "--file=m.py", "--yes"],
    ["apply", "p", "--file", "m.py", "--file", "n.py", "--yes"],
    ["apply", "p", "--file", "m.py", "--yes", "--yes"],
    ["apply", "p", "--file", "--yes"],
    ["apply", "p", "--file", "", "--yes"],
    ["apply", "p", "q", "--file", "m.py", "--yes"],
    ["apply", "--file", "m.py", "--yes"],
    ["apply", "p", "--file", "m.py", "--yes", "--"],
    ["apply", "p", "--file", "m.py", "--yes", "--hosts", "h"],
    ["apply", "p", "--file", "m.py", "--yes", "--root", "r"],
    ["--version", "apply", "p", "--file", "m.py", "--yes"],
    ["-w", "apply", "p", "--file", "m.py", "--yes"],
    ["plan", "p", "--file", "m.py", "--yes"],
    ["apply"],
    [],
]


@pytest.mark.pure
@pytest.mark.parametrize(("args", "expected"), PLAIN, ids=[" ".join(a) for a, _ in PLAIN])
def test_the_plain_shape_is_read_without_typer(args: list[str], expected: LocalApply) -> None:
    assert scripted_local_apply(args) == expected


@pytest.mark.pure
@pytest.mark.parametrize("args", TO_TYPER, ids=[" ".join(a) or "none" for a in TO_TYPER])
def test_every_other_shape_goes_to_typer(args: list[str]) -> None:
    assert scripted_local_apply(args) is None


PATCH = (
    'id = "guard-value"\nsummary = "s"\nrationale = "r"\n[target]\nmodule = "pkg.mod"\n'
    '[[edits]]\nkind = "insert"\nscope = "{scope}"\nposition = "start"\ncode = "x = 0"\n'
)

CASES = [
    ("apply", "guard-value", "--file", "pkg/mod.py", "--target-version", "1", "--yes"),
    ("apply", "guard-value", "--file", "pkg/mod.py", "--target-version", "1", "--yes", "--json"),
    ("-w", "ws", "--ledger", "other.sqlite3", "apply", "guard-value", "-f", "pkg/mod.py", "-y"),
    ("apply", "no-such-patch", "--file", "pkg/mod.py", "--yes"),
    ("apply", "no-such-patch", "--file", "pkg/mod.py", "--yes", "--json"),
    ("apply", "guard-value", "--file", "pkg/missing.py", "--yes"),
    ("apply", "guard-elsewhere", "--file", "pkg/mod.py", "--yes"),
    ("apply", "guard-elsewhere", "--file", "pkg/mod.py", "--yes", "--json"),
    ("apply", "guard-value", "--file", "pkg/mod.py", "--python", "no-such-python", "--yes"),
]
"""Applied (table, JSON, under -w and --ledger), an unknown patch, a missing file, a patch whose
scope is not in the file, an interpreter that does not exist."""

TYPER_APP = "import sys\nfrom opspatch.cli.app import main\nmain(sys.argv[1:])\n"


def _fresh(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    for workspace in (folder, folder / "ws"):
        (workspace / "patches").mkdir(parents=True)
        (workspace / "patches" / "guard-value.toml").write_text(PATCH.format(scope="f"))
        (workspace / "patches" / "guard-elsewhere.toml").write_text(
            PATCH.format(scope="g").replace("guard-value", "guard-elsewhere")
        )
    (folder / "pkg").mkdir()
    (folder / "pkg" / "mod.py").write_text("def f():\n    return 1\n", encoding="utf-8")


def _typer_app(args: tuple[str, ...], folder: Path, env: dict[str, str]) -> Run:
    import os

    done = subprocess.run(
        [sys.executable, "-c", TYPER_APP, *args],
        cwd=folder,
        env={**os.environ, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def _masked(text: str) -> str:
    """Run ids, times and hashes differ between two runs: every word of hex digits is masked,
    and a table's padding (a longer time widens its column)."""
    hex_masked = re.sub(r"\b[0-9a-f]{6,}\b", "0", text)  # a run id's suffix may have no digit
    return re.sub(r"[ ━]+", " ", re.sub(r"[0-9a-f]*[0-9][0-9a-f]*", "0", hex_masked))


@pytest.mark.process
@pytest.mark.parametrize("args", CASES, ids=[" ".join(c) for c in CASES])
def test_without_typer_the_same_words_code_and_file(args: tuple[str, ...], tmp_path: Path) -> None:
    assert scripted_local_apply(args) is not None
    folder = tmp_path / "w"
    env = {"OPSPATCH_STATE_DIR": str(folder / "state")}
    _fresh(folder)
    typer_run = _typer_app(args, folder, env)
    typer_file = (folder / "pkg" / "mod.py").read_text(encoding="utf-8")
    _fresh(folder)
    run = opspatch(*args, cwd=folder, env=env)
    assert "Traceback" not in run.stderr + typer_run.stderr, run.stderr + typer_run.stderr
    assert (run.code, _masked(run.stdout), _masked(run.stderr)) == (
        typer_run.code,
        _masked(typer_run.stdout),
        _masked(typer_run.stderr),
    )
    assert (folder / "pkg" / "mod.py").read_text(encoding="utf-8") == typer_file
