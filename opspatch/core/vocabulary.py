"""The words opspatch reports states in, defined once and used by the ledger, the playbook, the
runs and the CLI."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class Word(str, Enum):
    """The base of every word: a `str` whose value is its wire spelling, printed as itself, and
    one set/dict key with the plain string (`"applied" in {Outcome.APPLIED}`, Python 3.10 too)."""

    def __str__(self) -> str:
        return str(self.value)

    __hash__ = str.__hash__


class Outcome(Word):
    """Where one host ended in a run (the `outcome` of a host in the JSON and the ledger)."""

    APPLIED = "applied"
    """The patch is on the host and the server was restarted and proven by the smoke decode
    (`adopt` alone says it of a hand edit whose running server started after it, with no smoke
    decode: `runs.judgments.proof` claims a proof only where a smoke passed)."""
    ALREADY_APPLIED = "already-applied"
    """The host's file already carried the patch; nothing was changed."""
    STAGED = "staged"
    """The patched file is in place but the server was not restarted (`--restart never`)."""
    ROLLED_BACK = "rolled-back"
    """The apply failed after the swap and the pre-image is back (the run failed on this host)."""
    RESTORED = "restored"
    """rollback/recover put the pre-image back (or found it there) and the server is ready."""
    RESTORED_NOT_SERVING = "restored-not-serving"
    """rollback/recover put the pre-image back, but the server does not serve it: the smoke
    decode after the restore failed (the original code may be what was broken; a crash leaves
    the server down). The run failed on this host (exit 1)."""
    STAGED_BACK = "staged-back"
    """rollback put every pre-image back byte for byte and did not restart the server
    (`--restart never`, or a playbook's `restart = "never"`): the goal of a rollback that is told
    not to restart, so the run is ok (exit 0); the server runs the code it loaded until it is
    restarted."""
    FAILED = "failed"
    """Nothing changed on this host (unreachable, lock held, the swap refused)."""
    SKIPPED = "skipped"
    """Not started (the rollout halted) or refused before any change, with the reason."""
    NEEDS_ATTENTION = "needs-attention"
    """The host is in a state opspatch cannot vouch for (a restore failed)."""
    UNLOCKED = "unlocked"
    """`unlock` removed a lock left behind by a run that is over."""
    BAKED = "baked"
    """`bake`: the patched file(s) were built into a new image on top of the base image (or
    its build context written); no host or container of the fleet was changed."""
    WOULD_APPLY = "would-apply"
    """Dry run: the patch would change this host."""
    NOT_APPLICABLE = "not-applicable"
    """Dry run: the patch does not fit this host (version gate, anchors)."""

    @property
    def counts_as_failed(self) -> bool:
        """Whether this outcome counts towards a playbook's `max_failures`."""
        return self in FAILED_OUTCOMES


FAILED_OUTCOMES = frozenset(
    {
        Outcome.FAILED,
        Outcome.ROLLED_BACK,
        Outcome.RESTORED_NOT_SERVING,
        Outcome.NEEDS_ATTENTION,
    }
)
"""Host outcomes that count as a failed host, for the fleet policy and for the exit code (1, or
3 for `needs-attention`)."""

RECORDED_OUTCOMES = frozenset(
    {
        Outcome.APPLIED,
        Outcome.ALREADY_APPLIED,
        Outcome.STAGED,
        Outcome.ROLLED_BACK,
        Outcome.RESTORED,
        Outcome.RESTORED_NOT_SERVING,
        Outcome.STAGED_BACK,
        Outcome.FAILED,
        Outcome.SKIPPED,
        Outcome.NEEDS_ATTENTION,
        Outcome.UNLOCKED,
        Outcome.BAKED,
    }
)
"""Host outcomes a recorded (non-dry) run writes to the ledger."""


