"""The fast tier on a fresh machine, whose test cache holds no SGLang wheel (issue 42, item 23):
7 of its tests downloaded wheels with pip and failed the tier guard. The wheels are fetched by
an explicit step (`python3 -m tests.sglang_wheels`, which scripts/test.sh runs first); a test
never starts pip, it skips naming that step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import sglang_wheels
from tests.sglang_wheels import WheelUnavailable

ROOT = Path(__file__).resolve().parent.parent
FAST_TIER = "(pure or scripted) and not slow and not network"
FETCH_STEP = "`python3 -m tests.sglang_wheels` fetches the wheels the tests read"


@pytest.mark.pure
def test_a_wheel_not_in_the_cache_is_unavailable_without_a_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pure: a pip started here would fail this test's tier."""
    monkeypatch.setattr(sglang_wheels, "CACHE", tmp_path / "cold")
    for read in (
        lambda: sglang_wheels.wheel_of("0.5.23"),
        lambda: sglang_wheels.release_file("0.5.23", sglang_wheels.EAGLE_RELPATH),
        lambda: sglang_wheels.sglang_site("0.5.10"),
        lambda: sglang_wheels.seed_release_cache(tmp_path / "releases"),
    ):
        with pytest.raises(WheelUnavailable) as caught:
            read()
        assert FETCH_STEP in str(caught.value)
    assert not list(tmp_path.rglob("*.whl"))


def readers_of_wheels() -> list[str]:
    """The test files that read SGLang wheels (through the cache module or the release cases)."""
    return sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").glob("test_*.py")
        if path.name != Path(__file__).name
        and ("sglang_wheels" in (text := path.read_text()) or "releasecases" in text)
    )


@pytest.mark.process  # pytest itself, on the fast tier's selection
def test_the_fast_tier_on_a_cold_cache_passes_and_fetches_nothing(tmp_path: Path) -> None:
    cold = tmp_path / "cold"
    cold.mkdir()
    files = readers_of_wheels()
    assert len(files) >= 7, files
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", FAST_TIER]
        + files,
        cwd=ROOT,
        env={**os.environ, "OPSPATCH_TEST_CACHE": str(cold)},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    said = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, said
    assert " failed" not in said and " error" not in said, said
    assert "skipped" in said and FETCH_STEP in said, said  # the skips say how to fetch
    assert not list(cold.rglob("*.whl")), sorted(cold.rglob("*"))
