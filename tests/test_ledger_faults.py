"""A ledger on a full or read-only filesystem: the operator is told that, with the path and what to
do, not "disk I/O error ... is it an opspatch ledger? move it aside".

The filesystems are real: a tiny tmpfs (root ignores file permissions, a full or read-only
filesystem does not), filled with a file or remounted read-only, unmounted afterwards. A damaged
file is a real one with a page overwritten, as a bad sector leaves it: what SQLite says of it
reaches the caller as the ledger's error, never as sqlite3's.

A ledger deleted, moved or replaced under a writer (issue 42, item 12) stops it, its history
saved from the connection that still holds it; one made immutable (`chattr +i`, item 13, on a
folder of the real disk: tmpfs keeps no such attribute) is an error with a message, never the
bus error SQLite dies of when it writes the mapped `-shm` of an immutable file.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from opspatch.errors import LedgerError, LedgerLost
from opspatch.ledger import Ledger, NewFileVersion
from opspatch.runs.fleet.host_leases import Heartbeat
from opspatch.runs.fleet.recorder import Recorder as LedgerRecorder
from tests.clirunner import opspatch
from tests.fleetkit import wait_until
from tests.ledgerkit import ORIGINAL, Notices, begin, begin_and_die, sha

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
                NewFileVersion(
                    path="/srv/eagle_worker_v2.py",
                    sha256_before=sha(big),
                    sha256_after=sha(ORIGINAL),
                    mode=0o644,
                    owner="root:root",
                    pre_image=big,
                ),
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
    path = tiny_filesystem / "ledger.sqlite3"
    with Ledger.open(path) as ledger:  # a read never creates one: it must be there
        begin(ledger)
    fill(tiny_filesystem)
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


# ---------------------------------------------------------------------------------------------
# deleted, moved or replaced under a writer


@pytest.mark.parametrize("gone", [("",), ("", "-wal", "-shm")], ids=["file", "file-wal-shm"])
def test_a_ledger_deleted_under_a_writer_refuses_the_write_and_is_put_back(
    tmp_path: Path, gone: tuple[str, ...]
) -> None:
    """Before, the connection went on writing into the deleted file: every record of the run
    lost with it, and the next command created a new, empty ledger without a word."""
    path = tmp_path / "state" / "ledger.sqlite3"
    ledger = Ledger.open(path)
    assert ledger.created
    run_id = begin(ledger, hosts=("gpu-01",))
    ledger.record_step(run_id, "gpu-01", "lock", "ok", 0.01)
    for suffix in gone:
        Path(f"{path}{suffix}").unlink()
    with pytest.raises(LedgerLost) as caught:
        ledger.record_step(run_id, "gpu-01", "swap", "started")
    assert caught.value.exit_code == 3
    assert f"the ledger {path} was deleted or moved away while this process wrote" in str(
        caught.value
    )
    assert caught.value.rescued == str(path)
    with pytest.raises(LedgerLost):  # and so is every later use of it
        ledger.list_runs()
    ledger.close()
    assert sorted(p.name for p in path.parent.iterdir()) == ["ledger.sqlite3"]
    with Ledger.open(path) as back:
        assert not back.created and back.verify().ok
        assert [s.step for s in back.get_run(run_id).host("gpu-01").steps] == ["lock"]


def test_a_ledger_replaced_under_a_writer_is_left_alone_and_the_history_saved_beside_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger.open(path)
    run_id = begin(ledger, hosts=("gpu-01",))
    with Ledger.open(tmp_path / "other.sqlite3") as other:
        theirs = begin(other, hosts=("gpu-09",))
    os.replace(tmp_path / "other.sqlite3", path)
    with pytest.raises(LedgerLost) as caught:
        ledger.record_step(run_id, "gpu-01", "lock", "ok", 0.01)
    ledger.close()
    assert "was replaced by another file" in caught.value.message
    saved = Path(caught.value.rescued or "")
    assert saved.parent == tmp_path and saved.name.startswith("ledger.sqlite3.rescued-")
    with Ledger.open(path) as now:  # the replacement, untouched
        assert [r.run_id for r in now.list_runs()] == [theirs] and now.verify().ok
    with Ledger.open(saved) as kept:
        assert [r.run_id for r in kept.list_runs()] == [run_id] and kept.verify().ok


@pytest.mark.process
def test_a_write_ahead_log_without_its_ledger_is_never_taken_for_a_new_one(tmp_path: Path) -> None:
    """The ledger deleted while a controller had it open (killed since): a new ledger at the
    path would take the old log's pages for its own."""
    path = tmp_path / "ledger.sqlite3"
    run_id = begin_and_die(path)
    assert Path(f"{path}-wal").exists()
    path.unlink()
    with pytest.raises(LedgerLost) as caught:
        Ledger.open(path)
    assert f"its write-ahead log {path}-wal is there" in caught.value.message
    assert not path.exists()
    assert run_id