class SetState(Word):
    """Where the files of a patch set stand on one host, together (a set is changed whole)."""

    ALL_NEW = "all-new"
    """Every file is the post-image its run wrote."""
    ALL_OLD = "all-old"
    """Every file is its pre-image (never changed, or restored)."""
    PARTLY_APPLIED = "partly-applied"
    """Some files are new and the rest old: a run stopped between two files' swaps."""
    CHANGED = "changed"
    """A file is neither its pre- nor its post-image (someone else changed it)."""


class StepStatus(Word):
    """The status of one step on one host (a ledger step record, a `steps[]` entry)."""

    STARTED = "started"
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


class PatchState(Word):
    """What `status` says about one patch in one host's live file."""

    APPLIED = "applied"
    STAGED = "staged"
    NOT_APPLIED = "not-applied"
    DRIFTED = "drifted"
    NOT_APPLICABLE = "not-applicable"
    PARTIAL = "partial"
    UNKNOWN = "unknown"
    UNREACHABLE = "unreachable"
    FIXED_UPSTREAM = "fixed-upstream"
    """Not applied, and not needed: the host's installed release already ships the fix (its
    pristine file passes the patch's proof of the fix; `analysis/upstream.py`)."""


class UpstreamState(Word):
    """Whether a release's pristine file already carries a patch's fix (`analysis/upstream.py`)."""

    FIXED_UPSTREAM = "fixed-upstream"
    """The pristine file passes the patch's proof of the fix: the patch is redundant there."""
    NOT_FIXED = "not-fixed"
    """The fix is not in the file: the patch is still needed (and fits)."""
    ANCHOR_GONE = "anchor-gone"
    """Neither: the code the patch edits is not there any more (the patch needs a port)."""


class RunStatus(Word):
    """A ledger run's status, derived from its events and its controller process."""

    RUNNING = "running"
    INTERRUPTED = "interrupted"
    RECOVERED = "recovered"
    FINISHED = "finished"
    UNKNOWN = "unknown"


class RunOutcome(Word):
    """A whole run's outcome, one word per exit code (0 ok, 1 failed, 2 refused, 3 attention)."""

    OK = "ok"
    FAILED = "failed"
    REFUSED = "refused"
    NEEDS_ATTENTION = "needs-attention"


class SyncAction(Word):
    """What `sync` does about one desired patch on one host (`plan --fleet`, `sync --check`)."""

    NOTHING = "nothing"
    """The patch is there, its server runs it and, behind a router, its worker is in rotation."""
    APPLY = "apply"
    """The patch is missing (never applied, or a reinstall or recreated container wiped it) and
    fits the host's file: sync applies it through the apply pipeline."""
    RESTART = "restart"
    """The file carries the patch but the running server predates it (`opspatch restart`)."""
    RECOVER = "recover"
    """The file carries the patch, but the host serves nothing: its engine is not running, or
    its router does not list its worker healthy (out of rotation). Not at goal, since the goal
    is a fix that is served; sync writes nothing there (the fix is on disk) and names
    `opspatch recover --hosts H`, which starts the engine and re-admits the worker once its
    smoke decode passes, when the file is opspatch's own write; a release's own fix or a file
    the ledger does not explain is not recover's to finish: the row says to start the server by
    its own means."""
    NEEDS_PORT = "needs-port"
    """The patch no longer fits the host's release (anchor gone, pre-image unknown, outside the
    patch's own range): nothing is written; the patch must be ported."""
    FIXED_UPSTREAM = "fixed-upstream"
    """The host's release already has the fix, and serves it: left alone, the fleet entry is
    redundant there."""
    OUTSIDE_RANGE = "outside-range"
    """The host's release is outside the fleet entry's `releases`: the patch is not for it."""
    BY_HAND = "by-hand"
    """sync cannot decide (a partly applied file, an unknown release): an operator looks."""
    UNREACHABLE = "unreachable"
    """The host could not be inspected."""
    EXTRA = "extra"
    """A patch the fleet file does not want there is on the host; sync leaves it (never removes
    a fix unasked) and names the rollback."""

    @property
    def at_goal(self) -> bool:
        """Whether the host is as the fleet file wants it, as far as this patch goes."""
        return self in AT_GOAL


