"""The ledger against real SQLite files and a real PostgreSQL server (every test that is not about
SQLite's file runs on both): durability settings, append-only triggers, the hash chain catching
edits, deletions and altered blobs, concurrent writers, queries, and what a write may hold.
PostgreSQL's roles, migrations and copying: test_ledger_postgres.py. Run statuses: test_ledger_runs.py; a full or read-only filesystem: test_ledger_faults.py;
the ledger an earlier opspatch wrote: test_ledger_golden.py."""

from __future__ import annotations

import json
import multiprocessing
import socket
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.paths import default_ledger_location
from opspatch.core.filechange import FileChange
from opspatch.core.ledgerlocation import PostgresLedger, ledger_location
from opspatch.core.vocabulary import FileAction, Outcome, RunStatus, StepStatus
from opspatch.errors import InputError, LedgerError, LedgerIntegrityError
from opspatch.ledger import Ledger, NewFileVersion, RunDetail, new_run_id, operator_identity
from opspatch.ledger.chain import GENESIS_HASH, ROW_COLUMNS, EventRow, event_hash
from opspatch.ledger.records import Machine
from tests.clirunner import opspatch
from tests.ledgerkit import (
    ORIGINAL,
    PATCH_SHA,
    PATCHED,
    begin,
    drop_triggers,
    full_run,
    raw,
    record_patch,
    sha,
)
from tests.pgkit import BACKENDS, backend_location

pytestmark = pytest.mark.pure

sqlite_only = pytest.mark.parametrize("ledger_path", ["sqlite"], indirect=True)
"""A test of SQLite's file itself (PRAGMAs, its triggers, its VM): PostgreSQL has its own."""


@pytest.fixture(params=BACKENDS)
def ledger_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path | PostgresLedger:
    return backend_location(request, tmp_path)


@pytest.fixture
def ledger(ledger_path: Path) -> Iterator[Ledger]:
    opened = Ledger.open(ledger_path)
    yield opened
    opened.close()


# ---------------------------------------------------------------------------------------------
# opening and durability


@sqlite_only
def test_open_creates_parent_directories_and_uses_wal_full_sync_and_foreign_keys(
    ledger_path: Path,
) -> None:
    with Ledger.open(ledger_path) as ledger:
        settings = ledger.settings()
    assert ledger_path.is_file()
    assert settings["journal_mode"] == "wal"
    assert settings["synchronous"] == 2  # FULL
    assert settings["foreign_keys"] == 1
    assert settings["busy_timeout_ms"] >= 1000
    assert settings["schema_version"] == 1
    # WAL is a property of the file: another connection sees it too.
    assert raw(ledger_path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_default_path_is_in_the_isolated_state_directory(isolated_home: Path) -> None:
    path = default_ledger_location()
    assert path.is_relative_to(isolated_home)
    with Ledger.open(path) as ledger:
        assert ledger.verify().ok


def test_open_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    bogus = tmp_path / "ledger.sqlite3"
    bogus.write_bytes(b"this is not sqlite, just text that happens to be here\n" * 40)
    with pytest.raises(LedgerError, match="unusable") as caught:
        Ledger.open(bogus)
    assert caught.value.exit_code == 2  # the ledger given is no ledger: configuration, exit 2


@pytest.mark.process
@pytest.mark.parametrize(
    ("where", "url"),
    [
        ("--ledger", "http://db.example/ledger"),
        ("--ledger", "mysql://ops:hunter2-secret@db.example/ledger"),
        ("OPSPATCH_LEDGER", "sqlite:///var/lib/opspatch/ledger.sqlite3"),
        ("--ledger", "HTTPS://db.example:5432/ledger"),
    ],
)
def test_a_url_of_another_scheme_is_refused_never_taken_for_a_file(
    where: str, url: str, tmp_path: Path
) -> None:
    """A mistyped team ledger must not become a private file (`./http:/db.example/ledger`)
    that the operator takes for the shared one: refused, naming the schemes there are, without
    echoing the rest of the URL (it may hold a password)."""
    args, env = (["--ledger", url], {}) if where == "--ledger" else ([], {"OPSPATCH_LEDGER": url})
    done = opspatch(*args, "ledger", "list", env=env, cwd=tmp_path)
    assert done.code == 2, done.stdout + done.stderr
    scheme = url.split("://", 1)[0]
    assert f"{where}: {scheme}:// is not a ledger opspatch supports" in done.stderr
    assert "postgresql:// or postgres://" in done.stderr and "SQLite file" in done.stderr
    assert "hunter2" not in done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []  # no file, no directory named after the URL
    with pytest.raises(InputError, match="is not a ledger opspatch supports"):
        ledger_location(url, given_by=where)
    # What the backends are still is what they were: a file path, and PostgreSQL's two names.
    assert ledger_location("postgres://u@db.example/ledger") == PostgresLedger(
        "postgres://u@db.example/ledger"
    )
    assert ledger_location("./http:/x") == Path("./http:/x")


@sqlite_only
def test_open_refuses_a_ledger_from_a_newer_opspatch(ledger_path: Path) -> None:
    Ledger.open(ledger_path).close()
    raw(ledger_path).execute("PRAGMA user_version = 99")
    with pytest.raises(LedgerError, match="schema version 99"):
        Ledger.open(ledger_path)


def test_reopening_keeps_history(ledger_path: Path) -> None:
    with Ledger.open(ledger_path) as first:
        run_id = full_run(first)
    with Ledger.open(ledger_path) as second:
        assert [r.run_id for r in second.list_runs()] == [run_id]
        assert second.verify().ok


# ---------------------------------------------------------------------------------------------
# append-only


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET body = '{}' WHERE id = 2",
        "DELETE FROM events WHERE id = 2",
        "DELETE FROM events",
        "UPDATE blobs SET data = x'00'",
        "DELETE FROM blobs",
    ],
)
@sqlite_only
def test_update_and_delete_are_refused_on_every_history_table(
    ledger: Ledger, ledger_path: Path, statement: str
) -> None:
    full_run(ledger)
    with pytest.raises(sqlite3.IntegrityError, match="opspatch ledger is append-only"):
        raw(ledger_path).execute(statement)
    assert ledger.verify().ok


