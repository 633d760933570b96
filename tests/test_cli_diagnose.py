"""`diagnose`, `lint-init --hosts`, `adopt` and `ledger report` through the real console script on
a stand-in host (its own venv with the stand-in installed as a wheel; no engine started, so these
run in seconds): an unreachable host is a row, bad input is one message and exit 2 with nothing
changed, and the guard and adopted patches pass `check`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch
from tests.clirunner import Run, opspatch
from tests.standin import EAGLE_WORKER_MODULE, StandinHost, free_port, make_host

pytestmark = pytest.mark.process

HOTFIX = (
    "        self.speculation_disabled = False\n",
    "        self.speculation_disabled = False\n        self.spec_disable_batch_threshold = 0\n",
)


class Workspace:
    def __init__(self, root: Path, standin: StandinHost) -> None:
        self.root = root
        self.standin = standin
        self.state = root / "state"
        (root / "patches").mkdir(parents=True, exist_ok=True)
        (root / "inventories").mkdir(exist_ok=True)

    def run(self, *args: str) -> Run:
        return opspatch(*args, cwd=self.root, env={"OPSPATCH_STATE_DIR": str(self.state)})


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    standin = make_host(tmp_path / "host")
    ws = Workspace(tmp_path / "ws", standin)
    host_dir = standin.host_dir
    q = json.dumps
    (ws.root / "inventories" / "lab.toml").write_text(
        f"""
[hosts.standin-01]
transport = "local"
state_dir = {q(str(host_dir / "state"))}
[hosts.standin-01.engine]
python = {q(str(standin.python))}
url = "http://127.0.0.1:{free_port()}"
log_file = {q(str(host_dir / "server.log"))}
restart = {{ kind = "command", start = "true", pid_file = {q(str(host_dir / "server.pid"))}, workdir = {q(str(host_dir))} }}

