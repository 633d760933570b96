"""Restarting the engine: systemd, supervisor, or a start command (with its pid file and log);
and its two halves alone, `stop` (until every process is gone) and `start`, for a server of
several nodes, stopped on every node before any is started again."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, cast

from opspatch.hosts.agent.checks import failure_evidence
from opspatch.hosts.agent.fsutil import file_size, log_since, write_atomically
from opspatch.hosts.agent.processes import (
    alive,
    identity_file,
    identity_record,
    is_pid_files_process,
    read_pid_file,
    stop_process_tree,
)
from opspatch.hosts.agent.protocol import OpFailure, operation

if TYPE_CHECKING:
    import subprocess

    from opspatch.hosts.agent.protocol import (
        RestartReply,
        RestartRequest,
        Result,
        StopReply,
        StopRequest,
    )


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


def _running(pid_file: str) -> int | None:
    """The engine the pid file names, when it runs and is the one the file was written for."""
    old = read_pid_file(pid_file)
    if old is not None and alive(old) and is_pid_files_process(old, pid_file):
        return old
    return None


def _stop_command(settings: dict[str, Any]) -> list[int]:
    """Stop the process tree of the pid file's engine (TERM, wait `stop_timeout`, KILL what is
    left, wait until it is gone); the pids stopped (none when nothing runs)."""
    old = _running(settings["pid_file"])
    if old is None:
        return []
    return stop_process_tree(old, float(settings.get("stop_timeout") or 30.0))


def _start_command(settings: dict[str, Any], env: dict[str, str], log_file: str | None) -> Result:
    """Start the command detached, its output appended to the log; write the pid file and,
    beside it, the process's identity (stop finds it by that, whatever the wall clock did)."""
    pid_file = settings["pid_file"]
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
    owner = (stat_dir.st_uid, stat_dir.st_gid)
    # the identity first: a pid file is never read beside another process's identity
    identity = identity_record(process.pid)
    if identity is not None:
        write_atomically(identity_file(pid_file), identity.encode(), 0o644, *owner)
    write_atomically(pid_file, f"{process.pid}\n".encode(), 0o644, *owner)
    time.sleep(0.2)
    if process.poll() is not None:
        said, evidence = failure_evidence(log_since(log_file, offset))
        raise OpFailure(
            "start-failed",
            f"the start command exited at once with status {process.returncode}{said}",
            evidence,
        )
    return {"strategy": "command", "pid": process.pid, "log_offset": offset}


def _supervisorctl(settings: dict[str, Any]) -> list[str]:
    return ["supervisorctl"] + (["-c", settings["config"]] if settings.get("config") else [])


def _service_pid(settings: dict[str, Any]) -> int | None:
    """The main pid of a systemd unit or a supervisor program, None when it runs none."""
    if settings.get("kind") == "systemd":
        argv = ["systemctl", "show", "-p", "MainPID", "--value", settings["unit"]]
    else:
        argv = _supervisorctl(settings) + ["pid", settings["program"]]
    found = _run_tool(argv, 30).stdout.strip()
    return int(found) if found.isdigit() and found != "0" else None


def _systemd(verb: str, unit: str, timeout: float, offset: int | None) -> Result:
    """`systemctl restart|start UNIT`, then the unit must be active; its main pid."""
    done = _run_tool(["systemctl", verb, unit], timeout)
    if done.returncode != 0:
        raise OpFailure(f"{verb}-failed", f"systemctl {verb} {unit}: {done.stderr.strip()}")
    state = _run_tool(["systemctl", "is-active", unit], 30).stdout.strip()
    if state not in ("active", "activating", "reloading"):
        raise OpFailure(f"{verb}-failed", f"{unit} is {state or 'unknown'} after {verb}")
    pid = _service_pid({"kind": "systemd", "unit": unit})
    return {"strategy": "systemd", "pid": pid, "log_offset": offset, "detail": state}


def _supervisor(verb: str, settings: dict[str, Any], timeout: float, offset: int | None) -> Result:
    """`supervisorctl restart|start PROGRAM`, which must say `started`; its pid."""
    program = settings["program"]
    done = _run_tool(_supervisorctl(settings) + [verb, program], timeout)
    output = (done.stdout + done.stderr).strip()
    if verb == "start" and "already started" in output:
        raise OpFailure("engine-running", f"supervisorctl start {program}: {output}")
    if done.returncode != 0 or "started" not in output:
        raise OpFailure(f"{verb}-failed", f"supervisorctl {verb} {program}: {output}")
    pid = _service_pid(settings)
    return {"strategy": "supervisor", "pid": pid, "log_offset": offset, "detail": output}


