"""Where opspatch keeps its own state on the controller (XDG base directories)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from opspatch.core.ledgerlocation import LedgerLocation, ledger_location


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The controller's state directory (not created here)."""
    env = os.environ if environ is None else environ
    if env.get("OPSPATCH_STATE_DIR"):
        return Path(env["OPSPATCH_STATE_DIR"]).expanduser()
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME", "~")) / ".local" / "state")
    return Path(base).expanduser() / "opspatch"


def default_ledger_location(environ: Mapping[str, str] | None = None) -> LedgerLocation:
    """The ledger: `OPSPATCH_LEDGER` (a file or a `postgresql://` URL), else
    `<state>/ledger.sqlite3`.

    Raises:
        InputError: `OPSPATCH_LEDGER` is a URL that carries a password.
    """
    env = os.environ if environ is None else environ
    if env.get("OPSPATCH_LEDGER"):
        return ledger_location(env["OPSPATCH_LEDGER"], given_by="OPSPATCH_LEDGER")
    return state_dir(env) / "ledger.sqlite3"


def sandbox_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where `opspatch sandbox up` builds its hosts."""
    return state_dir(environ) / "sandbox"
