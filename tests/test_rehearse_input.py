"""`opspatch rehearse`: bad input is one message and exit 2, with nothing started (no folder of
the rehearsal made, no server, no state): a release the sandbox does not run, a patch for
another distribution or for a module the release lacks, a release outside the patch's range, a
patch that does not fit the released file, an index that cannot be reached for the wheel. A
patch the release already carries is exit 0, with nothing started either.

The release's wheel is read from the real engine's cache (tests/realkit.py; `.ci/run` fills it);
the tests that need it skip, naming the command that caches it, where it is missing."""

from __future__ import annotations

import difflib
import zipfile
from pathlib import Path

import pytest

from opspatch.sandbox.real.release import DEFAULT_REAL_RELEASE
from tests.clirunner import Run, opspatch
from tests.realkit import ENGINE_CACHE

pytestmark = pytest.mark.process

EAGLE = "sglang.srt.speculative.eagle_worker_v2"


def _patch(folder: Path, name: str, target: str, edit_scope: str = "<module>") -> None:
    (folder / "patches").mkdir(parents=True, exist_ok=True)
    (folder / "patches" / f"{name}.toml").write_text(
        f'id = "{name}"\nsummary = "a test patch"\nrationale = "a test"\n'
        f"[target]\n{target}\n"
        f'[[edits]]\nkind = "insert"\nscope = "{edit_scope}"\nposition = "end"\ncode = "X = 1"\n'
    )


@pytest.fixture(scope="module")
def cached_wheel() -> Path:
    found = sorted((ENGINE_CACHE / "wheels").glob(f"sglang-{DEFAULT_REAL_RELEASE}-*.whl"))
    if not found:  # no test downloads a wheel
        pytest.skip(
            f"sglang {DEFAULT_REAL_RELEASE}'s wheel is not in {ENGINE_CACHE}: "
            "`opspatch sandbox prepare --engine sglang` (with OPSPATCH_ENGINE_CACHE) caches it"
        )
    return found[0]


def _rehearse(tmp_path: Path, *args: str, env: dict[str, str] | None = None, code: int = 2) -> Run:
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    run = opspatch(
        "rehearse",
        *args,
        cwd=tmp_path,
        env={
            "OPSPATCH_STATE_DIR": str(tmp_path / "state"),
            "OPSPATCH_ENGINE_CACHE": str(ENGINE_CACHE),
            "TMPDIR": str(scratch),
            **(env or {}),
        },
    )
    assert run.code == code, run.stdout + run.stderr
    assert list(scratch.iterdir()) == [], "a rehearsal folder was made"
    assert not (tmp_path / "state").exists(), "state was written"
    assert run.stderr.count("error: ") == (1 if code == 2 else 0), run.stderr
    return run


def test_a_release_the_sandbox_does_not_run_is_refused_naming_the_ones_it_does(
    tmp_path: Path,
) -> None:
    _patch(tmp_path, "good", f'module = "{EAGLE}"')
    run = _rehearse(tmp_path, "good", "--release", "0.5.22")
    assert "--release 0.5.22: the sandbox runs real SGLang 0.5.23 only, not 0.5.22" in run.stderr
    assert "hint: use --release 0.5.23" in run.stderr


def test_a_patch_for_another_distribution_is_refused(tmp_path: Path) -> None:
    _patch(tmp_path, "other", 'module = "vllm.engine.llm_engine"\ndistribution = "vllm"')
    run = _rehearse(tmp_path, "other", "--json")
    message = run.json()["error"]["message"]
    assert message.startswith("other: targets vllm.engine.llm_engine of the distribution 'vllm'")
    assert "nothing was started" in message


def test_a_module_the_release_does_not_ship_is_refused(tmp_path: Path, cached_wheel: Path) -> None:
    _patch(tmp_path, "gone", 'module = "sglang.srt.speculative.eagle_worker_v9"')
    run = _rehearse(tmp_path, "gone")
    assert (
        "gone: sglang 0.5.23 has no module sglang.srt.speculative.eagle_worker_v9 "
        f"(no sglang/srt/speculative/eagle_worker_v9.py in {cached_wheel.name})"
    ) in run.stderr


def test_a_release_outside_the_patch_range_is_refused(tmp_path: Path, cached_wheel: Path) -> None:
    _patch(tmp_path, "later", f'module = "{EAGLE}"\nversions = ">=0.6"')
    run = _rehearse(tmp_path, "later")
    assert "later: sglang 0.5.23 is outside the versions this patch is for (>=0.6)" in run.stderr


def test_a_patch_that_does_not_fit_the_released_file_is_refused(
    tmp_path: Path, cached_wheel: Path
) -> None:
    _patch(tmp_path, "misfit", f'module = "{EAGLE}"', edit_scope="EAGLEWorkerV9")
    run = _rehearse(tmp_path, "misfit")
    assert (
        "misfit: does not fit sglang 0.5.23's sglang/srt/speculative/eagle_worker_v2.py: "
        "scope `EAGLEWorkerV9` is not defined in this file"
    ) in run.stderr


def test_an_index_that_cannot_be_reached_for_an_uncached_release_is_one_message(
    tmp_path: Path,
) -> None:
    _patch(tmp_path, "good", f'module = "{EAGLE}"')
    unreachable = {
        "OPSPATCH_ENGINE_CACHE": str(tmp_path / "empty-cache"),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_RETRIES": "0",
    }
    run = _rehearse(tmp_path, "good", env=unreachable)
    assert "cannot reach the package index http://127.0.0.1:9/simple" in run.stderr


def test_a_patch_the_release_already_carries_is_passed_with_nothing_started(
    tmp_path: Path, cached_wheel: Path
) -> None:
    relpath = EAGLE.replace(".", "/") + ".py"
    with zipfile.ZipFile(cached_wheel) as archive:
        released = archive.read(relpath).decode()
    line = "            finalize_tree_path=True,\n"
    assert released.count(line) == 1
    diff = "".join(
        difflib.unified_diff(
            released.replace(line, "").splitlines(keepends=True),
            released.splitlines(keepends=True),
            f"a/{relpath}",
            f"b/{relpath}",
        )
    )
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "carried.toml").write_text(
        'id = "carried"\nsummary = "a test patch"\nrationale = "a test"\n'
        f'[target]\nmodule = "{EAGLE}"\n'
        f"[[edits]]\nkind = \"diff\"\ndiff = '''\n{diff}'''\n"
    )
    table = _rehearse(tmp_path, "carried", code=0).stdout
    assert "rehearsal of carried on real sglang==0.5.23 (this CPU): ok" in table, table
    assert "the release already carries the change" in table, table
    run = _rehearse(tmp_path, "carried", "--json", code=0)
    report = run.json()
    assert (report["outcome"], report["failed_stage"]) == ("ok", None)
    assert report["stages"] == [
        {
            "stage": "install",
            "status": "passed",
            "detail": "the release already carries the change: nothing to rehearse",
            "seconds": None,
        }
    ]
