"""`become` on a real unprivileged fleet: a login user over real SSH, real sudo, a service user
who owns the engine (tests/becomekit.py builds the host and removes every user, sudoers file and
process it made).

What the issue asks to be proven, in order: the inventory shows the settings and never the
password; the headline apply (sudoers limited to the agent's interpreter and systemctl /
supervisorctl) and a rollback (NOPASSWD for everything) keep the file's owner and mode and run
only the changing steps raised; without become the swap fails with a permission error, said
truthfully, nothing changed; a password from the environment variable works and appears nowhere
(report, ledger, logs, host files, any process's command line while the run is in flight); the
terminal prompt is asked once; no password and no terminal, a wrong password, `requiretty` and
a sudoers rule that denies the agent all refuse with exit 2 before any host is changed.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.becomekit import (
    FILE_MODE,
    PASSWORD_ENV,
    BecomeHost,
    become_unavailable,
    build,
    teardown,
)
from tests.clirunner import Run
from tests.fleetkit import REPO

pytestmark = [pytest.mark.root, pytest.mark.ssh, pytest.mark.engine]

PATCH = "eagle-init-guard"


@pytest.fixture(scope="module")
def host() -> Iterator[BecomeHost]:
    reason = become_unavailable()
    if reason is not None:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="opspatch-become-"))
    made = BecomeHost(root=root, login="", service="", password="")
    try:
        made = build(root)
        shutil.copy(REPO / "patches" / f"{PATCH}.toml", made.workspace / "patches")
        yield made
    finally:
        teardown(made)
        assert made.sudoers_file is None or not made.sudoers_file.exists()


@pytest.fixture(autouse=True)
def no_password_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)


def apply(host: BecomeHost, *targets: str, env: dict[str, str] | None = None) -> Run:
    selection = ",".join(f"become:{t}" for t in targets or ("svc-host",))
    return host.opspatch(
        "apply", PATCH, "--hosts", selection, "--playbook", "become", "--yes", "--json", env=env
    )


def rollback(host: BecomeHost, env: dict[str, str] | None = None) -> Run:
    return host.opspatch(
        "rollback",
        PATCH,
        "--hosts",
        "become:svc-host",
        "--playbook",
        "become",
        "--yes",
        "--json",
        env=env,
    )


def only_host(run: Run) -> dict[str, Any]:
    hosts: list[dict[str, Any]] = run.json()["hosts"]
    assert len(hosts) == 1, hosts
    return hosts[0]


def steps_of(outcome: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["step"]: step for step in outcome["steps"]}


def service_uid(host: BecomeHost) -> int:
    import pwd

    return pwd.getpwnam(host.service).pw_uid


class Unchanged:
    """What must not move when a run is refused: the file, its owner and mode, the engine."""

    def __init__(self, host: BecomeHost) -> None:
        self.host = host
        self.sha = host.sha()
        self.owner_and_mode = host.owner_and_mode()
        self.pid = host.engine_pid()

    def check(self) -> None:
        assert self.host.sha() == self.sha
        assert self.host.owner_and_mode() == self.owner_and_mode
        assert self.host.engine_pid() == self.pid
        assert not (self.host.host_dir / "state" / "lock.json").exists()


# -- the settings -------------------------------------------------------------------------------


def test_inventory_show_displays_the_settings_never_the_password(host: BecomeHost) -> None:
    env = {PASSWORD_ENV: host.password}
    shown = host.opspatch("inventory", "show", "become", "--json", env=env)
    assert shown.code == 0, shown.stderr
    by_name = {h["name"]: h for h in shown.json()["hosts"]}
    assert by_name["svc-host"]["become"] == {
        "enabled": True,
        "user": host.service,
        "method": "sudo",
        "password_env": PASSWORD_ENV,
    }
    assert by_name["plain-host"]["become"]["enabled"] is False
    assert by_name["root-host"]["become"]["user"] == "root"
    table = host.opspatch("inventory", "show", "become", env=env)
    assert table.code == 0, table.stderr
    assert "become" in table.stdout and "sudo -u" in table.stdout
    for output in (shown.stdout, shown.stderr, table.stdout, table.stderr):
        assert host.password not in output


# -- the headline: apply and rollback with become --------------------------------------------


def test_apply_and_rollback_with_become_keep_owner_and_mode(host: BecomeHost) -> None:
    host.sudoers(host.rules_limited())  # the interpreter as the service user, nothing else used
    pre_image = host.sha()
    owner_and_mode = host.owner_and_mode()
    assert owner_and_mode == (host.service, host.service, FILE_MODE)
    old_pid = host.engine_pid()

    applied = apply(host)
    assert applied.code == 0, applied.stdout + applied.stderr
    outcome = only_host(applied)
    assert outcome["outcome"] == "applied"
    assert host.sha() == outcome["file"]["sha256_after"] != pre_image
    assert host.owner_and_mode() == owner_and_mode
    new_pid = host.engine_pid()
    assert new_pid is not None and new_pid != old_pid
    assert host.process_user(new_pid) == service_uid(host)  # restarted by the service user

    raised, login = f"{host.service} (sudo)", host.login
    steps = steps_of(outcome)
    assert steps["begin"]["ran_as"] == [raised, login]  # the lock raised, the inspection not
    assert steps["swap"]["ran_as"] == [raised]
    assert steps["restart"]["ran_as"] == [raised]
    assert steps["ready"]["ran_as"] == [login]
    assert steps["smoke"]["ran_as"] == [login]
    assert steps["backup"]["ran_as"] == []  # the ledger's copy: no exec on the host
    backup = host.host_dir / "state" / "backups" / pre_image
    assert backup.stat().st_uid == service_uid(host)

    shown = host.opspatch("ledger", "show", applied.json()["run_id"], "--json")
    recorded = {s["step"]: s["detail"] for s in shown.json()["host_records"][0]["steps"]}
    assert recorded["swap"].endswith(f"[ran as {raised}]")
    assert recorded["smoke"].endswith(f"[ran as {login}]")
    assert recorded["release"].endswith(f"[ran as {raised}]")  # the lock file, raised

    host.sudoers(host.rules_nopasswd_all())
    restored = rollback(host)
    # the unpatched engine crashes on its first decode, as in the incident: the restore's smoke
    # says the restored file is not served (exit 1)
    assert restored.code == 1, restored.stdout + restored.stderr
    outcome = only_host(restored)
    assert outcome["outcome"] == "restored-not-serving"
    assert host.sha() == pre_image
    assert host.owner_and_mode() == owner_and_mode
    steps = steps_of(outcome)
    assert steps["restore"]["ran_as"] == [raised]
    assert steps["restart"]["ran_as"] == [raised]


def test_without_become_the_swap_fails_with_a_permission_error(host: BecomeHost) -> None:
    unchanged = Unchanged(host)
    run = apply(host, "plain-host")
    assert run.code == 1, run.stdout + run.stderr
    outcome = only_host(run)
    assert outcome["outcome"] == "failed"
    assert outcome["reason"] == "host-error"
    # the code is any host's error: the sentence says it is a permission and what to set
    assert "Permission denied" in outcome["error"]
    assert "become = true" in outcome["error"]
    steps = steps_of(outcome)
    assert steps["swap"]["status"] == "failed"
    assert steps["swap"]["ran_as"] == [host.login]
    assert "restart" not in steps
    unchanged.check()


# -- passwords ----------------------------------------------------------------------------------


class ProcessWatch:
    """Reads every process's command line (and environment) while a run is in flight."""

    def __init__(self, secret: bytes, controller_pid: int) -> None:
        self.secret = secret
        self.controller_pid = controller_pid
        self.leaks: list[str] = []
        self.sudo_with_password_seen = False
        self.samples = 0

    def sample(self) -> None:
        self.samples += 1
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            for name in ("cmdline", "environ"):
                if name == "environ" and int(entry) == self.controller_pid:
                    continue  # the controller holds the variable: it is the password's source
                try:
                    data = Path(f"/proc/{entry}/{name}").read_bytes()
                except OSError:
                    continue
                if self.secret in data:
                    self.leaks.append(f"/proc/{entry}/{name}: {data[:200]!r}")
                if name == "cmdline" and data.startswith(b"sudo\0") and b"\0-S\0" in data:
                    self.sudo_with_password_seen = True


