"""`opspatch apply --file` against `python -m py_compile` on the same file (issue 44): before
and after in one run.

The real `eagle_worker_v2.py` of SGLang 0.5.23, a fresh copy for every run (in a
`<site>/sglang/srt/speculative/` folder), patched with `eagle-init-guard` by `apply --file --yes`
as an operator runs it (a new ledger and state folder each time), and compiled by
`python -m py_compile`, the floor: an interpreter's start and one compile of the file. Wall and
CPU of each process (its children included), median of `--runs`, the variants in turn:
- py_compile;
- after: this checkout (the agent's operations in the controller's process);
- before: `--before` (default: the commit before issue 44: two agent interpreters per apply);
- the imports alone, after and before (`python -c "import ..."` of what `apply --file` loads in
  each).
Both checkouts are byte-compiled first, as an install is.

    PYTHONPATH=$PWD python3 bench/bench_local_apply.py [--runs 9] [--before 3e9e2ce]
        [--out bench/results/local-apply-<UTC time>.json]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from revision import BEFORE_ISSUE_44, REPO, environment, unpacked

EAGLE = "sglang/srt/speculative/eagle_worker_v2.py"
IMPORTS = (
    "import opspatch.cli.localapply, opspatch.cli.exits, opspatch.config.patches, "
    "opspatch.runs.commands.local_files, opspatch.core.edit"
)
"""What `apply --file --yes` imports: its typer-free command (`cli/localapply.py`), the error
handler (with the output), the patch schema, the pipeline."""

IMPORTS_BEFORE_TYPER_FREE = (
    "import opspatch.cli.app, opspatch.cli.changes, opspatch.config.patches, "
    "opspatch.runs.commands.local_files, opspatch.core.edit"
)
"""The same before `apply --file --yes` ran without typer (a `--before` without
`cli/localapply.py`): the app, the command group of `apply` (named, since the app imports a
command's group only). A later `--before` is measured with `IMPORTS`."""


def _child(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU (ms) of one process and its children, started in `cwd`: never the
    checkout, which `-m` and `-c` put ahead of PYTHONPATH (a "before" would run this one)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, cwd=cwd)
    wall = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, (argv, done.stderr[-2000:])
    return wall, (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000


def _apply(folder: Path, old: Path) -> list[str]:
    return [
        sys.executable, "-m", "opspatch.cli", "apply", str(REPO / "patches" / "eagle-init-guard.toml"),
        "--file", str(folder / "site" / EAGLE), "--target-version", "0.5.23", "--yes",
    ]  # fmt: skip


def _py_compile(folder: Path, old: Path) -> list[str]:
    return [sys.executable, "-m", "py_compile", str(folder / "site" / EAGLE)]


def _imports(folder: Path, old: Path) -> list[str]:
    return [sys.executable, "-c", IMPORTS]


def _imports_before(folder: Path, old: Path) -> list[str]:
    typer_free = (old / "opspatch" / "cli" / "localapply.py").exists()
    return [sys.executable, "-c", IMPORTS if typer_free else IMPORTS_BEFORE_TYPER_FREE]


VARIANTS: dict[str, Callable[[Path, Path], list[str]]] = {
    "py_compile": _py_compile,
    "apply_after": _apply,
    "apply_before": _apply,
    "imports_after": _imports,
    "imports_before": _imports_before,
}
"""What is run, by name; a name ending in `_before` runs the `--before` revision's opspatch."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--before", default=BEFORE_ISSUE_44)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tests.sglang_wheels import release_file

    source = release_file("0.5.23", EAGLE)
    load_before = os.getloadavg()
    compileall.compile_dir(REPO / "opspatch", quiet=1)
    measured: dict[str, list[tuple[float, float]]] = {}
    with unpacked(args.before) as old:
        for run in range(args.runs + 1):  # the first round warms the caches, not counted
            for name, argv_of in VARIANTS.items():
                with tempfile.TemporaryDirectory() as scratch:
                    folder = Path(scratch)
                    (folder / "site" / EAGLE).parent.mkdir(parents=True)
                    (folder / "site" / EAGLE).write_bytes(source)
                    env = environment(old if name.endswith("_before") else None)
                    env["OPSPATCH_STATE_DIR"] = str(folder / "state")
                    sample = _child(argv_of(folder, old), env, folder)
                if run:
                    measured.setdefault(name, []).append(sample)
    floor = statistics.median(cpu for _, cpu in measured["py_compile"])
    floor_wall = statistics.median(wall for wall, _ in measured["py_compile"])
    rows = {
        name: {
            "wall_ms_median": round(statistics.median(w for w, _ in samples)),
            "cpu_ms_median": round(statistics.median(c for _, c in samples)),
            "wall_x_py_compile": round(statistics.median(w for w, _ in samples) / floor_wall, 1),
            "cpu_x_py_compile": round(statistics.median(c for _, c in samples) / floor, 1),
        }
        for name, samples in measured.items()
    }
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other work",
        "python": platform.python_version(),
        "load_before": load_before,
        "before_revision": args.before,
        "runs": args.runs,
        "rows": rows,
        "load_after": os.getloadavg(),
    }
    print(json.dumps(rows, indent=1))
    out = args.out or REPO / "bench" / "results" / time.strftime(
        "local-apply-%Y%m%dT%H%M%SZ.json", time.gmtime()
    )
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