# ---------------------------------------------------------------------------------------------
# the hash chain


def test_event_hash_format_is_pinned() -> None:
    # Changing the canonical form would make every existing ledger fail verification.
    assert (
        event_hash(
            event_id=1,
            run_id="20261130T025012Z-3f9a1c",
            kind="step",
            host="gpu-01",
            path=None,
            recorded_at="2026-11-30T02:50:12.000000Z",
            body='{"step":"lock"}',
            pre_image=None,
            post_image=None,
            prev_hash=GENESIS_HASH,
        )
        == "acb2763cc4f450e94dea46c265ec968e6cc001624bd4d3a6dd8d5254662654b4"
    )


def test_chain_starts_at_genesis_and_links_every_event(ledger: Ledger, ledger_path: Path) -> None:
    full_run(ledger)
    rows = raw(ledger_path).execute("SELECT id, prev_hash, hash FROM events ORDER BY id").fetchall()
    assert rows[0][1] == GENESIS_HASH
    for before, after in pairwise(rows):
        assert after[0] == before[0] + 1
        assert after[1] == before[2]
    report = ledger.verify()
    assert report.ok and report.first_broken is None
    assert report.events_checked == len(rows)
    assert report.blobs_checked == 2  # ORIGINAL and PATCHED, each stored once
    assert report.head_hash == rows[-1][2]


def test_an_edited_row_is_reported_by_its_event_id(ledger: Ledger, ledger_path: Path) -> None:
    full_run(ledger)
    tamper = raw(ledger_path)
    drop_triggers(tamper)
    tamper.execute("""UPDATE events SET body = replace(body, '"failed"', '"ok"') WHERE id = 12""")
    assert tamper.total_changes == 1

    report = ledger.verify()
    assert not report.ok
    assert report.first_broken == 12
    assert "edited" in (report.reason or "")
    with pytest.raises(LedgerIntegrityError, match="not intact at event 12") as caught:
        ledger.ensure_intact()
    assert caught.value.first_broken == 12


def test_an_edited_hash_is_caught_at_the_next_link(ledger: Ledger, ledger_path: Path) -> None:
    # Re-hashing an edited row is not enough: the next row's prev_hash still names the old hash.
    full_run(ledger)
    tamper = raw(ledger_path)
    drop_triggers(tamper)
    tamper.execute("UPDATE events SET hash = ? WHERE id = 5", ("f" * 64,))
    report = ledger.verify()
    assert report.first_broken == 5  # its own content no longer matches what it claims


