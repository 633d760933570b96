"""Shared fixtures. Every test runs with its own HOME and state directory, so nothing here can
read or write the user's own `~/.ssh`, ledger or sandbox."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

import pytest

# The test tiers' markers and the check that a test starts no resource its markers do not name;
# real OpenSSH sshd processes on 127.0.0.2-4 for the transport and remote-operation tests; a
# throwaway PostgreSQL server (socket only) for the ledger tests on PostgreSQL; pytester for the
# test of the tiers' check (tests/test_tiers.py).
pytest_plugins = ["tests.tiers", "tests.sshfleet", "tests.pgkit", "pytester"]

# The kits' asserts explain a failure as a test module's do (pytest rewrites only test modules,
# conftest files and plugins unless told): helpers moved into a kit fail as they did before.
KITS = [p.stem for p in Path(__file__).parent.glob("*kit.py") if not p.stem.startswith("test_")]
pytest.register_assert_rewrite(*(f"tests.{kit}" for kit in KITS))


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"pytest got signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM ends pytest as Ctrl-C does, with every fixture torn down: by default it ends the
    process at once, and the engines a fleet fixture started (in sessions of their own, as
    `sandbox up` starts them) kept running (tests/test_killed_pytest.py)."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupted)


@pytest.fixture(autouse=True)
def isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.delenv("OPSPATCH_STATE_DIR", raising=False)
    monkeypatch.delenv("OPSPATCH_LEDGER", raising=False)
    monkeypatch.delenv("OPSPATCH_HOME", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    # nor the terminal's size pytest was started from (an xdist worker is told 80 x 24): the
    # tables a test reads are as wide as the test says
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    return home
