"""The error tree of opspatch, drawn once; exit codes are mapped here and nowhere else.

```
OpspatchError                      base; carries a one-line message and optional hint
├── InputError                     exit 2: bad input, configuration or usage; nothing changed
│   ├── SpecError                  a patch, inventory or playbook file is wrong (file:line, field)
│   ├── AnchorError                an anchor matches nothing (nearest candidates) or several places
│   ├── TargetError                the file is not the patch's module / outside its version range
│   ├── SelectionError             --hosts names an unknown host or group (near names suggested)
│   ├── HostKeyError               unknown or changed SSH host key (fingerprint shown)
│   ├── BecomeError                sudo cannot raise privileges on a host (missing, password, denied)
│   ├── ConfirmationRequired       a change needs --yes (no terminal to ask on)
│   ├── RouterRefused              a router cannot be used before any change (unreachable, key,
│   │                              unknown worker URL, no capacity to drain)
│   ├── LeaseHeld                  a live lease of another run holds the hosts (its operator,
│   │                              controller machine and run named)
│   ├── ApprovalRefused            an apply needing a second operator's signature has no valid one
│   ├── LiveRefused                a live fix cannot be taken on a host (its inventory does not
│   │   │                          say `live = true`, its engine does not listen for live fixes)
│   │   └── PeerNotAllowed         its engine listens but refuses the agent's user
│   └── IndexUnreachable           the package index cannot be reached to build a real engine's
│                                  environment (the index named; what is cached is kept)
├── HostError                      exit 1: one host failed; carries host and step
│   ├── TransportError             connecting or running a command failed
│   │   ├── CommandTimeout         a remote command passed its deadline (process group ended)
│   │   └── ContainerError         the engine's container is missing, stopped, recreated, or the
│   │                              runtime is missing or not allowed (the runtime's own words)
│   ├── RemoteOperationError       a host-side operation refused or failed (its `code` says why)
│   │   ├── PreimageMismatch       the file is not the bytes the plan was made from
│   │   └── LockHeld               another run holds the host's lock (owner, run id, expiry)
│   ├── EngineError                restart, readiness or smoke decode failed
│   └── RouterError                a router's control plane or a worker's load report failed
├── LedgerError                    exit 3: the ledger cannot be trusted or written
│   ├── LedgerIntegrityError       the hash chain is broken (first broken link named)
│   ├── LedgerUnreachable          its server went away part-way (a restart, a network cut): a
│   │                              run's write is tried again within its lease expiry
│   ├── LedgerLost                 the ledger was deleted, moved or replaced while in use (a file
│   │                              unlinked or swapped, a database recreated or restored): the
│   │                              run stops before its next change
│   └── LedgerConfigError          exit 2: the ledger cannot be used as given, found when it is
│                                  opened or migrated, before anything changed (its server
│                                  unreachable or refusing, no or another schema, a file that
│                                  is no ledger, migrate as a role that is not the owner)
└── NeedsAttention                 exit 3: a host is in an unknown state (a restore failed)
    └── RunInterrupted             a second Ctrl-C: the run stopped waiting for hosts in flight
```

Why a tree: the CLI catches `OpspatchError` once (`exit_code_for`); below it, each failure raises
its most specific type with its context, so the message names file, line, field, host and step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

EXIT_OK = 0
EXIT_HOST_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NEEDS_ATTENTION = 3
EXIT_INTERRUPTED = 130
"""A Ctrl-C outside a run's own handling (a run answers its own: docs/cli.md): 128 + SIGINT,
as a shell reports a command stopped by Ctrl-C."""


class OpspatchError(Exception):
    """Base of every error opspatch raises on purpose.

    `message` is one sentence saying what is wrong; `hint` says what to do about it.
    """

    exit_code: int = EXIT_BAD_INPUT

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        """The text shown to an operator: the message, then the hint on its own line."""
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"

    def to_json(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint}


# ---------------------------------------------------------------------------------------------
# exit 2: bad input, nothing changed


class InputError(OpspatchError):
    """Bad input, configuration or usage; raised before anything is changed."""

    exit_code = EXIT_BAD_INPUT


@dataclass(frozen=True)
class Location:
    """Where in an input file a problem is: file, 1-based line (0 = unknown) and field path."""

    file: str
    line: int = 0
    field: str = ""

    def __str__(self) -> str:
        where = self.file if not self.line else f"{self.file}:{self.line}"
        return f"{where}: {self.field}" if self.field else where


class SpecError(InputError):
    """A patch, inventory or playbook file is malformed; names the file, line and field."""

    def __init__(self, location: Location, problem: str, *, hint: str | None = None) -> None:
        super().__init__(f"{location}: {problem}", hint=hint)
        self.location = location
        self.problem = problem


class AnchorError(InputError):
    """An anchor matched nothing or more than one place.

    `candidates` are the nearest names (no match) or every match with its line (several).
    """

    def __init__(
        self, message: str, *, candidates: Sequence[str] = (), hint: str | None = None
    ) -> None:
        if candidates:
            message = message + "\n" + "\n".join(f"    {c}" for c in candidates)
        super().__init__(message, hint=hint)
        self.candidates = tuple(candidates)


class TargetError(InputError):
    """The file is not the patch's target (wrong module, version outside the range)."""