AT_GOAL = frozenset({SyncAction.NOTHING, SyncAction.FIXED_UPSTREAM, SyncAction.OUTSIDE_RANGE})
"""Sync actions that leave a host as desired: `sync --check` exits 0 when every row is one."""


class DriftCause(Word):
    """Why a host's file is not what the ledger and the fleet file expect (`opspatch drift`)."""

    UPGRADED = "upgraded"
    """The release changed since opspatch wrote the file (pip install -U)."""
    REINSTALLED = "reinstalled"
    """The same release's pristine file is back (a reinstall), the fix gone."""
    RECREATED_CONTAINER = "recreated-container"
    """The engine's container was recreated from its image since it was patched."""
    HAND_EDIT = "hand-edit"
    """The file changed since opspatch wrote it, within the same release, not back to pristine."""
    PATCH_MISSING = "patch-missing"
    """A desired patch that opspatch never wrote on the host."""
    PATCH_EXTRA = "patch-extra"
    """A patch the fleet file does not want there is on the host."""


class RestartPolicy(Word):
    """A playbook's `restart`: what follows the swap."""

    ALWAYS = "always"
    """Restart, wait until ready, smoke-decode."""
    NEVER = "never"
    """Stage the patched file only (the host is `staged`; `opspatch restart` completes it)."""


class HaltAction(Word):
    """A playbook's `on_halt`: what a halted rollout does with the hosts it already changed."""

    STOP = "stop"
    """Leave patched hosts patched (and proven); start no more hosts."""
    ROLLBACK_RUN = "rollback-run"
    """Restore every host this run applied, then stop."""


class RestartKind(Word):
    """How a host's engine is restarted (the inventory's `restart.kind`)."""

    SYSTEMD = "systemd"
    SUPERVISOR = "supervisor"
    COMMAND = "command"
    CONTAINER = "container"


class FileState(Word):
    """Where one imported file stands, as `diagnose` judges it."""

    PRISTINE = "pristine"
    PATCHED_BY_OPSPATCH = "patched-by-opspatch"
    EDITED_OUTSIDE = "edited-outside"
    UNKNOWN = "unknown"
    NOT_INSTALLED = "not-installed"
    UNRESOLVED = "unresolved"


class FindingLevel(Word):
    """How much a `diagnose` finding matters."""

    PROBLEM = "problem"
    """The host is not clean."""
    WARNING = "warning"
    """Worth knowing; the host may still be clean."""
    INFO = "info"


class EditStatus(Word):
    """Where one edit of a patch stands in a file."""

    APPLIED = "applied"
    PENDING = "pending"
    """Not there yet, and it fits: applying it would put it there."""
    BROKEN = "broken"
    """Not there, and it does not fit (its anchor or selector matches nothing, or several)."""


class Detected(Word):
    """Whether a file carries a whole patch (`core.edit.detect`)."""

    APPLIED = "applied"
    NOT_APPLIED = "not-applied"
    PARTIAL = "partial"
    UNKNOWN = "unknown"


class Rotation(Word):
    """Whether a host behind a router is taking traffic at the end of a run (`rotation` of a
    host in the JSON; absent for a host with no router)."""

    IN_ROTATION = "in-rotation"
    """Registered with its router and healthy (re-admitted after a proven restart)."""
    OUT_OF_ROTATION = "out-of-rotation"
    """Drained and not re-admitted: its server did not prove it serves (or the router could not
    be reached); the router sends it nothing until `opspatch recover` re-admits it."""


class Goal(Word):
    """What a command that changes hosts wants of the change it is about, on each host: its row
    of the decision table (`runs.judgments.decisions`)."""

    NEW_AND_PROVEN = "new-and-proven"
    """apply, and sync for each desired patch: the change on the host, its server proven."""
    ALL_OLD = "all-old"
    """rollback: every file the change wrote back at its pre-image."""
    PROVEN_WHERE_STAGED = "proven-where-staged"
    """restart: a server restarted into what is staged for it (a file, the live plugin), proven."""
    LAST_INTENT = "last-intent"
    """recover: the ledger's last intent for the host, finished or undone; never applied twice."""


