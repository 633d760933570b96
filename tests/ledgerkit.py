"""Helpers for the ledger tests: a scripted two-host run, a run whose controller is SIGKILLed, and
a raw connection that goes behind opspatch's back (SQLite, or PostgreSQL as the tables' owner),
and `Notices`, a progress that keeps what a run tells its operator."""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opspatch.core.filechange import FileChange
from opspatch.core.ledgerlocation import PostgresLedger
from opspatch.ledger import Ledger, NewFileVersion
from tests.pgkit import PostgresTamper, as_owner

PATCH_SHA = "ab" * 32
ORIGINAL = b"class EAGLEWorkerV2:\n    def __init__(self):\n        pass\n"
PATCHED = b"class EAGLEWorkerV2:\n    def __init__(self):\n        self.x = 0\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def begin(ledger: Ledger, hosts: tuple[str, ...] = ("gpu-01", "gpu-02"), **kw: object) -> str:
    args: dict[str, object] = {
        "command": "apply",
        "patch_id": "eagle-init-guard",
        "patch_sha256": PATCH_SHA,
        "operator": "ops@controller",
        "command_line": "opspatch apply eagle-init-guard --hosts gpu-fleet",
        "hosts": hosts,
        "playbook": "default",
    }
    args.update(kw)
    return ledger.begin_run(**args)  # type: ignore[arg-type]


def record_patch(
    ledger: Ledger, run_id: str, host: str, path: str = "/srv/eagle_worker_v2.py"
) -> None:
    ledger.record_file_version(
        run_id,
        host,
        NewFileVersion(
            path=path,
            sha256_before=sha(ORIGINAL),
            sha256_after=sha(PATCHED),
            mode=0o644,
            owner="root:root",
            pre_image=ORIGINAL,
            post_image=PATCHED,
        ),
    )


def full_run(ledger: Ledger) -> str:
    """A finished two-host apply run: one host applied, one rolled back within the run."""
    run_id = begin(ledger)
    for host in ("gpu-01", "gpu-02"):
        ledger.record_facts(run_id, host, {"python": "3.11.9", "sglang": "0.5.23", "gpus": []})
        ledger.record_step(run_id, host, "lock", "ok", 0.02)
        record_patch(ledger, run_id, host)
        ledger.record_step(run_id, host, "swap", "ok", 0.05, "renamed over the target")
    ledger.record_step(run_id, "gpu-01", "smoke", "ok", 1.5)
    ledger.record_host_outcome(
        run_id,
        "gpu-01",
        "applied",
        file=FileChange("/srv/eagle_worker_v2.py", sha(ORIGINAL), sha(PATCHED)),
    )
    ledger.record_step(run_id, "gpu-02", "smoke", "failed", 2.5, "Traceback in the log")
    ledger.record_file_version(
        run_id,
        "gpu-02",
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
    ledger.record_host_outcome(run_id, "gpu-02", "rolled-back", error="smoke failed")
    ledger.finish_run(run_id, "failed")
    return run_id


def raw(path: Path | PostgresLedger) -> Any:
    """A connection that goes behind opspatch's back (the tamperer's tool): a sqlite3 connection
    to the file, or the owner's connection to the PostgreSQL ledger."""
    if isinstance(path, PostgresLedger):
        return PostgresTamper(as_owner(path))
    return sqlite3.connect(str(path), isolation_level=None)


def drop_triggers(conn: Any) -> None:
    """Take the append-only triggers out of the tamperer's way."""
    if isinstance(conn, PostgresTamper):
        conn.disable_triggers()
        return
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")]
    for name in names:
        conn.execute(f"DROP TRIGGER {name}")


def begin_and_die(path: Path | PostgresLedger, **begin_args: object) -> str:
    """Begin a run in a child process that is then SIGKILLed: its run is left interrupted.

    `begin_args` override those of `begin()` (for example `command="recover", parent_run=...`);
    the child records a `lock` step on each host first. Returns the run id.
    """
    script = textwrap.dedent(
        """
        import json, os, signal, sys
        from opspatch.core.ledgerlocation import ledger_location
        from opspatch.ledger import Ledger
        args = json.loads(sys.argv[2])
        ledger = Ledger.open(ledger_location(sys.argv[1]))
        run_id = ledger.begin_run(**args)
        for host in args["hosts"]:
            ledger.record_step(run_id, host, "lock", "ok", 0.01)
        print(run_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    args: dict[str, object] = {
        "command": "apply",
        "patch_id": "eagle-init-guard",
        "patch_sha256": PATCH_SHA,
        "operator": "ops@controller",
        "command_line": "opspatch apply eagle-init-guard --hosts gpu-fleet",
        "hosts": ["gpu-01", "gpu-02"],
    }
    args.update(begin_args)
    done = subprocess.run(
        [sys.executable, "-c", script, str(path), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.stdout.strip()


@dataclass
class Notices:
    """A Progress that keeps what the run says to its operator."""

    said: list[str]

    def run_started(self, run_id: str, summary: str) -> None:
        return None

    def update(self, host: str, step: str, status: str) -> None:
        return None

    def notice(self, text: str) -> None:
        self.said.append(text)
