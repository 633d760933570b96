"""Where a file stands, read once (`patchset.place_of`), and every word a command says about it
looked up in one table (`runs.judgments.views`), tested as data: facts in, word out, one row
per case in tests/data/views/*.json (as pyinfra's tests/operations/*/*.json feed facts to an
operation and expect its commands).

Each table answers every case exactly once: a word added to a key's vocabulary without its row
fails `test_every_case_has_exactly_one_row`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opspatch.core.edit import Detection
from opspatch.core.vocabulary import Detected, PatchState
from opspatch.ledger.lineage import AtPostImage, AtPreImage, ChangedSince, Located, PatchedFurther
from opspatch.ledger.records import FileVersion
from opspatch.runs.judgments import views
from opspatch.runs.judgments.patchset import (
    FileStanding,
    Place,
    Reference,
    ServerAge,
    Standing,
    judge,
    place_of,
)
from opspatch.runs.judgments.views import (
    DRIFT,
    FILE_STATES,
    LIVE,
    STATUS,
    SYNC,
    Coverage,
    DecisionTable,
    Written,
    set_carried,
    set_word,
    unit_words,
)

pytestmark = pytest.mark.pure

DATA = Path(__file__).parent / "data" / "views"
TABLES: dict[str, DecisionTable[Any]] = {
    "status": STATUS,
    "file-states": FILE_STATES,
    "sync": SYNC,
    "drift": DRIFT,
    "status-live": LIVE,
}


def _rows(name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads((DATA / f"{name}.json").read_text())
    return rows


def _version(event_id: int, before: str, after: str) -> FileVersion:
    return FileVersion(
        event_id=event_id,
        run_id=f"r{event_id}",
        patch_id="p",
        host="gpu-01",
        path="/srv/a.py",
        action="patch",
        sha256_before=before,
        sha256_after=after,
        mode=0o644,
        owner="root:root",
        size_before=1,
        pre_image_sha256=before,
        post_image_sha256=after,
        recorded_at="2026-12-04T00:00:00Z",
    )


WRITTEN = _version(1, "a0", "a1")
LINEAGE: dict[str, Located | None] = {
    "post-image": AtPostImage(WRITTEN),
    "patched-further": PatchedFurther(WRITTEN, (_version(2, "a1", "a2"),)),
    "pre-image": AtPreImage(WRITTEN),
    "changed-since": ChangedSince(WRITTEN),
    "none": None,
}


def _placed(facts: dict[str, Any]) -> Place:
    return place_of(
        LINEAGE[facts["lineage"]],
        fixed_upstream=facts.get("upstream_fixed", False),
        baked=facts.get("baked", False),
        recreated=facts.get("recreated", False),
    )


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_case_has_exactly_one_row(name: str) -> None:
    table = TABLES[name]
    gaps, overlaps = [], []
    for case in table.cases():
        found = table.matching(case)
        if not found:
            gaps.append(dict(zip(table.columns, case, strict=True)))
        elif len(found) > 1:
            overlaps.append((dict(zip(table.columns, case, strict=True)), found))
    assert not gaps, f"{name}: no row for {gaps[:5]} ({len(gaps)} cases)"
    assert not overlaps, f"{name}: several rows for {overlaps[:5]}"


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_row_is_reached(name: str) -> None:
    table = TABLES[name]
    reached = {index for case in table.cases() for index in table.matching(case)}
    assert reached == set(range(len(table.rows))), set(range(len(table.rows))) - reached


@pytest.mark.parametrize("row", _rows("status"), ids=lambda row: row["case"])
def test_status_says_a_word_per_place(row: dict[str, Any]) -> None:
    facts = row["facts"]
    place = _placed(facts)
    assert place == Place(row["place"])
    word = STATUS(
        place,
        Detected(facts.get("carried", "applied")),
        facts.get("applicable", True),
        ServerAge(facts.get("server", "newer")),
    )
    assert word == PatchState(row["status"])


@pytest.mark.parametrize("row", _rows("status-set"), ids=lambda row: row["case"])
def test_status_says_a_patch_sets_word_from_its_files(row: dict[str, Any]) -> None:
    words = [PatchState(w) for w in row["files"]]
    assert set_word(words) == PatchState(row["status"])
    assert set_word(list(reversed(words))) == PatchState(row["status"])  # order says nothing


@pytest.mark.parametrize("word", list(PatchState))
def test_a_set_of_one_says_its_files_word(word: PatchState) -> None:
    assert set_word([word]) == word


@pytest.mark.parametrize(
    ("carried", "together"),
    [
        (["applied", "applied"], "applied"),
        (["applied", "not-applied"], "partial"),
        (["not-applied", "unknown"], "unknown"),
        (["applied", None], None),
    ],
)
def test_what_a_sets_files_carry_together(carried: list[str | None], together: str | None) -> None:
    found = set_carried([None if c is None else Detected(c) for c in carried])
    assert found == (None if together is None else Detected(together))


@pytest.mark.parametrize("row", _rows("status-live"), ids=lambda row: row["case"])
def test_status_says_what_an_engine_holding_a_fix_live_runs(row: dict[str, Any]) -> None:
    facts = row["facts"]
    word = LIVE(PatchState(facts["state"]), facts["held"], facts.get("unread", False))
    assert word == PatchState(row["status"])


@pytest.mark.parametrize("row", _rows("status-unit"), ids=lambda row: row["case"])
def test_status_says_a_units_nodes_words_together(row: dict[str, Any]) -> None:
    reference, words = unit_words([PatchState(w) for w in row["nodes"]])
    assert (None if reference is None else str(reference)) == row["reference"]
    assert [str(w) for w in words] == row["words"]


@pytest.mark.parametrize("row", _rows("diagnose"), ids=lambda row: row["case"])
def test_diagnose_says_a_file_state_per_place(row: dict[str, Any]) -> None:
    facts = row["facts"]
    place = _placed(facts)
    assert place == Place(row["place"])
    standing = FileStanding(place, "/srv/a.py", "a9", reference=Reference(facts["reference"]))
    assert views.file_state(standing) == row["file_state"]


@pytest.mark.parametrize(
    ("code", "state"),
    [("module-not-found", "not-installed"), ("import-failed", "unresolved"), (None, "unresolved")],
)
def test_diagnose_says_a_file_state_for_a_module_that_did_not_resolve(
    code: str | None, state: str
) -> None:
    assert views.unresolved_state(code) == state


@pytest.mark.parametrize("row", _rows("sync"), ids=lambda row: row["case"])
def test_sync_acts_on_what_status_says(row: dict[str, Any]) -> None:
    facts = row["facts"]
    action = SYNC(
        PatchState(facts["state"]),
        Detected(facts["carried"]) if "carried" in facts else None,
        facts.get("held", False),
        facts.get("disagrees", False),
        facts.get("desired", True),
        Coverage(facts.get("coverage", "all")),
        facts.get("served", True),
    )
    assert (None if action is None else str(action)) == row["action"]


@pytest.mark.parametrize("row", _rows("drift"), ids=lambda row: row["case"])
def test_drift_says_why_a_file_is_not_as_expected(row: dict[str, Any]) -> None:
    facts = row["facts"]
    cause = DRIFT(
        views.SyncAction(facts["action"]),
        facts.get("drifted", False),
        facts.get("recreated", False),
        Written(facts.get("written", "never")),
        facts.get("upgraded", False),
        facts.get("at_pre_image", False),
    )
    assert (None if cause is None else str(cause)) == row["cause"]


@pytest.mark.parametrize(
    ("name", "column", "words"),
    [
        ("status", "place", {str(p) for p in Place}),
        ("status", "status", {str(s) for s in PatchState} - {"unreachable"}),
        ("diagnose", "place", {"new", "baked", "unrecorded", "old", "changed", "recreated"}),
        (
            "diagnose",
            "file_state",
            {"patched-by-opspatch", "pristine", "unknown", "edited-outside"},
        ),
        ("sync", "action", {str(a) for a in views.SyncAction} | {None}),
        ("drift", "cause", {str(c) for c in views.DriftCause} | {None}),
    ],
)
def test_the_rows_say_every_word(name: str, column: str, words: set[str | None]) -> None:
    """The data covers each word its view can say (status: every place; `unreachable` is a
    host not read, no file's place)."""
    assert {row[column] for row in _rows(name)} == words


@pytest.mark.parametrize("server", list(ServerAge))
@pytest.mark.parametrize("lineage", sorted(LINEAGE))
def test_status_and_the_commands_read_one_place(lineage: str, server: ServerAge) -> None:
    """A file the ledger explains: status's word and the standing recover, restart and rollback
    decide from come from the same place, so they agree by construction."""
    located = LINEAGE[lineage]
    standing = judge((located,), server=server, proven=False)
    carried = Detection(Detected.NOT_APPLIED if lineage == "pre-image" else Detected.APPLIED)
    word = views.status_word(
        FileStanding(place_of(located), "/srv/a.py", "a9", located, carried, server=server)
    )
    expected = {
        Standing.NEW_STALE: PatchState.STAGED,
        Standing.NEW_UNPROVEN: PatchState.APPLIED,
        Standing.NEW_UNPROVEN_NO_SERVER: PatchState.APPLIED,
        Standing.ALL_OLD: PatchState.NOT_APPLIED,
        Standing.CHANGED: PatchState.DRIFTED,
        Standing.NOTHING_RECORDED: PatchState.STAGED
        if server == ServerAge.OLDER
        else PatchState.APPLIED,
        Standing.PATCHED_FURTHER: PatchState.STAGED
        if server == ServerAge.OLDER
        else PatchState.APPLIED,
    }
    assert word == expected[standing], (standing, word)
