"""Start one real SGLang server on this machine's CPU and decode: the real-engine sandbox's
parts end to end, without a sandbox.

    PYTHONPATH=. python3 scripts/real_server.py [--tp 2] [--no-eagle] [--keep]

Builds (or finds cached) the shared environment of sglang 0.5.23 and the models, makes a host
environment in a temporary folder, starts the server, waits for /health_generate, sends ten
greedy requests (32 tokens) and prints each reply's text and meta_info, then the median accept
length, and stops it (unless --keep).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from opspatch.sandbox.processes import free_port
from opspatch.sandbox.real.build import BuildEvent, engine_cache_dir, ensure_base
from opspatch.sandbox.real.hostenv import make_real_host_python
from opspatch.sandbox.real.models import ensure_models
from opspatch.sandbox.real.release import DEFAULT_REAL_RELEASE
from opspatch.sandbox.real.server import RealServer

PROMPTS = (
    "The capital of France is",
    "Once upon a time",
    "Speculative decoding makes",
    "The quick brown fox",
    "Water boils at",
    "A good engineer reads",
    "In the morning the market",
    "The train leaves the station",
    "Hello, my name is",
    "The weather today",
)


def show(event: BuildEvent) -> None:
    print(f"[{event.step}/{event.steps} {event.title}] {event.detail}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--no-eagle", action="store_true")
    parser.add_argument("--keep", action="store_true", help="leave the server running")
    args = parser.parse_args()
    cache = engine_cache_dir()
    started = time.monotonic()
    base = ensure_base(cache, DEFAULT_REAL_RELEASE, show)
    models = ensure_models(cache, base, show)
    print(f"environment and models ready in {time.monotonic() - started:.0f}s: {base.path}")
    host = Path(tempfile.mkdtemp(prefix="opspatch-real-server-"))
    (wheel,) = sorted((cache / "wheels").glob(f"sglang-{DEFAULT_REAL_RELEASE}-*.whl"))
    python = make_real_host_python(host, base, wheel)
    server = RealServer.start(
        python,
        free_port("127.0.0.1", set()),
        models,
        host / "server.log",
        tp=args.tp,
        speculative=not args.no_eagle,
    )
    try:
        print(f"ready after {server.wait_ready():.1f}s at {server.url} (pids {server.pids()})")
        lengths = []
        for prompt in PROMPTS:
            reply = server.generate(prompt, 32)
            meta = reply["meta_info"]
            lengths.append(meta.get("spec_accept_length"))
            print(json.dumps({"prompt": prompt, "text": reply["text"], "meta_info": meta}))
        if not args.no_eagle:
            print(f"accept lengths {lengths}, median {statistics.median(lengths):.2f}")
    finally:
        if not args.keep:
            print(f"stopped pids {server.stop()}; log {server.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
