"""Run the real `opspatch` console script in a subprocess, as an operator would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def opspatch(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stdin: str = "",
    timeout: float = 300,
) -> Run:
    """`opspatch ARGS...` with the test's environment (isolated HOME) plus `env`."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("COLUMNS", "200")
    result = subprocess.run(
        [sys.executable, "-m", "opspatch.cli", *args],
        cwd=cwd,
        env=full_env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Run(result.returncode, result.stdout, result.stderr)
