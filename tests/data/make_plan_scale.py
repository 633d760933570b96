"""Writes `plan-scale.json`, what the planner says about generated patches of many edits.

Provenance: the committed file was written by the planner of commit 3e9e2ce (before issue 44,
when placing re-parsed the whole file after every edit), with this repository's
`tests/manyedits.py` beside it, so `tests/test_edit_scale.py` proves the faster planner says the
same. Re-run only on purpose (a deliberate change of output); the old planner takes minutes:

    PYTHONPATH=$PWD python3 tests/data/make_plan_scale.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.manyedits import GOLDEN_CASES, digest, golden_case, plan_record, scale_sources

OUT = Path(__file__).resolve().parent / "plan-scale.json"

if __name__ == "__main__":
    sources = scale_sources()
    records = {key: digest(plan_record(*golden_case(key, sources))) for key in GOLDEN_CASES}
    OUT.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(records)} cases -> {OUT}")
