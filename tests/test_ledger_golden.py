"""A ledger written by an earlier opspatch still verifies and still prints the same JSON, and the
current code writes the same bytes for the same calls.

`tests/data/ledger_v1.sql` and `ledger_v1_cli.json` were written by the ledger code of commit
9fb2838 (one 1,300-line module with hand-written to_json/from_json), before the ledger became a
package with one generic serialiser (`tests/data/make_ledger_v1.py` says how). What must hold:

- its hash chain verifies with the same head hash (the hashing rules did not move);
- `ledger list --json` and `ledger show --json` print the same keys, in the same order, with the
  same values (additions, listed in `ADDED_SUMMARY_KEYS`, come after `outcome`);
- the same API calls now write event bodies identical, byte for byte, to the ones in that ledger
  (apart from what differs by nature: run ids, times, the controller process);
- copied into a PostgreSQL ledger (`ledger copy`), the same history verifies to the same head and
  prints the same JSON (the `postgresql` param of `golden_ledger`).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from opspatch.core.ledgerlocation import PostgresLedger
from opspatch.ledger import Ledger, RunDetail, RunSummary
from opspatch.ledger.chain import ROW_COLUMNS, EventRow
from tests.clirunner import opspatch
from tests.data.make_ledger_v1 import write
from tests.pgkit import BACKENDS, PostgresServer

pytestmark = pytest.mark.pure

DATA = Path(__file__).parent / "data"
GOLDEN: dict[str, Any] = json.loads((DATA / "ledger_v1_cli.json").read_text(encoding="utf-8"))
ADDED_SUMMARY_KEYS = ["recovered_by", "inventories"]  # new since the golden ledger, after "outcome"
ADDED_FILE_VERSION_KEYS = ["container"]  # new since the golden ledger, last in a file version


@pytest.fixture(params=BACKENDS)
def golden_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Path | PostgresLedger:
    path = tmp_path / "ledger.sqlite3"
    conn = sqlite3.connect(str(path))
    conn.executescript((DATA / "ledger_v1.sql").read_text(encoding="utf-8"))
    conn.close()
    if request.param == "sqlite":
        return path
    server: PostgresServer = request.getfixturevalue("postgres")
    location = server.fresh_ledger()
    with Ledger.open(path) as source, Ledger.open(location) as target:
        source.copy_to(target)
    return location


def without_additions(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary document as the golden ledger's opspatch printed it (new keys checked, then
    removed); the keys keep their order."""
    keys = list(summary)
    at = keys.index("outcome") + 1
    assert keys[at : at + len(ADDED_SUMMARY_KEYS)] == ADDED_SUMMARY_KEYS, keys
    assert all(summary[k] is None for k in ADDED_SUMMARY_KEYS)  # every golden run finished
    kept = {k: v for k, v in summary.items() if k not in ADDED_SUMMARY_KEYS}
    if "host_records" in kept:
        kept["host_records"] = [
            {**r, "file_versions": [_file_version_as_it_was(v) for v in r["file_versions"]]}
            for r in kept["host_records"]
        ]
    return kept


def _file_version_as_it_was(version: dict[str, Any]) -> dict[str, Any]:
    """A file version as the golden ledger's opspatch printed it: the keys added since are last
    and empty (no golden host ran in a container), then removed."""
    keys = list(version)
    assert keys[-len(ADDED_FILE_VERSION_KEYS) :] == ADDED_FILE_VERSION_KEYS, keys
    assert all(version[k] is None for k in ADDED_FILE_VERSION_KEYS)
    return {k: v for k, v in version.items() if k not in ADDED_FILE_VERSION_KEYS}


def same_document(printed: Any, golden: Any) -> None:
    """Equal values and the same key order at every level (compared as the CLI prints them)."""
    assert json.dumps(printed, indent=2) == json.dumps(golden, indent=2)


def golden_rows(path: Path) -> list[EventRow]:
    conn = sqlite3.connect(str(path))
    try:
        return [EventRow(*r) for r in conn.execute(f"SELECT {ROW_COLUMNS} FROM events ORDER BY id")]
    finally:
        conn.close()


def test_the_golden_ledger_still_verifies_with_the_same_head(
    golden_ledger: Path | PostgresLedger,
) -> None:
    with Ledger.open(golden_ledger) as ledger:
        report = ledger.verify()
    assert report.ok, report
    assert report.head_hash == GOLDEN["head_hash"]
    same_document(report.to_json(), GOLDEN["ledger_verify"])


@pytest.mark.process
def test_ledger_list_json_prints_what_it_printed(golden_ledger: Path | PostgresLedger) -> None:
    listed = opspatch("ledger", "list", "--json", env={"OPSPATCH_LEDGER": str(golden_ledger)})
    assert listed.code == 0, listed.stderr
    runs = listed.json()["runs"]
    same_document({"runs": [without_additions(r) for r in runs]}, GOLDEN["ledger_list"])


@pytest.mark.process
@pytest.mark.parametrize("index", [0, 1])
def test_ledger_show_json_prints_what_it_printed(
    golden_ledger: Path | PostgresLedger, index: int
) -> None:
    run_id = GOLDEN["run_ids"][index]
    shown = opspatch(
        "ledger", "show", run_id, "--json", env={"OPSPATCH_LEDGER": str(golden_ledger)}
    )
    assert shown.code == 0, shown.stderr
    document = shown.json()
    assert list(document)[-1] == "host_records"
    same_document(without_additions(document), GOLDEN["ledger_show"][run_id])


def test_golden_documents_read_back_into_equal_records(
    golden_ledger: Path | PostgresLedger,
) -> None:
    with Ledger.open(golden_ledger) as ledger:
        for run_id in GOLDEN["run_ids"]:
            detail = ledger.get_run(run_id)
            assert RunDetail.from_json(GOLDEN["ledger_show"][run_id]) == detail
        for summary, golden in zip(ledger.list_runs(), GOLDEN["ledger_list"]["runs"], strict=True):
            assert RunSummary.from_json(golden) == summary


@pytest.mark.parametrize("golden_ledger", ["sqlite"], indirect=True)  # the file's own rows
def test_the_same_calls_write_the_same_event_bytes(golden_ledger: Path, tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "now.sqlite3") as ledger:
        new_ids = write(ledger)
    old, new = golden_rows(golden_ledger), golden_rows(tmp_path / "now.sqlite3")
    assert [r.kind for r in new] == [r.kind for r in old]
    renamed = dict(zip(GOLDEN["run_ids"], new_ids, strict=True))
    old_controller = json.loads(old[0].body)["controller"]
    new_controller = json.loads(new[0].body)["controller"]
    for before, now in zip(old, new, strict=True):
        expected = before.body
        for old_id, new_id in renamed.items():
            expected = expected.replace(old_id, new_id)
        expected = expected.replace(
            json.dumps(old_controller, sort_keys=True, separators=(",", ":")),
            json.dumps(new_controller, sort_keys=True, separators=(",", ":")),
        )
        assert now.body == expected, now.id
        assert (now.id, now.host, now.path, now.pre_image, now.post_image) == (
            before.id,
            before.host,
            before.path,
            before.pre_image,
            before.post_image,
        )
