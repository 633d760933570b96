"""`opspatch rehearse` on real SGLang 0.5.23: a patch `check` cannot fault, caught at the start.

The patch reads a server argument 0.5.23 does not have (`ServerArgs` grew grouped settings) in
`Scheduler.__init__`: it fits the released file, compiles and imports, so only a real start
finds it. One rehearsal, the cheapest that runs every effect: the release's host made, the
import probe passed, the unpatched server started and measured, the swap, a real start that
fails on the patch (named from the real log), the apply's rollback, and the teardown (no process
left, the folder removed, the operator's state untouched). Three real starts: a few minutes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from opspatch.hosts.agent.processes import alive
from tests.clirunner import opspatch
from tests.realkit import ENGINE_CACHE, real_engine

# three real starts (baseline, the patched one that fails, the restore's) on a loaded machine
pytestmark = [pytest.mark.sglang, pytest.mark.timeout(1500)]

SETTING = "speculative_disable_batch_threshold"
PATCH = f"""
id = "scheduler-spec-threshold"
summary = "Read the dynamic speculation threshold in the scheduler"
rationale = "written against a release whose ServerArgs had the setting"
[target]
module = "sglang.srt.managers.scheduler"
distribution = "sglang"
versions = ">=0.5.4"
[[edits]]
kind = "insert"
scope = "Scheduler.__init__"
position = "start"
code = "self.spec_disable_batch_threshold = server_args.{SETTING}"
"""
ERROR = f"AttributeError: 'ServerArgs' object has no attribute '{SETTING}'"


def _working_in(folder: Path) -> list[int]:
    inside = str(folder.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd.startswith(inside):
                found.append(int(entry.name))
    return found


def test_a_patch_that_fits_and_imports_but_fails_the_real_start_is_caught_and_torn_down(
    tmp_path: Path,
) -> None:
    real_engine()  # skips, with the reason, where the index cannot be reached to build it
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "scheduler-spec-threshold.toml").write_text(PATCH)
    # the servers' sockets go to the rehearsal's folder in $TMPDIR: a short one (a socket's
    # path holds 107 characters; tmp_path is longer than the rehearsal can take)
    scratch = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))
    try:
        _rehearse_and_check(tmp_path, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _rehearse_and_check(tmp_path: Path, scratch: Path) -> None:
    run = opspatch(
        "rehearse",
        "scheduler-spec-threshold",
        "--json",
        cwd=tmp_path,
        env={
            "OPSPATCH_STATE_DIR": str(tmp_path / "state"),
            "OPSPATCH_ENGINE_CACHE": str(ENGINE_CACHE),
            "TMPDIR": str(scratch),
        },
        timeout=1400,
    )
    assert run.code == 1, run.stdout + run.stderr
    report = run.json()
    stages = {s["stage"]: s for s in report["stages"]}
    assert (report["outcome"], report["failed_stage"]) == ("failed", "start")
    assert {name: s["status"] for name, s in stages.items()} == {
        "release": "passed",
        "import": "passed",
        "baseline": "passed",
        "install": "passed",
        "start": "failed",
        "first-decode": "not-reached",
        "judge": "not-reached",
    }, report["stages"]
    assert "exited before it was ready" in stages["start"]["detail"], stages["start"]
    assert ERROR in stages["start"]["detail"], stages["start"]
    assert report["host"]["outcome"] == "rolled-back", report["host"]
    restored = [s["step"] for s in report["host"]["steps"] if s["status"] == "ok"]
    assert "smoke-after-restore" in restored, report["host"]["steps"]

    teardown = report["teardown"]
    assert teardown["removed"] and not Path(teardown["folder"]).exists(), teardown
    assert Path(teardown["folder"]).parent == scratch
    assert teardown["stopped"], "the restored server was stopped"
    assert not [pid for pid in teardown["stopped"] if alive(pid)]
    assert _working_in(scratch) == [], "a process of the rehearsal is left"
    assert list(scratch.iterdir()) == [] and not (tmp_path / "state").exists()
    assert "rehearsing scheduler-spec-threshold on sglang 0.5.23" in run.stderr
    # the release's environment is found (or built) once, and said once: `up` is handed it
    assert run.stderr.count("real SGLang 0.5.23: its environment and models") == 1, run.stderr
