"""Real SGLang 0.5.23 on this machine's CPU (issue 41): start, decode and stop times, memory.

    PYTHONPATH=. python3 bench/real_engine.py [--runs 2] [--out bench/results/]

For each shape (TP=1 plain, TP=1 EAGLE-3, TP=2 EAGLE-3), `--runs` times in turn: a server
started in a fresh host environment (the shared one and the models from the engine cache, built
first if missing), the seconds until `/health_generate` answers 200, the resident memory of its
processes, a 16-token greedy decode (wall and `meta_info`), and the seconds its stop takes. One
server at a time. Writes `real-engine-<UTC time>.json`; the figures go into docs/benchmarks.md
by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from opspatch.sandbox.processes import free_port, proc_text
from opspatch.sandbox.real.build import engine_cache_dir, ensure_base
from opspatch.sandbox.real.hostenv import make_real_host_python
from opspatch.sandbox.real.models import ensure_models
from opspatch.sandbox.real.release import DEFAULT_REAL_RELEASE
from opspatch.sandbox.real.server import RealServer

SHAPES = (("tp1", 1, False), ("tp1-eagle3", 1, True), ("tp2-eagle3", 2, True))


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        for line in (proc_text(pid, "status") or "").splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return round(total / 1024, 1)


def one(python: Path, models, host: Path, tp: int, eagle: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    server = RealServer.start(
        python, free_port("127.0.0.1", set()), models, host / "server.log", tp=tp, speculative=eagle
    )
    try:
        ready = server.wait_ready()
        memory = rss_mb(server.pids())
        started = time.monotonic()
        reply = server.generate("Once upon a time", 16)
        decode = time.monotonic() - started
    finally:
        stopping = time.monotonic()
        server.stop()
        stop = time.monotonic() - stopping
    meta = reply["meta_info"]
    return {
        "ready_s": round(ready, 1),
        "rss_mb": memory,
        "decode_16_s": round(decode, 2),
        "stop_s": round(stop, 1),
        "spec_accept_length": meta.get("spec_accept_length"),
        "text": reply["text"],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    cache = engine_cache_dir()
    base = ensure_base(cache, DEFAULT_REAL_RELEASE)
    models = ensure_models(cache, base)
    (wheel,) = sorted((cache / "wheels").glob(f"sglang-{DEFAULT_REAL_RELEASE}-*.whl"))
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in SHAPES}
    for run in range(args.runs):
        for name, tp, eagle in SHAPES:
            host = Path(tempfile.mkdtemp(prefix=f"opspatch-bench-real-{name}-"))
            started = time.monotonic()
            python = make_real_host_python(host, base, wheel)
            env_s = round(time.monotonic() - started, 1)
            figures = {"host_env_s": env_s, **one(python, models, host, tp, eagle)}
            print(f"run {run + 1} {name}: {figures}", file=sys.stderr)
            results[name].append(figures)
    summary = {
        name: {
            key: statistics.median(r[key] for r in runs)
            for key in ("host_env_s", "ready_s", "rss_mb", "decode_16_s", "stop_s")
        }
        for name, runs in results.items()
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.out / f"real-engine-{stamp}.json"
    path.write_text(json.dumps({"runs": results, "medians": summary}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
