"""Writes `ledger_v1.sql` and `ledger_v1_cli.json`, the golden ledger of tests/test_ledger_golden.py.

Provenance matters more than the script: the committed files were written by the ledger code of
commit 9fb2838 (before the ledger package was split into store/records/chain/liveness), so the
test proves that a ledger written by that code still verifies and still prints the same JSON.
Re-running this script with later code writes a new ledger (new ids, times and pids); do that only
on purpose, for a new schema version.

    PYTHONPATH=$PWD python3 tests/data/make_ledger_v1.py
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from opspatch.core.filechange import FileChange
from opspatch.ledger import NewFileVersion
from opspatch.ledger.store import Ledger

HERE = Path(__file__).resolve().parent
ORIGINAL = "class EAGLEWorkerV2:\n    def __init__(self):\n        pass  # é ✓\n".encode()
PATCHED = "class EAGLEWorkerV2:\n    def __init__(self):\n        self.x = 0  # é ✓\n".encode()
TARGET = "/srv/sglang/srt/speculative/eagle_worker_v2.py"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(ledger: Ledger) -> list[str]:
    apply_run = ledger.begin_run(
        command="apply",
        patch_id="eagle-init-guard",
        patch_sha256="ab" * 32,
        operator="ops@controller",
        command_line="opspatch apply eagle-init-guard --hosts gpu-fleet --yes",
        hosts=["gpu-01", "gpu-02"],
        playbook="canary",
    )
    for host in ("gpu-01", "gpu-02"):
        ledger.record_facts(
            apply_run,
            host,
            {"python": "3.11.9", "sglang": "0.5.23", "gpus": ["H200"], "note": "naïve ✓"},
        )
        ledger.record_step(apply_run, host, "lock", "started")
        ledger.record_step(apply_run, host, "lock", "ok", 0.02, "held until 02:50Z")
        ledger.record_file_version(
            apply_run,
            host,
            NewFileVersion(
                path=TARGET,
                sha256_before=sha(ORIGINAL),
                sha256_after=sha(PATCHED),
                mode=0o644,
                owner="root:root",
                pre_image=ORIGINAL,
                post_image=PATCHED,
            ),
        )
        ledger.record_step(apply_run, host, "swap", "ok", 0.05, "renamed over the target")
    ledger.record_step(apply_run, "gpu-01", "smoke", "ok", 1.5)
    file_01 = FileChange(TARGET, sha(ORIGINAL), sha(PATCHED))
    ledger.record_host_outcome(apply_run, "gpu-01", "applied", file=file_01)
    ledger.record_step(
        apply_run, "gpu-02", "smoke", "failed", 2.5, 'Traceback in the log:\n  "quoted"\tline'
    )
    ledger.record_file_version(
        apply_run,
        "gpu-02",
        NewFileVersion(
            path=TARGET,
            sha256_before=sha(PATCHED),
            sha256_after=sha(ORIGINAL),
            mode=0o644,
            owner="root:root",
            pre_image=PATCHED,
            action="restore",
        ),
    )
    ledger.record_host_outcome(apply_run, "gpu-02", "rolled-back", error="smoke failed")
    ledger.finish_run(apply_run, "failed")

    rollback = ledger.begin_run(
        command="rollback",
        patch_id="eagle-init-guard",
        patch_sha256="ab" * 32,
        operator="ops@controller",
        command_line="opspatch rollback eagle-init-guard --hosts gpu-01",
        hosts=["gpu-01"],
        parent_run=apply_run,
    )
    ledger.record_step(rollback, "gpu-01", "restore", "ok", None)
    ledger.record_file_version(
        rollback,
        "gpu-01",
        NewFileVersion(
            path=TARGET,
            sha256_before=sha(PATCHED),
            sha256_after=sha(ORIGINAL),
            mode=0o644,
            owner="root:root",
            pre_image=PATCHED,
            post_image=ORIGINAL,
            action="restore",
        ),
    )
    ledger.record_host_outcome(rollback, "gpu-01", "restored", file=file_01)
    ledger.finish_run(rollback, "ok")
    return [apply_run, rollback]


def cli(ledger_path: Path, *args: str) -> object:
    env = {**os.environ, "OPSPATCH_LEDGER": str(ledger_path), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "opspatch.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(done.stdout)


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "ledger.sqlite3"
        with Ledger.open(path) as ledger:
            run_ids = write(ledger)
            head = ledger.verify().head_hash
        con = sqlite3.connect(str(path))
        dump = "\n".join(con.iterdump()) + "\n"
        con.close()
        golden = {
            "written_by": "opspatch ledger code at commit 9fb2838",
            "run_ids": run_ids,
            "head_hash": head,
            "ledger_list": cli(path, "ledger", "list", "--json"),
            "ledger_show": {r: cli(path, "ledger", "show", r, "--json") for r in run_ids},
            "ledger_verify": cli(path, "ledger", "verify", "--json"),
        }
    (HERE / "ledger_v1.sql").write_text(dump, encoding="utf-8")
    (HERE / "ledger_v1_cli.json").write_text(
        json.dumps(golden, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    main()
