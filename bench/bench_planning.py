"""Planning time against the number of a patch's edits (issue 44): before and after in one run.

For 10, 100, 300 and 1,000 insert edits spread over the real `eagle_worker_v2.py` of SGLang
0.5.23 (`tests/manyedits.py`, seed 0: the eagle-init-guard file with N inserts), the plan in
one process (`core.edit.apply_patch`: detection, placement, validation, the diff), CPU and wall,
median of `--repeat`:
- after: this checkout;
- after, placing the plain way: this checkout with every edit placed on the whole file parsed
  after each edit (`edit.PLACERS = (WholeReparse,)`, the reference), to tell the parts apart;
- before: the planner of `--before` (default: the commit before issue 44), once per count of
  `--before-counts` (1,000 is left out by default: the issue saw it never finish), stopped after
  `--limit` seconds.
Then `opspatch plan --file` of the largest patch as an operator runs it (a fresh process: the
patch file read and validated, the plan, the diff printed), wall and CPU, median of `--repeat`.
Each measurement is its own process, so one does not warm the next.

    PYTHONPATH=$PWD python3 bench/bench_planning.py [--counts 10,100,300,1000] [--repeat 3]
        [--before 3e9e2ce] [--before-counts 10,100,300] [--limit 1800]
        [--out bench/results/planning-<UTC time>.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from revision import BEFORE_ISSUE_44, REPO, environment, unpacked


def _child_plan(count: int, style: str, repeat: int, reference: bool) -> dict[str, Any]:
    """Plan the generated patch `repeat` times in this process (the `--child` side)."""
    from opspatch.core import edit
    from tests.manyedits import many_edits_patch
    from tests.sglang_wheels import EAGLE_RELPATH, release_file

    if reference:
        from opspatch.core.regions import WholeReparse

        edit.PLACERS = (WholeReparse,)
    source = release_file("0.5.23", EAGLE_RELPATH)
    patch = many_edits_patch(source, count, style=style)  # type: ignore[arg-type]
    cpu, wall, outcome = [], [], ""
    for _ in range(repeat):
        started, ticks = time.perf_counter(), time.process_time()
        outcome = edit.apply_patch(source, patch).outcome
        cpu.append((time.process_time() - ticks) * 1000)
        wall.append((time.perf_counter() - started) * 1000)
    return {"outcome": outcome, "cpu_ms": cpu, "wall_ms": wall}


def _measure(
    code: Path | None, count: int, repeat: int, limit: float, reference: bool
) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--child", str(count), "--repeat", str(repeat)]
    try:
        done = subprocess.run(
            argv + (["--reference"] if reference else []),
            env=environment(code),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=limit,
        )
    except subprocess.TimeoutExpired:
        return {"finished": False, "limit_s": limit}
    if done.returncode != 0:
        return {"finished": False, "error": done.stderr.strip().splitlines()[-1:]}
    measured = json.loads(done.stdout)
    return {
        "finished": True,
        "outcome": measured["outcome"],
        "cpu_ms_median": round(statistics.median(measured["cpu_ms"]), 1),
        "wall_ms_median": round(statistics.median(measured["wall_ms"]), 1),
        "runs": len(measured["cpu_ms"]),
    }


def _toml(value: Any) -> str:
    """A TOML value for what a generated patch holds (strings, numbers, flags, tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # its escapes are TOML's
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def _patch_file(count: int, folder: Path) -> Path:
    """The generated patch of `count` edits as a patch file in `folder/patches/`."""
    from tests.manyedits import many_edits_patch
    from tests.sglang_wheels import EAGLE_RELPATH, release_file

    spec = many_edits_patch(release_file("0.5.23", EAGLE_RELPATH), count)
    data = spec.model_dump(mode="json", exclude_defaults=True, by_alias=True)
    lines = [f"{k} = {_toml(v)}" for k, v in data.items() if k not in ("target", "edits")]
    lines += ["[target]", *(f"{k} = {_toml(v)}" for k, v in data["target"].items())]
    for item in data["edits"]:
        lines += ["[[edits]]", *(f"{k} = {_toml(v)}" for k, v in item.items())]
    path = folder / "patches" / f"{spec.id}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _cli_plan(count: int, repeat: int) -> dict[str, Any]:
    """`opspatch plan many-edits --file F` as an operator runs it: wall and CPU."""
    from tests.sglang_wheels import EAGLE_RELPATH, release_file

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        _patch_file(count, folder)
        target = folder / "site" / "pkg" / "mod.py"
        target.parent.mkdir(parents=True)
        target.write_bytes(release_file("0.5.23", EAGLE_RELPATH))
        argv = [sys.executable, "-m", "opspatch.cli", "-w", str(folder), "plan", "many-edits"]
        argv += ["--file", str(target), "--target-version", "0.5.23"]
        walls, cpus = [], []
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            done = subprocess.run(argv, env=environment(None), capture_output=True, cwd=folder)
            walls.append((time.perf_counter() - started) * 1000)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(
                (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
            )
            assert done.returncode == 0, done.stderr[-2000:]
    return {
        "command": f"opspatch plan many-edits --file F ({count} edits)",
        "wall_ms_median": round(statistics.median(walls)),
        "cpu_ms_median": round(statistics.median(cpus)),
        "runs": repeat,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="10,100,300,1000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", default=BEFORE_ISSUE_44, help="the revision measured before")
    parser.add_argument("--before-counts", default="10,100,300")
    parser.add_argument("--limit", type=float, default=1800, help="seconds a plan may take")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(_child_plan(args.child, "spread", args.repeat, args.reference)))
        return
    counts = [int(c) for c in args.counts.split(",")]
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other work",
        "python": platform.python_version(),
        "load_before": os.getloadavg(),
        "before_revision": args.before,
        "rows": [],
    }
    with unpacked(args.before) as old:
        for count in counts:
            row = {
                "edits": count,
                "after": _measure(None, count, args.repeat, args.limit, False),
                "after_placing_plainly": _measure(None, count, args.repeat, args.limit, True),
                "before": _measure(old, count, 1, args.limit, False)
                if str(count) in args.before_counts.split(",")
                else {"finished": False, "not_run": True},
            }
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
    result["cli"] = _cli_plan(max(counts), args.repeat)
    print(json.dumps(result["cli"]), flush=True)
    result["load_after"] = os.getloadavg()
    out = args.out or REPO / "bench" / "results" / time.strftime(
        "planning-%Y%m%dT%H%M%SZ.json", time.gmtime()
    )
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