def test_a_deleted_row_breaks_the_chain_at_the_next_id(ledger: Ledger, ledger_path: Path) -> None:
    full_run(ledger)
    tamper = raw(ledger_path)
    drop_triggers(tamper)
    tamper.execute("DELETE FROM events WHERE id = 7")
    report = ledger.verify()
    assert not report.ok
    assert report.first_broken == 8
    assert "7" in (report.reason or "") and "missing" in (report.reason or "")


def test_a_deleted_tail_is_detected(ledger: Ledger, ledger_path: Path) -> None:
    full_run(ledger)
    tamper = raw(ledger_path)
    last = tamper.execute("SELECT max(id) FROM events").fetchone()[0]
    drop_triggers(tamper)
    tamper.execute("DELETE FROM events WHERE id >= ?", (last - 1,))
    report = ledger.verify()
    assert not report.ok
    assert report.first_broken == last - 1
    assert "deleted from the end" in (report.reason or "")


def test_appending_after_a_deleted_tail_still_shows_the_gap(
    ledger: Ledger, ledger_path: Path
) -> None:
    full_run(ledger)
    tamper = raw(ledger_path)
    last = tamper.execute("SELECT max(id) FROM events").fetchone()[0]
    drop_triggers(tamper)
    tamper.execute("DELETE FROM events WHERE id = ?", (last,))
    begin(ledger)  # opspatch carries on writing, unaware
    assert ledger.verify().first_broken == last + 1


def test_an_altered_blob_is_detected_and_never_handed_out(
    ledger: Ledger, ledger_path: Path
) -> None:
    run_id = full_run(ledger)
    first_version = ledger.get_run(run_id).host("gpu-01").file_versions[0]
    tamper = raw(ledger_path)
    drop_triggers(tamper)
    tamper.execute("UPDATE blobs SET data = ? WHERE sha256 = ?", (b"import os\n", sha(ORIGINAL)))
    report = ledger.verify()
    assert not report.ok
    assert report.first_broken == first_version.event_id
    assert "blob was edited" in (report.reason or "")
    with pytest.raises(LedgerIntegrityError):
        ledger.blob(sha(ORIGINAL))


def test_a_deleted_blob_is_detected(ledger: Ledger, ledger_path: Path) -> None:
    run_id = full_run(ledger)
    first_version = ledger.get_run(run_id).host("gpu-01").file_versions[0]
    tamper = raw(ledger_path)
    drop_triggers(tamper)
    tamper.execute("PRAGMA foreign_keys = OFF")
    tamper.execute("DELETE FROM blobs WHERE sha256 = ?", (sha(ORIGINAL),))
    report = ledger.verify()
    assert report.first_broken == first_version.event_id
    assert "missing" in (report.reason or "")
    with pytest.raises(LedgerError, match="no stored bytes"):
        ledger.blob(sha(ORIGINAL))


@sqlite_only
def test_reopening_restores_dropped_triggers_and_says_so(ledger_path: Path) -> None:
    with Ledger.open(ledger_path) as ledger:
        full_run(ledger)
    drop_triggers(raw(ledger_path))
    with Ledger.open(ledger_path) as reopened:
        report = reopened.verify()
    assert report.ok  # nothing was edited, so the chain holds
    assert any("re-created" in w for w in report.warnings)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        raw(ledger_path).execute("DELETE FROM events")


# ---------------------------------------------------------------------------------------------
# concurrency


def _append_from_another_process(path: str, worker: int, events: int, ready: object) -> None:
    with Ledger.open(ledger_location(path)) as ledger:
        ready.wait()  # type: ignore[attr-defined]  # every writer starts at the same moment
        run_id = ledger.begin_run(
            command="apply",
            patch_id="eagle-init-guard",
            patch_sha256=None,
            operator=f"operator{worker}@controller",
            command_line="opspatch apply",
            hosts=[f"gpu-{worker}"],
        )
        for step in range(events):
            ledger.record_step(run_id, f"gpu-{worker}", "smoke", "ok", float(step))
            # Real steps are spaced out; without a pause the writer that holds the lock first
            # re-takes it before SQLite's busy handler wakes the others, and nothing interleaves.
            time.sleep(0.002)
        ledger.finish_run(run_id, "ok")


