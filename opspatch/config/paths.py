"""Where opspatch keeps its own state on the controller (XDG base directories).

- state: `$XDG_STATE_HOME/opspatch` (default `~/.local/state/opspatch`): the ledger, the sandbox
  fleet, backups beside nothing else.
- `OPSPATCH_STATE_DIR` overrides the whole state directory (tests use it to stay away from the
  user's own files); `OPSPATCH_LEDGER` overrides the ledger file alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The controller's state directory (not created here)."""
    env = os.environ if environ is None else environ
    if env.get("OPSPATCH_STATE_DIR"):
        return Path(env["OPSPATCH_STATE_DIR"]).expanduser()
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME", "~")) / ".local" / "state")
    return Path(base).expanduser() / "opspatch"


def default_ledger_path(environ: Mapping[str, str] | None = None) -> Path:
    """The ledger file: `OPSPATCH_LEDGER`, else `<state>/ledger.sqlite3`."""
    env = os.environ if environ is None else environ
    if env.get("OPSPATCH_LEDGER"):
        return Path(env["OPSPATCH_LEDGER"]).expanduser()
    return state_dir(env) / "ledger.sqlite3"


def sandbox_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where `opspatch sandbox up` builds its hosts."""
    return state_dir(environ) / "sandbox"
