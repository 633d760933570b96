"""`apply --live` of a function-body fix on the TP=2 stand-in (issue 34): a log line added at the
start of `Scheduler.finish` (a method every rank runs for every finished request) is taken by both
scheduler ranks of the running engine; the smoke decode after it then writes that line into the
log under `TP0` and `TP1`, and no pid of the engine changed: no restart.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.policy import BatchSize, Playbook
from opspatch.hosts.liveplugin import socket_paths
from opspatch.hosts.operations import open_transport
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.fleet.liveapply import live_former
from tests.enginekit import (  # noqa: F401
    ALL_SOCKETS,
    TP2,
    host,
    inventory_host,
    live_dir,
    tree_of,
    wait_for_sockets,
)
from tests.standin import StandinHost, running_engine

pytestmark = pytest.mark.engine

MARK = "opspatch-test: scheduler finished"
BODY_FIX = f'''
id = "scheduler-finish-log-test"
summary = "Log every request the scheduler finishes"
preserves_output = true
rationale = "a body-only change of a method the running engine calls per request"

[target]
module = "sglang.srt.managers.scheduler"
distribution = "sglang"
versions = "==0.5.23"
min_python = "3.10"

[[edits]]
kind = "insert"
scope = "Scheduler.finish"
position = "start"
code = """
logger.info(f"{MARK} {{req.rid}}")
"""
'''


def test_a_log_line_added_live_shows_in_every_ranks_log_with_no_pid_changed(
    host: StandinHost,  # noqa: F811
    live_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    patch_file = tmp_path / "scheduler-finish-log-test.toml"
    patch_file.write_text(BODY_FIX)
    scheduler = host.module_file("sglang.srt.managers.scheduler")
    pristine = scheduler.read_bytes()
    env = {socket_paths.LIVE_DIR_ENV: str(live_dir)}
    ledger = Ledger.open(tmp_path / "ledger.sqlite3")
    try:
        with running_engine(
            host, (*TP2, "--disable-cuda-graph"), env=env, log_name="body.log"
        ) as engine:
            wait_for_sockets(live_dir, engine, ALL_SOCKETS)
            pids = set(tree_of(engine.pid))
            assert MARK not in engine.log_text()
            report = apply_to_hosts(
                load_patch(patch_file),
                [inventory_host(host, engine, live_dir)],
                Playbook(canary=0, batch=BatchSize(count=1), max_failures=1),
                factory=open_transport,
                ledger=ledger,
                live=live_former,
            )
            (outcome,) = report.hosts
            assert outcome.outcome == "applied", (outcome, engine.log_text())
            steps = [str(s.step) for s in outcome.steps]
            assert "restart" not in steps and steps[-2:] == ["live", "smoke"], steps
            ranks = set(re.findall(rf"\[[^\]]* (TP\d)\] {re.escape(MARK)} ", engine.log_text()))
            assert ranks == {"TP0", "TP1"}, engine.log_text()[-3000:]
            assert set(tree_of(engine.pid)) == pids  # no process restarted
    finally:
        ledger.close()
        scheduler.write_bytes(pristine)
