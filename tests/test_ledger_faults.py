"""A ledger on a full or read-only filesystem: the operator is told that, with the path and what to
do, not "disk I/O error ... is it an opspatch ledger? move it aside".

The filesystems are real: a tiny tmpfs (root ignores file permissions, a full or read-only
filesystem does not), filled with a file or remounted read-only, unmounted afterwards. A damaged
file is a real one with a page overwritten, as a bad sector leaves it: what SQLite says of it
reaches the caller as the ledger's error, never as sqlite3's.
"""

from __future__ import annotations

import errno
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.errors import LedgerError
from opspatch.ledger import Ledger
from opspatch.runs.fleet.host_leases import Heartbeat
from opspatch.runs.fleet.recorder import LedgerRecorder
from tests.clirunner import opspatch
from tests.fleetkit import wait_until
from tests.ledgerkit import ORIGINAL, begin, begin_and_die, sha
from tests.test_team import Notices

pytestmark = pytest.mark.pure

FULL = "the filesystem that holds it is full"
READ_ONLY = "the filesystem that holds it is mounted read-only"


@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path]:
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k,mode=0755", "opspatch-test", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def fill(filesystem: Path) -> Path:
    """Write one file until the filesystem has no space left; returns it (delete it to free)."""
    filler = filesystem / "filler"
    with filler.open("wb") as out:
        try:
            for _ in range(1024):
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        else:
            raise AssertionError("the tiny filesystem never filled up")
    return filler


def remount_read_only(filesystem: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(filesystem)], check=True)


def assert_names(error: LedgerError, path: Path, problem: str, remedy: str) -> None:
    assert problem in error.message, error.render()
    assert str(path) in error.message
    assert remedy in (error.hint or ""), error.render()
    assert "is it an opspatch ledger" not in error.render()


# ---------------------------------------------------------------------------------------------
# full


@pytest.mark.root
def test_a_new_ledger_on_a_full_filesystem_says_it_is_full(tiny_filesystem: Path) -> None:
    fill(tiny_filesystem)
    path = tiny_filesystem / "state" / "ledger.sqlite3"
    with pytest.raises(LedgerError) as caught:
        Ledger.open(path)
    assert_names(caught.value, path, FULL, "free space")


@pytest.mark.root
def test_an_existing_ledger_on_a_full_filesystem_says_it_is_full(tiny_filesystem: Path) -> None:
    # Closed cleanly, the ledger has no -wal/-shm files; opening must create them, and SQLite
    # reports that failure as "disk I/O error" (SQLITE_IOERR_SHMSIZE).
    path = tiny_filesystem / "ledger.sqlite3"
    with Ledger.open(path) as ledger:
        begin(ledger)
    assert sorted(p.name for p in tiny_filesystem.iterdir()) == ["ledger.sqlite3"]
    fill(tiny_filesystem)
    with pytest.raises(LedgerError) as caught:
        Ledger.open(path)
    assert_names(caught.value, path, FULL, "free space")


@pytest.mark.root
def test_a_write_that_fills_the_filesystem_says_so_and_loses_nothing(
    tiny_filesystem: Path,
) -> None:
    path = tiny_filesystem / "ledger.sqlite3"
    with Ledger.open(path) as ledger:
        run_id = begin(ledger)
        ledger.record_step(run_id, "gpu-01", "lock", "ok", 0.01)
        filler = fill(tiny_filesystem)
        big = ORIGINAL * 4000  # about 240 KB of pre-image on a full filesystem
        with pytest.raises(LedgerError) as caught:
            ledger.record_file_version(
                run_id,
                "gpu-01",
                path="/srv/eagle_worker_v2.py",
                sha256_before=sha(big),
                sha256_after=sha(ORIGINAL),
                mode=0o644,
                owner="root:root",
                pre_image=big,
            )
        assert_names(caught.value, path, FULL, "free space")
        assert caught.value.message.startswith(f"cannot write the ledger {path}")

        filler.unlink()  # space again: the run carries on, the failed write left nothing behind
        ledger.record_step(run_id, "gpu-01", "swap", "ok", 0.02)
        host = ledger.get_run(run_id).host("gpu-01")
        assert [s.step for s in host.steps] == ["lock", "swap"] and host.file_versions == ()
        assert ledger.verify().ok