def _request(args: RestartRequest | StopRequest) -> tuple[dict[str, Any], str | None, float]:
    """The strategy's settings, the log file and the timeout of a restart, stop or start."""
    settings = dict(args.get("restart") or {})
    return settings, args.get("log_file"), float(args.get("timeout") or 180.0)


def _env(args: RestartRequest) -> dict[str, str]:
    return {str(k): str(v) for k, v in (args.get("env") or {}).items()}


@operation("restart")
def op_restart(args: RestartRequest) -> RestartReply:
    """Restart the engine with the inventory's strategy; return its pid and the log offset."""
    settings, log_file, timeout = _request(args)
    kind = settings.get("kind")
    if kind == "command":
        stopped = _stop_command(settings)
        started = _start_command(settings, _env(args), log_file)
        return cast("RestartReply", {**started, "stopped": stopped})
    offset = file_size(log_file)
    if kind == "container":
        # the runtime restarts a container from outside it (the controller runs it next):
        # inside, the agent only says where the log stands, for the smoke's scan since then
        return {"strategy": "container", "pid": None, "log_offset": offset}
    if kind == "systemd":
        return cast("RestartReply", _systemd("restart", settings["unit"], timeout, offset))
    if kind == "supervisor":
        return cast("RestartReply", _supervisor("restart", settings, timeout, offset))
    raise OpFailure("bad-restart", f"unknown restart strategy {kind!r}")


@operation("stop")
def op_stop(args: StopRequest) -> StopReply:
    """Only stop the engine, and wait until it is gone: the first half of a restart, for a
    server of several nodes, which is stopped on every node before any is started again.
    Stopping an engine that does not run stops nothing (`stopped` empty)."""
    settings, log_file, timeout = _request(args)
    kind = settings.get("kind")
    offset = file_size(log_file)
    if kind == "command":
        stopped = _stop_command(settings)
        left = [pid for pid in stopped if alive(pid)]
        if left:
            raise OpFailure(
                "stop-failed",
                f"the engine's processes {left} still run after SIGKILL",
                {"stopped": stopped, "left": left},
            )
        return {"strategy": "command", "stopped": stopped, "log_offset": offset}
    if kind == "container":
        # the runtime stops a container from outside it (the controller runs it next)
        return {"strategy": "container", "stopped": [], "log_offset": offset}
    if kind not in ("systemd", "supervisor"):
        raise OpFailure("bad-restart", f"unknown restart strategy {kind!r}")
    main_pid = _service_pid(settings)
    if kind == "systemd":
        unit = settings["unit"]
        done = _run_tool(["systemctl", "stop", unit], timeout)
        output = done.stderr.strip()
        state = _run_tool(["systemctl", "is-active", unit], 30).stdout.strip()
        failed = done.returncode != 0 or state not in ("inactive", "failed")
        what = f"systemctl stop {unit}: {output or state}"
    else:
        done = _run_tool(_supervisorctl(settings) + ["stop", settings["program"]], timeout)
        state = (done.stdout + done.stderr).strip()
        failed = "stopped" not in state and "not running" not in state
        what = f"supervisorctl stop {settings['program']}: {state}"
    if failed:
        raise OpFailure("stop-failed", what)
    stopped = [main_pid] if main_pid is not None else []
    return {"strategy": kind, "stopped": stopped, "log_offset": offset, "detail": state}


@operation("start")
def op_start(args: RestartRequest) -> RestartReply:
    """Only start the engine (the second half of a restart); refused while it still runs
    (`engine-running`: two engines would fight for its port and GPUs)."""
    settings, log_file, timeout = _request(args)
    kind = settings.get("kind")
    offset = file_size(log_file)
    if kind == "command":
        running = _running(settings["pid_file"])
        if running is not None:
            raise OpFailure(
                "engine-running",
                f"the engine still runs (pid {running}, its pid file {settings['pid_file']}): "
                "stop it first",
            )
        return cast("RestartReply", _start_command(settings, _env(args), log_file))
    if kind == "container":
        raise OpFailure(
            "bad-restart",
            "a stopped container is started by its runtime, from outside it: nothing runs in it",
        )
    if kind == "systemd":
        unit = settings["unit"]
        state = _run_tool(["systemctl", "is-active", unit], 30).stdout.strip()
        if state in ("active", "activating", "reloading"):
            raise OpFailure("engine-running", f"{unit} is {state}: stop it first")
        return cast("RestartReply", _systemd("start", unit, timeout, offset))
    if kind == "supervisor":
        return cast("RestartReply", _supervisor("start", settings, timeout, offset))
    raise OpFailure("bad-restart", f"unknown restart strategy {kind!r}")
