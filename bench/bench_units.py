"""A rollout over multi-node units against the same hosts as single servers (issue 33).

Two sandboxes, both up for the whole run (idle stand-in engines use no CPU), driven through the
CLI as an operator drives them:
- units: `opspatch sandbox up --units U --nodes N --tp T`: U servers of N nodes, T scheduler
  processes per node;
- singles: `opspatch sandbox up --count U*N`: the same number of hosts, each its own server with T
  scheduler processes (so both hold the same number of engine processes).

Each measured run: `opspatch apply eagle-init-guard --hosts <inventory> --playbook P --yes --json`
timed from the outside (wall, the CPU of opspatch's process tree by `wait4`, how busy the machine
was). Before it, not timed, both sandboxes go back to the same start: `opspatch rollback
eagle-init-guard --restart never` (a unit cannot be restarted by rollback yet; this restores the
files and the ledger), then `sandbox down` and `sandbox up`, which restart every engine, a unit as
one; every host's file must then hash as the stand-in's pristine source. After it, checked: every
server `applied`, one greedy decode on each server (a unit's head) from the benchmark itself.

From each apply's JSON: a server's restart time, its steps `stop` + `start` + `ready` on a unit's
head (the nodes stop in parallel), `restart` + `ready` on a single server; and `smoke`. Layouts
alternate within a repetition, playbooks too. Results: `bench/results/units-<UTC time>.json`.

    PYTHONPATH=$PWD python bench/bench_units.py [--units 4] [--nodes 2] [--tp 1] [--runs 3]
        [--playbooks default,incident] [--ssh] [--state DIR] [--out bench/results/]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import http.client
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
PATCH = "eagle-init-guard"
TARGET = "sglang/srt/speculative/eagle_worker_v2.py"
PRISTINE = REPO / "opspatch" / "sandbox" / "engine_src" / TARGET
RESTART_STEPS = {"units": ("stop", "start", "ready"), "singles": ("restart", "ready")}


def _machine_busy_seconds() -> float:
    """CPU seconds this machine's cores have been busy since boot (/proc/stat, all but idle and
    iowait): the engines share the controller's cores here."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


