"""The incident-response commands that read code, through the real console script: lint-init
writes a guard patch that check accepts and that applies; export gives a diff git applies and a
mail git am applies; check --releases gives the portability matrix."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.clirunner import opspatch
from tests.sglang_wheels import EAGLE_RELPATH, WheelUnavailable, seed_release_cache, sglang_site

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parent.parent
STANDIN_PACKAGE = REPO / "opspatch" / "sandbox" / "engine_src" / "sglang"


@pytest.fixture()
def standin_copy(tmp_path: Path) -> Path:
    """The stand-in engine's package, copied (lint-init reads the sibling files too)."""
    shutil.copytree(STANDIN_PACKAGE, tmp_path / "src" / "sglang")
    return tmp_path / "src" / "sglang" / "srt" / "speculative" / "eagle_worker_v2.py"


def test_lint_init_finds_the_incident_and_writes_a_guard_that_check_accepts_and_applies(
    standin_copy: Path, tmp_path: Path
) -> None:
    guard = tmp_path / "ws" / "patches" / "init-guard.toml"
    guard.parent.mkdir(parents=True)
    run = opspatch("lint-init", "--file", str(standin_copy), "--class", "EAGLEWorkerV2",
                   "--write-patch", str(guard), cwd=tmp_path)  # fmt: skip
    assert run.code == 1, run.stdout + run.stderr  # hazards found: a linter's exit 1
    assert "spec_disable_batch_threshold [late, skipped]" in run.stdout
    assert "StandaloneWorkerV2" in run.stdout  # the subclass that skips __init__, in a sibling file
    assert guard.is_file()
    checked = opspatch("check", str(guard), cwd=tmp_path / "ws")
    assert checked.code == 0, checked.stdout + checked.stderr
    planned = opspatch(
        "plan", str(guard), "--file", str(standin_copy), "--target-version", "0.5.23", cwd=tmp_path
    )
    assert planned.code == 0, planned.stdout + planned.stderr
    assert "+    spec_disable_batch_threshold" in planned.stdout


def test_lint_init_exits_0_on_a_clean_file_and_1_on_hazards(tmp_path: Path) -> None:
    clean = tmp_path / "clean.py"
    clean.write_text(
        "class Worker:\n    def __init__(self):\n        self.x = 0\n\n    def f(self):\n        return self.x\n"
    )
    assert opspatch("lint-init", "--file", str(clean)).code == 0
    late = tmp_path / "late.py"
    late.write_text(
        "class Worker:\n    def __init__(self):\n        self.setup()\n        self.x = 0\n\n    def f(self):\n        return self.x\n"
    )
    found = opspatch("lint-init", "--file", str(late), "--json")
    assert found.code == 1, found.stdout + found.stderr
    assert found.json()["classes"][0]["hazards"]


def test_lint_init_on_a_missing_class_is_one_message_exit_2(standin_copy: Path) -> None:
    run = opspatch("lint-init", "--file", str(standin_copy), "--class", "NoSuchWorker")
    assert run.code == 2
    assert "NoSuchWorker" in run.stderr and "Traceback" not in run.stderr


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)


def _release_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A git repository laid out as upstream SGLang (python/sglang/...) holding 0.5.23's file."""
    try:
        pristine = sglang_site("0.5.23") / EAGLE_RELPATH
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang 0.5.23 wheel not available (offline?): {exc}")
    repo = tmp_path / "sglang-upstream"
    target = repo / "python" / EAGLE_RELPATH
    target.parent.mkdir(parents=True)
    shutil.copy(pristine, target)
    for args in (("init", "-q"), ("add", "."), ("-c", "user.name=t", "-c", "user.email=t@e",
                 "commit", "-qm", "0.5.23")):  # fmt: skip
        assert _git(*args, cwd=repo).returncode == 0
    return repo, pristine


def test_export_diff_applies_with_git_and_the_mail_with_git_am(tmp_path: Path) -> None:
    repo, pristine = _release_repo(tmp_path)
    diff = opspatch("export", "eagle-init-guard", "--file", str(pristine), "--prefix", "python/")
    assert diff.code == 0, diff.stderr
    (tmp_path / "change.diff").write_text(diff.stdout)
    checked = _git("apply", "--check", str(tmp_path / "change.diff"), cwd=repo)
    assert checked.returncode == 0, checked.stderr
    mail = opspatch("export", "eagle-init-guard", "--file", str(pristine), "--prefix", "python/",
                    "--format", "git", "--author", "Ops Team <ops@example.com>")  # fmt: skip
    assert mail.code == 0, mail.stderr
    (tmp_path / "change.mbox").write_text(mail.stdout)
    applied = _git("-c", "user.name=t", "-c", "user.email=t@e", "am", str(tmp_path / "change.mbox"),
                   cwd=repo)  # fmt: skip
    assert applied.returncode == 0, applied.stdout + applied.stderr
    subject = _git("log", "-1", "--format=%s%n%an <%ae>", cwd=repo).stdout
    assert "spec_disable_batch_threshold" in subject and "Ops Team <ops@example.com>" in subject


def test_check_releases_offline_from_the_cache(tmp_path: Path) -> None:
    try:
        cache = seed_release_cache(tmp_path / "cache")
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang wheels not available (offline?): {exc}")
    env = {"OPSPATCH_CACHE": str(cache)}
    run = opspatch("check", "--releases", "eagle-init-guard", "--offline", "--json", env=env)
    assert run.code == 0, run.stdout + run.stderr
    (matrix,) = run.json()["matrices"]
    checked = {r["version"] for r in matrix["results"]}
    assert {"0.5.4", "0.5.10", "0.5.23"} <= checked
    narrowed = opspatch("check", "eagle-init-guard", "--releases", ">=0.5.10", "--offline",
                        "--json", env=env)  # fmt: skip
    assert narrowed.code == 0, narrowed.stdout + narrowed.stderr
    (only,) = narrowed.json()["matrices"]
    assert {r["version"] for r in only["results"]} == {"0.5.10", "0.5.23"}
