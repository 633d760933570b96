"""The edit engine gives byte-identical results on real SGLang files: the plans, re-plans,
detections, removals and validation problems recorded from the engine before the speed-up of
issue 20 (`tests/data/real_release_outcomes.json`). Skipped with the reason when offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.releasecases import cases, record
from tests.sglang_wheels import WheelUnavailable

pytestmark = pytest.mark.pure

RECORDED = json.loads(
    (Path(__file__).resolve().parent / "data" / "real_release_outcomes.json").read_text("utf-8")
)


@pytest.mark.slow  # in this process, but every edit on every real release takes ~10 s
def test_the_engine_gives_the_recorded_results_on_every_real_release() -> None:
    try:
        found = list(cases())
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang wheel not available (offline?): {exc}")
    assert sorted(name for name, *_ in found) == sorted(RECORDED)
    for name, relpath, source, patch in found:
        assert record(name, relpath, source, patch) == RECORDED[name], name
