"""The rehearsal's teardown, on real processes: whatever the rehearsal left running in its folder
(a server started while the sandbox was being stopped, say) is stopped by pid, and the folder is
removed, with or without a sandbox in it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from opspatch.hosts.agent.processes import alive
from opspatch.sandbox.layout import SandboxLayout
from opspatch.sandbox.rehearse import ENGINE_TEMP_ROOM, engines_temp_in, tear_down

pytestmark = pytest.mark.process


def _orphan_in(folder: Path) -> int:
    """A process working in `folder` that is no child of the test (as an engine the host agent
    started is no child of the controller)."""
    folder.mkdir(parents=True)
    done = subprocess.run(
        ["/bin/sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.strip())


def test_a_process_left_working_in_the_folder_is_stopped_and_the_folder_removed(
    tmp_path: Path,
) -> None:
    root = tmp_path / "opspatch-rehearse-x"
    pid = _orphan_in(root / "state" / "sandbox" / "hosts" / "sandbox-01")
    lines: list[str] = []
    try:
        teardown = tear_down(SandboxLayout(root / "state"), root, lines.append)
    finally:
        if alive(pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
    assert pid in teardown.stopped and not alive(pid)
    assert teardown.removed and not root.exists() and teardown.problem is None
    assert teardown.folder == str(root)
    assert lines == [f"stopping the rehearsal's servers and removing {root} (Ctrl-C waits for it)"]


def test_an_empty_rehearsal_folder_is_removed_with_nothing_to_stop(tmp_path: Path) -> None:
    root = tmp_path / "opspatch-rehearse-y"
    (root / "tmp").mkdir(parents=True)
    teardown = tear_down(SandboxLayout(root / "state"), root)
    assert (teardown.stopped, teardown.removed, teardown.problem) == ((), True, None)


def test_the_engines_temporary_files_go_to_the_folder_only_where_a_socket_path_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", "/operator/tmp")
    short = tmp_path / "t"
    with engines_temp_in(short):
        assert os.environ["TMPDIR"] == str(short) and short.is_dir()
    assert os.environ["TMPDIR"] == "/operator/tmp"
    long = tmp_path / ("x" * ENGINE_TEMP_ROOM)
    with engines_temp_in(long):
        assert os.environ["TMPDIR"] == "/operator/tmp" and not long.exists()