def test_processes_appending_at_once_keep_one_intact_chain(ledger_path: Path) -> None:
    Ledger.open(ledger_path).close()
    context = multiprocessing.get_context("spawn")
    workers, events = 4, 40
    ready = context.Barrier(workers)
    processes = [
        context.Process(
            target=_append_from_another_process, args=(str(ledger_path), w, events, ready)
        )
        for w in range(workers)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0

    with Ledger.open(ledger_path) as ledger:
        report = ledger.verify()
        runs = ledger.list_runs()
    assert report.ok, report
    assert report.events_checked == workers * (events + 2)
    assert sorted(r.operator for r in runs) == [f"operator{w}@controller" for w in range(workers)]
    assert all(r.status == "finished" and r.outcome == "ok" for r in runs)
    # The writers really interleaved (otherwise this test proves nothing about forks).
    kinds = [
        r[0] for r in raw(ledger_path).execute("SELECT run_id FROM events ORDER BY id").fetchall()
    ]
    switches = sum(1 for a, b in pairwise(kinds) if a != b)
    assert switches >= workers, switches


def test_threads_sharing_one_ledger_keep_one_intact_chain(ledger: Ledger) -> None:
    hosts = tuple(f"gpu-{i:02}" for i in range(16))
    run_id = begin(ledger, hosts=hosts)

    def work(host: str) -> None:
        for step in ("lock", "inspect", "swap", "restart", "ready", "smoke"):
            ledger.record_step(run_id, host, step, "ok", 0.01)
        ledger.record_host_outcome(run_id, host, "applied")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, hosts))
    ledger.finish_run(run_id, "ok")
    assert ledger.verify().ok
    detail = ledger.get_run(run_id)
    assert [h.host for h in detail.hosts] == list(hosts)
    assert all(h.outcome == "applied" and len(h.steps) == 6 for h in detail.hosts)


# ---------------------------------------------------------------------------------------------
# queries


def test_run_detail_round_trips_through_json(ledger: Ledger) -> None:
    run_id = full_run(ledger)
    detail = ledger.get_run(run_id)
    text = json.dumps(detail.to_json())
    again = type(detail).from_json(json.loads(text))
    assert again == detail
    document = json.loads(text)
    assert document["run_id"] == run_id
    assert document["outcome"] == "failed"
    assert [h["outcome"] for h in document["host_records"]] == ["applied", "rolled-back"]
    assert all(s.to_json() == json.loads(json.dumps(s.to_json())) for s in ledger.list_runs())


def test_get_run_gives_steps_facts_file_versions_and_outcomes(ledger: Ledger) -> None:
    run_id = full_run(ledger)
    detail = ledger.get_run(run_id)
    summary = detail.summary
    assert summary.command == "apply" and summary.patch_id == "eagle-init-guard"
    assert summary.patch_sha256 == PATCH_SHA and summary.playbook == "default"
    assert summary.operator == "ops@controller"
    assert summary.hosts == ("gpu-01", "gpu-02")
    gpu01 = detail.host("gpu-01")
    assert [s.step for s in gpu01.steps] == ["lock", "swap", "smoke"]
    assert gpu01.steps[1].detail == "renamed over the target"
    assert gpu01.facts == {"python": "3.11.9", "sglang": "0.5.23", "gpus": []}
    assert gpu01.outcome == "applied" and gpu01.error is None
    assert gpu01.file == FileChange("/srv/eagle_worker_v2.py", sha(ORIGINAL), sha(PATCHED))
    (version,) = gpu01.file_versions
    assert (version.mode, version.owner, version.size_before) == (0o644, "root:root", len(ORIGINAL))
    assert ledger.blob(version.pre_image_sha256) == ORIGINAL
    assert version.post_image_sha256 is not None
    assert ledger.blob(version.post_image_sha256) == PATCHED
    gpu02 = detail.host("gpu-02")
    assert gpu02.outcome == "rolled-back" and gpu02.error == "smoke failed"
    assert [v.action for v in gpu02.file_versions] == ["patch", "restore"]


def test_get_run_accepts_a_unique_prefix_and_refuses_unknown_ones(ledger: Ledger) -> None:
    run_id = full_run(ledger)
    assert ledger.get_run(run_id[:17]).run_id == run_id
    with pytest.raises(InputError, match="no run"):
        ledger.get_run("19990101T000000Z-000000")
    with pytest.raises(InputError, match="no run"):
        ledger.get_run("")


def test_list_runs_is_newest_first_and_limited(ledger: Ledger) -> None:
    ids = [begin(ledger) for _ in range(5)]
    for run_id in ids:
        ledger.finish_run(run_id, "ok")
    assert [r.run_id for r in ledger.list_runs()] == ids[::-1]
    assert [r.run_id for r in ledger.list_runs(limit=2)] == ids[:-3:-1]