@dataclass(frozen=True)
class Traits:
    """What an action does to a host, beyond its own steps: the facts a run needs before it
    starts (whether to lease the hosts, to look at their routers, to raise)."""

    leases: bool = False
    """Changes the host's files or engine: only under the run's lease of the host."""
    restarts: bool = False
    """Restarts the engine: drained from its router first, admitted after its proof."""
    raised: bool = False
    """Writes the engine's files or restarts it: as the host's raised user, where it has one."""
    readmits: bool = False
    """Puts back into rotation a worker it finds out of it, one its router does not list too."""


_CHANGES = Traits(leases=True, restarts=True, raised=True)


class Action(Word):
    """What a command does to one host (a cell of the decision table, or a command's own), with
    the traits it carries."""

    traits: Traits

    def __new__(cls, word: str, traits: Traits = Traits()) -> Action:
        member = str.__new__(cls, word)
        member._value_ = word
        member.traits = traits
        return member

    LEAVE = "leave"
    """Nothing to do: the host is reported as it was found (`skipped`, with why)."""
    REFUSE = "refuse"
    """Not this command's to change (someone else's bytes, a set not whole): `skipped`."""
    ATTENTION = "attention"
    """Not this command's to change, and left for a person: `needs-attention`."""
    ENSURE_RUNNING = "ensure-running", replace(_CHANGES, readmits=True)
    """Nothing to change on disk: make sure the server answers (restart it if it does not)."""
    PROVE_OR_UNDO = "prove-or-undo", _CHANGES
    """Restart into the change and prove it; a failed proof undoes it (`rolled-back`)."""
    RESTORE = "restore", _CHANGES
    """Put the pre-images back (the new files of the set), then prove the restore."""
    RESTORE_FROM_BACKUP = "restore-from-backup", _CHANGES
    """No record: take the patch off the file alone and restore the host's own backup."""
    APPLY = "apply", _CHANGES
    """Swap the patched files in, restart and prove them; a failed proof undoes them."""
    STAGE = "stage", Traits(leases=True, raised=True)
    """Swap the patched files in and restart nothing (`--restart never`): `staged`."""
    TAKE_LIVE = "take-live", Traits(leases=True, raised=True)
    """Swap the patched files in and take them into the running engine (`--live`)."""
    INSTALL_PLUGIN = "install-plugin", Traits(leases=True, raised=True)
    """Write the live plugin into the engine's environment (loaded at its next restart)."""
    REMOVE_PLUGIN = "remove-plugin", Traits(leases=True, raised=True)
    """Remove what `install-plugin` wrote (the running engine keeps it until it restarts)."""
    UNLOCK = "unlock", Traits(raised=True)
    """Remove a host lock whose run is over (the lock only: no lease)."""


