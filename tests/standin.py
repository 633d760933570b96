"""Test helpers for the stand-in engine: make a host, launch an engine on a free port, talk to it
over HTTP, stop it by pid.

Engines run as real processes from a host's own virtual environment (as the sandbox runs them),
with stdout and stderr in a log file, `CUDA_VISIBLE_DEVICES` empty (so CUDA graph capture fails
for real even on a machine with a GPU) and HOME set to the host folder.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from opspatch.sandbox.dist import engine_source_dir
from opspatch.sandbox.install import host_venv_dir, make_host_python, venv_site_packages

READY_LINE = "The server is fired up and ready to roll!"
EAGLE_WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"


@dataclass(frozen=True)
class StandinHost:
    """A folder with its own interpreter and its own installed copy of the stand-in."""

    host_dir: Path
    python: Path
    site_packages: Path

    def module_file(self, module: str) -> Path:
        return self.site_packages / (module.replace(".", "/") + ".py")

    @property
    def eagle_worker_file(self) -> Path:
        return self.module_file(EAGLE_WORKER_MODULE)


def make_host(host_dir: Path) -> StandinHost:
    python = make_host_python(host_dir)
    return StandinHost(host_dir, python, venv_site_packages(host_venv_dir(host_dir)))


def standin_module(relative: str) -> ModuleType:
    """A module of the stand-in that imports no other part of it (`models/corpus.py`), loaded
    by its path under a private name: the controller never imports the stand-in's `sglang`."""
    path = engine_source_dir() / "sglang" / "srt" / relative
    spec = importlib.util.spec_from_file_location(f"_standin_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class HttpReply:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_request(
    method: str,
    url: str,
    body: Any = None,
    *,
    raw_body: bytes | None = None,
    timeout: float = 30.0,
) -> HttpReply:
    """One HTTP request; a dropped connection raises ConnectionError (as a crashed server does)."""
    without_scheme = url.split("://", 1)[1]
    host_port, _, path = without_scheme.partition("/")
    host, _, port = host_port.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        data = (
            raw_body
            if raw_body is not None
            else (None if body is None else json.dumps(body).encode())
        )
        headers = {"Content-Type": "application/json"} if data is not None else {}
        connection.request(method, "/" + path, body=data, headers=headers)
        response = connection.getresponse()
        return HttpReply(response.status, response.read())
    finally:
        connection.close()


@dataclass
class EngineProcess:
    """A launched stand-in server: its process, port and log file."""

    popen: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        """The log so far ("" before the engine has created it)."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def get(self, path: str, timeout: float = 30.0) -> HttpReply:
        return http_request("GET", self.url + path, timeout=timeout)

    def post(self, path: str, body: Any, timeout: float = 30.0) -> HttpReply:
        return http_request("POST", self.url + path, body, timeout=timeout)

    def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        """Wait until the log contains `text`; fails with the log if the process ends first."""
        deadline = time.monotonic() + timeout
        while text not in self.log_text():
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"engine exited ({self.popen.returncode}) before logging {text!r}:\n"
                    + self.log_text()
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {text!r} in the log after {timeout} s:\n{self.log_text()}"
                )
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_for_log(READY_LINE, timeout)

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.popen.wait(timeout)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM by pid, then SIGKILL if it has not exited within `timeout`; returns its status."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout)
        return self.popen.returncode


def launch_engine(
    host: StandinHost,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    log_name: str = "engine.log",
) -> EngineProcess:
    """Start `python -m sglang.launch_server` from the host's interpreter on a free port."""
    port = free_port()
    log_path = host.host_dir / log_name
    environment = {
        **os.environ,
        "HOME": str(host.host_dir),
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONUNBUFFERED": "1",
    }
    environment.update(env or {})
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            [str(host.python), "-m", "sglang.launch_server", "--port", str(port), *args],
            cwd=host.host_dir,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return EngineProcess(popen, port, log_path)


@contextlib.contextmanager
def running_engine(
    host: StandinHost,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    log_name: str = "engine.log",
    wait_ready: bool = True,
) -> Iterator[EngineProcess]:
    """Launch an engine, (by default) wait until it is ready, and always stop it by pid."""
    engine = launch_engine(host, args, env=env, log_name=log_name)
    try:
        if wait_ready:
            engine.wait_ready()
        yield engine
    finally:
        engine.stop()