def test_last_applied_skips_a_patch_the_same_run_restored(ledger: Ledger) -> None:
    run_id = full_run(ledger)
    applied = ledger.last_applied("gpu-01", "/srv/eagle_worker_v2.py", "eagle-init-guard")
    assert applied is not None and applied.run_id == run_id and applied.action == "patch"
    assert ledger.last_applied("gpu-02", "/srv/eagle_worker_v2.py", "eagle-init-guard") is None
    assert ledger.last_applied("gpu-01", "/srv/eagle_worker_v2.py", "other-patch") is None
    assert ledger.last_applied("gpu-01", "/srv/other.py", "eagle-init-guard") is None


def test_last_applied_survives_a_later_rollback_run(ledger: Ledger) -> None:
    apply_run = full_run(ledger)
    rollback = begin(ledger, hosts=("gpu-01",), command="rollback", parent_run=apply_run)
    ledger.record_file_version(
        rollback,
        "gpu-01",
        NewFileVersion(
            path="/srv/eagle_worker_v2.py",
            sha256_before=sha(PATCHED),
            sha256_after=sha(ORIGINAL),
            mode=0o644,
            owner="root:root",
            pre_image=PATCHED,
            action="restore",
        ),
    )
    ledger.finish_run(rollback, "ok")
    # The live hash (now ORIGINAL = sha256_before) is what tells status it is not applied.
    applied = ledger.last_applied("gpu-01", "/srv/eagle_worker_v2.py", "eagle-init-guard")
    assert applied is not None and applied.run_id == apply_run
    assert ledger.get_run(rollback).summary.parent_run == apply_run


def test_a_restore_without_bytes_records_the_ledgers_own_post_image(ledger: Ledger) -> None:
    """A restore overwrites the post-image of the change it undoes, bytes the ledger holds: the
    run passes none (`pre_image` None) and the version records those as its pre-image."""
    apply_run = full_run(ledger)
    rollback = begin(ledger, hosts=("gpu-01",), command="rollback", parent_run=apply_run)
    restore = NewFileVersion(
        "/srv/eagle_worker_v2.py",
        sha(PATCHED),
        sha(ORIGINAL),
        0o644,
        "root:root",
        pre_image=None,
        action=FileAction.RESTORE,
    )
    version = ledger.record_file_version(rollback, "gpu-01", restore)
    assert (version.action, version.pre_image_sha256) == (FileAction.RESTORE, sha(PATCHED))
    assert version.size_before == len(PATCHED) and ledger.blob(sha(PATCHED)) == PATCHED
    never_stored = replace(restore, sha256_before=sha(b"never stored"))
    with pytest.raises(LedgerError, match="no stored bytes"):
        ledger.record_file_version(rollback, "gpu-01", never_stored)


def test_a_swap_that_was_refused_is_not_a_change_opspatch_made(ledger: Ledger) -> None:
    """The pre-image is recorded before the swap; a swap refused on the host (the file changed
    in between) leaves the run's outcome `failed`: that version must not count as a write, or
    status and rollback would say "changed since run R wrote it" of a run that wrote nothing."""
    earlier = full_run(ledger)
    refused = begin(ledger, hosts=("gpu-01",))
    record_patch(ledger, refused, "gpu-01")
    ledger.record_host_outcome(refused, "gpu-01", "failed", "the file changed since it was read")
    ledger.finish_run(refused, "failed")
    applied = ledger.last_applied("gpu-01", "/srv/eagle_worker_v2.py", "eagle-init-guard")
    assert applied is not None and applied.run_id == earlier
    assert refused not in {v.run_id for v in ledger.file_history("gpu-01")}
    # a run killed before any outcome may have written: it still counts
    killed = begin(ledger, hosts=("gpu-01",))
    record_patch(ledger, killed, "gpu-01")
    applied = ledger.last_applied("gpu-01", "/srv/eagle_worker_v2.py", "eagle-init-guard")
    assert applied is not None and applied.run_id == killed


def test_file_history_is_newest_first_and_filters_by_path(ledger: Ledger) -> None:
    run_id = full_run(ledger)
    history = ledger.file_history("gpu-02")
    assert [v.action for v in history] == ["restore", "patch"]
    assert all(v.run_id == run_id for v in history)
    assert ledger.file_history("gpu-02", "/srv/elsewhere.py") == []


