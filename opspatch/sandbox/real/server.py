"""One real SGLang server on this machine, started and stopped directly (not through a sandbox's
inventory): for the real-engine tests, the benchmarks and `scripts/real_server.py`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opspatch.errors import EngineError
from opspatch.sandbox.real.launch import cpu_env, server_args
from opspatch.sandbox.real.models import ModelPaths

ADDRESS = "127.0.0.1"


def _group_members(pgid: int) -> list[int]:
    """Every running process of process group `pgid` (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text(encoding="utf-8", errors="replace")
            fields = stat[stat.rfind(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return sorted(members)


@dataclass
class RealServer:
    """A started server: its main process, URL and log."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def start(
        cls,
        python: Path,
        port: int,
        models: ModelPaths,
        log: Path,
        *,
        tp: int = 1,
        speculative: bool = True,
        env: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> RealServer:
        """Start `python -m sglang.launch_server` in its own session, output to `log`."""
        argv = [str(python), "-m", "sglang.launch_server", "--host", ADDRESS, "--port", str(port)]
        argv += server_args(models.target, models.draft if speculative else None, tp)
        full_env = {**os.environ, **cpu_env(tp), "PYTHONUNBUFFERED": "1", **(env or {})}
        full_env["CUDA_VISIBLE_DEVICES"] = ""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [*argv, *extra_args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                cwd=log.parent,
                start_new_session=True,
            )
        return cls(process, f"http://{ADDRESS}:{port}", log)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def _health_generate(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health_generate", timeout=30) as reply:  # noqa: S310 - loopback
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):  # 503 while it starts, or nothing listening
            return False

    def wait_ready(self, timeout: float = 600.0) -> float:
        """Seconds from start until `/health_generate` answered 200.

        Raises:
            EngineError: the server exited, or did not answer in `timeout` (the log's tail said).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineError(
                    f"the real SGLang server exited with {self.process.returncode} before it "
                    f"was ready:\n{self.log_tail()}",
                    host=ADDRESS,
                    step="ready",
                )
            if self._health_generate():
                return time.monotonic() - self.started
            time.sleep(1.0)
        raise EngineError(
            f"the real SGLang server did not answer /health_generate in {timeout:.0f}s:\n"
            f"{self.log_tail()}",
            host=ADDRESS,
            step="ready",
        )

    def generate(self, text: str, max_new_tokens: int = 16, **extra: Any) -> dict[str, Any]:
        """One greedy `/generate`; the reply as SGLang sends it (`text`, `meta_info`, ...)."""
        body = {
            "text": text,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
            **extra,
        }
        request = urllib.request.Request(
            self.url + "/generate",
            data=json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as reply:  # noqa: S310 - loopback
            data: dict[str, Any] = json.loads(reply.read())
        return data

    def pids(self) -> list[int]:
        """The server's running processes: its session's process group."""
        return _group_members(self.process.pid)

    def stop(self, timeout: float = 30.0) -> list[int]:
        """SIGTERM the main process, wait up to `timeout` for the whole group to end, SIGKILL
        what is left; the pids that were running."""
        members = self.pids()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self.process.poll() is None or self.pids()):
            time.sleep(0.2)
        if self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        return members
