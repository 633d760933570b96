"""The agent's entry point: `main(request)` runs a list of operations and prints their replies."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING, NoReturn

# The operations' modules are not imported here: the controller sends an exec only the modules
# its operation needs (`opspatch.hosts.channel.modules_for`), each registering its operations.
from opspatch.hosts.agent.fsutil import user_name
from opspatch.hosts.agent.protocol import OPERATIONS, OpFailure, operation

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import (
        AgentReply,
        AgentRequest,
        Args,
        NoArgs,
        OperationCall,
        OperationReply,
        Receipt,
        SentRequest,
        WhoamiReply,
    )


def identity() -> WhoamiReply:
    """Who this agent runs as: its effective user (name and uid)."""
    uid = os.geteuid()
    return {"user": user_name(uid) or str(uid), "uid": uid}


@operation("whoami")
def op_whoami(args: NoArgs) -> WhoamiReply:
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


def perform(name: str, args: Args) -> OperationReply:
    """Run one operation here: its result, or its refusal (an unexpected exception is refused as
    `agent-error`, with its traceback: a bug or a host state nobody planned for, not hidden)."""
    try:
        handler = OPERATIONS.get(name)
        if handler is None:
            raise OpFailure(
                "unknown-operation",
                f"this agent has no operation {name!r}",
                {"known": sorted(OPERATIONS)},
            )
        return {"status": "done", "result": handler(args)}
    except OpFailure as failure:
        return refused(failure)
    except Exception as exc:
        import traceback  # only here: it imports textwrap, whose patterns compile at import

        return {
            "status": "refused",
            "code": "agent-error",
            "message": f"{type(exc).__name__}: {exc}",
            "data": {"traceback": traceback.format_exc()[-4000:]},
        }


def refused(failure: OpFailure) -> OperationReply:
    return {
        "status": "refused",
        "code": failure.code,
        "message": failure.message,
        "data": failure.data,
    }


def not_run() -> OperationReply:
    """The reply of an operation an earlier one stopped: nothing of it was attempted."""
    return {"status": "not-run"}


def run_batch(
    calls: Sequence[OperationCall], perform: Callable[[str, Args], OperationReply]
) -> list[OperationReply]:
    """Each call's reply, in order: the first refusal, or a gate whose result is not `ok`, stops
    the batch and every later call is `not-run` (nothing of it is attempted). `perform` runs one
    operation (the agent's own here; a test double's in `transport.scripted`)."""
    replies: list[OperationReply] = []
    stopped = False
    for call in calls:
        if stopped:
            replies.append(not_run())
            continue
        reply = perform(str(call["op"]), call.get("args") or {})
        replies.append(reply)
        result = reply.get("result")
        passed = isinstance(result, dict) and result.get("ok") is True
        stopped = reply["status"] != "done" or (bool(call.get("gate")) and not passed)
    return replies


def apply_env(request: SentRequest) -> None:
    """The engine's environment a raised request carries (sudo resets it), applied first, so a
    start command and the bytecode cache folder see it."""
    os.environ.update(request.get("env") or {})
    sys.pycache_prefix = os.environ.get("PYTHONPYCACHEPREFIX", sys.pycache_prefix)


def main(request: SentRequest) -> int:
    """One exec (`BOOTSTRAP`): run the request's operations and print their replies as one JSON
    line; the exit status is 0 even for refusals (the replies say what happened), non-zero only
    if no reply could be written."""
    apply_env(request)
    return answer(request, _reply_stream())


def answer(request: AgentRequest, reply_to: IO[str]) -> int:
    """Run the request's operations and write their reply line to `reply_to`."""
    calls = list(request.get("ops") or [])
    try:
        _enter_engine_workdir(request.get("cwd"))
    except OpFailure as failure:  # nothing can run where the server does not import from
        replies = [refused(failure)] + [not_run() for _ in calls[1:]]
    else:
        replies = run_batch(calls, perform)
    reply: AgentReply = {"replies": replies, "identity": identity()}
    reply_to.write(json.dumps(reply, sort_keys=True) + "\n")
    reply_to.flush()
    return 0


def serve(request: SentRequest, load: Callable[[SentRequest], object]) -> int:
    """The resident agent (`RESIDENT`): answer `request`, then each request line that follows
    on stdin (`load` registers the agent modules a line carries) until stdin ends.

    Each request is taken (a `Receipt` line) and run by a fork, which ends as an exec's
    interpreter would (its exit handlers run: `_answer_in_fork`); its reply is passed on once it
    ended, so a reply still means the request's process is gone. A fork that
    ends without a reply ends this agent with its exit status, as an exec that gave none would.
    """
    reply_to = _reply_stream()
    while True:
        receipt: Receipt = {"taken": int(request.get("seq") or 0)}
        reply_to.write(json.dumps(receipt) + "\n")
        reply_to.flush()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the request's own process: nothing it runs reads the request stream
            os.close(read_end)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            _answer_in_fork(request, os.fdopen(write_end, "w"))
        os.close(write_end)
        with os.fdopen(read_end, "r") as replies:
            reply = replies.read()
        code = _exit_code(os.waitpid(pid, 0)[1])
        if not reply.endswith("\n"):  # none, or cut short: no reply, as an exec's end says
            return code or 1
        reply_to.write(reply)
        reply_to.flush()
        line = sys.stdin.buffer.readline()
        if not line:
            return 0  # the controller closed the channel: the run is over
        request = json.loads(line)
        load(request)


def _answer_in_fork(request: SentRequest, reply_to: IO[str]) -> NoReturn:
    """Answer `request` and end the fork as an exec's interpreter ends (its exit handlers run,
    its output flushed, an exception printed and exit 1), without the interpreter's teardown,
    which walks every object the fork shares with the agent (15 ms a request, copying pages)."""
    code = 1
    try:
        apply_env(request)
        code = answer(request, reply_to)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _exit_code(status: int) -> int:
    """A wait status as the shell says it: the exit code, or 128 + the signal that ended it."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
