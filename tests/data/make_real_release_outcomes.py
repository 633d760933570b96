"""Writes `real_release_outcomes.json`, what the edit engine makes of real SGLang files.

Provenance: the committed file was written by the engine of commit e50d1ae (before the speed-up
of issue 20), so `tests/test_real_release_outcomes.py` proves the faster engine gives the same
bytes, reasons and validation problems. Re-run only on purpose (a deliberate change of output):

    PYTHONPATH=$PWD python3 tests/data/make_real_release_outcomes.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.releasecases import cases, record

OUT = Path(__file__).resolve().parent / "real_release_outcomes.json"

if __name__ == "__main__":
    records = {
        name: record(name, relpath, source, patch) for name, relpath, source, patch in cases()
    }
    OUT.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(records)} cases -> {OUT}")
