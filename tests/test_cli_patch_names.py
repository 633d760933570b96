"""A patch given as a path may have any file name; only lookup by id needs `<id>.toml`
(issue 19). The first-only replace of the issue, applied twice through the real CLI, changes the
file once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clirunner import opspatch

pytestmark = pytest.mark.process

MODULE = """\
class S:
    def step(self):
        if self.free <= 0 and self.chunked is not None:
            return None
        if self.chunked is not None and self.dynamic:
            return len(self.chunked.prefix)
"""

PATCH = """\
id = "first-only"
summary = "invert the first check only"
rationale = "repro"
[target]
module = "pkg.mod"
distribution = "pkg"
[[edits]]
kind = "replace"
scope = "S.step"
select = { expression = "self.chunked is not None", which = "first" }
code = "self.chunked is None"
"""


def test_a_patch_path_with_any_file_name_applies_once_and_only_once(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    module = tmp_path / "pkg" / "mod.py"
    module.write_text(MODULE)
    (tmp_path / "patch.toml").write_text(PATCH)
    env = {"OPSPATCH_LEDGER": str(tmp_path / "ledger.db")}

    planned = opspatch("plan", "patch.toml", "--file", "pkg/mod.py", cwd=tmp_path, env=env)
    assert planned.code == 0, planned.stderr
    first = opspatch("apply", "patch.toml", "--file", "pkg/mod.py", "-y", cwd=tmp_path, env=env)
    assert first.code == 0, first.stderr
    applied = module.read_bytes()
    assert (
        applied
        == MODULE.replace(
            "        if self.free <= 0 and self.chunked is not None:\n",
            "        # opspatch:first-only\n        if self.free <= 0 and self.chunked is None:\n",
        ).encode()
    )

    again = opspatch("apply", "patch.toml", "--file", "pkg/mod.py", "-y", cwd=tmp_path, env=env)
    assert again.code == 0, again.stderr
    assert "already-applied" in again.stdout
    assert module.read_bytes() == applied
    replanned = opspatch("plan", "patch.toml", "--file", "pkg/mod.py", cwd=tmp_path, env=env)
    assert replanned.code == 0 and "already applied" in replanned.stdout


def test_lookup_by_id_still_needs_the_file_named_after_the_id(tmp_path: Path) -> None:
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "other.toml").write_text(PATCH)
    run = opspatch("check", "other", cwd=tmp_path)
    assert run.code == 2
    assert "does not match the file name 'other.toml'" in run.stdout + run.stderr
