"""Start-up stays light: the commands an operator runs most often for a quick answer import
neither the SSH libraries nor torch (they cost hundreds of milliseconds and, for torch, can touch
the GPU). Checked in a fresh interpreter per command, as the console script runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

PROBE = """
import json, sys
from opspatch.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = ("paramiko", "fabric", "invoke", "torch", "cryptography")
sys.stderr.write("\\nLOADED " + json.dumps(sorted(m for m in heavy if m in sys.modules)) + "\\n")
"""


@pytest.mark.parametrize("args", [["--version"], ["check"], ["schema"], ["check", "--json"]])
def test_quick_commands_import_neither_ssh_libraries_nor_torch(
    args: list[str], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stderr.rsplit("LOADED ", 1)[1])
    assert loaded == [], f"`opspatch {' '.join(args)}` imported {loaded}"