class Command(Word):
    """Every command of opspatch, once: the word a ledger run records (its value), its spelling
    on the command line (`cli`), and, for one that changes hosts, its goal (the decision table
    gives the actions it takes for it) and the actions it takes by itself. What the run needs to
    know of it (leases, routers) follows from its actions' traits
    (`runs.judgments.decisions.traits_of`)."""

    cli: str
    goal: Goal | None
    actions: tuple[Action, ...]

    def __new__(
        cls,
        word: str,
        cli: str | None = None,
        goal: Goal | None = None,
        actions: tuple[Action, ...] = (),
    ) -> Command:
        member = str.__new__(cls, word)
        member._value_ = word
        member.cli = cli or word
        member.goal = goal
        member.actions = actions
        return member

    APPLY = "apply", None, Goal.NEW_AND_PROVEN, (Action.APPLY, Action.STAGE, Action.TAKE_LIVE)
    ROLLBACK = "rollback", None, Goal.ALL_OLD
    RESTART = "restart", None, Goal.PROVEN_WHERE_STAGED
    RECOVER = "recover", None, Goal.LAST_INTENT
    """Its finished runs recover their (interrupted) parent run (`ledger.events.recovered_by`)."""
    UNLOCK = "unlock", None, None, (Action.UNLOCK,)
    SYNC = "sync", None, Goal.NEW_AND_PROVEN, (Action.APPLY, Action.STAGE)
    """One goal per desired patch: each applied through apply's run, recorded as `sync`."""
    ADOPT = "adopt"
    """Records a hand edit as a file version: nothing sent, no lock, no lease."""
    BAKE = "bake"
    """Builds the patch into a new image from a scratch container: no host of the fleet."""
    APPROVE = "approve"
    """Recorded by the ledger itself (`Ledger.record_approval`): one `sign` step per principal."""
    SMOKE = "smoke"
    """Runs through the fleet run like the others but records nothing (the null recorder)."""
    JUDGE = "judge"
    """`opspatch judge`: a question like `smoke`, through the fleet run, recording nothing."""
    LIVE_ENABLE = "live-enable", "live enable", None, (Action.INSTALL_PLUGIN,)
    """The live plugin's distribution written into the engine's environment."""
    LIVE_DISABLE = "live-disable", "live disable", None, (Action.REMOVE_PLUGIN,)
    """The files `live enable` wrote removed again."""
    CHECK = "check"
    DIAGNOSE = "diagnose"
    DRIFT = "drift"
    EXPORT = "export"
    LINT_INIT = "lint-init"
    PLAN = "plan"
    REHEARSE = "rehearse"
    """Tries a patch on a throwaway engine of its release: no host of the fleet, nothing recorded."""
    SCHEMA = "schema"
    STATUS = "status"
    INVENTORY_SHOW = "inventory-show", "inventory show"
    LEDGER_COPY = "ledger-copy", "ledger copy"
    LEDGER_LIST = "ledger-list", "ledger list"
    LEDGER_MIGRATE = "ledger-migrate", "ledger migrate"
    LEDGER_REPORT = "ledger-report", "ledger report"
    LEDGER_SHOW = "ledger-show", "ledger show"
    LEDGER_VERIFY = "ledger-verify", "ledger verify"
    SANDBOX_DOWN = "sandbox-down", "sandbox down"
    SANDBOX_LOAD = "sandbox-load", "sandbox load"
    SANDBOX_PREPARE = "sandbox-prepare", "sandbox prepare"
    SANDBOX_REINSTALL = "sandbox-reinstall", "sandbox reinstall"
    SANDBOX_STATUS = "sandbox-status", "sandbox status"
    SANDBOX_UP = "sandbox-up", "sandbox up"


class FileAction(Word):
    """What a ledger file version records (`FileVersion.action`)."""

    PATCH = "patch"
    """The patched text was swapped in."""
    RESTORE = "restore"
    """Earlier bytes were put back."""


class EventKind(Word):
    """The kinds of event the ledger's `events` table holds (in the order its schema names them:
    the `CHECK` constraint of both backends is written from this order)."""

    RUN_STARTED = "run-started"
    STEP = "step"
    FACTS = "facts"
    FILE_VERSION = "file-version"
    HOST_OUTCOME = "host-outcome"
    RUN_FINISHED = "run-finished"


