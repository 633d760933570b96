"""The sandbox's router: a real `sglang-router` (the `sandbox` extra) in front of the stand-in
engines, on loopback, with its own Prometheus port (its exporter is always on, 0.0.0.0:29000
by default: a second router on one machine would panic at start)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from opspatch.errors import HostError, InputError
from opspatch.sandbox.layout import ENGINE_ADDRESS, SandboxLayout
from opspatch.sandbox.processes import is_running, proc_text, read_pid

ROUTER_MODULE = "sglang_router.launch_router"
ROUTER_PROCESS_TITLE = "sglang::router"
ROUTER_READY_TIMEOUT = 60.0
ROUTER_STOP_TIMEOUT = 10.0
DEAD_PROXY = "http://127.0.0.1:9"
"""A loopback port nothing listens on: the router's model-hub fetch fails at once."""


def router_dir(layout: SandboxLayout) -> Path:
    return layout.root / "router"


def router_url(port: int) -> str:
    return f"http://{ENGINE_ADDRESS}:{port}"


def router_pid(layout: SandboxLayout) -> int | None:
    """The sandbox router's pid while it runs (a pid recycled by another process is not it)."""
    pid = read_pid(router_dir(layout) / "router.pid")
    if pid is None or not is_running(pid):
        return None
    command = proc_text(pid, "cmdline") or ""
    # the router names its own process `sglang::router` once started
    return pid if ROUTER_MODULE in command or ROUTER_PROCESS_TITLE in command else None


def require_router_package() -> None:
    """Raises InputError when sglang-router is not installed on this controller."""
    if importlib.util.find_spec("sglang_router") is None:
        raise InputError(
            "`--router` needs the sglang-router package, which is not installed",
            hint="pip install 'opspatch[sandbox]' (or pip install sglang-router==0.3.2)",
        )


def start_router(
    layout: SandboxLayout, *, port: int, prometheus_port: int, worker_urls: Sequence[str]
) -> int:
    """Start the router in front of `worker_urls` and wait until it lists them all healthy;
    its pid. Already running: its pid, untouched (`up` is idempotent).

    Raises:
        HostError: the router exited or did not list every worker healthy in time (its log's
            tail in the message).
    """
    running = router_pid(layout)
    if running is not None:
        return running
    folder = router_dir(layout)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "router.log"
    argv = [
        sys.executable,
        "-m",
        ROUTER_MODULE,
        "--host",
        ENGINE_ADDRESS,
        "--port",
        str(port),
        "--prometheus-host",
        ENGINE_ADDRESS,
        "--prometheus-port",
        str(prometheus_port),
        "--policy",
        "round_robin",
        "--disable-retries",
        "--worker-startup-check-interval",
        "1",
        "--worker-urls",
        *worker_urls,
    ]
    env = dict(os.environ, HTTPS_PROXY=DEAD_PROXY, https_proxy=DEAD_PROXY, NO_COLOR="1")
    with open(log, "ab") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    (folder / "router.pid").write_text(f"{process.pid}\n", encoding="utf-8")
    deadline = time.monotonic() + ROUTER_READY_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise HostError(f"the router exited at start (code {process.returncode})\n{_tail(log)}")
        if _healthy_workers(router_url(port)) >= len(worker_urls):
            return process.pid
        time.sleep(0.2)
    stop_router(layout)
    raise HostError(
        f"the router did not list {len(worker_urls)} healthy workers within "
        f"{ROUTER_READY_TIMEOUT:.0f}s\n{_tail(log)}"
    )


def stop_router(layout: SandboxLayout) -> int | None:
    """Stop the sandbox router (TERM, then KILL after a wait); the pid stopped, or None."""
    pid = router_pid(layout)
    if pid is None:
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + ROUTER_STOP_TIMEOUT
    while is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if is_running(pid):
        os.kill(pid, signal.SIGKILL)
    return pid


def _healthy_workers(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/workers", timeout=2) as response:  # noqa: S310 - loopback
            listed = json.loads(response.read()).get("workers", [])
    except (urllib.error.URLError, OSError, ValueError):
        return 0
    return sum(1 for worker in listed if worker.get("is_healthy"))


def _tail(log: Path, lines: int = 12) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