[hosts.gone-01]
address = "127.0.0.1"
port = {free_port()}
user = "nobody"
[hosts.gone-01.engine]
python = "/usr/bin/python3"
"""
    )
    return ws


def test_an_unreachable_host_is_a_row_and_the_others_are_diagnosed(workspace: Workspace) -> None:
    run = workspace.run("diagnose", "--hosts", "lab", "--json")
    assert run.code == 1, run.stderr
    hosts = {h["host"]: h for h in run.json()["hosts"]}
    assert hosts["gone-01"]["status"] == "unreachable" and hosts["gone-01"]["error"]
    standin = hosts["standin-01"]
    assert standin["status"] == "down"  # no engine runs on it
    eagle = next(f for f in standin["files"] if f["module"] == EAGLE_WORKER_MODULE)
    assert (eagle["state"], eagle["install"]) == ("pristine", "wheel")
    text = workspace.run("diagnose", "--hosts", "lab")
    assert "== gone-01: unreachable" in text.stdout and "== standin-01: down" in text.stdout


def test_bad_input_to_diagnose_is_one_message_and_exit_2(workspace: Workspace) -> None:
    for args, said in (
        (("--module", "sglang.srt.no_such"), "error: module 'sglang.srt.no_such' does not resolve on any host read"),
        (("--since", "5x"), "error: --since '5x': not a duration"),
        (("--max-log-bytes", "10"), "error: --max-log-bytes 10: at least 4096"),
    ):  # fmt: skip
        run = workspace.run("diagnose", "--hosts", "lab:standin-01", *args)
        assert run.code == 2, run.stdout + run.stderr
        assert run.stderr.startswith(said), run.stderr
        assert run.stdout == ""


def test_lint_init_reads_the_module_from_the_host_and_writes_a_guard(workspace: Workspace) -> None:
    guard = workspace.root / "patches" / "host-guard.toml"
    run = workspace.run(
        "lint-init", "--module", EAGLE_WORKER_MODULE, "--hosts", "lab:standin-01",
        "--class", "EAGLEWorkerV2", "--write-patch", str(guard), "--versions", ">=0.5.4",
    )  # fmt: skip
    assert run.code == 1, run.stderr  # hazards found (the guard is written for them)
    source = workspace.standin.eagle_worker_file
    line = next(
        n for n, text in enumerate(source.read_text().splitlines(), 1)
        if "self.spec_disable_batch_threshold = server_args" in text
    )  # fmt: skip
    assert "spec_disable_batch_threshold" in run.stdout and f"line {line}" in run.stdout
    assert "StandaloneWorkerV2" in run.stdout  # the sibling module was read from the host too
    check = workspace.run("check", "host-guard")
    assert check.code == 0, check.stdout + check.stderr
    applied = apply_patch(source.read_bytes(), load_patch(guard).spec)
    assert isinstance(applied, Applied)


def test_bad_input_to_lint_init_hosts_is_one_message_and_exit_2(workspace: Workspace) -> None:
    broken = workspace.standin.site_packages / "sglang" / "broken.py"
    broken.write_text("def broken(:\n    pass\n")
    for args, said in (
        (("--module", "sglang.srt.no_such"), "error: [standin-01] module 'sglang.srt.no_such' does not resolve"),
        (("--module", EAGLE_WORKER_MODULE, "--class", "Nope"), "error: "),
        (("--module", "sglang.broken"), "error: "),
        ((), "error: lint-init --hosts needs --module M"),
    ):  # fmt: skip
        run = workspace.run("lint-init", "--hosts", "lab:standin-01", *args)
        assert run.code == 2, run.stdout + run.stderr
        assert run.stderr.startswith(said), run.stderr
    assert (
        "not Python"
        in workspace.run(
            "lint-init", "--hosts", "lab:standin-01", "--module", "sglang.broken"
        ).stderr
    )
    assert (
        "Nope"
        in workspace.run(
            "lint-init",
            "--hosts",
            "lab:standin-01",
            "--module",
            EAGLE_WORKER_MODULE,
            "--class",
            "Nope",
        ).stderr
    )


def test_adopt_with_a_given_pristine_file_and_its_refusals(
    workspace: Workspace, tmp_path: Path
) -> None:
    target = workspace.standin.eagle_worker_file
    pristine = tmp_path / "pristine.py"
    pristine.write_bytes(target.read_bytes())
    adopt = ("adopt", "--hosts", "lab:standin-01", "--module", EAGLE_WORKER_MODULE, "--yes")

    nothing = workspace.run(*adopt, "--id", "hand-fix")
    assert nothing.code == 2 and "nothing to adopt" in nothing.stderr

    target.write_text(target.read_text().replace(*HOTFIX))
    edited = target.read_bytes()
    unknown = workspace.run(*adopt, "--id", "hand-fix")  # one host, no ledger, no other copy
    assert unknown.code == 2 and "no pristine text known" in unknown.stderr
    assert "--pristine FILE" in unknown.stderr
    wrong = tmp_path / "wrong.py"
    wrong.write_text("x = 1\n")
    mismatch = workspace.run(*adopt, "--id", "hand-fix", "--pristine", str(wrong))
    assert mismatch.code == 2 and "is not the pristine file of sglang 0.5.23" in mismatch.stderr
    bad_id = workspace.run(*adopt, "--id", "Hand Fix", "--pristine", str(pristine))
    assert bad_id.code == 2 and "is not a patch id" in bad_id.stderr
    taken = workspace.run(*adopt, "--id", "eagle-init-guard", "--pristine", str(pristine))
    assert taken.code == 2 and "already exists" in taken.stderr
    assert not (workspace.root / "patches" / "hand-fix.toml").exists()
    assert workspace.run("ledger", "list", "--json").json()["runs"] == []  # nothing recorded

    done = workspace.run(*adopt, "--id", "hand-fix", "--pristine", str(pristine), "--json")
    assert done.code == 0, done.stdout + done.stderr
    assert target.read_bytes() == edited  # adopt never writes to a host
    spec = load_patch(workspace.root / "patches" / "hand-fix.toml").spec
    outcome = apply_patch(pristine.read_bytes(), spec)
    assert isinstance(outcome, Applied) and outcome.new_source == edited
    assert workspace.run("check", "hand-fix").code == 0
    again = workspace.run(*adopt, "--id", "hand-fix-2", "--pristine", str(pristine))
    assert again.code == 2 and "nothing to adopt" in again.stderr  # it is hand-fix's now
    # No engine runs on the host: adopt saw nothing serve the edit, so it says staged (before:
    # `applied`, and status and recover then called it proven by a smoke decode that never ran)
    (host,) = done.json()["hosts"]
    assert host["outcome"] == "staged", host
    assert "its server is not running, so nothing serves the edit yet" in host["note"]
    assert "`opspatch restart --hosts standin-01` starts it into the patch" in host["note"]
    status = workspace.run("status", "--hosts", "lab:standin-01", "--patch", "hand-fix", "--json")
    (said,) = status.json()["status"]
    assert said["state"] == "applied"  # the file carries it; whether it is served is the detail
    assert said["detail"].startswith(f"staged by run {done.json()['run_id']}: "), said
    assert "proven" not in said["detail"], said
    report = workspace.run("ledger", "report", done.json()["run_id"], "--json")
    (run,) = report.json()["runs"]
    assert run["command"] == "adopt" and run["patch_id"] == "hand-fix"
    assert [s["step"] for s in run["host_records"][0]["steps"]] == ["read", "adopt"]


def test_bad_input_to_ledger_report_is_one_message(workspace: Workspace) -> None:
    # Nothing recorded yet is no error: the empty report, as `ledger list` says "no runs yet"
    # with 0, and no ledger file created by a read.
    empty = workspace.run("ledger", "report", "--json")
    assert empty.code == 0, empty.stderr
    assert empty.json()["runs"] == [] and empty.json()["chain_ok"] is True
    text = workspace.run("ledger", "report")
    assert text.code == 0 and "0 run(s)" in text.stdout and "No run in this window." in text.stdout
    assert not workspace.state.exists()
    unknown = workspace.run("ledger", "report", "abc123")
    assert unknown.code == 2 and "no run 'abc123' in the ledger" in unknown.stderr
    assert not workspace.state.exists()
    assert workspace.run("ledger", "list").code == 0  # no ledger there, and none made by a read
    assert not workspace.state.exists()
    again = workspace.run("ledger", "report", "--json")
    assert again.code == 0 and again.json()["runs"] == []
    for args, said in (
        (("abc", "--since", "1h"), "error: ledger report takes a RUN_ID or --since DURATION, not both"),
        (("--format", "json"), "error: No such option: --format"),  # one way to ask: --json
    ):  # fmt: skip
        run = workspace.run("ledger", "report", *args)
        assert run.code == 2 and run.stderr.startswith(said), run.stderr