class Step(Word):
    """The name of one step a host goes through in a run (a ledger step record, a `steps[]` entry
    of the JSON, the progress line). A word a released opspatch once recorded stays here, so that
    an old ledger still reads back."""

    BEGIN = "begin"
    """Lock the host and inspect its file(s) in one exec."""
    INSPECT = "inspect"
    """Inspect without taking the lock (a dry run, a rollback's preflight)."""
    LOCK = "lock"
    UNLOCK = "unlock"
    RELEASE = "release"
    """Give back what is left of the run's lock on the host."""
    LEASE = "lease"
    """A lease taken or given back (recorded by the ledger itself)."""
    PLAN = "plan"
    BACKUP = "backup"
    SWAP = "swap"
    RECONCILE = "reconcile"
    """Read back a file whose swap did not answer."""
    READ = "read"
    READ_SET = "read-set"
    BASELINE = "baseline"
    DRAIN = "drain"
    """Take the host out of its router's rotation before a restart."""
    ADMIT = "admit"
    """Put the host back into rotation after a proven restart."""
    RESTART = "restart"
    READY = "ready"
    SMOKE = "smoke"
    JUDGE_BASELINE = "judge-baseline"
    """The judge's prompt set decoded on the old server, before the swap: its baseline."""
    JUDGE = "judge"
    """The judge's prompt set decoded on the changed server and compared with its baseline."""
    RESTORE = "restore"
    RESTART_AFTER_RESTORE = "restart-after-restore"
    READY_AFTER_RESTORE = "ready-after-restore"
    SMOKE_AFTER_RESTORE = "smoke-after-restore"
    READY_AFTER_RESTART = "ready-after-restart"
    LIVE = "live"
    """`apply --live`: the fix taken into the running engine's processes (no restart), each
    process's answer in the detail; `live` and `status` ask what they hold."""
    LIVE_REVERT = "live-revert"
    """A live fix undone in the running engine's processes (a process refused or the smoke
    failed; `rollback` of a live fix)."""
    LIVE_READBACK = "live-readback"
    """A unit's node: what each of its engine's processes holds, read back (`list`) after a
    live fix was taken or reverted through the head."""
    LIVE_ENABLE = "live-enable"
    """`live enable`: the plugin's files written into the engine's site-packages (the detail
    names the folder, the start and the RECORD's sha256)."""
    LIVE_DISABLE = "live-disable"
    """`live disable`: the files `live enable` wrote (its RECORD's) removed."""
    STOP = "stop"
    """A unit's node: its engine stopped (every node stops before any starts)."""
    START = "start"
    """A unit's node: its engine started again (the head first)."""
    STOP_AFTER_RESTORE = "stop-after-restore"
    START_AFTER_RESTORE = "start-after-restore"
    CONTEXT = "context"
    """`bake`: write the image's build context."""
    BUILD = "build"
    """`bake`: build the image."""
    ADOPT = "adopt"
    """`adopt`: a hand edit recorded as a patch."""
    APPROVAL = "approval"
    """An apply's verified approval, as releases before `approved_by` recorded it."""
    SIGN = "sign"
    """`approve`: one principal's signature (its host column is the principal)."""


class Verdict(Word):
    """What the judge says of one metric, or of a host, comparing it with a baseline measured in
    the same run (`runs/judgments/canary.py`)."""

    PASS = "pass"
    """No difference the thresholds call one."""
    MARGINAL = "marginal"
    """A difference worth saying that does not fail the host (outputs that diverge only where
    the model was near a tie; a significant change smaller than the threshold)."""
    FAIL = "fail"
    """A difference beyond the threshold, or a failed request: a failed proof."""
    UNMEASURED = "unmeasured"
    """A latency metric timed on too few prompts to tell a change (the host read the streams
    late): never a pass; a host fails on it as on `fail`."""
    NO_BASELINE = "no-baseline"
    """Nothing to compare with (no old server answered): only the absolute checks were made,
    and they passed. Never read as a pass."""

    @property
    def rank(self) -> int:
        """How bad: the worst of several verdicts is the one with the highest rank."""
        return VERDICT_RANK[self]


VERDICT_RANK = {
    Verdict.PASS: 0,
    Verdict.NO_BASELINE: 1,
    Verdict.MARGINAL: 2,
    Verdict.UNMEASURED: 3,
    Verdict.FAIL: 4,
}
FAILING = frozenset({Verdict.FAIL, Verdict.UNMEASURED})
"""The verdicts that fail a host (`Judgment.failed`)."""


class JudgeHosts(Word):
    """A playbook's `[judge] hosts`: which hosts of an apply the judge proves."""

    CANARY = "canary"
    """The canaries only (the rest are proven by the smoke, as the canary was judged)."""
    ALL = "all"
    """Every host the apply changes."""


