"""Restart strategies, readiness and the smoke decode, run by the host agent against real
stand-in engine processes (and a real supervisord for the supervisor strategy)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch
from opspatch.core.host import Host
from opspatch.core.policy import SmokePrompt, SmokeSettings, StepTimeouts
from opspatch.errors import EngineError
from opspatch.hosts.engine import EngineControl
from opspatch.sandbox.install import make_host_python
from tests.enginekit import _stop, command_host, control
from tests.fleetkit import alive, wait_until
from tests.standin import free_port

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def host_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host venv with the stand-in engine, eagle-init-guard applied (a healthy engine)."""
    root = tmp_path_factory.mktemp("engine-host")
    python = make_host_python(root)
    target = next(
        root.glob("venv/lib/python*/site-packages/sglang/srt/speculative/eagle_worker_v2.py")
    )
    outcome = apply_patch(
        target.read_bytes(), load_patch(REPO / "patches" / "eagle-init-guard.toml").spec
    )
    assert isinstance(outcome, Applied)
    target.write_bytes(outcome.new_source)
    return python


@pytest.fixture()
def engine(host_python: Path, tmp_path: Path) -> Iterator[tuple[Host, EngineControl]]:
    host = command_host(host_python, tmp_path)
    try:
        yield host, control(host)
    finally:
        _stop(host)


def test_command_restart_starts_and_replaces_the_process_tree(
    engine: tuple[Host, EngineControl],
) -> None:
    host, ctl = engine
    first = ctl.restart()
    assert first["pid"] is not None and alive(first["pid"])
    ready = ctl.wait_ready(first)
    assert ready.polls >= 1
    second = ctl.restart()
    assert first["pid"] in second["stopped"]
    assert not alive(first["pid"])
    assert second["pid"] is not None and second["pid"] != first["pid"]
    assert (
        second["log_offset"] is not None and second["log_offset"] > 0
    )  # scans start after the old log
    ctl.wait_ready(second)


def test_restart_does_not_kill_a_process_that_reused_the_pid(
    engine: tuple[Host, EngineControl], tmp_path: Path
) -> None:
    host, ctl = engine
    pid_file = tmp_path / "server.pid"
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        pid_file.write_text(f"{stranger.pid}\n")
        old = time.time() - 3600
        os.utime(pid_file, (old, old))  # the pid file predates the process holding that pid now
        result = ctl.restart()
        assert result["stopped"] == []
        assert alive(stranger.pid)
        ctl.wait_ready(result)
    finally:
        stranger.kill()


def test_smoke_on_a_healthy_speculative_engine_passes(engine: tuple[Host, EngineControl]) -> None:
    _, ctl = engine
    restart = ctl.restart()
    ctl.wait_ready(restart)
    smoke = ctl.smoke(log_offset=restart["log_offset"])
    assert smoke.ok, smoke.failures
    assert all(p.spec_verify_ct and p.spec_verify_ct > 0 for p in smoke.prompts)
    assert all(p.completion_tokens == 16 for p in smoke.prompts)
    # the same decode again is the baseline: it matches
    again = ctl.smoke(log_offset=restart["log_offset"], baseline=smoke.texts)
    assert again.ok


def test_smoke_failures_are_reported_not_raised(host_python: Path, tmp_path: Path) -> None:
    host = command_host(host_python, tmp_path)
    try:
        smoke_settings = SmokeSettings(
            prompts=(SmokePrompt("The capital of France is", expect="^Paris"),)
        )
        ctl = control(host, smoke=smoke_settings)
        restart = ctl.restart()
        ctl.wait_ready(restart)
        result = ctl.smoke(log_offset=restart["log_offset"], baseline=["something else entirely"])
        assert not result.ok
        assert "does not match '^Paris'" in result.failures[0]
        plain = control(host)
        differs = plain.smoke(log_offset=restart["log_offset"], baseline=["x", "y"])
        assert not differs.ok and "differs from the pre-patch baseline" in differs.failures[0]
        # a traceback written to the log since the restart fails the smoke too
        with open(host.engine.log_file or "", "a") as log:
            log.write(
                "[2026-11-30 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
            )
        logged = plain.smoke(log_offset=restart["log_offset"])
        assert not logged.ok and logged.log_hits and "server log" in logged.failures[-1]
        # but a log written before the restart is not this engine's problem
        clean = plain.smoke(log_offset=os.path.getsize(host.engine.log_file or ""))
        assert clean.ok
    finally:
        _stop(host)


