"""Live against restart behind the real sglang-router (issues 34, 41): time to mitigate the
incident and failed client requests, on stand-in hosts whose every engine start takes
`--restart-seconds`, or on real SGLang servers (`--engine sglang`).

    PYTHONPATH=$PWD python -m bench.live [--hosts 8] [--restart-seconds 60] [--out bench/results/]
    PYTHONPATH=$PWD python -m bench.live --engine sglang --hosts 3

One sandbox (`sandbox up --router --live --restart-seconds S --count N`: `live = true` in its
inventory and the plugin installed before each engine starts; NOT timed, it is the preparation
a fleet does once; the runs of 2026-12-05 did it by `live enable`, then down and up). Then, with the
playbook `bench/playbooks/live-bench.toml` (`[rotation] max_unavailable = 1`, one host a batch):

1. incident, restart: `apply eagle-init-guard --hosts sandbox` on the incident's servers (healthy,
   each crashing on its first decode), timed; then `rollback` (not timed) back to the incident.
2. incident, live: the same with `--live`, timed.
   No client load runs during 1 and 2: every decode an unpatched server gets IS the incident (the
   server crashes), whatever the mitigation does, and a crashed engine cannot take a fix live. A
   load after each (`--check-seconds`) shows the mitigated fleet serves with 0 failures.
3. under load, live: `apply scheduler-finish-log --live` (a log line added at the start of
   `Scheduler.finish`, `bench/patches/`) while `sandbox load` runs through the router from the
   moment the apply starts until it ends, timed, failed requests counted; `rollback` (not timed).
4. under load, restart: the same patch through the restart path (drain, restart, re-admit).

On real SGLang (`--engine sglang`: `up --engine sglang --live`, EAGLE-3, the plugin installed
before the first start) each start takes minutes here, so only the runs that need no fresh start
run: 2, then 3 and 4 with `scheduler-request-log` (the real `Scheduler`'s per-request method),
its live fix taken out live between them (`real_runs` says why 1 is left out): 6 starts, not 18.

The results go to `<out>/live-<UTC time>.json`; docs/benchmarks.md's section is written by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opspatch.sandbox.load import run_load

if sys.version_info >= (3, 11):
    import tomllib
else:  # the project still runs on 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "bench" / "playbooks" / "live-bench.toml"
BODY_FIXES = {
    "standin": REPO / "bench" / "patches" / "scheduler-finish-log.toml",
    "sglang": REPO / "bench" / "patches" / "scheduler-request-log.toml",
}
INCIDENT_FIX = "eagle-init-guard"


class Bench:
    def __init__(self, state: Path, engine: str) -> None:
        self.env = {**os.environ, "OPSPATCH_STATE_DIR": str(state), "PYTHONPATH": str(REPO)}
        self.inventory = state / "inventories" / "sandbox.toml"
        self.engine = engine

    def cli(self, *args: str, check: bool = True) -> dict[str, Any]:
        """One `opspatch` command (`--json`), its document and wall seconds."""
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "opspatch.cli", *args, "--json"],
            env=self.env,
            capture_output=True,
            text=True,
        )
        wall = time.monotonic() - started
        print(f"  {' '.join(args[:3])} ... rc {done.returncode} in {wall:.1f} s", flush=True)
        if check and done.returncode != 0:
            raise SystemExit(f"{args}: rc {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr}")
        document = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
        return {"rc": done.returncode, "wall_s": round(wall, 2), "document": document}

    def up(self, hosts: int, restart_seconds: float) -> None:
        """The sandbox up, `live = true` in its inventory and the plugin in every engine."""
        args = ["sandbox", "up", "--router", "--live", "--count", str(hosts)]
        if self.engine == "sglang":
            args += ["--engine", "sglang"]
        else:
            args += ["--restart-seconds", f"{restart_seconds:g}"]
        self.cli(*args)

    def router(self) -> str:
        return str(tomllib.loads(self.inventory.read_text())["defaults"]["router"]["url"])

    def engine_pids(self) -> dict[str, int]:
        hosts = tomllib.loads(self.inventory.read_text())["hosts"]
        return {
            name: int(Path(h["engine"]["restart"]["pid_file"]).read_text().strip())
            for name, h in hosts.items()
        }

    def stop_engines(self) -> None:
        self.cli("sandbox", "down")  # every engine (and the router); `up` starts them again

    def apply(self, patch: str, *, live: bool, load: bool) -> dict[str, Any]:
        args = ["apply", patch, "--hosts", "sandbox", "-p", str(PLAYBOOK), "-y"]
        if live:
            args.append("--live")
        pids_before = self.engine_pids()
        report: dict[str, Any] = {}
        stop = threading.Event()
        loader = None
        if load:
            router = self.router()

            def drive() -> None:
                report.update(run_load(router, requests=None, seconds=3600, until=stop).to_json())

            loader = threading.Thread(target=drive)
            loader.start()
        result = self.cli(*args, check=False)
        stop.set()
        if loader is not None:
            loader.join()
        hosts = result["document"].get("hosts", [])
        return {
            "patch": Path(patch).stem,
            "live": live,
            "rc": result["rc"],
            "wall_s": result["wall_s"],
            "outcomes": {h.get("host"): h.get("outcome") for h in hosts},
            "hosts": hosts,
            "pids_changed": sum(
                1 for name, pid in self.engine_pids().items() if pids_before.get(name) != pid
            ),
            "load": report or None,
        }

    def live_rollback(self, patch: str) -> dict[str, Any]:
        """`rollback --restart never` of a fix taken live: taken out of the running engines
        (without `--restart never` the playbook's restart runs: every server started again)."""
        pids_before = self.engine_pids()
        result = self.cli("rollback", patch, "--hosts", "sandbox", "--restart", "never", "-y")
        changed = sum(1 for n, pid in self.engine_pids().items() if pids_before.get(n) != pid)
        return {"rc": result["rc"], "wall_s": result["wall_s"], "pids_changed": changed}

    def check(self, seconds: float) -> dict[str, Any]:
        return run_load(self.router(), requests=None, seconds=seconds).to_json()

    def rollback(self, patch: str, hosts: int, restart_seconds: float) -> None:
        """The files restored, every engine restarted by the sandbox (a restart through opspatch
        would fail its smoke: the restored file is the incident)."""
        self.cli("rollback", patch, "--hosts", "sandbox", "--restart", "never", "-y")
        self.stop_engines()
        self.up(hosts, restart_seconds)


def machine() -> dict[str, Any]:
    load1, load5, load15 = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "loadavg_at_start": [load1, load5, load15],
        "note": "shared 2-core machine: other helpers' builds and tests ran on it throughout",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--restart-seconds", type=float, default=60.0)
    parser.add_argument("--check-seconds", type=float, default=10.0)
    parser.add_argument("--state", type=Path, default=Path("/tmp/opspatch-bench-live"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--engine", choices=sorted(BODY_FIXES), default="standin")
    args = parser.parse_args()
    bench = Bench(args.state, args.engine)
    result: dict[str, Any] = {
        "benchmark": "live",
        "started": datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"),
        "engine": args.engine,
        "hosts": args.hosts,
        "restart_seconds": args.restart_seconds if args.engine == "standin" else None,
        "playbook": PLAYBOOK.name,
        "machine": machine(),
    }
    print("prepare (not timed): sandbox up --live (the plugin in before each start)", flush=True)
    started = time.monotonic()
    bench.up(args.hosts, args.restart_seconds)
    result["up_s"] = round(time.monotonic() - started, 1)
    runs = real_runs(bench, args) if args.engine == "sglang" else standin_runs(bench, args)
    result["runs"] = runs
    if "incident_restart" in runs:
        result["ratio_incident_live_over_restart"] = round(
            runs["incident_live"]["wall_s"] / runs["incident_restart"]["wall_s"], 4
        )
    result["ratio_body_live_over_restart"] = round(
        runs["body_live_under_load"]["wall_s"] / runs["body_restart_under_load"]["wall_s"], 4
    )
    result["machine"]["loadavg_at_end"] = list(os.getloadavg())
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"live-{args.engine}-{result['started']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    for name, run in runs.items():
        failed = (run.get("load") or {}).get("failed")
        print(f"{name}: {run['wall_s']} s, rc {run['rc']}, pids changed {run['pids_changed']}, "
              f"failed under load {failed}, outcomes {set(run['outcomes'].values())}")  # fmt: skip
    print(f"written: {path}")


def standin_runs(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """The four runs in the issue's order; the fix undone between them by down/up."""
    body_fix = str(BODY_FIXES["standin"])
    runs: dict[str, Any] = {}
    print("1. incident, restart rollout", flush=True)
    runs["incident_restart"] = bench.apply(INCIDENT_FIX, live=False, load=False)
    runs["incident_restart"]["after"] = bench.check(args.check_seconds)
    bench.rollback(INCIDENT_FIX, args.hosts, args.restart_seconds)
    print("2. incident, live", flush=True)
    runs["incident_live"] = bench.apply(INCIDENT_FIX, live=True, load=False)
    runs["incident_live"]["after"] = bench.check(args.check_seconds)
    print("3. function-body fix under load, live", flush=True)
    runs["body_live_under_load"] = bench.apply(body_fix, live=True, load=True)
    bench.rollback(body_fix, args.hosts, args.restart_seconds)
    print("4. function-body fix under load, restart rollout", flush=True)
    runs["body_restart_under_load"] = bench.apply(body_fix, live=False, load=True)
    return runs


def real_runs(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """On real servers, the runs that need no fresh start: the incident fixed live on the
    never-decoded incident servers, then the body fix live and taken out live (no restart),
    then the body fix through the restart rollout. The incident is not fixed again by restart:
    getting back to never-decoded incident servers takes every server's start again (a
    `rollback` restarts into the incident and fails its smoke), and a restart rollout's time
    per host does not depend on the patch (stop, start, ready, smoke)."""
    body_fix = str(BODY_FIXES["sglang"])
    runs: dict[str, Any] = {}
    print("2. incident, live (on the never-decoded incident servers)", flush=True)
    runs["incident_live"] = bench.apply(INCIDENT_FIX, live=True, load=False)
    runs["incident_live"]["after"] = bench.check(args.check_seconds)
    print("3. function-body fix under load, live", flush=True)
    runs["body_live_under_load"] = bench.apply(body_fix, live=True, load=True)
    runs["body_live_under_load"]["rollback"] = bench.live_rollback(body_fix)
    print("4. function-body fix under load, restart rollout", flush=True)
    runs["body_restart_under_load"] = bench.apply(body_fix, live=False, load=True)
    return runs


if __name__ == "__main__":
    main()