class SelectionError(InputError):
    """A host selection (`--hosts`) names something the inventory does not have."""


class HostKeyError(InputError):
    """An SSH host key is unknown or `changed`; nothing was run on the host."""

    def __init__(
        self,
        message: str,
        *,
        host: str,
        fingerprint: str,
        changed: bool = False,
        hint: str | None = None,
    ):
        super().__init__(message, hint=hint)
        self.host = host
        self.fingerprint = fingerprint
        self.changed = changed


class BecomeError(InputError):
    """Privileges cannot be raised on a host: sudo is not installed, needs a password that is not
    available or was refused, denies the command, or requires a terminal. Nothing ran there as
    the other user. `reason` is the host's report code (`core/reasons.py`): `sudo-missing`,
    `password-missing`, `password-malformed`, `password-rejected`, `sudo-denied`, `requiretty`, `become-user-unknown`,
    `interpreter-missing`, `become-refused` (sudo's words say none of those)."""

    def __init__(self, message: str, *, host: str, reason: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.host = host
        self.reason = reason


class ConfirmationRequired(InputError):
    """A command that changes hosts was run without a terminal and without --yes."""


class RouterRefused(InputError):
    """A router in front of the selected hosts cannot be used, found before anything changed:
    it does not answer or refuses the admin call, does not know a worker URL, or draining would
    take more workers out of rotation than the playbook allows."""


class LeaseHeld(InputError):
    """A live lease of another run holds hosts this run needs (another operator's run heart-beats
    on them): refused before any change, naming that run's operator, controller and run."""


class UnitRefused(InputError):
    """A command would change or restart part of a multi-node server (a unit, docs/inventory.md
    "Units") alone, or restart its nodes one by one, or patch nodes that are not alike: refused
    before any change, naming the unit, its nodes and what works."""


class ApprovalRefused(InputError):
    """The playbook asks for a second operator's signature of the patch and none that verifies
    is recorded (none at all, none allowed_signers accepts, or only the author's)."""


class LiveRefused(InputError):
    """A live fix cannot be taken (or the plugin installed) on a host: its inventory does not say
    `live = true`, or its engine does not listen for live fixes (the plugin not installed or not
    loaded, `SGLANG_PLUGINS` without it). Nothing was changed."""


class NotTakenLive(LiveRefused):
    """`apply --live` of a change whose live form is refused (`core/live.py`: changed free
    variables, a restart-only module, changed defaults or decorators) or whose take the engine's
    `check` says would not be in effect (objects already built, a value read at import, a frame
    that never returns): the run is refused in preflight, since one who asked for no restart
    must not get one, nor an "applied" the server does not run; apply without --live restarts."""


class PeerNotAllowed(LiveRefused):
    """The engine listens for live fixes but refuses the agent's user (`peer-not-allowed`: only
    root and the engine's own user may use its sockets): the agent must run as one of them."""


class IndexUnreachable(InputError):
    """The package index cannot be reached, and a real engine's environment needs something not
    yet cached (`opspatch.sandbox.real.build`). Tests of the real engine skip on it, with it."""


# ---------------------------------------------------------------------------------------------
# exit 1: a host failed


class HostError(OpspatchError):
    """A step failed on one host. `host` and `step` say where; other hosts are unaffected."""

    exit_code = EXIT_HOST_FAILED

    def __init__(
        self, message: str, *, host: str = "", step: str = "", hint: str | None = None
    ) -> None:
        prefix = " ".join(p for p in (host and f"[{host}]", step and f"{step}:") if p)
        super().__init__(f"{prefix} {message}" if prefix else message, hint=hint)
        self.host = host
        self.step = step
        self.detail = message


class TransportError(HostError):
    """Connecting to a host or running a command on it failed."""

    def at(self, *, host: str, step: str) -> TransportError:
        """The same failure, said at `host` and `step` (its caller's)."""
        return type(self)(self.detail, host=host, step=step, hint=self.hint)


class CommandTimeout(TransportError):
    """A command ran past its deadline; its process group was ended."""


class ContainerError(TransportError):
    """The engine's container cannot be used: it does not exist, is not running, was recreated
    since this run first reached it, or the runtime is missing, refuses the login user or
    cannot set a resource limit. `reason` is the host's report code (`core/reasons.py`):
    `container-missing`, `container-not-running`, `container-recreated`, `runtime-missing`,
    `runtime-not-allowed`, `runtime-rlimit`, `runtime-failed`; nothing was run inside the
    container."""

    def __init__(
        self,
        message: str,
        *,
        host: str = "",
        step: str = "",
        hint: str | None = None,
        reason: str = "runtime-failed",
    ) -> None:
        super().__init__(message, host=host, step=step, hint=hint)
        self.reason = reason

    def at(self, *, host: str, step: str) -> ContainerError:
        return ContainerError(self.detail, host=host, step=step, hint=self.hint, reason=self.reason)


class RemoteOperationError(HostError):
    """A host-side operation refused or failed; `code` is a stable machine-readable reason."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        host: str = "",
        step: str = "",
        data: dict[str, Any] | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, host=host, step=step, hint=hint)
        self.code = code
        self.data = data or {}


class PreimageMismatch(RemoteOperationError):
    """The file on the host is not the bytes the plan was made from; nothing was written."""


class LockHeld(RemoteOperationError):
    """Another run holds the host's lock; says who, which run and until when."""


class RouterError(HostError):
    """A call to a router's control plane, or a worker's `/v1/loads`, failed or answered
    something unexpected; the message names the router (or worker), the call and the answer."""


class EngineError(HostError):
    """Restarting the engine, waiting for it to be ready, or the smoke decode failed.

    `data` carries what the engine itself said, when the host sent it: `log_tail` (its last
    relevant log lines, bounded) and `exception` (the traceback found in its log: type, message,
    final frame).
    """

    def __init__(
        self,
        message: str,
        *,
        host: str = "",
        step: str = "",
        data: dict[str, Any] | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, host=host, step=step, hint=hint)
        self.data = data or {}


# ---------------------------------------------------------------------------------------------
# exit 3: cannot be trusted / needs a human


class LedgerError(OpspatchError):
    """The ledger cannot be opened, written, or trusted."""

    exit_code = EXIT_NEEDS_ATTENTION


class LedgerIntegrityError(LedgerError):
    """The ledger's hash chain is broken; `first_broken` is the first bad event id."""

    def __init__(self, message: str, *, first_broken: int | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.first_broken = first_broken


class LedgerUnreachable(LedgerError):
    """The ledger's server went away part-way (a restart, `pg_terminate_backend`, a network cut)
    or cannot be reached again. What was being written is not in the ledger, or, when
    `outcome_unknown` (the connection was lost at COMMIT), may be: the server may have
    committed it. A run's write is tried again within its lease expiry (`Ledger.retrying`),
    looking first whether such a write landed, so nothing is written twice."""

    def __init__(
        self, message: str, *, hint: str | None = None, outcome_unknown: bool = False
    ) -> None:
        super().__init__(message, hint=hint)
        self.outcome_unknown = outcome_unknown


class LedgerLost(LedgerError):
    """The ledger this process writes to is no longer the one at its location: its file was
    deleted, moved or replaced by another (a SQLite connection keeps writing to the unlinked
    inode, where no later command would find it), or a PostgreSQL database no longer holds the
    events this connection wrote (recreated, restored from an older copy). Writing on would
    record the run where nobody reads it, so the run stops; `rescued` names the copy of the
    history this process still held (SQLite), when one was saved."""

    def __init__(self, message: str, *, hint: str | None = None, rescued: str | None = None):
        super().__init__(message, hint=hint)
        self.rescued = rescued


class LedgerConfigError(LedgerError):
    """The ledger cannot be used as it is given: its server cannot be reached or refuses the
    role, the database holds no opspatch schema or another version of it, the file is no ledger,
    or `ledger migrate` ran as a role that may not create or grant. Found when the ledger is
    opened or migrated, before any host or any history changed: a configuration error (exit
    2). A ledger lost part-way through a run is a plain `LedgerError` (exit 3)."""

    exit_code = EXIT_BAD_INPUT


class NeedsAttention(OpspatchError):
    """A host is in a state opspatch cannot vouch for (for example a restore failed)."""

    exit_code = EXIT_NEEDS_ATTENTION


class RunInterrupted(NeedsAttention):
    """The operator's second Ctrl-C: the run stopped waiting for the hosts in flight, which may
    be part-way through their pipeline (the run is left interrupted in the ledger)."""

    def __init__(self, run_id: str | None, in_flight: Sequence[str]) -> None:
        hosts = ", ".join(in_flight) or "no host"
        run = f"run {run_id}" if run_id else "the run"
        super().__init__(
            f"interrupted (second Ctrl-C): {run} stopped waiting for {hosts} in flight; "
            "their files and servers may be part-way",
            hint=(
                f"`opspatch recover --run {run_id}` finishes or undoes them"
                if run_id
                else "nothing was recorded (a dry run); run `opspatch status` to see the hosts"
            ),
        )
        self.run_id = run_id
        self.in_flight = tuple(in_flight)


def exit_code_for(error: BaseException) -> int:
    """Map an exception to the process exit code (the one place this is decided).

    A Ctrl-C is 130 (`EXIT_INTERRUPTED`). Unknown exceptions are bugs in opspatch, not operator
    mistakes: they map to 3 because the state of whatever was being changed is not known.
    """
    if isinstance(error, OpspatchError):
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_NEEDS_ATTENTION