def test_smoke_requires_spec_verify_on_a_speculative_host(
    host_python: Path, tmp_path: Path
) -> None:
    host = command_host(host_python, tmp_path, algorithm="NONE")
    try:
        speculative = Host(
            **{
                **host.__dict__,
                "engine": type(host.engine)(**{**host.engine.__dict__, "speculative": True}),
            }
        )
        ctl = control(speculative)
        restart = ctl.restart()
        ctl.wait_ready(restart)
        result = ctl.smoke(log_offset=restart["log_offset"])
        assert not result.ok
        assert "no spec_verify_ct" in result.failures[0]
        assert (
            control(host).smoke(log_offset=restart["log_offset"]).ok
        )  # not speculative: not required
    finally:
        _stop(host)


def test_engine_exiting_before_ready_fails_fast_with_log_tail(
    host_python: Path, tmp_path: Path
) -> None:
    host = command_host(host_python, tmp_path, extra="--context-length 16")  # warm-up fails
    try:
        ctl = control(host)
        restart = ctl.restart()
        started = time.monotonic()
        with pytest.raises(EngineError) as caught:
            ctl.wait_ready(restart)
        assert time.monotonic() - started < 60
        assert "exited before it was ready" in caught.value.message
        # the engine's own words travel with the error: its log since the restart, bounded
        tail = caught.value.data["log_tail"]
        assert "Initialization failed. warmup error" in tail
        assert len(tail.splitlines()) <= 20 and len(tail.encode()) <= 4096
    finally:
        _stop(host)


def script_host(python: Path, work: Path, script: str) -> Host:
    """A host whose start command runs `script` (a Python file written to `work`)."""
    (work / "server.py").write_text(textwrap.dedent(script))
    port = free_port()
    text = textwrap.dedent(
        f"""
        [hosts.h1]
        address = "127.0.0.1"
        transport = "local"
        state_dir = "{work}/state"
        [hosts.h1.engine]
        python = "{python}"
        url = "http://127.0.0.1:{port}"
        log_file = "{work}/server.log"
        restart = {{ kind = "command", start = "{python} {work}/server.py", pid_file = "{work}/server.pid", workdir = "{work}", stop_timeout = 5 }}
        """
    )
    return parse_inventory(text, str(work / "inv.toml"), name="test").hosts[0]


def test_an_import_error_at_start_up_is_in_the_error_with_its_frame(tmp_path: Path) -> None:
    (tmp_path / "eagle_helpers.py").write_text("present = 1\n")
    host = script_host(
        Path(sys.executable),
        tmp_path,
        """\
        import time; time.sleep(1)  # exits after the restart has seen it start
        from eagle_helpers import missing_name
        time.sleep(60)
        """,
    )
    try:
        ctl = control(host)
        with pytest.raises(EngineError) as caught:
            # one block: on a machine slow enough to take 1 s for 0.2 s, the restart sees the exit
            ctl.wait_ready(ctl.restart())
        error = caught.value
        exception = "ImportError: cannot import name 'missing_name' from 'eagle_helpers'"
        frame = f'File "{tmp_path}/server.py", line 2, in <module>'
        assert error.step in ("ready", "restart")
        assert f": {exception}" in error.message
        assert f"({frame})" in error.message
        assert error.data["exception"]["type"] == "ImportError"
        assert error.data["exception"]["lineno"] == 2
        assert exception in error.data["log_tail"]
        assert frame in error.data["log_tail"]
    finally:
        _stop(host)


def test_engine_never_ready_times_out(host_python: Path, tmp_path: Path) -> None:
    host = command_host(host_python, tmp_path)
    host = Host(
        **{
            **host.__dict__,
            "engine": type(host.engine)(
                **{
                    **host.engine.__dict__,
                    "env": {"CUDA_VISIBLE_DEVICES": "", "SGLANG_STANDIN_WARMUP_DELAY_S": "30"},
                }
            ),
        }
    )
    try:
        ctl = control(host, timeouts=StepTimeouts(ready=2))
        restart = ctl.restart()
        log = Path(host.engine.log_file or "")
        # hung in its start-up: what it logged so far must reach the operator
        assert wait_until(lambda: "Delaying warm-up" in log.read_text(), 120)
        with pytest.raises(EngineError) as caught:
            ctl.wait_ready(restart)
        assert "not ready after 2s" in caught.value.message
        assert "Delaying warm-up by 30 s" in caught.value.data["log_tail"]
    finally:
        _stop(host)