class Metric(Word):
    """What the judge compares between a changed server and its baseline."""

    ERRORS = "errors"
    """Failed requests: any fails the judge."""
    TOKENS = "tokens"
    """Greedy outputs: equal, or at the first divergence each side's token in the other's
    top-k (vLLM's rule for comparing two implementations)."""
    SPECULATION = "speculation"
    """Speculative acceptance length per request (completion_tokens / spec_verify_ct)."""
    TTFT = "ttft"
    """Time to first token, per request, measured on the host."""
    TPOT = "tpot"
    """Time per output token after the first, per request, measured on the host."""


class LivePolicy(Word):
    """A patch's `live`: whether `apply --live` may take its change into running processes."""

    ALLOWED = "allowed"
    """Taken live where its live form allows, even in a module that is restart-only by default
    (the model forward, the CUDA graph runner): the patch's author says no captured graph or
    compiled code replays it."""
    RESTART_ONLY = "restart-only"
    """Never taken live: applied with a restart even under `--live` (code reachable from CUDA
    graph capture or `torch.compile`, where a captured graph replays the old kernels)."""


class LiveKind(Word):
    """What one definition of a live fix is, so the plugin knows how to take it."""

    CONSTANT = "constant"
    """A module-level name: set on the module, and rebound where `from m import NAME` bound it."""
    CLASS_ATTRIBUTE = "class-attribute"
    """`Class.name` that is not a function: set on the running class."""
    FUNCTION = "function"
    """A module-level function: its code swapped in the running function object."""
    METHOD = "method"
    """`Class.name` defined by `def`: its code swapped in the running function object."""


class NotLiveReason(Word):
    """Why a change cannot be taken live (`core/live.py:live_form`, and the engine's own answer
    to the preflight's `check`: `runs/judgments/live.py:judge_check`): `apply --live` is refused
    before any change (apply without --live restarts)."""

    DECLARED_RESTART_ONLY = "declared-restart-only"
    """The patch says `live = "restart-only"`."""
    RESTART_ONLY_MODULE = "restart-only-module"
    """The module is the model forward or the CUDA graph runner (a captured graph replays the old
    kernels) and the patch does not say `live = "allowed"`."""
    UNPARSABLE = "unparsable"
    """The pre- or post-image is not Python this opspatch can compile."""
    STATEMENT = "statement"
    """A statement that defines nothing by name changed (an import, an `if`, a call, a
    docstring-less expression, a name defined twice): running it again is not a fix."""
    REMOVED = "removed"
    """A definition is gone from the post-image: a live module would keep it."""
    NEW_CLASS = "new-class"
    """A class was added: its methods would live on the file's copy of the module."""
    DEFAULTS = "defaults"
    """A function's default values changed: they are objects built at definition time."""
    DECORATORS = "decorators"
    """A decorator changed or was added (or a decorated class's attributes changed): its result
    was built when the module was imported."""
    FREE_VARIABLES = "free-variables"
    """A function's own free variables changed (`super()` where there was none, a name of an
    enclosing function newly read): its code cannot be swapped into the running function. A
    new closure nested inside it changes none of them and is taken."""
    GENERATOR = "generator"
    """A generator or coroutine function changed: its live frames keep the old code."""
    BASES = "bases"
    """A class's bases or metaclass changed: a running class keeps its own."""
    NOT_IMPORTED = "not-imported"
    """No process of the engine imported the module: there is nothing running to take it."""
    ALREADY_HELD = "already-held"
    """A changed definition is held by another live fix in the engine: the take would refuse."""
    CAPTURED_AT_IMPORT = "captured-at-import"
    """A changed constant or class attribute was read while a module was imported (a default
    argument, a dataclass field, another constant): what was built then keeps the old value."""
    BUILT_OBJECTS = "built-objects"
    """A changed method runs only while an object is built (`__init__`), and the engine already
    built objects of its class: they keep the state the old code gave them."""
    NEVER_RETURNS = "never-returns"
    """A changed function runs in a frame that does not return (the scheduler's loop): that frame
    keeps the old code, so the new code would never run."""
