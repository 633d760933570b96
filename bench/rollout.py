"""Rollout benchmark: opspatch against Ansible, pyinfra and the raw ssh+sed loop (issue 10).

    python3 bench/rollout.py --hosts 1,4,16,32 --rtt 0,50 --runs 3 --out bench/results/
    python3 bench/report.py bench/results/<the file it wrote>   # docs/benchmarks.md + PNG plots

On one machine: N stand-in SGLang hosts over real SSH (`opspatch sandbox up --ssh`, driven
through the CLI), a latency relay per host (relay.py: 0 and 50 ms round trip), and the same job
done by each tool on the same hosts from the same starting state (tools.py): the full pipeline
(edit, validate, restart, wait, smoke; up to the number of engines this machine holds) and the
patch phase alone (no restart; up to every N). Each run is measured (measure.py): wall time,
controller CPU time and memory of the tool's whole process tree, SSH connections and exec
round trips per host (the benchmark's sshd at LogLevel VERBOSE, fleet.py), and checked
afterwards (checks.py). Then the operator-facing latencies (`opspatch --version`, `check`,
`plan --file`, `status --hosts`; `ansible --version`, `ansible-playbook --check --diff`).

Results: one JSON file under --out. Everything the harness starts is ended by pid on exit, also
on Ctrl-C; the sandboxes' files are kept under --state for the next run (`--purge` removes them).
Ansible, pyinfra and matplotlib live in their own venv (--venv, made on first use), never in
the project's environment. The tools run with HOME in the state folder: ~/.ssh is never used.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checks import run_problems  # noqa: E402
from fleet import Fleet  # noqa: E402
from measure import Runner, ToolRun  # noqa: E402
from relay import RelaySet  # noqa: E402
from tools import TOOLS, Endpoint, Workloads  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path.home() / ".cache" / "opspatch-bench"
VENV_PACKAGES = ("ansible-core>=2.17", "pyinfra>=3.0", "matplotlib>=3.8")
ENGINE_PSS_ESTIMATE_MB = 400.0  # before one is measured: the stand-in measured ~235 MB PSS
MEMORY_SHARE = 0.75  # of MemAvailable at start that the engines may take
RESULT_FORMAT = 1


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="opspatch rollout benchmark (issue 10)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[1],
    )
    parser.add_argument("--hosts", type=int_list, default=[1, 4, 16, 32], help="N values")
    parser.add_argument("--rtt", type=int_list, default=[0, 50], help="round trips in ms")
    parser.add_argument("--runs", type=int, default=3, help="measured runs per tool and case")
    parser.add_argument("--tools", default=",".join(TOOLS), help="subset of " + ",".join(TOOLS))
    parser.add_argument("--phases", default="full,patch", help="full and/or patch")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--state", type=Path, default=DEFAULT_CACHE / "state")
    parser.add_argument("--venv", type=Path, default=DEFAULT_CACHE / "venv")
    parser.add_argument(
        "--max-engines",
        type=int,
        default=0,
        help="engines this machine may run at once (0: from MemAvailable and a measured engine)",
    )
    parser.add_argument(
        "--poll-delay",
        type=float,
        default=1.0,
        help="seconds between /health polls of Ansible, pyinfra and the sed loop (default 1)",
    )
    parser.add_argument("--latency-runs", type=int, default=5, help="0 skips operator latencies")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per tool run")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up")
    parser.add_argument(
        "--opspatch",
        default=None,
        help="the opspatch command (default: this Python -m opspatch.cli, from this checkout)",
    )
    parser.add_argument("--purge", action="store_true", help="remove the sandboxes at the end")
    parser.add_argument(
        "--sandbox-size",
        type=int,
        default=16,
        help="hosts per sandbox (at most 16, opspatch's limit; smaller tests the several-"
        "sandbox path at small N)",
    )
    args = parser.parse_args(argv)
    args.tools = [t for t in args.tools.split(",") if t]
    args.phases = [p for p in args.phases.split(",") if p]
    for tool in args.tools:
        if tool not in TOOLS:
            parser.error(f"unknown tool {tool!r}; choose from {', '.join(TOOLS)}")
    for phase in args.phases:
        if phase not in ("full", "patch"):
            parser.error(f"unknown phase {phase!r}; choose full and/or patch")
    if args.runs < 1 or not args.hosts or min(args.hosts) < 1:
        parser.error("--runs and every --hosts value must be at least 1")
    return args


# ---------------------------------------------------------------------------------------------
# the machine and the tools' environment


def ensure_venv(venv: Path) -> None:
    """The bench venv with ansible-core, pyinfra and matplotlib (from PyPI), made once."""
    wanted = [venv / "bin" / "ansible-playbook", venv / "bin" / "pyinfra"]
    if all(p.exists() for p in wanted):
        return
    log(f"creating {venv} with {', '.join(VENV_PACKAGES)} (once)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", *VENV_PACKAGES],
        check=True,
    )


def meminfo() -> dict[str, int]:
    values = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        values[key] = int(rest.split()[0]) // 1024  # MB
    return values


def machine_description() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    models = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    free = subprocess.run(["free", "-m"], capture_output=True, text=True, check=False).stdout
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False).stderr
    return {
        "cpu_model": models[0] if models else platform.processor(),
        "cpus": os.cpu_count(),
        "free_m": free.strip(),
        "mem_total_mb": meminfo()["MemTotal"],
        "kernel": platform.release(),
        "python": platform.python_version(),
        "openssh": ssh.strip(),
        "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def tool_versions(env: dict[str, str], opspatch: Sequence[str], venv: Path) -> dict[str, str]:
    def first_line(argv: Sequence[str]) -> str:
        if Path(argv[0]).is_absolute() and not Path(argv[0]).exists():
            return ""  # a venv tool this run did not need, so never installed
        done = subprocess.run(
            list(argv), env=env, cwd=REPO, capture_output=True, text=True, check=False
        )
        return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else ""

    return {
        "opspatch": first_line([*opspatch, "--version"]),
        "ansible": first_line([str(venv / "bin" / "ansible"), "--version"]),
        "pyinfra": first_line([str(venv / "bin" / "pyinfra"), "--version"]),
    }


def git_revision() -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--", "opspatch", "bench")),
    }


# ---------------------------------------------------------------------------------------------
# one measured run


def tail(text: str, limit: int = 3000) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def opspatch_steps(stdout: str) -> dict[str, Any] | None:
    """Per-step seconds from `opspatch apply --json` (median over hosts), and host outcomes."""
    try:
        document = json.loads(stdout)
    except ValueError:
        return None
    steps: dict[str, list[float]] = {}
    outcomes: dict[str, int] = {}
    for host in document.get("hosts", []):
        outcomes[host.get("outcome", "?")] = outcomes.get(host.get("outcome", "?"), 0) + 1
        for step in host.get("steps", []):
            if isinstance(step.get("seconds"), int | float):
                steps.setdefault(step["step"], []).append(float(step["seconds"]))
    return {
        "outcome": document.get("outcome"),
        "host_outcomes": outcomes,
        "step_seconds_median": {k: round(statistics.median(v), 3) for k, v in steps.items()},
    }


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.runner = Runner()
        self.relay: RelaySet | None = None
        self.fleet: Fleet | None = None
        self.workloads: Workloads | None = None
        self.records: list[dict[str, Any]] = []
        self.latencies: list[dict[str, Any]] = []
        self.notes: list[str] = []
        python_env = dict(os.environ)
        python_env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO)] + ([python_env["PYTHONPATH"]] if python_env.get("PYTHONPATH") else [])
        )
        python_env.pop("OPSPATCH_STATE_DIR", None)
        python_env.pop("OPSPATCH_LEDGER", None)
        python_env.pop("OPSPATCH_HOME", None)
        self.base_env = python_env
        self.opspatch = (
            args.opspatch.split() if args.opspatch else [sys.executable, "-m", "opspatch.cli"]
        )
        if not args.opspatch:
            self.compile_checkout()

    def compile_checkout(self) -> None:
        """Byte-compile this checkout's opspatch, as `pip install` does for an installed one.

        Without it, an environment with PYTHONDONTWRITEBYTECODE set (this benchmark's machine
        has it) makes every opspatch run compile its own modules from source: about 45 ms of
        `opspatch check`, more for an apply, that no installed copy pays. The other tools run
        from the benchmark's venv, byte-compiled by pip."""
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(REPO / "opspatch")],
            check=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        )
        if os.environ.get("PYTHONDONTWRITEBYTECODE"):
            self.notes.append(
                "PYTHONDONTWRITEBYTECODE is set here: opspatch's checkout was byte-compiled "
                "first (compileall), as pip does at install"
            )

    # -------------------------------------------------------------------------------------------

    def engine_limit(self, total: int) -> dict[str, Any]:
        available = meminfo()["MemAvailable"]
        by_memory = int(available * MEMORY_SHARE // ENGINE_PSS_ESTIMATE_MB)
        value = self.args.max_engines or by_memory
        return {
            "value": value,
            "mem_available_mb_at_start": available,
            "engine_pss_mb_assumed": ENGINE_PSS_ESTIMATE_MB,
            "basis": (
                "--max-engines"
                if self.args.max_engines
                else f"{MEMORY_SHARE:.0%} of MemAvailable / {ENGINE_PSS_ESTIMATE_MB:.0f} MB"
            ),
        }

    def run(self) -> Path:
        args = self.args
        if {"ansible", "pyinfra"} & set(args.tools):  # the only tools that live in the venv
            ensure_venv(args.venv)
        counts = sorted(set(args.hosts))
        total = max(counts)
        started = dt.datetime.now(dt.timezone.utc)
        machine = machine_description()
        limit = self.engine_limit(total)
        log(f"machine: {machine['cpus']} CPUs, {machine['mem_total_mb']} MB; engine limit {limit}")

        args.state.mkdir(parents=True, exist_ok=True)
        work = args.state / "work"
        if work.exists():
            shutil.rmtree(work)
        controller = args.state / "controller"  # opspatch's ledger and inventories: fresh
        if controller.exists():
            shutil.rmtree(controller)
        self.fleet = fleet = Fleet(args.state, self.opspatch, self.base_env, REPO, log)
        fleet.up(total, min(limit["value"], total), args.sandbox_size)
        limit["engine_pss_mb_measured"] = round(fleet.engine_rss_mb(fleet.hosts[0]), 1)
        limit["engine_start_cpu_s_measured"] = round(fleet.engine_cpu_s(fleet.hosts[0]), 2)
        if limit["engine_pss_mb_measured"]:
            limit["limit_by_measured_memory"] = int(
                limit["mem_available_mb_at_start"] * MEMORY_SHARE // limit["engine_pss_mb_measured"]
            )
        engines = min(limit["value"], total)
        log(f"{total} hosts up; engines running on the first {engines}")

        self.relay = relay = RelaySet(
            [(h.ssh_address, s.port) for h, s in zip(fleet.hosts, fleet.sshds, strict=True)]
        ).start()
        endpoints = [Endpoint(h, p) for h, p in zip(fleet.hosts, relay.ports, strict=True)]
        workloads = Workloads(
            repo=REPO,
            work=work,
            controller_state=controller,
            home=args.state / "home",
            venv=args.venv,
            opspatch=self.opspatch,
            user_key=fleet.user_key,
            base_env=self.base_env,
            poll_delay=args.poll_delay,
        )
        self.workloads = workloads
        # Ansible's ControlPersist masters are recognised by their ControlPath folder.
        self.runner.marker = f"{workloads.control_dir}/"
        latency_hosts = min(16, total)
        workloads.write_all(endpoints, sorted(set(counts) | {latency_hosts}))
        restart_never = workloads.opspatch_supports_restart_never()
        if not restart_never and "patch" in args.phases and "opspatch" in args.tools:
            self.notes.append(
                "opspatch apply has no --restart option yet: its patch-phase runs are skipped"
            )
            log(self.notes[-1])

        cases = self.cases(counts, limit["value"], restart_never)
        if not args.no_warmup:
            self.warm_up(workloads, min(counts), restart_never)
        for rtt, phase, count in cases:
            relay.set_rtt(rtt)
            for run in range(args.runs):
                tools = [
                    t
                    for t in args.tools
                    if phase == "full" or not t.startswith("opspatch") or restart_never
                ]
                order = tools[run % len(tools) :] + tools[: run % len(tools)]
                for tool in order:
                    self.measure(workloads, tool, phase, count, rtt, run)
        if args.latency_runs > 0:
            self.operator_latencies(workloads, latency_hosts)

        finished = dt.datetime.now(dt.timezone.utc)
        machine["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
        document = {
            "format": RESULT_FORMAT,
            "started": started.isoformat(timespec="seconds"),
            "finished": finished.isoformat(timespec="seconds"),
            "command": " ".join(["python3", "bench/rollout.py", *sys.argv[1:]]),
            "settings": {
                "hosts": counts,
                "rtt_ms": args.rtt,
                "runs": args.runs,
                "tools": args.tools,
                "phases": args.phases,
                "poll_delay_s": args.poll_delay,
                "opspatch_command": self.opspatch,
                "opspatch_restart_never": restart_never,
                "warmup": not args.no_warmup,
                "sandbox_size": args.sandbox_size,
                "sandboxes": len(fleet.sandboxes),
            },
            "machine": machine,
            "engine_limit": limit,
            "versions": tool_versions(workloads.env(), self.opspatch, args.venv),
            "git": git_revision(),
            "notes": self.notes,
            "runs": self.records,
            "latencies": self.latencies,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        path: Path = args.out / f"rollout-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        path.write_text(json.dumps(document, indent=1) + "\n")
        return path

    def cases(
        self, counts: Sequence[int], engine_limit: int, restart_never: bool
    ) -> list[tuple[int, str, int]]:
        cases = []
        for rtt in self.args.rtt:
            for phase in self.args.phases:
                for count in counts:
                    if phase == "full" and count > engine_limit:
                        note = (
                            f"full pipeline at N={count} skipped: above the {engine_limit} "
                            "engines this machine holds"
                        )
                        if note not in self.notes:
                            self.notes.append(note)
                            log(note)
                        continue
                    cases.append((rtt, phase, count))
        return cases

    def warm_up(self, workloads: Workloads, count: int, restart_never: bool) -> None:
        """One untimed patch-phase run per tool, so no measured run pays for cold caches."""
        assert self.fleet is not None and self.relay is not None
        self.relay.set_rtt(0)
        hosts = self.fleet.hosts[:count]
        for tool in self.args.tools:
            self.fleet.restore_pristine(hosts)
            if tool.startswith("opspatch") and not restart_never:
                command = workloads.opspatch_plan_command(count, tool)
            else:
                command = workloads.command(tool, count, "patch")
            log(f"warm-up: {tool}")
            result = self.runner.run(
                command.argv,
                env=command.env,
                cwd=REPO,
                timeout=self.args.timeout,
                log_dir=workloads.work / "logs",
                label=f"warmup-{tool}",
            )
            if result.returncode != 0:
                log(f"warm-up of {tool} exited {result.returncode}: {tail(result.stderr, 800)}")

    def measure(
        self, workloads: Workloads, tool: str, phase: str, count: int, rtt: int, run: int
    ) -> None:
        fleet, relay = self.fleet, self.relay
        assert fleet is not None and relay is not None
        hosts = fleet.hosts[:count]
        fleet.restore_pristine(hosts)
        if phase == "full":
            fleet.restart_engines(hosts)
        pids_before = {h.name: fleet.engine_pid(h) for h in hosts}
        time.sleep(0.5)  # let the restarted engines settle
        command = workloads.command(tool, count, phase)
        offsets = fleet.log_offsets()
        host_cpu_before = fleet.host_cpu(count)
        relay_before = relay.snapshot()
        label = f"{phase}-n{count}-rtt{rtt}-{tool}-{run + 1}"
        result: ToolRun = self.runner.run(
            command.argv,
            env=command.env,
            cwd=REPO,
            timeout=self.args.timeout,
            log_dir=workloads.work / "logs",
            label=label,
        )
        time.sleep(0.2)  # sshd logs the end of sessions after the client is gone
        ssh = fleet.ssh_counts(offsets, count)
        host_cpu = [a - b for a, b in zip(fleet.host_cpu(count), host_cpu_before, strict=True)]
        relay_after = relay.snapshot()
        problems = run_problems(fleet, hosts, phase, pids_before)
        per_host = [
            {
                "host": h.name,
                "connections": s.connections,
                "execs": s.execs,
                "relay_connections": relay_after[i].connections - relay_before[i].connections,
                "host_cpu_s": round(host_cpu[i], 3),
            }
            for i, (h, s) in enumerate(zip(hosts, ssh, strict=True))
        ]
        ok = result.returncode == 0 and not problems and not result.interrupted
        record = {
            "tool": tool,
            "phase": phase,
            "n": count,
            "rtt_ms": rtt,
            "run": run + 1,
            "ok": ok,
            "returncode": result.returncode,
            "timed_out": result.interrupted,
            "problems": problems,
            "wall_s": round(result.wall_s, 3),
            "cpu_s": round(result.cpu_s, 3),
            "leftover_cpu_s": round(result.leftover_cpu_s, 3),
            "machine_busy_s": round(result.machine_busy_s, 2),
            "host_cpu_s": round(sum(host_cpu), 3),  # every host's sshd, sessions and execs
            "max_rss_mb": round(result.max_rss_mb, 1),
            "peak_tree_rss_mb": round(result.peak_tree_rss_mb, 1),
            "processes": result.processes_seen,
            "per_host": per_host,
            "argv": list(result.argv),
        }
        if tool.startswith("opspatch"):
            record["opspatch"] = opspatch_steps(result.stdout)
        if not ok:
            record["stdout_tail"] = tail(result.stdout)
            record["stderr_tail"] = tail(result.stderr)
        self.records.append(record)
        execs = statistics.mean(s.execs for s in ssh)
        conns = statistics.mean(s.connections for s in ssh)
        status = "ok" if ok else f"FAILED (exit {result.returncode}; {'; '.join(problems[:3])})"
        log(
            f"{label}: {result.wall_s:.2f}s wall, {result.cpu_s:.2f}s cpu, "
            f"machine {result.machine_busy_s / (result.wall_s * (os.cpu_count() or 1)):.0%} busy, "
            f"{result.peak_tree_rss_mb:.0f} MB, {conns:.1f} conn/host, {execs:.1f} exec/host: "
            f"{status}"
        )

    # -------------------------------------------------------------------------------------------

    def operator_latencies(self, workloads: Workloads, count: int) -> None:
        """Median of several runs, after one untimed run (warm cache)."""
        assert self.fleet is not None and self.relay is not None
        self.fleet.restore_pristine(self.fleet.hosts[:count])
        target = str(self.fleet.hosts[0].target_file)
        env = workloads.env()
        ansible = str(self.args.venv / "bin" / "ansible")
        local = [
            ("opspatch --version", [*self.opspatch, "--version"]),
            ("opspatch check", [*self.opspatch, "check"]),
            (
                "opspatch plan eagle-init-guard --file F",
                [*self.opspatch, "plan", "eagle-init-guard", "--file", target],
            ),
            ("ansible --version", [ansible, "--version"]),
        ]
        remote = [
            (
                f"opspatch status --hosts ({count} hosts)",
                [*self.opspatch, "status", "--hosts", workloads.opspatch_inventory_name(count)],
            ),
            (
                f"ansible-playbook --check --diff ({count} hosts)",
                list(workloads.ansible_check_diff_command(count).argv),
            ),
        ]
        cases = [(name, argv, None) for name, argv in local]
        for rtt in self.args.rtt:
            cases += [(name, argv, rtt) for name, argv in remote]
        for name, argv, rtt in cases:
            if rtt is not None:
                self.relay.set_rtt(rtt)
            walls, cpus, codes = [], [], []
            for attempt in range(self.args.latency_runs + 1):
                result = self.runner.run(
                    argv,
                    env=env,
                    cwd=REPO,
                    timeout=600,
                    log_dir=workloads.work / "logs",
                    label="latency-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"),
                )
                if attempt == 0:
                    continue  # warms the caches; not counted
                walls.append(result.wall_s)
                cpus.append(result.cpu_s)
                codes.append(result.returncode)
            entry = {
                "command": name,
                "rtt_ms": rtt,
                "argv": argv,
                "runs": len(walls),
                "wall_s_median": round(statistics.median(walls), 4),
                "wall_s_min": round(min(walls), 4),
                "wall_s_max": round(max(walls), 4),
                "cpu_s_median": round(statistics.median(cpus), 4),
                "returncodes": sorted(set(codes)),
            }
            self.latencies.append(entry)
            where = "" if rtt is None else f" at {rtt} ms"
            log(
                f"{name}{where}: {statistics.median(walls) * 1000:.0f} ms (exit {sorted(set(codes))})"
            )

    # -------------------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """End every process the harness started, by pid (also after Ctrl-C)."""
        self.runner.kill_current()
        if self.relay is not None:
            self.relay.stop()
        if self.fleet is not None:
            for note in self.fleet.down():
                log(note)
            if self.args.purge:
                for state in self.fleet.sandboxes:
                    subprocess.run(
                        [*self.opspatch, "sandbox", "down", "--purge"],
                        env={**self.base_env, "OPSPATCH_STATE_DIR": str(state)},
                        cwd=REPO,
                        capture_output=True,
                        check=False,
                    )
        if self.workloads is not None:
            shutil.rmtree(self.workloads.control_dir, ignore_errors=True)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    # Ctrl-C interrupts even when this was started with SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    code = 0
    try:
        path = bench.run()
        log(f"results: {path}")
        print(path)
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        code = 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the cleanup finish
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        bench.cleanup()
        failed = [r for r in bench.records if not r["ok"]]
        if failed:
            log(f"{len(failed)} run(s) failed; see 'problems' and the output tails in the JSON")
    return code


if __name__ == "__main__":
    sys.exit(main())
