"""How fast the ledger appends and verifies, on this machine's disk.

Every append is committed in a `BEGIN IMMEDIATE` transaction with `synchronous=FULL` before it
returns, which is the price of never forking the chain and never losing a committed event; with
`--threads`, hosts are recorded at once, as a fleet run's threads do, and a run's events queued
meanwhile share a transaction. This prints events per second for appends and for `verify()`, so
a change to either can be judged.

    python bench/bench_ledger.py [--runs 20] [--hosts 32] [--threads 1] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from opspatch.core.vocabulary import Command, Outcome, RunOutcome, Step, StepStatus
from opspatch.ledger.records import NewFileVersion
from opspatch.ledger.store import Ledger

STEPS = (Step.LOCK, Step.INSPECT, Step.SWAP, Step.RESTART, Step.READY, Step.SMOKE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument(
        "--threads", type=int, default=1, help="hosts recorded at once, each by its own thread"
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the ledger file goes")
    args = parser.parse_args()

    original = b"# eagle_worker_v2.py stand-in\n" * 4000  # about 120 KB, like the real file
    patched = original + b"spec_disable_batch_threshold = 0\n"
    before, after = hashlib.sha256(original).hexdigest(), hashlib.sha256(patched).hexdigest()
    hosts = [f"gpu-{i:03}" for i in range(args.hosts)]

    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        path = Path(scratch) / "ledger.sqlite3"
        with Ledger.open(path) as ledger:
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(args.runs):
                run_id = ledger.begin_run(
                    command=Command.APPLY,
                    patch_id="eagle-init-guard",
                    patch_sha256=None,
                    operator="bench@controller",
                    command_line="opspatch apply eagle-init-guard --hosts gpu-fleet",
                    hosts=hosts,
                )

                def one_host(host: str, run_id: str = run_id) -> None:
                    ledger.record_facts(run_id, host, {"python": "3.11.9", "sglang": "0.5.23"})
                    ledger.record_file_version(
                        run_id,
                        host,
                        NewFileVersion(
                            path="/opt/sglang/eagle_worker_v2.py",
                            sha256_before=before,
                            sha256_after=after,
                            mode=0o644,
                            owner="root:root",
                            pre_image=original,
                            post_image=patched,
                        ),
                    )
                    for step in STEPS:
                        ledger.record_step(run_id, host, step, StepStatus.OK, 0.1)
                    ledger.record_host_outcome(run_id, host, Outcome.APPLIED)

                with ThreadPoolExecutor(max_workers=args.threads) as pool:
                    list(pool.map(one_host, hosts))  # each host's records in order, as a run's
                ledger.finish_run(run_id, RunOutcome.OK)
            append_seconds = time.perf_counter() - started
            append_cpu = time.process_time() - cpu_started

            started = time.perf_counter()
            report = ledger.verify()
            verify_seconds = time.perf_counter() - started
        size = path.stat().st_size + sum(
            p.stat().st_size for p in path.parent.glob("ledger.sqlite3-*")
        )

    events = report.events_checked
    print(
        f"events appended: {events} in {append_seconds:.2f} s ({events / append_seconds:.0f}/s), "
        f"{append_cpu:.2f} s CPU, {args.threads} thread(s)"
    )
    print(
        f"verify: {events} events, {report.blobs_checked} blobs in {verify_seconds:.3f} s "
        f"({events / verify_seconds:.0f} events/s); ok={report.ok}"
    )
    print(f"ledger size: {size / 1e6:.1f} MB (identical pre-images are stored once)")


if __name__ == "__main__":
    main()
