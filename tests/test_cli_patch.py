"""The patch commands on local files, run as the real console script."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.clirunner import opspatch

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "opspatch" / "sandbox" / "engine_src"
EAGLE = "sglang/srt/speculative/eagle_worker_v2.py"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    """A site-packages holding the stand-in engine and a dist-info saying 0.5.23."""
    from opspatch.sandbox.install import install_standin

    site = tmp_path / "site-packages"
    site.mkdir()
    install_standin(site)
    return site


@pytest.fixture()
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "patches").mkdir(parents=True)
    return ws


def test_schema_prints_json_schema() -> None:
    run = opspatch("schema")
    assert run.code == 0
    assert run.json()["title"] == "opspatch patch file"


def test_check_bundled_patches_from_any_directory(tmp_path: Path) -> None:
    run = opspatch("check", "--json", cwd=tmp_path)
    assert run.code == 0, run.stderr
    ids = {p["patch"] for p in run.json()["patches"]}
    assert {"eagle-init-guard", "scheduler-report-partial-init"} <= ids


def test_check_reports_bad_patch_with_file_line_field(workspace: Path) -> None:
    bad = workspace / "patches" / "broken.toml"
    text = (
        (REPO / "patches" / "eagle-init-guard.toml")
        .read_text()
        .replace('id = "eagle-init-guard"', 'id = "broken"')
        .replace('position = "start"\ncomment = "set', 'position = "middle"\ncomment = "set')
    )
    bad.write_text(text)
    line = text.splitlines().index('position = "middle"') + 1
    run = opspatch("check", "broken", cwd=workspace)
    assert run.code == 2
    assert f"broken.toml:{line}: edits[1].position" in run.stderr  # errors go to stderr


def test_plan_shows_diff_and_changes_nothing(site: Path) -> None:
    target = site / EAGLE
    before = sha(target)
    run = opspatch("plan", "eagle-init-guard", "--file", str(target))
    assert run.code == 0, run.stderr
    assert "+    spec_disable_batch_threshold: int = 0" in run.stdout
    assert "+        self.spec_disable_batch_threshold = 0" in run.stdout
    assert sha(target) == before
    doc = opspatch("plan", "eagle-init-guard", "--file", str(target), "--json").json()
    assert doc["outcome"] == "applicable"
    assert doc["version"] == "0.5.23"
    assert doc["sha256_before"] == before


def test_plan_refuses_a_file_that_is_not_the_target_module(site: Path, tmp_path: Path) -> None:
    other = tmp_path / "copy.py"
    shutil.copy(site / EAGLE, other)
    run = opspatch("plan", "eagle-init-guard", "--file", str(other))
    assert run.code == 2
    assert "eagle-init-guard.toml:" in run.stderr
    assert "target.module" in run.stderr
    assert "is not sglang.srt.speculative.eagle_worker_v2" in run.stderr


def test_plan_refuses_a_version_outside_the_range(site: Path) -> None:
    run = opspatch(
        "plan",
        "scheduler-report-partial-init",
        "--file",
        str(site / "sglang/srt/managers/scheduler.py"),
        "--target-version",
        "0.5.22",
    )
    assert run.code == 2
    assert "target.versions" in run.stderr and "0.5.22 is outside" in run.stderr


def test_plan_anchor_miss_names_patch_line_and_nearest(site: Path, workspace: Path) -> None:
    text = (
        (REPO / "patches" / "eagle-init-guard.toml")
        .read_text()
        .replace(
            'scope = "EAGLEWorkerV2.__init__"\nposition',
            'scope = "EAGLEWorkerV2.__int__"\nposition',
        )
    )
    (workspace / "patches" / "eagle-init-guard.toml").write_text(text)
    line = text.splitlines().index('scope = "EAGLEWorkerV2.__int__"') + 1
    run = opspatch("plan", "eagle-init-guard", "--file", str(site / EAGLE), cwd=workspace)
    assert run.code == 2
    assert f"eagle-init-guard.toml:{line}: edits[1].scope" in run.stderr
    assert "EAGLEWorkerV2.__init__" in run.stderr  # the nearest candidate


def test_unknown_patch_suggests_near_names(tmp_path: Path) -> None:
    run = opspatch("plan", "eagle-init-gaurd", "--file", "x.py", cwd=tmp_path)
    assert run.code == 2
    assert "did you mean eagle-init-guard" in run.stderr


# ---------------------------------------------------------------------------------------------
# apply / rollback on a local file (the same host agent and ledger as a fleet)


def test_apply_file_then_rollback_is_byte_identical_and_recorded(
    site: Path, tmp_path: Path
) -> None:
    target = site / EAGLE
    target.chmod(0o640)
    before = target.read_bytes()
    env = {"OPSPATCH_STATE_DIR": str(tmp_path / "state")}

    dry = opspatch("apply", "eagle-init-guard", "--file", str(target), "--dry-run", env=env)
    assert dry.code == 0 and target.read_bytes() == before

    refused = opspatch("apply", "eagle-init-guard", "--file", str(target), env=env)
    assert refused.code == 2 and "--yes" in refused.stderr
    assert target.read_bytes() == before

    run = opspatch("apply", "eagle-init-guard", "--file", str(target), "--yes", "--json", env=env)
    assert run.code == 0, run.stdout + run.stderr
    host = run.json()["hosts"][0]
    assert host["outcome"] == "applied"
    assert b"self.spec_disable_batch_threshold = 0" in target.read_bytes()
    assert target.stat().st_mode & 0o777 == 0o640
    assert host["file"]["sha256_before"] == hashlib.sha256(before).hexdigest()

    again = opspatch("apply", "eagle-init-guard", "--file", str(target), "--yes", "--json", env=env)
    assert again.code == 0 and again.json()["hosts"][0]["outcome"] == "already-applied"

    back = opspatch(
        "rollback", "eagle-init-guard", "--file", str(target), "--yes", "--json", env=env
    )
    assert back.code == 0, back.stdout + back.stderr
    assert back.json()["hosts"][0]["outcome"] == "restored"
    assert target.read_bytes() == before
    assert target.stat().st_mode & 0o777 == 0o640

    runs = opspatch("ledger", "list", "--json", env=env).json()["runs"]
    assert [r["command"] for r in runs][:2] == ["rollback", "apply"]
    assert opspatch("ledger", "verify", env=env).code == 0


def test_a_ledger_is_created_only_by_a_command_that_records_and_that_says_so(
    site: Path, tmp_path: Path
) -> None:
    """Its first use creates the ledger, saying where; a ledger deleted between two commands is
    never replaced by an empty one without a word."""
    target = site / EAGLE
    ledger = tmp_path / "state" / "ledger.sqlite3"
    env = {"OPSPATCH_LEDGER": str(ledger)}
    created = f"there was no ledger at {ledger}: created a new, empty one (its first use)"
    first = opspatch("apply", "eagle-init-guard", "--file", str(target), "--yes", env=env)
    assert first.code == 0, first.stdout + first.stderr
    assert created in first.stderr and ledger.exists()
    back = opspatch("rollback", "eagle-init-guard", "--file", str(target), "--yes", env=env)
    assert back.code == 0, back.stdout + back.stderr
    assert "created a new" not in back.stderr
    for suffix in ("", "-wal", "-shm"):
        Path(f"{ledger}{suffix}").unlink(missing_ok=True)
    again = opspatch("apply", "eagle-init-guard", "--file", str(target), "--yes", env=env)
    assert again.code == 0, again.stdout + again.stderr
    assert created in again.stderr
    assert "If a ledger was expected there, it was moved or deleted" in again.stderr


def test_rollback_file_without_a_record_is_refused(site: Path, tmp_path: Path) -> None:
    target = site / EAGLE
    before = target.read_bytes()
    run = opspatch(
        "rollback",
        "eagle-init-guard",
        "--file",
        str(target),
        "--yes",
        env={"OPSPATCH_STATE_DIR": str(tmp_path / "state")},
    )
    assert run.code == 2
    assert "the ledger has no change" in run.stderr
    assert target.read_bytes() == before


def test_apply_file_plans_the_file_once(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan shown before asking is the plan applied: the pipeline does not plan again."""
    from opspatch.config.patches import load_patch
    from opspatch.core import edit
    from opspatch.ledger.store import Ledger
    from opspatch.runs.commands import local_files as localfile
    from opspatch.runs.fleet import pipeline

    planned: list[bytes] = []

    def counting(source: bytes, patch: object, **kwargs: object) -> edit.PlanOutcome:
        planned.append(source)
        return edit.apply_patch(source, patch, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(localfile, "apply_patch", counting)
    monkeypatch.setattr(pipeline, "apply_patch", counting)
    loaded = load_patch(
        Path(__file__).resolve().parent.parent / "patches" / "eagle-init-guard.toml"
    )
    target = site / EAGLE
    before = target.read_bytes()
    plan = localfile.plan_local_file(loaded, target, None)
    ledger = Ledger.open(tmp_path / "ledger.sqlite3")
    try:
        report = localfile.apply_local_file(
            loaded,
            plan,
            python=shutil.which("python3") or "python3",
            ledger=ledger,
            state_dir=tmp_path / "state",
        )
    finally:
        ledger.close()
    assert [h.outcome for h in report.hosts] == ["applied"]
    assert planned == [before] and target.read_bytes() != before


def _held_python(folder: Path) -> Path:
    """An interpreter for `--python` that holds its run at the agent's second request (after
    `begin` took the lock, before the swap) until `folder/release` exists, saying so in
    `folder/held`. It counts the request lines its stdin passes on, across processes, so it
    holds the same request whether each request is a process of its own or a line to one
    resident agent."""
    folder.mkdir()
    wrapper = folder / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'd="{folder}"\n'
        'while IFS= read -r line || [ -n "$line" ]; do\n'
        '  n=$(cat "$d/lines" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$d/lines"\n'
        '  if [ "$n" -eq 2 ]; then\n'
        '    touch "$d/held"\n'
        '    while [ ! -e "$d/release" ]; do sleep 0.05; done\n'
        "  fi\n"
        "  printf '%s\\n' \"$line\"\n"
        f'done | "{shutil.which("python3")}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def test_apply_file_runs_on_two_files_of_one_machine_do_not_hold_each_other_off(
    site: Path, workspace: Path, tmp_path: Path
) -> None:
    """Issue 31, item 18: while one `apply --file` holds its lock (held between its begin and
    its swap), an apply to another file of the same machine goes ahead; one to the same file is
    refused naming the holder, changing nothing. Before, the second file's run was refused too
    ("locked by ... until" 30 minutes later): the lock was the machine's, not the file's."""
    import subprocess
    import sys
    import time

    eagle, scheduler = site / EAGLE, site / "sglang/srt/managers/scheduler.py"
    eagle_before, scheduler_before = eagle.read_bytes(), scheduler.read_bytes()
    (workspace / "patches" / "scheduler-mark.toml").write_text(
        'id = "scheduler-mark"\nsummary = "mark"\nrationale = "test"\n'
        '[target]\nmodule = "sglang.srt.managers.scheduler"\n'
        '[[edits]]\nkind = "insert"\nscope = "<module>"\nposition = "end"\n'
        'code = "SCHEDULER_MARK = 1"\n'
    )
    env = {"OPSPATCH_STATE_DIR": str(tmp_path / "state")}
    hold = tmp_path / "hold"
    held_python = _held_python(hold)
    first = subprocess.Popen(
        [sys.executable, "-m", "opspatch.cli", "apply", "eagle-init-guard", "--file", str(eagle),
         "--python", str(held_python), "--yes", "--json"],
        cwd=workspace, env={**os.environ, **env}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300  # only how long the first run may take to get there
        while not (hold / "held").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first run never reached its swap"
            time.sleep(0.05)

        other = opspatch("apply", "scheduler-mark", "--file", str(scheduler), "--yes", "--json",
                         cwd=workspace, env=env)  # fmt: skip
        assert other.code == 0, other.stdout + other.stderr
        assert [h["outcome"] for h in other.json()["hosts"]] == ["applied"], other.stdout
        assert scheduler.read_bytes().endswith(b"SCHEDULER_MARK = 1\n")

        same = opspatch("apply", "eagle-init-guard", "--file", str(eagle), "--yes", "--json",
                        cwd=workspace, env=env)  # fmt: skip
        assert same.code == 2, same.stdout + same.stderr
        assert [h["reason"] for h in same.json()["hosts"]] == ["lease-held"], same.stdout
        assert eagle.read_bytes() == eagle_before
    finally:
        (hold / "release").touch()
        out, errors = first.communicate(timeout=300)
    assert first.returncode == 0, out + errors
    assert [h["outcome"] for h in json.loads(out)["hosts"]] == ["applied"], out
    assert eagle.read_bytes() != eagle_before

    back = opspatch("rollback", "scheduler-mark", "--file", str(scheduler), "--yes", "--json",
                    cwd=workspace, env=env)  # fmt: skip
    assert back.code == 0, back.stdout + back.stderr
    assert scheduler.read_bytes() == scheduler_before


# ---------------------------------------------------------------------------------------------
# which recorded change the live file is at: stacked patches, a patch applied twice


def _module_end_patch(patch_id: str, line: str) -> str:
    """A patch that appends `line` to eagle_worker_v2 (each `line` a different edit)."""
    return (
        f'id = "{patch_id}"\nsummary = "append {line}"\nrationale = "test"\n'
        '[target]\nmodule = "sglang.srt.speculative.eagle_worker_v2"\nversions = ">=0.5.4"\n'
        f'[[edits]]\nkind = "insert"\nscope = "<module>"\nposition = "end"\ncode = "{line}"\n'
    )


def _apply_file(patch_id: str, target: Path, workspace: Path, env: dict[str, str]) -> str:
    run = opspatch("apply", patch_id, "--file", str(target), "--yes", "--json",
                   cwd=workspace, env=env)  # fmt: skip
    assert run.code == 0, run.stdout + run.stderr
    assert run.json()["hosts"][0]["outcome"] == "applied"
    return str(run.json()["run_id"])


def _rollback_file(*args: str, target: Path, workspace: Path, env: dict[str, str]) -> dict:  # type: ignore[type-arg]
    run = opspatch("rollback", *args, "--file", str(target), "--yes", "--json",
                   cwd=workspace, env=env)  # fmt: skip
    doc = run.json()
    doc["exit"] = run.code
    return doc  # type: ignore[no-any-return]


def test_stacked_patches_roll_back_newest_first_to_the_pristine_bytes(
    site: Path, workspace: Path, tmp_path: Path
) -> None:
    """Patch B applied on top of patch A on one file: rolling A back first is refused, naming
    B's run (opspatch made that change itself, nothing drifted); B then A gives the pristine
    bytes back."""
    target = site / EAGLE
    pristine = target.read_bytes()
    env = {"OPSPATCH_STATE_DIR": str(tmp_path / "state")}
    (workspace / "patches" / "stack-a.toml").write_text(_module_end_patch("stack-a", "STACK_A = 1"))
    (workspace / "patches" / "stack-b.toml").write_text(_module_end_patch("stack-b", "STACK_B = 2"))
    _apply_file("stack-a", target, workspace, env)
    with_a = target.read_bytes()
    run_b = _apply_file("stack-b", target, workspace, env)
    with_both = target.read_bytes()

    first_a = _rollback_file("stack-a", target=target, workspace=workspace, env=env)
    assert first_a["exit"] == 2, first_a
    (host,) = first_a["hosts"]
    assert (host["outcome"], host["reason"]) == ("skipped", "patched-further"), host
    assert f"by run {run_b} (stack-b): roll stack-b back first" in host["error"]  # what to do
    assert target.read_bytes() == with_both

    b = _rollback_file("stack-b", target=target, workspace=workspace, env=env)
    assert (b["exit"], b["hosts"][0]["outcome"]) == (0, "restored"), b
    assert target.read_bytes() == with_a
    a = _rollback_file("stack-a", target=target, workspace=workspace, env=env)
    assert (a["exit"], a["hosts"][0]["outcome"]) == (0, "restored"), a
    assert target.read_bytes() == pristine


def test_a_patch_applied_twice_rolls_back_through_every_recorded_version(
    site: Path, workspace: Path, tmp_path: Path
) -> None:
    """Two runs of one patch, the second on the first's post-image (the patch file changed in
    between): rollback restores wherever the live file is a recorded post-image, so two
    rollbacks give the pristine bytes and only the third says there is nothing to restore.
    `rollback --run R --file F` undoes one run, and names the run on top of it first."""
    target = site / EAGLE
    pristine = target.read_bytes()
    env = {"OPSPATCH_STATE_DIR": str(tmp_path / "state")}
    patch_file = workspace / "patches" / "twice.toml"
    patch_file.write_text(_module_end_patch("twice", "TWICE = 1"))
    run_1 = _apply_file("twice", target, workspace, env)
    once = target.read_bytes()
    patch_file.write_text(_module_end_patch("twice", "TWICE_AGAIN = 2"))
    _apply_file("twice", target, workspace, env)
    twice = target.read_bytes()

    under = _rollback_file("--run", run_1, target=target, workspace=workspace, env=env)
    assert under["exit"] == 2, under
    assert under["hosts"][0]["reason"] == "patched-further", under
    assert target.read_bytes() == twice

    back = _rollback_file("twice", target=target, workspace=workspace, env=env)
    assert (back["exit"], back["hosts"][0]["outcome"]) == (0, "restored"), back
    assert target.read_bytes() == once
    back = _rollback_file("twice", target=target, workspace=workspace, env=env)
    assert (back["exit"], back["hosts"][0]["outcome"]) == (0, "restored"), back
    assert target.read_bytes() == pristine
    done = _rollback_file("twice", target=target, workspace=workspace, env=env)
    assert (done["exit"], done["hosts"][0]["outcome"]) == (0, "skipped"), done
    assert done["hosts"][0]["reason"] == "nothing-to-do", done
    assert target.read_bytes() == pristine

    # the same walk by run: run 2 first, then run 1
    _apply_file("twice", target, workspace, env)  # TWICE_AGAIN = 2 onto the pristine file
    patch_file.write_text(_module_end_patch("twice", "TWICE = 1"))
    top = _apply_file("twice", target, workspace, env)
    by_run = _rollback_file("--run", top, target=target, workspace=workspace, env=env)
    assert (by_run["exit"], by_run["hosts"][0]["outcome"]) == (0, "restored"), by_run
    assert b"TWICE_AGAIN = 2" in target.read_bytes() and b"TWICE = 1" not in target.read_bytes()