@pytest.mark.root
def test_the_cli_tells_the_operator_the_filesystem_is_full(tiny_filesystem: Path) -> None:
    fill(tiny_filesystem)
    path = tiny_filesystem / "ledger.sqlite3"
    listed = opspatch("ledger", "list", env={"OPSPATCH_LEDGER": str(path)})
    assert listed.code == 3
    assert FULL in listed.stderr and str(path) in listed.stderr
    assert "Traceback" not in listed.stderr


# ---------------------------------------------------------------------------------------------
# read-only


@pytest.mark.root
def test_an_existing_ledger_on_a_read_only_filesystem_says_so(tiny_filesystem: Path) -> None:
    path = tiny_filesystem / "ledger.sqlite3"
    with Ledger.open(path) as ledger:
        begin(ledger)
    remount_read_only(tiny_filesystem)
    with pytest.raises(LedgerError) as caught:
        Ledger.open(path)
    assert_names(caught.value, path, READ_ONLY, "remount it read-write")


@pytest.mark.root
@pytest.mark.parametrize("name", ["ledger.sqlite3", "state/ledger.sqlite3"])
def test_a_new_ledger_on_a_read_only_filesystem_says_so(tiny_filesystem: Path, name: str) -> None:
    remount_read_only(tiny_filesystem)
    path = tiny_filesystem / name
    with pytest.raises(LedgerError) as caught:
        Ledger.open(path)
    assert_names(caught.value, path, READ_ONLY, "remount it read-write")


@pytest.mark.root
def test_a_read_only_ledger_can_be_read_but_a_write_says_read_only(
    tiny_filesystem: Path,
) -> None:
    # A controller killed mid-run leaves the -wal and -shm files behind; then the filesystem
    # went read-only. Reading works (ledger list, show, verify); writing says why it cannot.
    path = tiny_filesystem / "ledger.sqlite3"
    run_id = begin_and_die(path)
    assert {p.name for p in tiny_filesystem.iterdir()} >= {"ledger.sqlite3-wal"}
    remount_read_only(tiny_filesystem)
    with Ledger.open(path) as ledger:
        assert [r.run_id for r in ledger.list_runs()] == [run_id]
        assert ledger.verify().ok
        with pytest.raises(LedgerError) as caught:
            ledger.record_step(run_id, "gpu-01", "swap", "started")
    assert_names(caught.value, path, READ_ONLY, "remount it read-write")
    assert caught.value.message.startswith(f"cannot write the ledger {path}")


# ---------------------------------------------------------------------------------------------
# damaged


def damage_table(path: Path, table: str) -> None:
    """Overwrite the header of `table`'s root page in the (closed, checkpointed) ledger file, as
    a bad sector would: SQLite then calls the file malformed wherever it reads that table."""
    conn = sqlite3.connect(path)
    (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    assert not path.with_name(path.name + "-wal").exists()  # every page is in the file itself
    with path.open("r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(b"\xff" * 16)


def test_a_lease_write_on_a_damaged_ledger_is_the_ledgers_error_and_the_heartbeat_says_so(
    tmp_path: Path,
) -> None:
    """Taking, renewing and giving back leases run their own SQL inside the write transaction;
    SQLite's error there is a `LedgerError` naming the ledger (as an append's is), so a run's
    heartbeat says the ledger did not take the beat and goes on trying, instead of its thread
    dying of a `sqlite3.DatabaseError` while the run goes on as if it held its hosts."""
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path) as ledger:
        run_id = begin(ledger, hosts=("gpu-01",))
        ledger.take_leases(run_id, {"gpu-01": "m/gpu-01:/s"}, expires_after=60)
    damage_table(path, "leases")
    with Ledger.open(path) as ledger:
        head = ledger.verify()
        writes = (
            lambda: ledger.take_leases(run_id, {"gpu-01": "m/gpu-01:/s"}, expires_after=60),
            lambda: ledger.renew_leases(run_id),
            lambda: ledger.give_back_leases(run_id),
        )
        for write in writes:
            with pytest.raises(LedgerError) as caught:
                write()
            said = f"cannot write the ledger {path}: database disk image is malformed"
            assert caught.value.message == said
        assert ledger.verify() == head  # nothing was written: the history is as it was

        notices = Notices([])
        heartbeat = Heartbeat(LedgerRecorder(ledger, run_id), 0.3, notices, held=1).start()
        try:
            assert wait_until(lambda: heartbeat.lost is not None, timeout=30, interval=0.05)
        finally:
            heartbeat.stop()
    assert "the ledger did not take this run's lease heartbeat" in notices.said[0]
    assert "database disk image is malformed" in notices.said[0]
    assert "leases could not be renewed" in str(heartbeat.lost)