def test_identical_pre_images_are_stored_once(ledger: Ledger, ledger_path: Path) -> None:
    run_id = begin(ledger, hosts=tuple(f"gpu-{i}" for i in range(5)))
    for i in range(5):
        record_patch(ledger, run_id, f"gpu-{i}")
    assert raw(ledger_path).execute("SELECT count(*) FROM blobs").fetchone()[0] == 2


# ---------------------------------------------------------------------------------------------
# refusals


def test_a_finished_run_accepts_nothing_more(ledger: Ledger) -> None:
    run_id = begin(ledger)
    ledger.finish_run(run_id, "ok")
    with pytest.raises(LedgerError, match="already finished"):
        ledger.record_step(run_id, "gpu-01", "lock", "ok")
    with pytest.raises(LedgerError, match="already finished"):
        ledger.finish_run(run_id, "failed")


def test_events_for_an_unknown_run_are_refused(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="not in the ledger"):
        ledger.record_step("20261130T025012Z-000000", "gpu-01", "lock", "ok")
    with pytest.raises(LedgerError, match="parent run"):
        begin(ledger, parent_run="20261130T025012Z-000000")


def test_a_pre_image_that_does_not_match_its_hash_is_refused(ledger: Ledger) -> None:
    run_id = begin(ledger)
    with pytest.raises(ValueError, match="pre_image"):
        ledger.record_file_version(
            run_id,
            "gpu-01",
            NewFileVersion(
                path="/srv/x.py",
                sha256_before=sha(PATCHED),
                sha256_after=sha(PATCHED),
                mode=0o644,
                owner="root:root",
                pre_image=ORIGINAL,
            ),
        )
    assert ledger.get_run(run_id).host("gpu-01").file_versions == ()


@pytest.mark.parametrize(
    ("field", "value"),
    [("step", "Swap Step"), ("status", ""), ("step", "swap;rm")],
)
def test_step_names_and_statuses_must_be_plain_words(
    ledger: Ledger, field: str, value: str
) -> None:
    run_id = begin(ledger)
    args = {"step": "swap", "status": "ok", field: value}
    with pytest.raises(ValueError, match=field):
        ledger.record_step(run_id, "gpu-01", args["step"], args["status"])


def test_facts_that_are_not_json_are_refused_before_writing(ledger: Ledger) -> None:
    run_id = begin(ledger)
    with pytest.raises(TypeError):
        ledger.record_facts(run_id, "gpu-01", {"when": object()})
    assert ledger.verify().events_checked == 1


# ---------------------------------------------------------------------------------------------
# identity helpers


def test_operator_is_user_at_controller_hostname() -> None:
    user, _, host = operator_identity().partition("@")
    assert user and host == socket.gethostname()


def test_run_ids_are_unique_and_sort_by_time() -> None:
    from datetime import datetime, timezone

    earlier = new_run_id(datetime(2026, 11, 30, 2, 50, 12, tzinfo=timezone.utc))
    later = new_run_id(datetime(2026, 11, 30, 2, 50, 13, tzinfo=timezone.utc))
    assert earlier.startswith("20261130T025012Z-") and len(earlier) == 23
    assert earlier < later
    assert len({new_run_id() for _ in range(20)}) == 20


# ---------------------------------------------------------------------------------------------
# the vocabulary: statuses and outcomes are the shared words, on disk the same as ever


def test_steps_and_outcomes_read_back_as_the_vocabulary(ledger: Ledger, ledger_path: Path) -> None:
    run_id = full_run(ledger)
    gpu01, gpu02 = ledger.get_run(run_id).hosts
    assert gpu01.steps[0].status is StepStatus.OK
    assert gpu01.outcome is Outcome.APPLIED and gpu02.outcome is Outcome.ROLLED_BACK
    (summary,) = ledger.list_runs()
    assert summary.status is RunStatus.FINISHED
    # On disk and in JSON they are the plain words they always were.
    bodies = [
        r[0] for r in raw(ledger_path).execute("SELECT body FROM events WHERE host = 'gpu-02'")
    ]
    assert '{"error":"smoke failed","file":null,"outcome":"rolled-back"}' in bodies
    assert gpu01.to_json()["outcome"] == "applied"
    assert type(gpu01.to_json()["steps"][0]["status"]) is str


