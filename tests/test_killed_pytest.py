"""A pytest ended by SIGTERM (CI's timeout, `kill`) tears its fleets down as Ctrl-C does: a
child pytest holding a one-host sandbox fleet is sent SIGTERM and leaves no engine process.
Before, SIGTERM ended pytest at once, no fixture was torn down, and the fleet's engines (in
sessions of their own, as `sandbox up` starts them) kept running (tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.enginekit import tree_of
from tests.fleetkit import REPO, running, wait_until

pytestmark = pytest.mark.engine

CHILD_TEST = """
import os
import time
from pathlib import Path

import pytest

from tests.enginekit import tree_of
from tests.fleetkit import SandboxFleet


@pytest.fixture
def fleet(tmp_path):
    sandbox = SandboxFleet(tmp_path, 1).up()
    try:
        yield sandbox
    finally:
        sandbox.close()


def test_held_until_killed(fleet):
    pids = tree_of(fleet.pid(fleet.names[0]))
    Path(os.environ["ENGINE_PIDS"]).write_text(" ".join(map(str, pids)))
    time.sleep(600)
"""


def test_a_pytest_sent_sigterm_tears_its_fleet_down(tmp_path: Path) -> None:
    child = tmp_path / "child"
    child.mkdir()
    (child / "test_held.py").write_text(CHILD_TEST)
    # the repository's own SIGTERM handling, and nothing else of its conftest
    (child / "conftest.py").write_text("from tests.conftest import pytest_configure  # noqa\n")
    pids_file = tmp_path / "engine-pids"
    env = dict(os.environ, ENGINE_PIDS=str(pids_file))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    pytest_run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_held.py"],
        cwd=child,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert wait_until(lambda: pids_file.exists() or pytest_run.poll() is not None, 300)
        assert pids_file.exists(), pytest_run.communicate()[0]
        pids = [int(pid) for pid in pids_file.read_text().split()]
        assert pids and all(running(pid) for pid in pids), pids
        pytest_run.send_signal(signal.SIGTERM)
        said = pytest_run.communicate(timeout=300)[0]
        assert wait_until(lambda: not any(running(pid) for pid in pids), 60), [
            (pid, tree_of(pid)) for pid in pids if running(pid)
        ]
        assert "KeyboardInterrupt" in said, said  # ended as Ctrl-C ends it
    finally:
        if pytest_run.poll() is None:
            pytest_run.kill()
            pytest_run.wait()
        if pids_file.exists():  # what the test found left behind: no other test inherits it
            for pid in [int(pid) for pid in pids_file.read_text().split()]:
                if running(pid):
                    os.kill(pid, signal.SIGKILL)
