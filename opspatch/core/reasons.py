"""Why a host did not reach a run's goal, as a code: the `reason` of a host's outcome.

A host's `error` is a sentence for the operator; its `reason` is the word a script, the ledger
and the tests read (`--json`'s `reason`, the ledger's `host-outcome` event), set where the
sentence is made.
"""

from __future__ import annotations

from opspatch.core.vocabulary import Word


class Reason(Word):
    """Why a host refused a run, was not started, or failed."""

    NOT_APPLICABLE = "not-applicable"
    """The patch does not fit the host (version gate, anchors, module), or its input is refused
    there: nothing was changed."""
    HOST_ERROR = "host-error"
    """The host could not be reached, or an operation there failed before anything changed
    (a swap the host refused: the set put back); in a ledger written before the container
    codes below, also a container that could not be used."""
    BACKUP_NOT_RECORDED = "backup-not-recorded"
    """The ledger could not record the host's pre-image before its swap (the ledger failed,
    not the host): nothing was changed there."""
    HOST_KEY_UNKNOWN = "host-key-unknown"
    """The host's SSH host key is not known: nothing was run there."""
    HOST_KEY_CHANGED = "host-key-changed"
    """The host's SSH host key changed (never accepted by a flag): nothing was run there."""
    SUDO_MISSING = "sudo-missing"
    """`become`: sudo is not installed on the host."""
    PASSWORD_MISSING = "password-missing"
    """`become`: sudo needs a password and none is available (no `become_password_env`
    variable set, no terminal to ask on, nothing typed)."""
    PASSWORD_MALFORMED = "password-malformed"
    """`become`: the password found contains a line break, and sudo reads one line: it is never
    sent."""
    PASSWORD_REJECTED = "password-rejected"
    """`become`: sudo refused the password it was given."""
    SUDO_DENIED = "sudo-denied"
    """`become`: sudoers does not allow the login user to run the host agent as the user asked
    for (sudo's own words in the error)."""
    REQUIRETTY = "requiretty"
    """`become`: sudo requires a terminal, and opspatch runs commands without one."""
    BECOME_USER_UNKNOWN = "become-user-unknown"
    """`become`: sudo does not know the user to run as (`become_user`) on the host."""
    INTERPRETER_MISSING = "interpreter-missing"
    """`become`: sudo cannot find the engine's interpreter (`engine.python`) to run as the user."""
    BECOME_REFUSED = "become-refused"
    """`become`: sudo refused in words none of the codes above says (its words in the error);
    in a ledger written before them, every sudo refusal."""
    CONTAINER_MISSING = "container-missing"
    """The engine's container does not exist (the inventory's `container` names none)."""
    CONTAINER_NOT_RUNNING = "container-not-running"
    """The engine's container exists but is not running."""
    CONTAINER_RECREATED = "container-recreated"
    """The engine's container was recreated since this run first reached it: nothing is written
    into a container the run did not read."""
    RUNTIME_MISSING = "runtime-missing"
    """The container runtime (`docker`, `podman`) is not installed on the host."""
    RUNTIME_NOT_ALLOWED = "runtime-not-allowed"
    """The login user may not use the container runtime (the runtime's own words)."""
    RUNTIME_RLIMIT = "runtime-rlimit"
    """The container runtime cannot set a resource limit higher than the machine allows."""
    RUNTIME_FAILED = "runtime-failed"
    """The container runtime failed in words none of the codes above says (its words in the
    error)."""
    LOCK_HELD = "lock-held"
    """Another run holds the host's lock (`unlock`: a run still running)."""
    LOCK_LOST = "lock-lost"
    """This run held the host's lock and another run took it over (or it was removed): the
    exec was refused before it ran, so nothing more was done there."""
    LEASE_HELD = "lease-held"
    """A live lease of another run holds the host (its operator and controller named)."""
    NOT_LISTENING = "not-listening"
    """`apply --live`: the host's engine does not listen for live fixes."""
    PEER_NOT_ALLOWED = "peer-not-allowed"
    """`apply --live`: the engine listens for live fixes but refuses the agent's user (neither
    root nor the engine's): run the agent as one of them (`become`)."""
    NOT_TAKEN_LIVE = "not-taken-live"
    """`apply --live`: the change has no live form there (apply without --live restarts)."""
    UNIT_NOT_ALIKE = "unit-not-alike"
    """The nodes of the host's unit differ in release, in a target file's pre-image, or in
    whether they carry the change (`restart`)."""
    CHANGED_SINCE = "changed-since"
    """The host's file is not the bytes opspatch read or wrote there (a hand edit, a
    reinstall, a `live` plugin file not ours): nothing overwrites or restarts into it."""
    PATCHED_FURTHER = "patched-further"
    """Later recorded changes sit on top of the one to roll back: roll those back first."""
    NO_RECORD = "no-record"
    """The ledger has no record of the change on the host, and it cannot be undone from the
    file or the host's backup alone."""
    SET_NOT_WHOLE = "set-not-whole"
    """The host's files of a patch set are neither all new nor all old (`recover` makes it
    whole)."""
    NOT_RESTARTED = "not-restarted"
    """`sync`: the file carries the patch but the running server predates it (`restart`)."""
    NOT_SERVING = "not-serving"
    """The host serves nothing: `sync` finds the file carrying the patch (`recover`), or the
    smoke decode after a restore failed (`restored-not-serving`)."""
    BY_HAND = "by-hand"
    """`sync` cannot decide (a partly applied file, an unknown release): an operator looks."""
    EXTRA = "extra"
    """`sync`: a patch the fleet file does not want is on the host (never removed unasked)."""
    STEP_FAILED = "step-failed"
    """A step failed on the host (its failed step in `steps` says which): the change undone
    (a swap that did not answer, found written), or none made (`bake`: nothing built)."""
    SMOKE_FAILED = "smoke-failed"
    """The smoke decode after the restart failed a check: the change undone."""
    JUDGE_FAILED = "judge-failed"
    """The playbook's judge found the patched server worse than its baseline: undone."""
    BASELINE_FAILED = "baseline-failed"
    """The playbook requires a baseline and the pre-patch decode failed: nothing changed."""
    NOTHING_TO_DO = "nothing-to-do"
    """Nothing there for the command to change, so the host is left as it is: rollback's
    file already at the pre-image or no change recorded, restart's nothing staged, `live
    disable`'s plugin not installed, `unlock`'s lock not held, `adopt`'s file not hand-edited."""
    OTHER_VERSION = "other-version"
    """`live enable`: another version of the live plugin is installed (`live disable` first)."""
    UNKNOWN_HOLDER = "unknown-holder"
    """`unlock`: the lock's run is not in this ledger and may be alive on another controller
    (`--force` removes it)."""
    UNDO_FAILED = "undo-failed"
    """Putting the host's files back, restarting after it, or locking it to, failed: how it
    stands is not known (`needs-attention`)."""
    PART_WAY = "part-way"
    """A change stopped part-way (no reply, a failure mid-change) and the host, read back, is
    neither old nor new or could not be read (`needs-attention`)."""
    INTERNAL_ERROR = "internal-error"
    """A bug in opspatch stopped the host's run: how it stands is not known."""
    HALTED = "halted"
    """`on_halt = rollback-run`: the host was proven, but the rollout halted, so its change
    was undone."""
    NOT_STARTED = "not-started"
    """The run never started the host: it halted, was cancelled, or refused elsewhere."""


BECOME_REFUSALS = frozenset(
    {
        Reason.SUDO_MISSING,
        Reason.PASSWORD_MISSING,
        Reason.PASSWORD_MALFORMED,
        Reason.PASSWORD_REJECTED,
        Reason.SUDO_DENIED,
        Reason.REQUIRETTY,
        Reason.BECOME_USER_UNKNOWN,
        Reason.INTERPRETER_MISSING,
        Reason.BECOME_REFUSED,
    }
)
"""The codes of a `BecomeError`: sudo could not raise privileges on the host, before anything
was run there as the other user."""

CONTAINER_REFUSALS = frozenset(
    {
        Reason.CONTAINER_MISSING,
        Reason.CONTAINER_NOT_RUNNING,
        Reason.CONTAINER_RECREATED,
        Reason.RUNTIME_MISSING,
        Reason.RUNTIME_NOT_ALLOWED,
        Reason.RUNTIME_RLIMIT,
        Reason.RUNTIME_FAILED,
    }
)
"""The codes of a `ContainerError`: the engine's container could not be used, and nothing was
run inside it."""
