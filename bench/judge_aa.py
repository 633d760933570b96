"""The canary judge on the sandbox (issues 35, 42): its false-positive rate over repeated A/A runs
(the same code on both sides) and its power against the changes it exists for.

    PYTHONPATH=$PWD python -m bench.judge_aa [--repeats 300] [--power-repeats 50] [--busy 2]

One sandbox of two stand-in engines (`sandbox up --count 2`, the incident's fix applied so that
they decode). The judge runs in this process through the code `opspatch judge` runs
(`judge_hosts`: each host's agent over the local transport, the two servers measured in turns,
a latency fail confirmed by a second measurement), with the playbook settings below (`JUDGE`:
24 prompts of 64 tokens, the judge's defaults, and the floor under which a latency rise is noise
set to 0, so the statistics alone decide; the stand-in's time per token is a tenth of a
millisecond, under the default floor of 1 ms). Then:

1. A/A, in turns: `--repeats` judgments of sandbox-02 against sandbox-01, same code.
2. A/A, apart: `--repeats` judgments of sandbox-01 against itself measured just before, one
   measurement after the other, as an apply's own-baseline judge measures (the agent's
   measurement run in this process; a latency fail confirmed as `judging.judge_step` does).
3. Power: each patch of `PATCHES` applied to sandbox-02 (no judge in that apply), then
   `--power-repeats` judgments against sandbox-01; then rolled back.

`--busy N` starts N busy loops beside the whole benchmark (ended by pid at the end), as the
shared CI machine often is. The results go to `<out>/judge-aa-<UTC time>.json`; docs/benchmarks.md's
section is written by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opspatch.config.inventory import load_inventory
from opspatch.core.host import Host
from opspatch.core.policy import JudgeSettings, Playbook
from opspatch.core.verdicts import Judgment
from opspatch.hosts.agent.measure import op_measure
from opspatch.hosts.measure import Measurement, measure_args
from opspatch.runs.commands.judge import judge_hosts
from opspatch.runs.fleet.connect import transport_factory
from opspatch.runs.fleet.judging import CONFIRM_AFTER_SECONDS
from opspatch.runs.judgments.canary import confirm, judge, unconfirmed

REPO = Path(__file__).resolve().parent.parent
PATCHES = {
    # patch (bench/patches/<id>.toml): the metric that must fail
    "judge-shorter-drafts": "speculation",
    "judge-double-step": "tpot",
    "judge-one-token": "tokens",
    "judge-context-window": "tokens",
    "judge-text-space": "tokens",
}
JUDGE = JudgeSettings(count=24, max_new_tokens=64, latency_floor_ms=0.0)


class Sandbox:
    """Two stand-in engines in a state folder of their own, and a workspace with the patches."""

    def __init__(self, root: Path) -> None:
        shutil.rmtree(root, ignore_errors=True)
        self.workspace = root / "workspace"
        shutil.copytree(REPO / "bench" / "patches", self.workspace / "patches")
        self.env = {**os.environ, "OPSPATCH_STATE_DIR": str(root / "state")}
        self.inventory = root / "state" / "inventories" / "sandbox.toml"

    def cli(self, *args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "opspatch.cli", *args],
            cwd=self.workspace,
            env=self.env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"opspatch {' '.join(args)}: rc {done.returncode}\n{done.stdout}")

    def up(self) -> tuple[Host, Host]:
        self.cli("sandbox", "up", "--count", "2")
        self.cli("apply", "eagle-init-guard", "--hosts", "sandbox", "--yes")
        first, second = sorted(load_inventory(self.inventory).hosts, key=lambda h: h.name)
        return first, second


def in_turns(baseline: Host, canary: Host) -> Judgment:
    """`opspatch judge --hosts CANARY --baseline BASELINE` (both measured in turns), here."""
    report = judge_hosts([canary], Playbook(judge=JUDGE), baseline=baseline, factory=_factory)
    (host,) = report.hosts
    assert host.judgment is not None, host.error
    return host.judgment


def apart(host: Host) -> Judgment:
    """The host judged against itself measured just before: an apply's own baseline."""
    before, after = (_measured(host) for _ in range(2))
    judgment = judge(after, before, JUDGE, baseline_from="itself, just before")
    if unconfirmed(judgment):  # as `judging.judge_step` does: measured again to confirm
        time.sleep(CONFIRM_AFTER_SECONDS)
        judgment = confirm(judgment, judge(_measured(host), before, JUDGE, baseline_from="x"))
    return judgment


def _measured(host: Host) -> Measurement:
    return Measurement.from_json(op_measure(measure_args(host, JUDGE)))


_factory = transport_factory()


def tally(judgments: Callable[[], Judgment], repeats: int) -> dict[str, Any]:
    """Verdicts over `repeats` judgments: the host's, each metric's, and a failed one's figures."""
    verdicts: Counter[str] = Counter()
    metrics: dict[str, Counter[str]] = {}
    failures: list[str] = []
    started = time.monotonic()
    for _ in range(repeats):
        judgment = judgments()
        verdicts[judgment.verdict.value] += 1
        for metric in judgment.metrics:
            metrics.setdefault(metric.metric.value, Counter())[metric.verdict.value] += 1
        if judgment.failed and len(failures) < 5:
            failures.append(judgment.summary())
    seconds = time.monotonic() - started
    print(f"    {dict(verdicts)} in {seconds:.1f} s", flush=True)
    return {
        "repeats": repeats,
        "verdicts": dict(verdicts),
        "metrics": {name: dict(counts) for name, counts in metrics.items()},
        "failures": failures,
        "seconds": round(seconds, 1),
    }


def busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    loop = "import time\nend = time.time() + 5400\nwhile time.time() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--power-repeats", type=int, default=50)
    parser.add_argument("--busy", type=int, default=0, help="busy loops running beside")
    parser.add_argument("--state", type=Path, default=Path("/tmp/opspatch-bench-judge"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    load1, load5, load15 = os.getloadavg()
    result: dict[str, Any] = {
        "benchmark": "judge-aa",
        "started": datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"),
        "judge": {k: v for k, v in JUDGE.to_json().items() if k != "prompts"},
        "busy_loops": args.busy,
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "loadavg_at_start": [load1, load5, load15],
        },
    }
    sandbox = Sandbox(args.state)
    busy = busy_loops(args.busy)
    try:
        baseline, canary = sandbox.up()
        print(f"1. A/A in turns, {args.repeats} judgments", flush=True)
        result["aa_in_turns"] = tally(lambda: in_turns(baseline, canary), args.repeats)
        print(f"2. A/A apart, {args.repeats} judgments", flush=True)
        result["aa_apart"] = tally(lambda: apart(baseline), args.repeats)
        power = {}
        for patch, metric in PATCHES.items():
            print(f"3. {patch}: {args.power_repeats} judgments", flush=True)
            sandbox.cli("apply", patch, "--hosts", canary.name, "--yes")
            power[patch] = {"metric": metric} | tally(
                lambda: in_turns(baseline, canary), args.power_repeats
            )
            sandbox.cli("rollback", patch, "--hosts", canary.name, "--yes")
        result["power"] = power
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()
        sandbox.cli("sandbox", "down", "--purge")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"judge-aa-{result['started']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {path}")


if __name__ == "__main__":
    main()
