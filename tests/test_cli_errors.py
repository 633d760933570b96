"""One error style in every command group: `error: MESSAGE` (and its hint) on stderr, exit 2,
nothing on stdout; with --json, also `{"error": {"message", "hint", "exit_code"}}` on stdout, so a
script that reads stdout learns why there is no result. Usage errors of the option parser look
the same as opspatch's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clirunner import opspatch

pytestmark = pytest.mark.process

# One bad input per command group (patches, changes, inspect, incident, respond, ledger,
# inventory, sandbox) and the option parser's own errors, none of which needs a host.
CASES = [
    ("plan", "nosuch-patch", "--file", "x.py"),
    ("apply", "eagle-init-guard", "--hosts", "nosuch-fleet", "--yes"),
    ("status", "--hosts", "nosuch-fleet"),
    ("lint-init", "--module", "sglang.x"),
    ("diagnose", "--hosts", "nosuch-fleet"),
    ("adopt", "--hosts", "nosuch-fleet", "-m", "sglang.x", "--id", "new-id", "--yes"),
    ("ledger", "show", "nosuch-run"),
    ("ledger", "report", "abc", "--since", "1h"),
    ("inventory", "show", "nosuch-fleet"),
    ("sandbox", "up", "--count", "0"),
    ("status", "--no-such-option"),
    ("no-such-command",),
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(case) for case in CASES])
def test_an_error_is_one_message_on_stderr(args: tuple[str, ...], tmp_path: Path) -> None:
    run = opspatch(*args, cwd=tmp_path)
    assert run.code == 2, run.stdout + run.stderr
    assert run.stderr.startswith("error: "), run.stderr
    assert "Error:" not in run.stderr and "Traceback" not in run.stderr
    assert run.stdout == ""


@pytest.mark.parametrize("args", CASES, ids=[" ".join(case) for case in CASES])
def test_with_json_an_error_is_also_a_json_object_on_stdout(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    run = opspatch(*args, "--json", cwd=tmp_path)
    assert run.code == 2, run.stdout + run.stderr
    assert run.stderr.startswith("error: "), run.stderr
    error = run.json()["error"]
    assert error["exit_code"] == 2
    assert error["message"] and error["message"] in run.stderr
    assert set(error) == {"message", "hint", "exit_code"}


def test_a_usage_error_names_the_help_to_read(tmp_path: Path) -> None:
    run = opspatch("sandbox", "up", "--hosts", "2", cwd=tmp_path)
    assert run.code == 2
    message, hint = run.stderr.splitlines()
    assert message.startswith("error: No such option: --hosts")
    assert hint == "  hint: see `opspatch sandbox up --help`"


def test_check_reports_a_bad_patch_on_stderr_in_the_same_style(tmp_path: Path) -> None:
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "half.toml").write_text('id = "half"\n')
    run = opspatch("check", "half", cwd=tmp_path)
    assert run.code == 2
    assert run.stdout == ""
    assert run.stderr.startswith("error: ") and "half.toml:1: summary" in run.stderr
    assert "\n  hint: " in run.stderr


def test_adopt_without_a_terminal_or_yes_refuses_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "lab.toml").write_text(
        '[defaults]\ntransport = "local"\n\n[hosts.lab-01]\n'
    )
    ledger = tmp_path / "ledger.sqlite3"
    run = opspatch(
        "--ledger", str(ledger), "adopt", "--hosts", "lab", "-m", "sglang.x", "--id", "new-id",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.code == 2, run.stdout + run.stderr
    assert run.stderr.startswith("error: Adopt the hand edit of sglang.x on 1 host(s)")
    assert "no terminal to ask on; nothing was changed" in run.stderr
    assert "hint: re-run with --yes" in run.stderr
    assert not (tmp_path / "patches").exists() and not ledger.exists()


# Every command that takes --hosts, over a selection of no host (an inventory that lists none).
ZERO_HOSTS = [
    ("apply", "eagle-init-guard", "--hosts", "lab", "--yes"),
    ("apply", "eagle-init-guard", "--hosts", "lab", "--dry-run"),
    ("rollback", "eagle-init-guard", "--hosts", "lab", "--yes"),
    ("restart", "--hosts", "lab", "--yes"),
    ("recover", "--hosts", "lab", "--yes"),
    ("unlock", "--hosts", "lab", "--yes"),
    ("sync", "--hosts", "lab", "--yes"),
    ("sync", "--check", "--hosts", "lab"),
    ("drift", "--hosts", "lab"),
    ("plan", "--fleet", "--hosts", "lab"),
    ("plan", "eagle-init-guard", "--hosts", "lab"),
    ("status", "--hosts", "lab"),
    ("smoke", "--hosts", "lab"),
    ("diagnose", "--hosts", "lab"),
    ("adopt", "--hosts", "lab", "-m", "sglang.x", "--id", "new-id", "--yes"),
]


@pytest.mark.parametrize("args", ZERO_HOSTS, ids=[" ".join(case) for case in ZERO_HOSTS])
def test_a_selection_of_no_host_is_refused_by_every_command_and_records_no_run(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    """Before, `apply --hosts lab` over an inventory with no hosts printed an empty table,
    "outcome: ok (exit 0)", and recorded a run of zero hosts; status, smoke, diagnose, rollback,
    restart and recover did the same kind of nothing with exit 0."""
    import shutil

    from opspatch.ledger import Ledger

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "patches").mkdir()
    shutil.copy(root / "patches" / "eagle-init-guard.toml", tmp_path / "patches")
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "lab.toml").write_text('[defaults]\ntransport = "local"\n')
    (tmp_path / "inventories" / "other.toml").write_text('[hosts.other-01]\ntransport = "local"\n')
    (tmp_path / "fleet.toml").write_text(
        '[[patches]]\nid = "eagle-init-guard"\nhosts = ["other"]\n'
    )
    state = tmp_path / "state"
    run = opspatch(*args, cwd=tmp_path, env={"OPSPATCH_STATE_DIR": str(state)})
    assert run.code == 2, run.stdout + run.stderr
    assert run.stderr.startswith("error: 'lab' selects no host: inventory 'lab' ("), run.stderr
    assert run.stdout == ""
    ledger = state / "ledger.sqlite3"
    if ledger.exists():
        with Ledger.open(ledger) as opened:
            assert opened.list_runs() == []
