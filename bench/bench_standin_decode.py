"""How fast the sandbox's stand-in engine starts and decodes on this machine.

Builds one throw-away sandbox host (its own venv with the stand-in installed), starts the server
with CUDA graphs disabled (so it decodes without the incident's crash), and prints seconds to
ready, then the latency of greedy decodes and the throughput of a concurrent batch, with and
without speculation. Sandbox rollouts and the engine tests restart servers many times, so start
time and a 16-token smoke decode are the numbers that matter.

    python bench/bench_standin_decode.py [--repeats 20] [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from opspatch.sandbox.install import make_host_python

READY_LINE = "The server is fired up and ready to roll!"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def start(python: Path, log: Path, algorithm: str) -> tuple[subprocess.Popen[bytes], str, float]:
    port = free_port()
    started = time.perf_counter()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(python), "-m", "sglang.launch_server", "--port", str(port)]
            + ["--disable-cuda-graph", "--speculative-algorithm", algorithm],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        )
    while READY_LINE not in log.read_text():
        if process.poll() is not None:
            raise SystemExit(f"the server exited:\n{log.read_text()}")
        time.sleep(0.02)
    return process, f"http://127.0.0.1:{port}", time.perf_counter() - started


def measure(url: str, repeats: int, batch: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for tokens in (16, 128):
        body = {"text": "Hello", "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
        latencies = []
        for _ in range(repeats):
            started = time.perf_counter()
            meta = post(url + "/generate", body)["meta_info"]
            latencies.append(time.perf_counter() - started)
        result[f"greedy_{tokens}_median_ms"] = round(1000 * statistics.median(latencies), 2)
        result[f"greedy_{tokens}_accept_length"] = meta.get("spec_accept_length")
    prompts = [f"prompt number {i}" for i in range(batch)]
    body = {"text": prompts, "sampling_params": {"max_new_tokens": 64, "temperature": 0}}
    started = time.perf_counter()
    post(url + "/generate", body)
    result[f"batch_{batch}x64_tokens_per_s"] = round(batch * 64 / (time.perf_counter() - started))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        python = make_host_python(Path(scratch) / "host")
        report: dict[str, Any] = {"make_host_s": round(time.perf_counter() - started, 2)}
        for algorithm in ("EAGLE3", "NONE"):
            process, url, ready_s = start(python, Path(scratch) / f"{algorithm}.log", algorithm)
            try:
                report[algorithm] = {"ready_s": round(ready_s, 2)} | measure(
                    url, args.repeats, args.batch
                )
            finally:
                os.kill(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
