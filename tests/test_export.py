"""export: a patch as an upstreamable diff and a `git format-patch` mail, checked with real git.

The pristine file is a real SGLang release's (downloaded as the patch engine tests do; skipped with
the reason when offline) laid out in a temporary git repository the way upstream lays it out
(`python/sglang/...`), or the stand-in's file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from opspatch.analysis.export import export_diff, git_blob_sha1, normalize_prefix, render_mail
from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch
from opspatch.core.spec import PatchSpec
from opspatch.errors import InputError, TargetError
from tests.patchkit import make_patch
from tests.sglang_wheels import EAGLE_RELPATH, WheelUnavailable, sglang_site

REPO = Path(__file__).resolve().parent.parent
STANDIN_EAGLE = REPO / "opspatch/sandbox/engine_src" / EAGLE_RELPATH
DATE = datetime(2026, 12, 1, 9, 30, tzinfo=timezone(timedelta(hours=1)))
AUTHOR = "Fleet Ops <ops@example.com>"

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed"),
]


def _git(repo: Path, *args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Upstream",
        "GIT_AUTHOR_EMAIL": "upstream@example.com",
        "GIT_COMMITTER_NAME": "Maintainer",
        "GIT_COMMITTER_EMAIL": "maintainer@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        input=input_text,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def _repo_with(tmp_path: Path, relpath: str, content: bytes) -> Path:
    repo = tmp_path / "upstream"
    (repo / relpath).parent.mkdir(parents=True)
    (repo / relpath).write_bytes(content)
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "release")):
        result = _git(repo, *args)
        assert result.returncode == 0, result.stderr
    return repo


@pytest.fixture(scope="module")
def guard() -> PatchSpec:
    return load_patch(REPO / "patches" / "eagle-init-guard.toml").spec


@pytest.fixture(scope="module")
def pristine_0_5_23() -> bytes:
    try:
        return (sglang_site("0.5.23") / EAGLE_RELPATH).read_bytes()
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang 0.5.23 wheel not available (offline?): {exc}")


def test_diff_applies_to_the_real_release_in_upstreams_layout(
    tmp_path: Path, guard: PatchSpec, pristine_0_5_23: bytes
) -> None:
    change = export_diff(guard, pristine_0_5_23, prefix="python/")
    assert change.path == "python/" + EAGLE_RELPATH
    assert change.diff.startswith(f"diff --git a/python/{EAGLE_RELPATH} b/python/{EAGLE_RELPATH}\n")
    assert f"--- a/python/{EAGLE_RELPATH}\n+++ b/python/{EAGLE_RELPATH}\n" in change.diff
    # the class-level default (2 marker lines, the line, its blank line) and the early assignment
    assert (change.insertions, change.deletions) == (6, 0)
    repo = _repo_with(tmp_path, "python/" + EAGLE_RELPATH, pristine_0_5_23)
    (tmp_path / "change.diff").write_text(change.diff)
    check = _git(repo, "apply", "--check", str(tmp_path / "change.diff"))
    assert check.returncode == 0, check.stderr
    assert _git(repo, "apply", str(tmp_path / "change.diff")).returncode == 0
    assert (repo / "python" / EAGLE_RELPATH).read_bytes() == change.new_source
    # the index line names the real blobs: git agrees
    assert _git(repo, "hash-object", f"python/{EAGLE_RELPATH}").stdout.strip() == git_blob_sha1(
        change.new_source
    )


def test_diff_without_prefix_is_relative_to_the_package_root(
    tmp_path: Path, guard: PatchSpec, pristine_0_5_23: bytes
) -> None:
    change = export_diff(guard, pristine_0_5_23)
    assert change.path == EAGLE_RELPATH
    repo = _repo_with(tmp_path, EAGLE_RELPATH, pristine_0_5_23)
    (tmp_path / "change.diff").write_text(change.diff)
    result = _git(repo, "apply", "--check", str(tmp_path / "change.diff"))
    assert result.returncode == 0, result.stderr


def test_mail_is_applied_by_git_am(
    tmp_path: Path, guard: PatchSpec, pristine_0_5_23: bytes
) -> None:
    change = export_diff(guard, pristine_0_5_23, prefix="python")
    mail = render_mail(change, guard, author=AUTHOR, date=DATE, signoff=AUTHOR)
    assert mail.startswith(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
    )
    assert f"Subject: [PATCH] {guard.summary}\n" in mail
    assert "\n---\n python/sglang/srt/speculative/eagle_worker_v2.py | 6 ++++++\n" in mail
    assert " 1 file changed, 6 insertions(+)\n" in mail
    assert mail.endswith("\n-- \nopspatch\n\n")
    repo = _repo_with(tmp_path, "python/" + EAGLE_RELPATH, pristine_0_5_23)
    (tmp_path / "0001.patch").write_text(mail)
    result = _git(repo, "am", str(tmp_path / "0001.patch"))
    assert result.returncode == 0, result.stderr + result.stdout
    assert (repo / "python" / EAGLE_RELPATH).read_bytes() == change.new_source
    log = _git(repo, "log", "-1", "--format=%an <%ae>%n%aI%n%s%n%b").stdout
    author, when, subject, body = log.split("\n", 3)
    assert author == AUTHOR
    assert when == "2026-12-01T09:30:00+01:00"
    assert subject == guard.summary
    assert body.startswith(guard.rationale.strip().splitlines()[0])
    assert f"Incident: {guard.incident}\n" in body
    assert f"Signed-off-by: {AUTHOR}" in body


def test_standin_export_with_a_non_ascii_summary_and_a_message_breaking_rationale(
    tmp_path: Path, guard: PatchSpec
) -> None:
    patch = guard.model_copy(
        update={
            "summary": "Défaut sûr pour spec_disable_batch_threshold",
            "rationale": "Why:\n---\ndiff -u is not the end of this message\n",
        }
    )
    pristine = STANDIN_EAGLE.read_bytes()
    change = export_diff(patch, pristine, prefix="python/")
    mail = render_mail(change, patch, author="Zoë Ops <zoe@example.com>", date=DATE)
    assert "Content-Type: text/plain; charset=UTF-8" in mail
    repo = _repo_with(tmp_path, "python/" + EAGLE_RELPATH, pristine)
    (tmp_path / "0001.patch").write_text(mail, encoding="utf-8")
    result = _git(repo, "am", str(tmp_path / "0001.patch"))
    assert result.returncode == 0, result.stderr + result.stdout
    log = _git(repo, "log", "-1", "--format=%an%n%s%n%b").stdout
    assert log.startswith(
        "Zoë Ops\nDéfaut sûr pour spec_disable_batch_threshold\nWhy:\n ---\n diff -u"
    )


def test_a_file_without_a_final_newline(tmp_path: Path) -> None:
    patch = make_patch(
        """
        [[edits]]
        kind = "insert"
        scope = "W"
        position = "end"
        code = "y = 2"
        """
    )
    pristine = b"class W:\n    x = 1"
    change = export_diff(patch, pristine)
    assert "\\ No newline at end of file\n" in change.diff
    repo = _repo_with(tmp_path, "pkg/mod.py", pristine)
    (tmp_path / "change.diff").write_text(change.diff)
    result = _git(repo, "apply", str(tmp_path / "change.diff"))
    assert result.returncode == 0, result.stderr
    outcome = apply_patch(pristine, patch)
    assert isinstance(outcome, Applied)
    assert (repo / "pkg/mod.py").read_bytes() == outcome.new_source


def test_refusals_are_one_clear_message(guard: PatchSpec) -> None:
    patched = export_diff(guard, STANDIN_EAGLE.read_bytes()).new_source
    with pytest.raises(TargetError, match="already contains eagle-init-guard"):
        export_diff(guard, patched)
    with pytest.raises(
        TargetError,
        match=r"does not apply to this file: edits\[0\]\.scope: scope `EAGLEWorkerV2` is not",
    ):
        export_diff(guard, b"class Other:\n    pass\n")
    with pytest.raises(InputError, match="relative folder"):
        normalize_prefix("../python")
    change = export_diff(guard, STANDIN_EAGLE.read_bytes())
    with pytest.raises(InputError, match="is not `Name <email>`"):
        render_mail(change, guard, author="nobody", date=DATE)
    with pytest.raises(InputError, match="time zone"):
        render_mail(change, guard, author=AUTHOR, date=datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("given", "expected"),
    [("", ""), ("python", "python/"), ("./python/", "python/"), ("a/b/", "a/b/")],
)
def test_prefix_normalisation(given: str, expected: str) -> None:
    assert normalize_prefix(given) == expected