def test_enum_members_and_their_words_are_both_accepted(ledger: Ledger) -> None:
    run_id = begin(ledger)
    ledger.record_step(run_id, "gpu-01", "swap", StepStatus.STARTED)
    ledger.record_step(run_id, "gpu-01", "swap", "ok", 0.1)
    ledger.record_host_outcome(run_id, "gpu-01", Outcome.NEEDS_ATTENTION, error="restore failed")
    ledger.record_host_outcome(run_id, "gpu-02", "already-applied")
    detail = ledger.get_run(run_id)
    assert [s.status for s in detail.host("gpu-01").steps] == ["started", "ok"]
    assert detail.host("gpu-01").outcome == "needs-attention"
    assert detail.host("gpu-02").outcome is Outcome.ALREADY_APPLIED


@pytest.mark.parametrize("status", ["succeeded", "OK", "done"])
def test_a_step_status_outside_the_vocabulary_is_refused(ledger: Ledger, status: str) -> None:
    run_id = begin(ledger)
    with pytest.raises(ValueError, match="status must be one of started, ok, failed, skipped"):
        ledger.record_step(run_id, "gpu-01", "swap", status)
    assert ledger.verify().events_checked == 1


@pytest.mark.parametrize("outcome", ["succeeded", "would-apply", "not-applicable", "Applied"])
def test_a_host_outcome_outside_the_recorded_outcomes_is_refused(
    ledger: Ledger, outcome: str
) -> None:
    # Dry-run words (would-apply, not-applicable) are never recorded: a dry run writes nothing.
    run_id = begin(ledger)
    with pytest.raises(ValueError, match="outcome must be one of applied, already-applied"):
        ledger.record_host_outcome(run_id, "gpu-01", outcome)
    assert ledger.verify().events_checked == 1


def test_an_event_this_opspatch_cannot_read_is_a_ledger_error(
    ledger: Ledger, ledger_path: Path
) -> None:
    # A word from a newer opspatch, appended with a valid hash (the chain holds): reading it
    # must say what is wrong, not end in a traceback.
    run_id = begin(ledger)
    conn = raw(ledger_path)
    last_id, last_hash = conn.execute("SELECT id, hash FROM events ORDER BY id DESC").fetchone()
    row = EventRow(
        id=last_id + 1,
        run_id=run_id,
        kind="step",
        host="gpu-01",
        path=None,
        recorded_at="2026-11-30T02:50:12.000000Z",
        body='{"detail":"","seconds":null,"status":"paused","step":"swap"}',
        pre_image=None,
        post_image=None,
        prev_hash=last_hash,
        hash="",
    )
    row = replace(row, hash=row.computed_hash())
    conn.execute(f"INSERT INTO events ({ROW_COLUMNS}) VALUES ({', '.join('?' * 11)})", row.values())
    assert ledger.verify().ok
    with pytest.raises(
        LedgerError, match="cannot read.*status: Input should be .*, got 'paused'"
    ) as caught:
        ledger.get_run(run_id)
    assert "newer opspatch" in (caught.value.hint or "")


# ---------------------------------------------------------------------------------------------
# records and their one JSON mechanism


def test_every_record_round_trips_through_json(ledger: Ledger) -> None:
    run_id = full_run(ledger)
    detail = ledger.get_run(run_id)
    records: list[Any] = [
        detail,
        detail.summary,
        detail.summary.controller,
        *detail.hosts,
        *(s for h in detail.hosts for s in h.steps),
        *(v for h in detail.hosts for v in h.file_versions),
        ledger.verify(),
    ]
    for record in records:
        text = json.dumps(record.to_json())
        assert type(record).from_json(json.loads(text)) == record, type(record).__name__
    # The derived last_step is written in its place and not read back.
    host_json = detail.host("gpu-02").to_json()
    assert list(host_json)[:5] == ["host", "outcome", "error", "file", "last_step"]
    assert host_json["last_step"] == host_json["steps"][-1]


def test_from_json_names_the_key_that_is_wrong(ledger: Ledger) -> None:
    document = ledger.get_run(full_run(ledger)).to_json()
    document["host_records"][1]["steps"][0]["seconds"] = "fast"
    with pytest.raises(ValueError, match=r"RunDetail\.host_records\[1\]\.steps\[0\]\.seconds"):
        RunDetail.from_json(document)
    del document["controller"]
    with pytest.raises(ValueError, match=r"RunDetail\.summary\.controller: missing"):
        RunDetail.from_json(document)