def run_watched(host: BecomeHost, args: list[str], env: dict[str, str]) -> tuple[Run, ProcessWatch]:
    """`opspatch ARGS` in the background, every process's command line read until it ends."""
    process = subprocess.Popen(
        [sys.executable, "-m", "opspatch.cli", *args],
        cwd=host.workspace,
        env={**os.environ, **host.env(env), "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    watch = ProcessWatch(host.password.encode(), process.pid)
    outputs: dict[str, bytes] = {}

    def collect() -> None:
        outputs["out"], outputs["err"] = process.communicate(timeout=600)

    collector = threading.Thread(target=collect)
    collector.start()
    while collector.is_alive():
        watch.sample()
    collector.join()
    return Run(process.returncode, outputs["out"].decode(), outputs["err"].decode()), watch


def files_under(*folders: Path) -> Iterator[Path]:
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                yield path


def test_password_from_the_environment_works_and_never_shows(host: BecomeHost) -> None:
    host.sudoers(host.rules_password())
    pre_image = host.sha()
    args = ["apply", PATCH, "--hosts", "become:svc-host", "--playbook", "become", "--yes", "--json"]
    run, watch = run_watched(host, args, {PASSWORD_ENV: host.password})
    assert run.code == 0, run.stdout + run.stderr
    outcome = only_host(run)
    assert outcome["outcome"] == "applied"
    assert steps_of(outcome)["swap"]["ran_as"] == [f"{host.service} (sudo)"]
    assert host.owner_and_mode() == (host.service, host.service, FILE_MODE)

    assert watch.sudo_with_password_seen, f"no sudo -S seen in {watch.samples} samples"
    assert watch.leaks == []
    secret = host.password.encode()
    assert secret not in run.stdout.encode() + run.stderr.encode()
    shown = host.opspatch("ledger", "show", run.json()["run_id"], "--json")
    assert secret not in shown.stdout.encode()
    assert host.sshd is not None
    for path in files_under(host.state, host.host_dir / "state", host.sshd.workdir):
        assert secret not in path.read_bytes(), path  # ledger (and its WAL), backups, sshd log
    assert secret not in host.log_file.read_bytes()

    # the terminal prompt: asked once, the answer used, the file back at its pre-image
    code, screen = run_on_terminal(
        host, ["rollback", PATCH, "--hosts", "become:svc-host", "--playbook", "become", "--yes"]
    )
    # the restored pre-image is the incident's code: its smoke decode crashes the server, so
    # the host is restored-not-serving (exit 1); the password was asked once and worked
    assert code == 1, screen.decode(errors="replace")
    assert b"restored-not-serving" in screen
    assert screen.count(b"sudo password") == 1
    assert secret not in screen
    assert host.sha() == pre_image


def test_restart_reaches_sudo_with_the_password_as_apply_does(host: BecomeHost) -> None:
    """`opspatch restart` builds its connections as apply does, with the run's sudo passwords:
    before, it could not raise privileges on a host whose sudo asks for a password."""
    host.sudoers(host.rules_password())
    pre_image = host.sha()
    env = {PASSWORD_ENV: host.password}
    common = ["--hosts", "become:svc-host", "--playbook", "become", "--yes", "--json"]
    staged = host.opspatch("apply", PATCH, *common, "--restart", "never", env=env)
    assert staged.code == 0, staged.stdout + staged.stderr
    assert only_host(staged)["outcome"] == "staged"
    old_pid = host.engine_pid()
    restarted = host.opspatch("restart", *common, env=env)
    assert restarted.code == 0, restarted.stdout + restarted.stderr
    outcome = only_host(restarted)
    assert outcome["outcome"] == "applied", outcome
    assert steps_of(outcome)["restart"]["ran_as"] == [f"{host.service} (sudo)"]
    new_pid = host.engine_pid()
    assert new_pid is not None and new_pid != old_pid
    assert host.password not in restarted.stdout + restarted.stderr
    host.opspatch("rollback", PATCH, *common, env=env)
    assert host.sha() == pre_image


def run_on_terminal(host: BecomeHost, args: list[str]) -> tuple[int, bytes]:
    """`opspatch ARGS` on a terminal (a pty) without the variable: the password is typed at the
    prompt. Returns the exit status and everything the terminal showed."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "opspatch.cli", *args],
        cwd=host.workspace,
        env={**os.environ, **host.env(), "COLUMNS": "200", "TERM": "dumb"},
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    screen = b""
    answered = 0
    try:
        while True:
            ready, _, _ = select.select([controller], [], [], 1.0)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(controller, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not data:
                break
            screen += data
            if screen.count(b"sudo password") > answered:
                os.write(controller, host.password.encode() + b"\n")
                answered += 1
    finally:
        os.close(controller)
    return process.wait(timeout=600), screen


def test_no_password_and_no_terminal_refuses_before_any_change(host: BecomeHost) -> None:
    host.sudoers(host.rules_password())
    unchanged = Unchanged(host)
    run = apply(host)
    assert run.code == 2, run.stdout + run.stderr
    report = run.json()
    assert report["refused"] is True
    outcome = only_host(run)
    assert outcome["outcome"] == "skipped"
    assert outcome["reason"] == "password-missing"
    assert "swap" not in steps_of(outcome)
    unchanged.check()


def test_a_wrong_password_refuses(host: BecomeHost) -> None:
    host.sudoers(host.rules_password())
    unchanged = Unchanged(host)
    run = apply(host, env={PASSWORD_ENV: "not-" + host.password})
    assert run.code == 2, run.stdout + run.stderr
    outcome = only_host(run)
    assert outcome["outcome"] == "skipped"
    assert outcome["reason"] == "password-rejected"
    assert host.password not in run.stdout + run.stderr
    unchanged.check()


def test_requiretty_refuses(host: BecomeHost) -> None:
    host.sudoers(host.rules_requiretty())
    unchanged = Unchanged(host)
    run = apply(host)
    assert run.code == 2, run.stdout + run.stderr
    outcome = only_host(run)
    assert outcome["reason"] == "requiretty"
    unchanged.check()


def test_a_host_whose_sudoers_denies_the_agent_refuses_the_rollout_in_preflight(
    host: BecomeHost,
) -> None:
    # root-host raises to root; the limited rules allow root only systemctl and supervisorctl
    host.sudoers(host.rules_limited())
    unchanged = Unchanged(host)
    run = apply(host, "svc-host", "root-host", env={PASSWORD_ENV: host.password})
    assert run.code == 2, run.stdout + run.stderr
    report = run.json()
    assert report["refused"] is True
    assert "privileges cannot be raised on root-host" in report["halted"]
    by_name = {h["host"]: h for h in report["hosts"]}
    denied = by_name["root-host"]
    assert denied["outcome"] == "skipped"
    assert denied["reason"] == "sudo-denied"
    assert host.password not in run.stdout + run.stderr
    other = by_name["svc-host"]
    assert other["outcome"] == "skipped"  # preflight passed there, and the rollout never started
    assert "swap" not in steps_of(other)
    unchanged.check()


def test_a_restart_that_needs_root_is_proven_in_preflight(host: BecomeHost) -> None:
    # file operations as the service user are allowed; a systemd restart would need root
    host.sudoers(host.rules_limited())
    unchanged = Unchanged(host)
    run = apply(host, "systemd-host", env={PASSWORD_ENV: host.password})
    assert run.code == 2, run.stdout + run.stderr
    outcome = only_host(run)
    assert outcome["reason"] == "sudo-denied"
    assert "as root" in outcome["error"]  # the restart's user, not the become user
    assert [s["step"] for s in outcome["steps"]] == ["begin"]  # refused at its start
    assert steps_of(outcome)["begin"]["ran_as"] == [f"{host.service} (sudo)"]  # the lock only
    unchanged.check()  # and the lock it took was given back