# ---------------------------------------------------------------------------------------------
# immutable (chattr +i)


@pytest.fixture
def real_disk_folder() -> Iterator[Path]:
    """A folder on a filesystem that keeps `chattr` attributes (not tmpfs), its attributes
    taken off again at the end whatever happened."""
    folder = Path(tempfile.mkdtemp(prefix="opspatch-chattr-", dir="/var/tmp"))
    probe = folder / "probe"
    probe.write_text("")
    tried = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, text=True)
    subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
    if tried.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"chattr +i is not possible here: {tried.stderr.strip() or 'no chattr'}")
    probe.unlink()
    try:
        yield folder
    finally:
        for entry in [folder, *folder.iterdir()]:
            subprocess.run(["chattr", "-i", "-a", str(entry)], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


IMMUTABLE_WRITER = textwrap.dedent(
    """
    import subprocess, sys
    from pathlib import Path
    from opspatch.errors import LedgerError
    from opspatch.ledger import Ledger
    path = Path(sys.argv[1])
    ledger = Ledger.open(path)
    run_id = ledger.begin_run(command="apply", patch_id="p", patch_sha256="ab" * 32,
                              operator="ops@controller", command_line="opspatch apply p",
                              hosts=["gpu-01"])
    frozen = [str(path), f"{path}-wal", f"{path}-shm", str(path.parent)]
    subprocess.run(["chattr", "+i", *frozen], check=True)
    for doing, call in (("write", lambda: ledger.record_step(run_id, "gpu-01", "swap", "started")),
                        ("read", ledger.list_runs)):
        try:
            call()
        except LedgerError as exc:
            print(doing, type(exc).__name__, exc.render(), flush=True)
        else:
            print(doing, "no error", flush=True)
    """
)


@pytest.mark.root
def test_an_immutable_ledger_is_an_error_with_a_message_not_a_bus_error(
    real_disk_folder: Path,
) -> None:
    """`chattr +i` on the ledger, its -wal and -shm and its folder while a run writes: before,
    the controller died of SIGBUS, with no message, part-way through a host."""
    path = real_disk_folder / "ledger.sqlite3"
    done = subprocess.run(
        [sys.executable, "-c", IMMUTABLE_WRITER, str(path)], capture_output=True, text=True
    )
    assert done.returncode != -signal.SIGBUS, "the writer died of a bus error"
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout
    assert f"write LedgerError cannot write the ledger {path}: {path}, {path}-wal, " in said
    assert "are immutable or append-only (chattr +i / +a)" in said
    assert f"`chattr -i -a {path} {path}-wal {path}-shm` lets opspatch write it again" in said
    assert "read LedgerError cannot read the ledger" in said
    listed = opspatch("ledger", "list", env={"OPSPATCH_LEDGER": str(path)})
    assert listed.code == 3 and "immutable" in listed.stderr, listed.stdout + listed.stderr
    assert "Traceback" not in listed.stderr