@pytest.fixture(scope="module")
def unpatched_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host venv with the stand-in as shipped: its first speculative decode crashes."""
    return make_host_python(tmp_path_factory.mktemp("unpatched-host"))


def test_a_decode_crash_names_the_exception_and_where_it_was_raised(
    unpatched_python: Path, tmp_path: Path
) -> None:
    host = command_host(unpatched_python, tmp_path)
    try:
        ctl = control(host, smoke=SmokeSettings(prompts=(SmokePrompt("The capital of"),)))
        restart = ctl.restart()
        ctl.wait_ready(restart)
        result = ctl.smoke(log_offset=restart["log_offset"], pid=restart["pid"])
        assert not result.ok
        crash = (
            "AttributeError: 'EAGLEWorkerV2' object has no attribute "
            "'spec_disable_batch_threshold' (File \""
        )
        assert result.failures[0].startswith(f"prompt 1: the server crashed: {crash}")
        assert 'eagle_worker_v2.py", line ' in result.failures[0]
        # the log scan shows the exception too, not the line its pattern matched
        assert result.failures[-1].startswith(f"server log: {crash}")
        assert "Traceback (most recent call last)" not in result.summary()
        assert [(e["type"], e["count"]) for e in result.exceptions] == [("AttributeError", 1)]
        assert "AttributeError" in result.log_tail
    finally:
        _stop(host)


def test_a_decode_that_hangs_is_told_from_a_crash(engine: tuple[Host, EngineControl]) -> None:
    host, _ = engine
    ctl = control(
        host,
        smoke=SmokeSettings(prompts=(SmokePrompt("The capital of"),)),
        timeouts=StepTimeouts(smoke=3),
    )
    restart = ctl.restart()
    ctl.wait_ready(restart)
    assert restart["pid"] is not None
    os.killpg(restart["pid"], signal.SIGSTOP)  # the whole server hangs, alive
    try:
        given = ctl.smoke(log_offset=restart["log_offset"], pid=restart["pid"])
        from_pid_file = ctl.smoke(log_offset=restart["log_offset"])
    finally:
        os.killpg(restart["pid"], signal.SIGCONT)
    for result in (given, from_pid_file):
        assert not result.ok
        assert result.failures == (
            f"prompt 1: did not answer within 3s; the server (pid {restart['pid']}) is still running",
        )


def test_systemd_strategy_reports_systemctl_failure(tmp_path: Path) -> None:
    text = f"""
    [hosts.h1]
    address = "127.0.0.1"
    transport = "local"
    state_dir = "{tmp_path}/state"
    [hosts.h1.engine]
    python = "{sys.executable}"
    restart = {{ kind = "systemd", unit = "opspatch-test-does-not-exist.service" }}
    """
    host = parse_inventory(textwrap.dedent(text), "inv.toml", name="t").hosts[0]
    with pytest.raises(EngineError) as caught:
        control(host).restart()
    message = caught.value.message
    assert "systemctl" in message  # not installed, no systemd as PID 1, or no such unit


@pytest.mark.skipif(
    shutil.which("supervisord") is None,
    reason="supervisor is not installed (pip install supervisor)",
)
def test_supervisor_strategy_restarts_through_a_real_supervisord(
    host_python: Path, tmp_path: Path
) -> None:
    port = free_port()
    config = tmp_path / "supervisord.conf"
    config.write_text(
        textwrap.dedent(
            f"""
            [unix_http_server]
            file={tmp_path}/supervisor.sock
            [supervisord]
            logfile={tmp_path}/supervisord.log
            pidfile={tmp_path}/supervisord.pid
            nodaemon=false
            [rpcinterface:supervisor]
            supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
            [supervisorctl]
            serverurl=unix://{tmp_path}/supervisor.sock
            [program:sglang]
            command={host_python} -m sglang.launch_server --port {port}
            directory={tmp_path}
            environment=CUDA_VISIBLE_DEVICES=""
            redirect_stderr=true
            stdout_logfile={tmp_path}/server.log
            startsecs=1
            stopasgroup=true
            killasgroup=true
            """
        )
    )
    subprocess.run(["supervisord", "-c", str(config)], check=True)
    try:
        text = f"""
        [hosts.h1]
        address = "127.0.0.1"
        transport = "local"
        state_dir = "{tmp_path}/state"
        [hosts.h1.engine]
        python = "{host_python}"
        url = "http://127.0.0.1:{port}"
        log_file = "{tmp_path}/server.log"
        speculative = true
        restart = {{ kind = "supervisor", program = "sglang", config = "{config}" }}
        """
        host = parse_inventory(textwrap.dedent(text), "inv.toml", name="t").hosts[0]
        ctl = control(host)
        assert wait_until(lambda: (tmp_path / "supervisor.sock").exists(), 20)
        first = ctl.restart()
        ctl.wait_ready(first)
        second = ctl.restart()
        assert first["pid"] and second["pid"] and first["pid"] != second["pid"]
        ctl.wait_ready(second)
        assert ctl.smoke(log_offset=second["log_offset"]).ok
    finally:
        subprocess.run(["supervisorctl", "-c", str(config), "shutdown"], capture_output=True)
