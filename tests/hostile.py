"""Helpers for tests that feed hostile input to the CLI: run it in-process, build deep nesting."""

from __future__ import annotations

import contextlib
import io
import shutil
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GUARD_PATCH = REPO / "patches" / "eagle-init-guard.toml"
EAGLE_RELPATH = "sglang/srt/speculative/eagle_worker_v2.py"
STANDIN_EAGLE = REPO / "opspatch" / "sandbox" / "engine_src" / EAGLE_RELPATH


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_in_process(*args: str) -> Result:
    """`opspatch ARGS...` in this process (for many cases; the console script costs a start-up
    each). An exception escaping `main` (a traceback for an operator) propagates to the test."""
    from opspatch.cli.app import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        else:  # pragma: no cover - main always exits
            code = 0
    return Result(code, stdout.getvalue(), stderr.getvalue())


def nested_arrays(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def nested_inline_tables(depth: int) -> str:
    return "{ a = " * depth + "1" + " }" * depth


def long_sum(terms: int) -> str:
    return "+".join(["1"] * terms)


def target_copy(folder: Path, extra: str = "") -> Path:
    """The stand-in engine's eagle_worker_v2.py under `folder`, at the module's path (so the
    patch's target check passes), with `extra` appended."""
    path = folder / EAGLE_RELPATH
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(STANDIN_EAGLE, path)
    if extra:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(extra)
    return path
