"""Write docs/benchmarks.md and its PNG plots from the JSON of `bench/rollout.py`.

    python3 bench/report.py [RESULTS.json] [--doc docs/benchmarks.md] [--plots docs/benchmarks]

Without a file it takes the newest `bench/results/rollout-*.json`. The plots (wall time against
N per tool, one figure per round trip, a panel per phase) need matplotlib, which lives in the
benchmark's venv: when this Python lacks it, the script runs itself again with that venv's
Python (`--venv`, default ~/.cache/opspatch-bench/venv).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VENV = Path.home() / ".cache" / "opspatch-bench" / "venv"
TOOL_LABELS = {
    "opspatch": "opspatch apply (incident playbook)",
    "opspatch-per-exec": "opspatch apply, one agent interpreter per request",
    "ansible": "Ansible playbook",
    "pyinfra": "pyinfra deploy",
    "sed": "ssh + sed loop (incident)",
}
TOOL_COLOURS = {
    "opspatch": "tab:blue",
    "opspatch-per-exec": "tab:cyan",
    "ansible": "tab:red",
    "pyinfra": "tab:green",
    "sed": "tab:gray",
}
PHASE_LABELS = {
    "full": "Full pipeline: edit, validate, restart, wait for /health, smoke decode",
    "patch": "Patch phase alone: edit and validate, no restart",
}

Summary = dict[tuple[str, int, int, str], dict[str, Any]]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="?", help="a rollout-*.json file")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--plots", type=Path, default=REPO / "docs" / "benchmarks")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    return parser.parse_args(argv)


def newest_results() -> Path:
    found = sorted((REPO / "bench" / "results").glob("rollout-*.json"))
    if not found:
        sys.exit("no bench/results/rollout-*.json: run bench/rollout.py first")
    return found[-1]


# ---------------------------------------------------------------------------------------------
# numbers


def summarise(runs: Iterable[dict[str, Any]], cpus: int) -> Summary:
    """Per (phase, rtt, n, tool): wall median/min/max over the runs that did the job, the
    medians of CPU, memory and SSH counts, and how many runs were ok."""
    groups: dict[tuple[str, int, int, str], list[dict[str, Any]]] = {}
    for run in runs:
        key = (run["phase"], run["rtt_ms"], run["n"], run["tool"])
        groups.setdefault(key, []).append(run)
    summary: Summary = {}
    for key, group in groups.items():
        good = [r for r in group if r["ok"]] or group
        walls = [r["wall_s"] for r in good]

        def per_host(field: str, runs: list[dict[str, Any]] = good) -> tuple[float, int]:
            means = [statistics.mean(h[field] for h in r["per_host"]) for r in runs]
            peaks = [max(h[field] for h in r["per_host"]) for r in runs]
            return statistics.median(means), max(peaks)

        summary[key] = {
            "runs": len(group),
            "ok": sum(1 for r in group if r["ok"]),
            "wall_median": statistics.median(walls),
            "wall_min": min(walls),
            "wall_max": max(walls),
            "cpu_median": statistics.median(r["cpu_s"] for r in good),
            # share of all cores busy during the run (results from before it was recorded: None)
            "busy_median": statistics.median(
                r["machine_busy_s"] / (r["wall_s"] * cpus) for r in good
            )
            if all("machine_busy_s" in r for r in good)
            else None,
            "rss_median": statistics.median(r["peak_tree_rss_mb"] for r in good),
            "max_rss_median": statistics.median(r["max_rss_mb"] for r in good),
            "connections": per_host("connections"),
            "execs": per_host("execs"),
            "steps": next(
                (r["opspatch"]["step_seconds_median"] for r in good if r.get("opspatch")), None
            ),
        }
    return summary


def fmt_s(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


# ---------------------------------------------------------------------------------------------
# the document


def machine_section(doc: dict[str, Any]) -> list[str]:
    machine, limit = doc["machine"], doc["engine_limit"]
    lines = [
        "## The machine",
        "",
        f"- CPU: {machine['cpus']} × {machine['cpu_model']} (from /proc/cpuinfo)",
        f"- kernel {machine['kernel']}, Python {machine['python']}, {machine['openssh']}",
        f"- load average (1, 5, 15 min) at the start: {' '.join(machine['loadavg_start'])}; "
        f"at the end: {' '.join(machine.get('loadavg_end', ['?']))}",
        "- memory (`free -m`):",
        "",
        "```",
        machine["free_m"],
        "```",
        "",
        "Engines this machine holds: "
        f"**{limit['value']}** ({limit['basis']}; MemAvailable at the start "
        f"{limit['mem_available_mb_at_start']} MB). One stand-in engine measured "
        f"{limit.get('engine_pss_mb_measured', '?')} MB PSS"
        + (
            f", which would allow {limit['limit_by_measured_memory']}"
            if limit.get("limit_by_measured_memory")
            else ""
        )
        + (
            f"; starting one took {limit['engine_start_cpu_s_measured']} s of CPU"
            if limit.get("engine_start_cpu_s_measured")
            else ""
        )
        + ". Idle engines use no CPU; starting them is CPU-bound (torch import), so restarting "
        "N at once costs about N times that, shared by the cores. The full pipeline runs up to "
        "this many hosts; the patch phase runs every N.",
        "",
    ]
    return lines


def results_table(summary: Summary, phase: str, rtt: int, tools: Sequence[str]) -> list[str]:
    counts = sorted({n for (p, r, n, _t) in summary if p == phase and r == rtt})
    if not counts:
        return []
    # results from before the machine's busy time was recorded have no such column
    busy = any(v["busy_median"] is not None for v in summary.values())
    lines = [
        f"#### {rtt} ms round trip",
        "",
        "| N | tool | wall s, median (min–max) | controller CPU s "
        + ("| machine busy " if busy else "")
        + "| peak RSS MB (tree / largest) | SSH connections per host | execs per host | runs ok |",
        "|---:|---|---|---:|" + ("---:|" if busy else "") + "---|---|---|---|",
    ]
    for count in counts:
        for tool in tools:
            entry = summary.get((phase, rtt, count, tool))
            if entry is None:
                continue
            conns, conns_max = entry["connections"]
            execs, execs_max = entry["execs"]
            cells = [
                str(count),
                tool,
                f"**{fmt_s(entry['wall_median'])}** "
                f"({fmt_s(entry['wall_min'])}–{fmt_s(entry['wall_max'])})",
                f"{entry['cpu_median']:.2f}",
            ]
            if busy:
                share = entry["busy_median"]
                cells.append("-" if share is None else f"{share:.0%}")
            cells += [
                f"{entry['rss_median']:.0f} / {entry['max_rss_median']:.0f}",
                f"{conns:g} (max {conns_max})",
                f"{execs:g} (max {execs_max})",
                f"{entry['ok']}/{entry['runs']}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def ratio(
    summary: Summary, a: tuple[str, int, int, str], b: tuple[str, int, int, str]
) -> float | None:
    if a in summary and b in summary and summary[b]["wall_median"] > 0:
        return float(summary[a]["wall_median"] / summary[b]["wall_median"])
    return None


def targets_section(doc: dict[str, Any], summary: Summary) -> list[str]:
    rows: list[tuple[str, str, str]] = []
    rtts = doc["settings"]["rtt_ms"]

    def verdict(ok: bool | None, miss: str) -> str:
        if ok is None:
            return "not measured"
        return "met" if ok else f"**missed** ({miss})"

    full = [k for k in summary if k[0] == "full" and k[3] == "opspatch"]
    if full:
        conns = max(summary[k]["connections"][1] for k in full)
        execs = max(summary[k]["execs"][1] for k in full)
        # opspatch polls readiness inside one exec of its own (its `ready` step), if it has one.
        polling = int(any("ready" in (summary[k]["steps"] or {}) for k in full))
        others = execs - polling
        rows.append(
            (
                "per host: 1 SSH connection, at most 4 execs besides readiness polling",
                f"{conns} connection(s); {execs} execs, {others} besides the readiness exec",
                verdict(conns <= 1 and others <= 4, f"{others} execs, {conns} connection(s)"),
            )
        )
    else:
        rows.append(("per host: 1 SSH connection, at most 4 execs", "-", "not measured"))
    for rtt in rtts:
        speed = ratio(summary, ("full", rtt, 16, "ansible"), ("full", rtt, 16, "opspatch"))
        rows.append(
            (
                f"opspatch ≥ 5x faster than Ansible at N = 16, {rtt} ms",
                "-" if speed is None else f"{speed:.2f}x",
                verdict(None if speed is None else speed >= 5, f"{speed or 0:.2f}x of 5x"),
            )
        )
        speed = ratio(summary, ("full", rtt, 16, "pyinfra"), ("full", rtt, 16, "opspatch"))
        rows.append(
            (
                f"opspatch faster than pyinfra at N = 16, {rtt} ms",
                "-" if speed is None else f"{speed:.2f}x",
                verdict(None if speed is None else speed > 1, f"{speed or 0:.2f}x"),
            )
        )
    for rtt in rtts:
        slower = ratio(summary, ("full", rtt, 1, "opspatch"), ("full", rtt, 1, "sed"))
        rows.append(
            (
                f"N = 1: opspatch within 1.3x of the sed loop, {rtt} ms",
                "-" if slower is None else f"{slower:.2f}x the sed loop's time",
                verdict(None if slower is None else slower <= 1.3, f"{slower or 0:.2f}x"),
            )
        )
        for count in sorted({k[2] for k in summary if k[2] >= 4}):
            slower = ratio(summary, ("full", rtt, count, "opspatch"), ("full", rtt, count, "sed"))
            if slower is None:
                continue
            rows.append(
                (
                    f"N = {count}: opspatch faster than the sed loop, {rtt} ms",
                    f"{slower:.2f}x the sed loop's time",
                    verdict(slower < 1, f"{slower:.2f}x"),
                )
            )
    counts = sorted({k[2] for k in summary if k[0] == "patch"})
    if 50 in rtts:
        growth = ratio(summary, ("patch", 50, 32, "opspatch"), ("patch", 50, 1, "opspatch"))
        rows.append(
            (
                "patch phase, 50 ms: 32 hosts within 3x of 1 host",
                "-" if growth is None else f"{growth:.2f}x",
                verdict(None if growth is None else growth <= 3, f"{growth or 0:.2f}x")
                if 32 in counts
                else "not measured (N = 32 not run)",
            )
        )
    latencies = {e["command"]: e for e in doc.get("latencies", [])}
    for command, limit in (("opspatch --version", 0.150), ("opspatch check", 0.300)):
        entry = latencies.get(command)
        median = None if entry is None else entry["wall_s_median"]
        rows.append(
            (
                f"`{command}` under {limit * 1000:.0f} ms (median, warm)",
                "-" if median is None else f"{median * 1000:.0f} ms",
                verdict(
                    None if median is None else median < limit,
                    f"{(median or 0) / limit:.2f}x the limit",
                ),
            )
        )
    lines = ["## Targets (issue 10)", "", "| target | measured | status |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return lines + [""]


def latency_section(doc: dict[str, Any]) -> list[str]:
    entries = doc.get("latencies", [])
    if not entries:
        return []
    lines = [
        "## Operator-facing latencies",
        "",
        "Median of several runs after one untimed run (warm caches); commands over SSH go "
        "through the relay at the round trip shown.",
        "",
        "| command | round trip | median ms | min–max ms | CPU ms | exit |",
        "|---|---|---:|---|---:|---|",
    ]
    for e in entries:
        rtt = "local" if e["rtt_ms"] is None else f"{e['rtt_ms']} ms"
        lines.append(
            f"| `{e['command']}` | {rtt} | {e['wall_s_median'] * 1000:.0f} "
            f"| {e['wall_s_min'] * 1000:.0f}–{e['wall_s_max'] * 1000:.0f} "
            f"| {e['cpu_s_median'] * 1000:.0f} | {', '.join(map(str, e['returncodes']))} |"
        )
    return lines + [""]


def steps_section(summary: Summary) -> list[str]:
    rows = [
        (k, v["steps"]) for k, v in sorted(summary.items()) if k[3] == "opspatch" and v["steps"]
    ]
    if not rows:
        return []
    names = list(dict.fromkeys(name for _, steps in rows for name in steps))
    lines = [
        "## opspatch's own step times",
        "",
        "From `opspatch apply --json`: median over hosts of each step's `seconds` as opspatch "
        "reports it, median run.",
        "",
        "| phase | round trip | N | " + " | ".join(names) + " |",
        "|---|---|---:|" + "---:|" * len(names),
    ]
    for (phase, rtt, count, _), steps in rows:
        cells = " | ".join(f"{steps[n]:.2f}" if n in steps else "" for n in names)
        lines.append(f"| {phase} | {rtt} ms | {count} | {cells} |")
    return lines + [""]


def failures_section(doc: dict[str, Any]) -> list[str]:
    failed = [r for r in doc["runs"] if not r["ok"]]
    if not failed:
        return []
    lines = ["## Runs that did not do the job", ""]
    for r in failed:
        problems = "; ".join(r["problems"][:3]) or (r.get("stderr_tail") or "")[-300:]
        lines.append(
            f"- {r['phase']} N={r['n']} {r['rtt_ms']} ms {r['tool']} run {r['run']}: "
            f"exit {r['returncode']}: {problems}"
        )
    return lines + [""]


def render(doc: dict[str, Any], summary: Summary, plots: list[Path], doc_path: Path) -> str:
    settings = doc["settings"]
    tools = [t for t in TOOL_LABELS if t in settings["tools"]]
    preliminary = settings["runs"] < 3 or max(settings["hosts"]) < 16
    lines = [
        "# Benchmarks: a rollout with opspatch, Ansible, pyinfra and the raw sed loop",
        "",
        "Written by `bench/report.py` from the results of `bench/rollout.py` "
        f"(`{Path(doc.get('source', '')).name}`); the method is in `bench/README.md`. "
        "CI asserts no timing: these figures are measured by hand and committed.",
        "",
    ]
    if preliminary:
        lines += [
            "> **Preliminary:** a small development run "
            f"(N = {', '.join(map(str, settings['hosts']))}; {settings['runs']} run(s) per case), "
            "not the published figures. Re-run the command of the issue on a quiet machine.",
            "",
        ]
    lines += [
        "## How it was run",
        "",
        "```",
        doc["command"],
        f"python3 bench/report.py {doc.get('source', '')}",
        "```",
        "",
        f"- {doc['started']} to {doc['finished']}; opspatch at "
        f"{doc['git']['commit'][:12]} ({doc['git']['branch']}"
        f"{', uncommitted changes' if doc['git']['dirty'] else ''})",
        f"- {doc['versions'].get('opspatch', '')}; {doc['versions'].get('ansible', '')}; "
        f"{doc['versions'].get('pyinfra', '')}",
        f"- {settings['runs']} measured run(s) per tool and case, tools in rotating order, "
        f"{'after one untimed warm-up run each' if settings.get('warmup') else 'no warm-up'}; "
        f"the other tools poll /health every {settings['poll_delay_s']:g} s",
        "- every run starts from the same state: the pristine file (checked against RECORD) "
        "and, for the full pipeline, freshly restarted engines",
        "- every tool reaches each host through the latency relay (each direction delayed by "
        "half the round trip), also at 0 ms",
        "",
    ]
    lines += machine_section(doc)
    lines += targets_section(doc, summary)
    findings = Path(__file__).resolve().parent / "findings.md"
    if findings.is_file():  # the analysis of the misses, written by hand beside the figures
        lines += findings.read_text(encoding="utf-8").rstrip().splitlines() + [""]
    for phase in settings["phases"]:
        if not any(k[0] == phase for k in summary):
            continue
        lines += [f"## {PHASE_LABELS[phase]}", ""]
        for rtt in settings["rtt_ms"]:
            lines += results_table(summary, phase, rtt, tools)
    for plot in plots:
        lines += [f"![wall time against N]({os.path.relpath(plot, doc_path.parent)})", ""]
    lines += latency_section(doc)
    lines += steps_section(summary)
    if doc.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    lines += failures_section(doc)
    controller = Path(__file__).resolve().parent / "controller.md"
    if controller.is_file():  # bench_controller.py's figures (issue 20), written by hand
        lines += controller.read_text(encoding="utf-8").rstrip().splitlines() + [""]
    lines += [
        "## Reading the columns",
        "",
        "- wall: from the tool's start to its exit; the median of the runs that did the job "
        "(checked afterwards: the file carries the fix, and in the full pipeline the engine was "
        "restarted and decodes with `spec_verify_ct > 0`).",
        "- controller CPU: user + system time of the tool's whole process tree on this machine "
        "(`wait4`, plus SSH ControlPersist masters read from /proc before they are ended).",
        "- machine busy (in results that record it): the share of all the machine's cores that were busy during the run "
        "(/proc/stat), whoever used them: the tool, the hosts' sshd and agents or modules, the "
        "engines. All hosts share this machine's cores, so near 100% the wall time is set by "
        "the fleet's summed CPU, not by the tool's waiting.",
        "- peak RSS: the largest sum of RSS over the tool's processes, sampled every 100 ms "
        "(forked workers share pages, so this over-states a forking tool; a process shorter "
        "than a sample is missed, so the sum can be below the largest) / the largest single "
        "process (`ru_maxrss`, every process the tool waited for).",
        "- SSH connections and execs per host: from the benchmark's sshd log at LogLevel VERBOSE "
        "(`Accepted publickey`, `Starting session: command`); mean over hosts (and the most on "
        "any host). Ansible's and pyinfra's readiness polls are execs of their own; opspatch "
        "polls inside its `ready` exec.",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# plots


def make_plots(doc: dict[str, Any], summary: Summary, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    phases = [p for p in doc["settings"]["phases"] if any(k[0] == p for k in summary)]
    for rtt in doc["settings"]["rtt_ms"]:
        figure, axes = plt.subplots(1, len(phases), figsize=(6 * len(phases), 4.5), squeeze=False)
        for axis, phase in zip(axes[0], phases, strict=True):
            for tool in TOOL_LABELS:
                points = sorted(
                    (n, v) for (p, r, n, t), v in summary.items() if (p, r, t) == (phase, rtt, tool)
                )
                if not points:
                    continue
                xs = [n for n, _ in points]
                ys = [v["wall_median"] for _, v in points]
                low = [v["wall_median"] - v["wall_min"] for _, v in points]
                high = [v["wall_max"] - v["wall_median"] for _, v in points]
                axis.errorbar(
                    xs,
                    ys,
                    yerr=[low, high],
                    marker="o",
                    capsize=3,
                    color=TOOL_COLOURS[tool],
                    label=TOOL_LABELS[tool],
                )
            counts = sorted({n for (p, r, n, _t) in summary if (p, r) == (phase, rtt)})
            axis.set_xscale("log", base=2)
            axis.set_xticks(counts, [str(n) for n in counts])
            axis.minorticks_off()
            axis.set_xlabel("hosts (N)")
            axis.set_ylabel("wall time, s (median; min–max)")
            axis.set_title(f"{'full pipeline' if phase == 'full' else 'patch phase'}, {rtt} ms RTT")
            axis.set_ylim(bottom=0)
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=8)
        figure.tight_layout()
        path = folder / f"wall-rtt{rtt}ms.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        python = args.venv / "bin" / "python"
        if python.exists() and Path(sys.prefix).resolve() != args.venv.resolve():
            os.execv(
                str(python), [str(python), __file__, *(sys.argv[1:] if argv is None else argv)]
            )
        sys.exit(f"matplotlib is missing; run bench/rollout.py once (it makes {args.venv})")
    source = args.results or newest_results()
    doc = json.loads(source.read_text())
    try:
        doc["source"] = str(source.resolve().relative_to(REPO))
    except ValueError:
        doc["source"] = str(source)
    summary = summarise(doc["runs"], int(doc["machine"]["cpus"] or 1))
    plots = make_plots(doc, summary, args.plots)
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(render(doc, summary, plots, args.doc))
    print(args.doc)
    for plot in plots:
        print(plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