def test_the_names_callers_import_from_the_store_module_still_import() -> None:
    # runs/, cli/, bench/ and older tests import these from opspatch.ledger.store.
    from opspatch.ledger import store

    for name in (
        "GENESIS_HASH",
        "ControllerProcess",
        "FileVersion",
        "HostRecord",
        "Ledger",
        "RunDetail",
        "RunSummary",
        "StepRecord",
        "VerifyReport",
        "canonical_json",
        "event_hash",
        "new_run_id",
        "operator_identity",
    ):
        assert name in store.__all__ and hasattr(store, name), name
    assert store.Ledger is Ledger


def test_file_history_by_machine_id_joins_the_names_one_machine_was_recorded_under(
    ledger: Ledger,
) -> None:
    """One machine reached through two inventories (`lab-gpu`, `sandbox-01`) is one host for a
    file's history when the facts of the run that recorded it say the same machine id; the same
    path on another machine (or on a clone with the same machine id but another hostname),
    another path on the same machine, and a refused swap are not."""
    path = "/srv/eagle_worker_v2.py"
    machine = "3d1219c7c4c5404aaa1f6d2a48adfda4"
    run_id = begin(ledger, hosts=("lab-gpu", "other-gpu", "lab-gpu-2"))
    ledger.record_facts(run_id, "lab-gpu", {"machine_id": machine, "hostname": "gpu7"})
    ledger.record_facts(run_id, "other-gpu", {"machine_id": "f" * 32, "hostname": "gpu8"})
    ledger.record_facts(run_id, "lab-gpu-2", {"machine_id": machine, "hostname": "gpu7"})
    clone = begin(ledger, hosts=("clone-gpu",))  # an image cloned with its machine id
    ledger.record_facts(clone, "clone-gpu", {"machine_id": machine, "hostname": "gpu9"})
    record_patch(ledger, clone, "clone-gpu")
    record_patch(ledger, run_id, "lab-gpu")
    record_patch(ledger, run_id, "other-gpu")
    record_patch(ledger, run_id, "lab-gpu-2", path="/srv/other.py")
    refused = begin(ledger, hosts=("lab-gpu",))
    ledger.record_facts(refused, "lab-gpu", {"machine_id": machine, "hostname": "gpu7"})
    record_patch(ledger, refused, "lab-gpu")
    ledger.record_host_outcome(refused, "lab-gpu", "failed", "the file changed since it was read")

    joined = ledger.file_history("sandbox-01", path, machine=Machine(machine, "gpu7"))
    assert [(v.run_id, v.host) for v in joined] == [(run_id, "lab-gpu")]
    assert ledger.file_history("sandbox-01", path) == []
    assert ledger.file_history("sandbox-01", path, machine=Machine("0" * 32, "gpu7")) == []
    other = ledger.file_history("other-gpu", path, machine=Machine("f" * 32, "gpu8"))
    assert [v.host for v in other] == ["other-gpu"]


@sqlite_only
def test_checking_a_run_is_open_costs_the_same_however_many_events_it_has(
    ledger_path: Path,
) -> None:
    """Every event a fleet run writes first checks its run is open: that check must be a point
    lookup, not a scan of the run's events (counted in SQLite VM steps, not timed)."""
    from opspatch.ledger.events import require_open_run

    def steps_to_check(conn: sqlite3.Connection, run_id: str) -> int:
        counted = [0]

        def tick() -> int:
            counted[0] += 1
            return 0

        conn.set_progress_handler(tick, 1)
        try:
            require_open_run(conn, run_id)
        finally:
            conn.set_progress_handler(None, 1)
        return counted[0]

    with Ledger.open(ledger_path) as ledger:
        run_id = ledger.begin_run(
            command="apply",
            patch_id="eagle-init-guard",
            patch_sha256=None,
            operator="operator@controller",
            command_line="opspatch apply",
            hosts=["gpu-01"],
        )
        ledger.record_step(run_id, "gpu-01", "lock", "ok")
        with sqlite3.connect(ledger_path) as conn:
            few = steps_to_check(conn, run_id)
        for step in range(300):
            ledger.record_step(run_id, "gpu-01", "smoke", "ok", float(step))
        with sqlite3.connect(ledger_path) as conn:
            many = steps_to_check(conn, run_id)
        ledger.finish_run(run_id, "ok")
    assert many == few