@dataclass
class Layout:
    """One sandbox, in its own OPSPATCH_STATE_DIR."""

    name: str  # "units" or "singles"
    state: Path
    up_args: list[str]
    ssh: bool
    retried_up: int = 0  # resets whose `sandbox up` failed once and was run again

    @property
    def inventory(self) -> str:
        return "sandbox-ssh" if self.ssh else "sandbox"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "OPSPATCH_STATE_DIR": str(self.state), "PYTHONPATH": str(REPO)}

    def opspatch(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "opspatch.cli", *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def must(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = self.opspatch(*args)
        if done.returncode != 0:
            raise RuntimeError(
                f"{self.name}: opspatch {' '.join(args)} exited {done.returncode}:\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
        return done

    def up(self) -> None:
        manifest = self.state / "sandbox" / "sandbox.json"
        if manifest.is_file() and _shape(json.loads(manifest.read_text())) != self.up_args:
            self.must("sandbox", "down", "--purge")  # `up` keeps a sandbox's shape: rebuild
        self.must("sandbox", "up", *self.up_args, *(["--ssh"] if self.ssh else []))

    def servers(self) -> dict[str, str]:
        """Each server's HTTP URL, by the host that serves it (a unit's head)."""
        path = self.state / "inventories" / f"{self.inventory}.toml"
        doc = tomllib.loads(path.read_text())
        manifest = json.loads((self.state / "sandbox" / "sandbox.json").read_text())
        heads = {u["hosts"][0] for u in manifest.get("units") or []}
        return {
            name: host["engine"]["url"]
            for name, host in doc["hosts"].items()
            if not heads or name in heads
        }

    def server_of(self) -> dict[str, str]:
        """Each host's server: a unit's nodes belong to its head, a single host to itself."""
        manifest = json.loads((self.state / "sandbox" / "sandbox.json").read_text())
        owner = {h["name"]: h["name"] for h in manifest["hosts"]}
        for unit in manifest.get("units") or []:
            owner.update({node: unit["hosts"][0] for node in unit["hosts"]})
        return owner

    def target_files(self) -> list[Path]:
        files = sorted(
            (self.state / "sandbox" / "hosts").glob(f"*/venv/lib/python*/site-packages/{TARGET}")
        )
        if not files:
            raise RuntimeError(f"{self.name}: no {TARGET} under {self.state}")
        return files

    def reset(self) -> None:
        """Back to the start: pristine files, every engine freshly started, ready."""
        pristine = hashlib.sha256(PRISTINE.read_bytes()).hexdigest()
        if any(_sha(f) != pristine for f in self.target_files()):
            self.must("rollback", PATCH, "--hosts", self.inventory, "--restart", "never", "--yes")
        self.must("sandbox", "down")
        if self.opspatch("sandbox", "up").returncode != 0:
            # a unit's rendezvous port can be taken meanwhile (seen: another unit's gloo
            # listener on it); once more from a clean stop, and the run says so
            self.retried_up += 1
            self.must("sandbox", "down")
            self.must("sandbox", "up")
        odd = [str(f) for f in self.target_files() if _sha(f) != pristine]
        if odd:
            raise RuntimeError(f"{self.name}: not pristine after the reset: {odd}")

    def down(self) -> None:
        self.opspatch("sandbox", "down")


def _shape(manifest: dict[str, Any]) -> list[str]:
    """The `sandbox up` arguments a recorded sandbox was made with (as this benchmark passes
    them)."""
    units = manifest.get("units") or []
    if units:
        return [
            "--units", str(len(units)), "--nodes", str(len(units[0]["hosts"])),
            "--tp", str(units[0]["tp"]),
        ]  # fmt: skip
    return ["--count", str(len(manifest["hosts"]))]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _decodes(url: str) -> bool:
    """One greedy decode from outside opspatch: the server answers and produced tokens."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps(
        {
            "text": "The capital of France is",
            "sampling_params": {"max_new_tokens": 8, "temperature": 0},
        }
    )
    try:
        conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status == 200 and bool(json.loads(response.read()).get("text"))
    except (OSError, http.client.HTTPException, ValueError):
        return False
    finally:
        conn.close()


def waves(ledger: Path, run_id: str, server_of: dict[str, str]) -> dict[str, int]:
    """How the run restarted the servers, from the ledger's step events: a server is out from
    its first `stop` (any node of a unit) or `restart` until its `smoke` ended (a unit's head);
    `waves` counts the stretches with some server out, `most_at_once` the most out together."""
    with contextlib.closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)) as db:
        rows = db.execute(
            "SELECT host, recorded_at, body FROM events WHERE run_id = ? AND kind = 'step'"
            " ORDER BY id",
            (run_id,),
        ).fetchall()
    spans: dict[str, list[float]] = {}
    for host, at, body in rows:
        step = json.loads(body)
        when = dt.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
        span = spans.setdefault(server_of[host], [])
        out = step["step"] in ("stop", "restart") and step["status"] == "started" and not span
        back = step["step"] == "smoke" and step["status"] != "started" and host == server_of[host]
        if out or back:
            span.append(when)
    edges = sorted(
        (t, d) for a, b in (s for s in spans.values() if len(s) == 2) for t, d in ((a, 1), (b, -1))
    )
    count = most = stretches = 0
    for _, change in edges:
        stretches += count == 0 and change == 1
        count += change
        most = max(most, count)
    return {"waves": stretches, "most_at_once": most}


def measure(layout: Layout, playbook: str, log_dir: Path, label: str) -> dict[str, Any]:
    """One timed apply (after an untimed reset), with what it did per server."""
    layout.reset()
    argv = [sys.executable, "-m", "opspatch.cli", "apply", PATCH, "--hosts", layout.inventory,
            "--playbook", playbook, "--yes", "--json"]  # fmt: skip
    out, err = log_dir / f"{label}.json", log_dir / f"{label}.err"
    load_before = os.getloadavg()
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        busy_before = _machine_busy_seconds()
        started = time.perf_counter()
        process = subprocess.Popen(argv, env=layout.env, cwd=REPO, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        busy = _machine_busy_seconds() - busy_before
    code = os.waitstatus_to_exitcode(status)
    doc = json.loads(out.read_text() or "{}")
    servers = layout.servers()
    restart, smoke, outcomes = {}, {}, {}
    for host in doc.get("hosts", []):
        outcomes[host["host"]] = host["outcome"]
        if host["host"] not in servers:
            continue
        steps = {s["step"]: float(s["seconds"]) for s in host["steps"]}
        restart[host["host"]] = round(sum(steps.get(s, 0.0) for s in RESTART_STEPS[layout.name]), 3)
        smoke[host["host"]] = steps.get("smoke", 0.0)
    decodes = {name: _decodes(url) for name, url in servers.items()}
    problems = []
    if code != 0:
        problems.append(f"exit {code}: {err.read_text()[-500:]}")
    problems += [f"{h}: {o}" for h, o in outcomes.items() if o != "applied"]
    problems += [f"{h}: no decode after the run" for h, ok in decodes.items() if not ok]
    return {
        "layout": layout.name,
        "playbook": playbook,
        "run_id": doc.get("run_id"),
        "ok": not problems,
        "problems": problems,
        "wall_s": round(wall, 3),
        "controller_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "machine_busy_s": round(busy, 2),
        "machine_busy_share": round(busy / wall / (os.cpu_count() or 1), 3),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "restart_s": restart,
        "smoke_s": smoke,
        "outcomes": outcomes,
        **(
            waves(layout.state / "ledger.sqlite3", doc["run_id"], layout.server_of())
            if doc.get("run_id")
            else {}
        ),
    }


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians per layout and playbook over the runs that did the job."""
    rows = []
    for layout, playbook in dict.fromkeys((r["layout"], r["playbook"]) for r in runs):
        good = [r for r in runs if (r["layout"], r["playbook"]) == (layout, playbook) and r["ok"]]
        if not good:
            continue
        restarts = [s for r in good for s in r["restart_s"].values()]
        rows.append({
            "layout": layout,
            "playbook": playbook,
            "runs": len(good),
            "wall_s_median": round(statistics.median(r["wall_s"] for r in good), 2),
            "wall_s_all": [r["wall_s"] for r in good],
            "restart_s_median": round(statistics.median(restarts), 2),
            "restart_s_max": round(max(restarts), 2),
            "controller_cpu_s_median": round(statistics.median(r["controller_cpu_s"] for r in good), 2),
            "machine_busy_share_median": round(statistics.median(r["machine_busy_share"] for r in good), 2),
        })  # fmt: skip
    return rows


def machine() -> dict[str, Any]:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    meminfo = dict(
        line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line
    )
    return {
        "cpu": f"{os.cpu_count()} x {model}",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "mem_available_mb": int(meminfo["MemAvailable"].split()[0]) // 1024,
        "load_at_start": os.getloadavg(),
    }


def git_revision() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1, help="scheduler processes per node")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--playbooks", default="default,incident")
    parser.add_argument("--ssh", action="store_true", help="through each host's sshd")
    parser.add_argument("--state", type=Path, default=Path.home() / ".cache/opspatch-bench/units")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--keep-up", action="store_true", help="leave the engines running")
    args = parser.parse_args()
    hosts = args.units * args.nodes
    units_args = ["--units", str(args.units), "--nodes", str(args.nodes), "--tp", str(args.tp)]
    layouts = [
        Layout("units", args.state / f"units-{args.units}x{args.nodes}-tp{args.tp}", units_args, args.ssh),
        Layout("singles", args.state / f"singles-{hosts}", ["--count", str(hosts)], args.ssh),
    ]  # fmt: skip
    if args.tp != 1:  # a single server's --tp-size is the sandbox's default; say so, do not guess
        print("note: the singles run one scheduler process each (sandbox up --count has no --tp)")
    playbooks = args.playbooks.split(",")
    started = dt.datetime.now(dt.timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    log_dir = args.state / "logs" / stamp
    log_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "benchmark": "units",
        "started": started.isoformat(timespec="seconds"),
        "settings": {**vars(args), "state": str(args.state), "out": str(args.out)},
        "machine": machine(),
        "git": git_revision(),
        "runs": [],
    }
    try:
        for layout in layouts:
            layout.up()
        for rep in range(args.runs):
            for p_index, playbook in enumerate(playbooks):
                order = layouts if (rep + p_index) % 2 == 0 else layouts[::-1]
                for layout in order:
                    label = f"{rep + 1}-{playbook}-{layout.name}"
                    run = measure(layout, playbook, log_dir, label)
                    run["repetition"] = rep + 1
                    result["runs"].append(run)
                    print(f"{label}: wall {run['wall_s']:.2f} s, restart "
                          f"{sorted(run['restart_s'].values())}, ok={run['ok']} {run['problems']}",
                          flush=True)  # fmt: skip
    finally:
        if not args.keep_up:
            for layout in layouts:
                layout.down()
        result["ended"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        result["machine"]["load_at_end"] = os.getloadavg()
        result["summary"] = summarize(result["runs"])
        result["resets_retried"] = {layout.name: layout.retried_up for layout in layouts}
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"units-{stamp}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        shutil.copy(path, log_dir / path.name)
        print(json.dumps(result["summary"], indent=1))
        print(f"written: {path}")


if __name__ == "__main__":
    main()
