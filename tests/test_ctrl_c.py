"""A Ctrl-C that reaches the command line (outside a run's own handling, docs/cli.md "Exit
codes"): the typer app and `apply --file --yes` (run without typer) say the same line and exit
with the same code, 130, as a shell reports a command stopped by Ctrl-C."""

from __future__ import annotations

import sys

import pytest

from opspatch.cli import render
from opspatch.cli.app import main as typer_main
from opspatch.cli.context import GlobalOptions
from opspatch.cli.localapply import run_scripted, scripted_local_apply
from opspatch.errors import EXIT_INTERRUPTED

pytestmark = pytest.mark.pure

ARGS = ["apply", "guard-value", "--file", "mod.py"]


@pytest.fixture
def ctrl_c_while_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's Ctrl-C arrives while the patch is read: before any host is reached."""

    def interrupted(self: GlobalOptions, reference: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(GlobalOptions, "load_patch", interrupted)


def _exit_code(run: object) -> int:
    with pytest.raises(SystemExit) as done:
        assert callable(run)
        run()
    assert isinstance(done.value.code, int)
    return done.value.code


@pytest.mark.usefixtures("ctrl_c_while_loading")
def test_a_ctrl_c_says_what_stopped_and_exits_130_on_both_paths(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    typer_code = _exit_code(lambda: typer_main([*ARGS, "--yes", "--dry-run"]))
    typer_err = capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["opspatch", *ARGS, "--yes"])  # as the console script has
    scripted = scripted_local_apply([*ARGS, "--yes"])
    assert scripted is not None
    scripted_code = _exit_code(lambda: run_scripted(scripted))
    scripted_err = capsys.readouterr().err
    assert typer_code == scripted_code == EXIT_INTERRUPTED == 130
    for said in (typer_err, scripted_err):
        assert said.startswith("error: interrupted (Ctrl-C): `opspatch apply"), said
        assert "opspatch status" in said, said  # where each host stands: how to see it


@pytest.mark.usefixtures("ctrl_c_while_loading")
def test_a_ctrl_c_with_json_writes_its_exit_code_in_the_error_document(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render._JsonState, "written", False)  # once a process: this test's
    code = _exit_code(lambda: typer_main([*ARGS, "--yes", "--dry-run", "--json"]))
    assert code == 130
    assert '"exit_code": 130' in capsys.readouterr().out
