"""Per-release alternatives through the real CLI (issue 19): `plan` shows which alternative fit,
the ledger keeps it (the plan step's detail), re-applying finds it in place and `rollback`
restores the release's own bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from opspatch.ledger.store import Ledger
from tests.clirunner import opspatch

pytestmark = pytest.mark.process

OLD_RELEASE = """\
class S:
    def step(self):
        if self.free <= 0 and self.chunked is not None and self.dynamic:
            return None
"""
NEW_RELEASE = OLD_RELEASE.replace("self.dynamic", "self.enable_dynamic_chunking")

PATCH = """\
id = "chunk-check"
summary = "drop the free-slots check"
rationale = "upstream fix, backported"
[target]
module = "pkg.mod"
distribution = "pkg"
[[edits]]
kind = "replace"
scope = "S.step"
select = { test_of = "if", containing = "self.dynamic" }
code = "self.chunked is not None and self.dynamic"
[[edits.alternatives]]
name = "sglang >= 0.5.10"
select = { test_of = "if", containing = "self.enable_dynamic_chunking" }
code = "self.chunked is not None and self.enable_dynamic_chunking"
"""

MATCHED = "edits[0]: alternatives[0] (sglang >= 0.5.10)"


def test_plan_shows_the_alternative_that_fit_and_the_ledger_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    module = tmp_path / "pkg" / "mod.py"
    module.write_text(NEW_RELEASE)
    (tmp_path / "fix.toml").write_text(PATCH)
    env = {"OPSPATCH_LEDGER": str(tmp_path / "ledger.db")}

    planned = opspatch("plan", "fix.toml", "--file", "pkg/mod.py", cwd=tmp_path, env=env)
    assert planned.code == 0, planned.stderr
    assert MATCHED in planned.stderr
    doc = opspatch("plan", "fix.toml", "--file", "pkg/mod.py", "--json", cwd=tmp_path, env=env)
    assert doc.json()["matched"] == [MATCHED]
    assert doc.json()["edits"][0]["variant"] == 1

    applied = opspatch(
        "apply", "fix.toml", "--file", "pkg/mod.py", "-y", "--json", cwd=tmp_path, env=env
    )
    assert applied.code == 0, applied.stderr
    assert "self.chunked is not None and self.enable_dynamic_chunking:" in module.read_text()
    run_id = str(applied.json()["run_id"])
    ledger = Ledger.open(tmp_path / "ledger.db")
    try:
        (host,) = ledger.get_run(run_id).hosts
        plan_steps = [s.detail for s in host.steps if s.step == "plan" and s.detail]
    finally:
        ledger.close()
    assert plan_steps == [f"applicable; {MATCHED}"]

    again = opspatch("plan", "fix.toml", "--file", "pkg/mod.py", cwd=tmp_path, env=env)
    assert again.code == 0 and "already applied" in again.stdout
    assert MATCHED in again.stdout

    rolled = opspatch("rollback", "fix.toml", "--file", "pkg/mod.py", "-y", cwd=tmp_path, env=env)
    assert rolled.code == 0, rolled.stderr
    assert module.read_text() == NEW_RELEASE
