"""The agent's entry point: `main(request)` runs one operation and prints its reply.

The bootstrap (`opspatch.hosts.channel.BOOTSTRAP`) registers the agent modules sent and calls this
module's `main`, which prints exactly one JSON line on the original stdout:

    {"ok": true, "result": {...}, "as": {"user": "ops", "uid": 1000}}
    {"ok": false, "code": "preimage-mismatch", "message": "...", "data": {...}, "as": {...}}

`as` says who ran the operation (the effective user: the login user, or the one sudo raised to),
so every step's record can say it.

Anything else the process prints (an import warning, a library's banner) is sent to stderr, so the
reply line cannot be corrupted.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import IO, TYPE_CHECKING, Any

# The operations' modules are not imported here: the controller sends an exec only the modules
# its operation needs (`opspatch.hosts.channel.modules_for`), each registering its operations.
from opspatch.hosts.agent.fsutil import user_name
from opspatch.hosts.agent.protocol import OPERATIONS, OpFailure, operation

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import Args, Result


def identity() -> Result:
    """Who this agent runs as: its effective user (name and uid)."""
    uid = os.geteuid()
    return {"user": user_name(uid) or str(uid), "uid": uid}


@operation("whoami")
def op_whoami(args: Args) -> Result:
    """Who runs the agent: how the controller proves sudo lets it raise to a user, before any
    change is made (`become`)."""
    return identity()


def _reply_stream() -> IO[str]:
    """Keep the real stdout for the reply and send everything else printed to stderr."""
    sys.stdout.flush()
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(reply_fd, "w")


def _enter_engine_workdir(cwd: str | None) -> None:
    """Import from where the server imports. `python -c` puts the current folder first on
    sys.path, as `python -m sglang.launch_server` does in the server's folder; over SSH the
    current folder is the login's home, which the server never sees. So: work in the server's
    folder when the inventory names one, else drop the current folder from sys.path."""
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            raise OpFailure("bad-workdir", f"cannot enter {cwd}: {exc.strerror}") from None
    else:
        sys.path[:] = [entry for entry in sys.path if entry not in ("", ".")]


def main(request: dict[str, Any]) -> int:
    """Run one operation and print its reply as one JSON line; the exit status is 0 even for
    refusals (the reply says what happened), non-zero only if no reply could be written."""
    reply_to = _reply_stream()
    try:
        name = request.get("op")
        handler = OPERATIONS.get(str(name))
        if handler is None:
            raise OpFailure(
                "unknown-operation",
                f"this agent has no operation {name!r}",
                {"known": sorted(OPERATIONS)},
            )
        _enter_engine_workdir(request.get("cwd"))
        reply: dict[str, Any] = {"ok": True, "result": handler(request.get("args") or {})}
    except OpFailure as failure:
        reply = {
            "ok": False,
            "code": failure.code,
            "message": failure.message,
            "data": failure.data,
        }
    except Exception as exc:  # a bug or an unexpected host state: report it, do not hide it
        reply = {
            "ok": False,
            "code": "agent-error",
            "message": f"{type(exc).__name__}: {exc}",
            "data": {"traceback": traceback.format_exc()[-4000:]},
        }
    reply["as"] = identity()
    reply_to.write(json.dumps(reply, sort_keys=True) + "\n")
    reply_to.flush()
    return 0
