"""Restarting the engine: systemd, supervisor, or a start command (with its pid file and log).

The old server is found and stopped through `processes` (a pid file's process is trusted only if
it started before the file was written); a start command that dies at once is reported with the
exception its log shows (`checks.failure_evidence`).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, cast

from opspatch.hosts.agent.checks import failure_evidence
from opspatch.hosts.agent.fsutil import file_size, log_since, write_atomically
from opspatch.hosts.agent.processes import (
    alive,
    read_pid_file,
    started_before,
    stop_process_tree,
)
from opspatch.hosts.agent.protocol import OpFailure, operation

if TYPE_CHECKING:
    import subprocess

    from opspatch.hosts.agent.protocol import RestartReply, RestartRequest, Result


def _run_tool(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    import subprocess  # only where a process is started: an inspect does not pay for it

    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise OpFailure(
            "restart-tool-missing", f"{argv[0]} is not installed on this host"
        ) from None
    except subprocess.TimeoutExpired:
        raise OpFailure(
            "restart-timeout", f"{' '.join(argv)} did not finish in {timeout:.0f}s"
        ) from None


def _restart_command(
    settings: dict[str, Any], env: dict[str, str], log_file: str | None, timeout: float
) -> Result:
    pid_file = settings["pid_file"]
    stopped: list[int] = []
    old = read_pid_file(pid_file)
    if old is not None and alive(old) and started_before(old, pid_file):
        stopped = stop_process_tree(old, float(settings.get("stop_timeout") or 30.0))
    log_path = log_file or os.devnull
    if log_file:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
    offset = file_size(log_file)
    full_env = dict(os.environ)
    full_env.update(env)
    import subprocess

    with open(log_path, "ab") as log:
        process = subprocess.Popen(  # noqa: S602 - the operator's start command, as systemd's ExecStart
            settings["start"],
            shell=True,
            cwd=settings.get("workdir") or None,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this agent and the SSH session that started it
            close_fds=True,
        )
    pid_dir = os.path.dirname(os.path.abspath(pid_file))
    os.makedirs(pid_dir, exist_ok=True)
    stat_dir = os.stat(pid_dir)
    write_atomically(pid_file, f"{process.pid}\n".encode(), 0o644, stat_dir.st_uid, stat_dir.st_gid)
    time.sleep(0.2)
    if process.poll() is not None:
        said, evidence = failure_evidence(log_since(log_file, offset))
        raise OpFailure(
            "start-failed",
            f"the start command exited at once with status {process.returncode}{said}",
            evidence,
        )
    return {"strategy": "command", "pid": process.pid, "log_offset": offset, "stopped": stopped}


@operation("restart")
def op_restart(args: RestartRequest) -> RestartReply:
    """Restart the engine with the inventory's strategy; return its pid and the log offset."""
    settings = dict(args.get("restart") or {})
    log_file = args.get("log_file")
    timeout = float(args.get("timeout") or 180.0)
    env = {str(k): str(v) for k, v in (args.get("env") or {}).items()}
    kind = settings.get("kind")
    if kind == "command":
        return cast("RestartReply", _restart_command(settings, env, log_file, timeout))
    offset = file_size(log_file)
    if kind == "container":
        # the runtime restarts a container from outside it (the controller runs it next):
        # inside, the agent only says where the log stands, for the smoke's scan since then
        return {"strategy": "container", "pid": None, "log_offset": offset}
    if kind == "systemd":
        unit = settings["unit"]
        done = _run_tool(["systemctl", "restart", unit], timeout)
        if done.returncode != 0:
            raise OpFailure("restart-failed", f"systemctl restart {unit}: {done.stderr.strip()}")
        state = _run_tool(["systemctl", "is-active", unit], 30).stdout.strip()
        if state not in ("active", "activating", "reloading"):
            raise OpFailure("restart-failed", f"{unit} is {state or 'unknown'} after restart")
        main_pid = _run_tool(
            ["systemctl", "show", "-p", "MainPID", "--value", unit], 30
        ).stdout.strip()
        pid = int(main_pid) if main_pid.isdigit() and main_pid != "0" else None
        return {"strategy": "systemd", "pid": pid, "log_offset": offset, "detail": state}
    if kind == "supervisor":
        program = settings["program"]
        ctl = ["supervisorctl"] + (["-c", settings["config"]] if settings.get("config") else [])
        done = _run_tool(ctl + ["restart", program], timeout)
        output = (done.stdout + done.stderr).strip()
        if done.returncode != 0 or "started" not in output:
            raise OpFailure("restart-failed", f"supervisorctl restart {program}: {output}")
        found = _run_tool(ctl + ["pid", program], 30).stdout.strip()
        pid = int(found) if found.isdigit() and found != "0" else None
        return {"strategy": "supervisor", "pid": pid, "log_offset": offset, "detail": output}
    raise OpFailure("bad-restart", f"unknown restart strategy {kind!r}")
