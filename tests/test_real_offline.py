"""`opspatch sandbox prepare --engine sglang` (what `up --engine sglang` does first) when the
package index cannot be reached: one message naming the index, exit 2, nothing built."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clirunner import opspatch

pytestmark = pytest.mark.process

UNREACHABLE = "http://127.0.0.1:9/simple"  # the discard port: nothing listens


def test_an_unreachable_index_is_one_message_and_exit_2(tmp_path: Path) -> None:
    cache = tmp_path / "engines"
    env = {"OPSPATCH_ENGINE_CACHE": str(cache), "PIP_INDEX_URL": UNREACHABLE, "PIP_RETRIES": "0"}

    run = opspatch("sandbox", "prepare", "--engine", "sglang", env=env, timeout=300)

    assert run.code == 2, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: cannot reach the package index {UNREACHABLE} to download the sglang 0.5.23 "
        "wheel; nothing was changed"
    ]
    assert not (cache / "base").exists() and not (cache / "models").exists()
