"""Rollouts: the per-host pipeline, written once, and the fleet policy around it.

Per host (architecture.md), each step with a deadline and a ledger record:

```
begin (lock + facts + resolve + read, one exec) -> plan (pure) -> [baseline decode]
  -> backup (the full pre-image into the ledger) -> swap (host: check pre-image, compile with
     the host's Python, backup copy, atomic rename, bytecode purge)
  -> restart -> ready -> smoke (decode + log scan) -> commit (outcome in the ledger) -> release
on a failure after the swap:  restore -> restart -> ready -> smoke (reported)
  restored and ready: `rolled-back`;  restore or its restart failed: `needs-attention` (halts)
```

Every host's result is a `HostOutcome` value; the fleet runner (`FleetRollout`) collects them all
and only then does the CLI choose an exit code (`RunReport.exit_code`). Before any host is changed,
a preflight inspects every selected host and plans the patch there: a host where the patch does
not fit (version gate, anchors, module not resolving) refuses the whole run with exit 2, so a
rollout never starts on a fleet it cannot finish.

Transports are opened through a factory passed in (`TransportFactory`), one per host per run,
reused for every step of that host and closed at the end.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, apply_patch
from opspatch.core.host import EngineSettings, Host
from opspatch.core.policy import Playbook, plan_rollout
from opspatch.core.spec import LoadedPatch
from opspatch.errors import (
    EXIT_BAD_INPUT,
    EXIT_HOST_FAILED,
    EXIT_NEEDS_ATTENTION,
    EXIT_OK,
    InputError,
    LockHeld,
    OpspatchError,
    PreimageMismatch,
    RemoteOperationError,
    TargetError,
    TransportError,
)
from opspatch.hosts.engine import EngineControl, RestartResult, SmokeResult
from opspatch.hosts.operations import HostInspection, HostOperations, RestoreResult
from opspatch.hosts.transport.base import Transport
from opspatch.ledger.store import Ledger, operator_identity

# Host outcomes (architecture.md's vocabulary).
APPLIED = "applied"
ALREADY_APPLIED = "already-applied"
ROLLED_BACK = "rolled-back"
RESTORED = "restored"
FAILED = "failed"
SKIPPED = "skipped"
NEEDS_ATTENTION = "needs-attention"

TransportFactory = Callable[[Host], Transport]


class Progress(Protocol):
    """Where live progress goes (the CLI draws a line per host); a no-op by default."""

    def update(self, host: str, step: str, status: str) -> None: ...


class NoProgress:
    """Progress that goes nowhere (library use, tests)."""

    def update(self, host: str, step: str, status: str) -> None:
        return None


@dataclass(frozen=True)
class StepResult:
    step: str
    status: str  # ok | failed | skipped
    seconds: float
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class FileChange:
    path: str
    sha256_before: str | None
    sha256_after: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256_before": self.sha256_before,
            "sha256_after": self.sha256_after,
        }


@dataclass(frozen=True)
class HostOutcome:
    """One host's result: what happened, why, the file's hashes, and every step with timing."""

    host: str
    outcome: str
    error: str | None = None
    file: FileChange | None = None
    steps: tuple[StepResult, ...] = ()
    diff: str | None = None
    smoke: SmokeResult | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "host": self.host,
            "outcome": self.outcome,
            "error": self.error,
            "note": self.note,
            "file": self.file.to_json() if self.file else None,
            "steps": [s.to_json() for s in self.steps],
        }
        if self.diff is not None:
            data["diff"] = self.diff
        if self.smoke is not None:
            data["smoke"] = self.smoke.to_json()
        return data


@dataclass(frozen=True)
class RunReport:
    """A whole run: every host's outcome, whether the fleet policy halted, and the run's exit."""

    run_id: str | None
    command: str
    patch: str | None
    hosts: tuple[HostOutcome, ...]
    halted: str | None = None
    dry_run: bool = False
    refused: bool = False

    @property
    def outcome(self) -> str:
        code = self.exit_code
        return {
            EXIT_OK: "ok",
            EXIT_HOST_FAILED: "failed",
            EXIT_BAD_INPUT: "refused",
            EXIT_NEEDS_ATTENTION: "needs-attention",
        }[code]

    @property
    def exit_code(self) -> int:
        """3 if a host needs attention; else 1 if a host failed or was rolled back; else 2 if the
        run was refused before any change, or a host was refused (nothing changed there); else 1
        if the fleet policy halted the run; else 0."""
        outcomes = {h.outcome for h in self.hosts}
        if NEEDS_ATTENTION in outcomes:
            return EXIT_NEEDS_ATTENTION
        if outcomes & {FAILED, ROLLED_BACK}:
            return EXIT_HOST_FAILED
        if self.refused or any(h.outcome == SKIPPED and h.error for h in self.hosts):
            return EXIT_BAD_INPUT
        if self.halted:
            return EXIT_HOST_FAILED
        return EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "command": self.command,
            "patch": self.patch,
            "outcome": self.outcome,
            "dry_run": self.dry_run,
            "refused": self.refused,
            "halted": self.halted,
            "hosts": [h.to_json() for h in self.hosts],
        }


def record_outcome(ledger: Ledger | None, run_id: str | None, outcome: HostOutcome) -> None:
    """A host's final outcome, into the ledger (a dry run records nothing)."""
    if ledger is not None and run_id is not None:
        ledger.record_host_outcome(
            run_id,
            outcome.host,
            outcome.outcome,
            outcome.error,
            outcome.file.to_json() if outcome.file else None,
        )


class HostFailed(Exception):
    """Ends a host's pipeline with an outcome; carries the step where it happened."""

    def __init__(self, outcome: str, error: str) -> None:
        super().__init__(error)
        self.outcome = outcome
        self.error = error


# ---------------------------------------------------------------------------------------------
# one host's session: its transport, operations, engine control, and a step recorder


class HostSession:
    """Everything one run does on one host goes through here: one transport, reused."""

    def __init__(
        self,
        host: Host,
        factory: TransportFactory,
        playbook: Playbook,
        *,
        ledger: Ledger | None,
        run_id: str | None,
        progress: Progress,
    ) -> None:
        self.host = host
        self.playbook = playbook
        self.ledger = ledger
        self.run_id = run_id
        self.progress = progress
        self.steps: list[StepResult] = []
        self._factory = factory
        self._transport: Transport | None = None
        self._ops: HostOperations | None = None

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def ops(self) -> HostOperations:
        if self._ops is None:
            self._transport = self._factory(self.host)
            self._ops = HostOperations(self._transport, self.host)
        return self._ops

    @property
    def engine(self) -> EngineControl:
        return EngineControl(self.ops, self.host, self.playbook)

    @property
    def exec_count(self) -> int:
        return self._transport.exec_count if self._transport is not None else 0

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def refused(self, exc: OpspatchError) -> HostOutcome:
        """The outcome of a host whose step raised before anything was changed there: its lock
        is held (`failed`, naming who holds it), the patch or inventory does not fit (`skipped`,
        with the reason), or the host could not be reached or refused (`failed`)."""
        steps = tuple(self.steps)
        if isinstance(exc, LockHeld):
            return HostOutcome(self.name, FAILED, f"refused: {exc.detail}", steps=steps)
        if isinstance(exc, (InputError, TargetError)):
            return HostOutcome(self.name, SKIPPED, exc.message, steps=steps)
        return HostOutcome(self.name, FAILED, describe_error(exc), steps=steps)

    def record_outcome(self, outcome: HostOutcome) -> None:
        """The host's final outcome, into the ledger (when this is a recorded run)."""
        record_outcome(self.ledger, self.run_id, outcome)

    def record(
        self, step: str, status: str, seconds: float | None = None, detail: str = ""
    ) -> None:
        if self.ledger is not None and self.run_id is not None:
            self.ledger.record_step(self.run_id, self.name, step, status, seconds, detail[:2000])

    @contextmanager
    def step(self, name: str) -> Iterator[dict[str, str]]:
        """Run one step: progress, a `started` and an `ok`/`failed` ledger record, timing.

        The body may set `note["detail"]` to describe what it did.
        """
        note: dict[str, str] = {"detail": ""}
        self.progress.update(self.name, name, "running")
        self.record(name, "started")
        started = time.monotonic()
        try:
            yield note
        except BaseException as exc:
            seconds = time.monotonic() - started
            detail = describe_error(exc)
            self.steps.append(StepResult(name, "failed", seconds, detail))
            self.record(name, "failed", seconds, detail)
            self.progress.update(self.name, name, "failed")
            raise
        seconds = time.monotonic() - started
        self.steps.append(StepResult(name, "ok", seconds, note["detail"]))
        self.record(name, "ok", seconds, note["detail"])
        self.progress.update(self.name, name, "ok")


def describe_error(exc: BaseException) -> str:
    """One line (plus a log tail when the host sent one) saying why a step failed."""
    if isinstance(exc, HostFailed):
        return exc.error
    if isinstance(exc, OpspatchError):
        detail = getattr(exc, "detail", None) or exc.message
        data = getattr(exc, "data", None) or {}
        tail = data.get("log_tail") if isinstance(data, dict) else None
        return f"{detail}\n{tail}" if tail else str(detail)
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------------
# the pipeline, written once


@dataclass(frozen=True)
class Prepared:
    """A host after `begin` and `plan`: its lock is held and the outcome of the plan is known."""

    inspection: HostInspection
    plan: Applied | AlreadyApplied | NotApplicable
    version_problem: str | None


class ApplyPipeline:
    """Apply one patch to one host: the template every apply runs through."""

    def __init__(
        self, patch: LoadedPatch, playbook: Playbook, *, restart_engine: bool = True
    ) -> None:
        self.patch = patch
        self.playbook = playbook
        self.restart_engine = restart_engine

    # -- preflight: begin + plan ---------------------------------------------------------

    def prepare(
        self,
        session: HostSession,
        *,
        lock: bool,
        path: str | None = None,
        installed_version: str | None = None,
    ) -> Prepared:
        """Lock (unless a dry run) and inspect the host, then plan the patch on its file.

        The file is the one the engine's interpreter imports for the patch's module, or `path`
        (a local file: `installed_version` then says its distribution's version, if known).
        """
        target = self.patch.spec.target
        module = None if path is not None else target.module
        timeout = self.playbook.timeouts.lock + self.playbook.timeouts.inspect
        with session.step("begin" if lock else "inspect") as note:
            if lock:
                assert session.run_id is not None
                _, inspection = session.ops.begin(
                    module,
                    path=path,
                    run_id=session.run_id,
                    timeout=timeout,
                )
            else:
                inspection = session.ops.inspect(module, path=path, timeout=timeout)
            facts = inspection.facts
            note["detail"] = (
                f"{inspection.file.realpath} sha256 {inspection.file.sha256[:12]}; python "
                f"{facts.python_version}, {target.distribution} {facts.sglang_version or '?'}"
            )
        if session.ledger is not None and session.run_id is not None:
            session.ledger.record_facts(session.run_id, session.name, inspection.facts.to_json())
        installed = inspection.facts.sglang_version if target.distribution == "sglang" else None
        if path is not None:
            installed = installed_version
        mismatch = target.mismatch(inspection.file.realpath, installed)
        if mismatch is None and inspection.module is not None:
            mismatch = target.mismatch(inspection.module.origin, installed)
        with session.step("plan") as note:
            plan = apply_patch(inspection.file.content, self.patch.spec)
            note["detail"] = plan.outcome
        return Prepared(inspection, plan, mismatch)

    # -- the change ------------------------------------------------------------------------

    def apply(self, session: HostSession, prepared: Prepared) -> HostOutcome:
        """Swap, restart, prove; on failure restore. Returns the host's outcome (never raises
        for a host-level failure)."""
        plan = prepared.plan
        assert isinstance(plan, Applied)
        remote = prepared.inspection.file
        change = FileChange(remote.realpath, plan.sha256_before, plan.sha256_after)
        baseline = self._baseline(session)
        ledger, run_id = session.ledger, session.run_id
        try:
            with session.step("backup") as note:
                if ledger is not None and run_id is not None:
                    ledger.record_file_version(
                        run_id,
                        session.name,
                        path=remote.realpath,
                        sha256_before=plan.sha256_before,
                        sha256_after=plan.sha256_after,
                        mode=remote.mode,
                        owner=f"{remote.owner or remote.uid}:{remote.group or remote.gid}",
                        pre_image=plan.old_source,
                        post_image=plan.new_source,
                    )
                note["detail"] = (
                    f"pre-image {plan.sha256_before[:12]} ({len(plan.old_source)} bytes) in the ledger"
                )
            with session.step("swap") as note:
                swapped = session.ops.swap(
                    remote.realpath,
                    expected_sha256=plan.sha256_before,
                    new_content=plan.new_source,
                    lock_run_id=run_id,
                    timeout=self.playbook.timeouts.swap,
                )
                note["detail"] = (
                    f"{swapped.sha256_before[:12]} -> {swapped.sha256_after[:12]}; "
                    f"purged {len(swapped.purged_bytecode)} pyc"
                )
        except PreimageMismatch as exc:
            return self._outcome(
                session, FAILED, f"the file changed since it was read: {exc.detail}", change, plan
            )
        except TransportError as exc:
            # The swap may or may not have happened: look before deciding anything.
            return self._reconcile_after_lost_swap(session, change, plan, exc)
        except OpspatchError as exc:
            return self._outcome(session, FAILED, describe_error(exc), change, plan)
        if not self.restart_engine:
            return self._outcome(session, APPLIED, None, change, plan)
        try:
            restart = self._restart_and_prove(session, baseline=baseline)
        except HostFailed as failure:
            return self._roll_back(session, change, plan, failure.error)
        return self._outcome(session, APPLIED, None, change, plan, smoke=restart)

    def _baseline(self, session: HostSession) -> tuple[str | None, ...] | None:
        """Greedy texts from the unpatched server, if the playbook and the patch ask for it.

        Best effort: a failed baseline decode gives no baseline and never fails the host.
        """
        if not (
            self.restart_engine
            and self.playbook.smoke.baseline
            and self.patch.spec.preserves_output
        ):
            return None
        try:
            with session.step("baseline") as note:
                result = session.engine.smoke(log_offset=None, checks=False, step="baseline")
                note["detail"] = "taken" if all(result.texts) else "incomplete"
            return result.texts if all(t is not None for t in result.texts) else None
        except OpspatchError:
            return None

    def _restart_and_prove(
        self, session: HostSession, *, baseline: Sequence[str | None] | None
    ) -> SmokeResult:
        restart = restart_step(session)
        ready_step(session, restart)
        return smoke_step(session, restart, baseline=baseline)

    def _roll_back(
        self, session: HostSession, change: FileChange, plan: Applied, why: str
    ) -> HostOutcome:
        """Put the pre-image back after a failure past the swap, then restart and prove."""
        try:
            restore_pre_image(
                session,
                path=change.path,
                pre_sha256=plan.sha256_before,
                post_sha256=plan.sha256_after,
                timeout=self.playbook.timeouts.restore,
            )
            restart = restart_step(session, step="restart-after-restore")
            ready_step(session, restart, step="ready-after-restore")
        except (OpspatchError, HostFailed) as exc:
            error = f"{why}; then the restore failed: {describe_error(exc)}"
            return self._outcome(session, NEEDS_ATTENTION, error, change, plan)
        smoke: SmokeResult | None = None
        try:
            smoke = smoke_step(
                session, restart, baseline=None, step="smoke-after-restore", must_pass=False
            )
        except OpspatchError:
            smoke = None
        restored_change = FileChange(change.path, plan.sha256_before, plan.sha256_before)
        return self._outcome(session, ROLLED_BACK, why, restored_change, plan, smoke=smoke)

    def _reconcile_after_lost_swap(
        self, session: HostSession, change: FileChange, plan: Applied, exc: TransportError
    ) -> HostOutcome:
        why = f"the swap did not answer: {exc.detail}"
        try:
            with session.step("reconcile") as note:
                live = session.ops.read(change.path, timeout=session.playbook.timeouts.inspect)
                note["detail"] = f"file is {live.sha256[:12]}"
        except OpspatchError as again:
            return self._outcome(
                session,
                NEEDS_ATTENTION,
                f"{why}; the host is unreachable ({describe_error(again)})",
                change,
                plan,
            )
        if live.sha256 == plan.sha256_before:
            return self._outcome(session, FAILED, f"{why}; the file is unchanged", change, plan)
        if live.sha256 == plan.sha256_after:
            return self._roll_back(session, change, plan, why)
        return self._outcome(
            session,
            NEEDS_ATTENTION,
            f"{why}; the file is neither the pre- nor the post-image",
            change,
            plan,
        )

    def _outcome(
        self,
        session: HostSession,
        outcome: str,
        error: str | None,
        change: FileChange | None,
        plan: Applied | None,
        smoke: SmokeResult | None = None,
    ) -> HostOutcome:
        return HostOutcome(
            host=session.name,
            outcome=outcome,
            error=error,
            file=change,
            steps=tuple(session.steps),
            diff=plan.diff if plan is not None else None,
            smoke=smoke,
        )


def restore_pre_image(
    session: HostSession,
    *,
    path: str,
    pre_sha256: str,
    post_sha256: str,
    timeout: float,
    mode: int = 0,
    owner: str = "",
) -> RestoreResult:
    """Put the pre-image back: from the host's own backup, else from the ledger's copy.

    The host's backup is tried first (no bytes cross the network); when it is missing or does
    not hash to the pre-image, the ledger's copy is sent (the ledger re-hashes it on the way
    out, so a tampered copy is refused rather than written). When the file changed, the
    restore is recorded as a file version (the bytes it overwrote are the ledger's post-image).

    Raises:
        RemoteOperationError: the restore failed on the host (`not-our-file`, `write-failed`...).
        LedgerIntegrityError, LedgerError: the ledger's copy is missing or not the pre-image.
    """
    with session.step("restore") as note:
        try:
            restored = session.ops.restore(
                path, pre_sha256=pre_sha256, current_sha256=post_sha256, timeout=timeout
            )
        except RemoteOperationError as exc:
            if exc.code not in ("backup-missing", "backup-hash-mismatch") or session.ledger is None:
                raise
            content = session.ledger.blob(pre_sha256)
            restored = session.ops.restore(
                path,
                pre_sha256=pre_sha256,
                content=content,
                current_sha256=post_sha256,
                timeout=timeout,
            )
        note["detail"] = f"back to {restored.sha256_after[:12]} from {restored.source}"
    if restored.changed and session.ledger is not None and session.run_id is not None:
        session.ledger.record_file_version(
            session.run_id,
            session.name,
            path=path,
            sha256_before=restored.sha256_before,
            sha256_after=restored.sha256_after,
            mode=mode,
            owner=owner,
            pre_image=session.ledger.blob(restored.sha256_before),
            action="restore",
        )
    return restored


def restart_step(session: HostSession, *, step: str = "restart") -> RestartResult:
    """Restart the engine as a recorded step; a failure ends the pipeline (`HostFailed`)."""
    try:
        with session.step(step) as note:
            result = session.engine.restart(step=step)
            note["detail"] = f"{result.strategy}: pid {result.pid}"
        return result
    except OpspatchError as exc:
        raise HostFailed(FAILED, f"{step}: {describe_error(exc)}") from exc


def ready_step(session: HostSession, restart: RestartResult, *, step: str = "ready") -> None:
    """Wait until the engine is ready, as a recorded step (`HostFailed` when it is not)."""
    try:
        with session.step(step) as note:
            ready = session.engine.wait_ready(restart, step=step)
            note["detail"] = f"/health 200 after {ready.seconds:.1f}s ({ready.polls} polls)"
    except OpspatchError as exc:
        raise HostFailed(FAILED, f"{step}: {describe_error(exc)}") from exc


def smoke_step(
    session: HostSession,
    restart: RestartResult | None,
    *,
    baseline: Sequence[str | None] | None,
    step: str = "smoke",
    must_pass: bool = True,
) -> SmokeResult:
    """The smoke decode as a recorded step; with `must_pass`, a failed check ends the pipeline
    (`HostFailed`), otherwise the result is returned for the caller to report."""
    try:
        with session.step(step) as note:
            result = session.engine.smoke(
                log_offset=restart.log_offset if restart else None,
                baseline=baseline,
                pid=restart.pid if restart else None,
                step=step,
            )
            note["detail"] = result.summary()
            if must_pass and not result.ok:
                raise HostFailed(FAILED, f"smoke failed: {result.summary()}")
        return result
    except OpspatchError as exc:
        raise HostFailed(FAILED, f"{step}: {describe_error(exc)}") from exc


def release(session: HostSession) -> None:
    """Release the host's lock held by this run (best effort: it expires on its own)."""
    if session.run_id is None or session._ops is None:
        return
    try:
        with session.step("release"):
            session.ops.unlock(run_id=session.run_id, timeout=session.playbook.timeouts.lock)
    except OpspatchError:
        pass  # the lock expires on its own; the outcome is already decided


# ---------------------------------------------------------------------------------------------
# the fleet


@dataclass
class FleetRollout:
    """Apply one patch across selected hosts under a playbook (canary, batches, halting).

    `run_id` / `ledger` are None for a dry run, which locks nothing and records nothing.
    """

    patch: LoadedPatch
    playbook: Playbook
    hosts: Sequence[Host]
    factory: TransportFactory
    ledger: Ledger | None
    run_id: str | None
    progress: Progress = field(default_factory=NoProgress)
    dry_run: bool = False
    sessions: dict[str, HostSession] = field(default_factory=dict)

    def _session(self, host: Host) -> HostSession:
        if host.name not in self.sessions:
            self.sessions[host.name] = HostSession(
                host,
                self.factory,
                self.playbook,
                ledger=self.ledger,
                run_id=self.run_id,
                progress=self.progress,
            )
        return self.sessions[host.name]

    def run(self) -> RunReport:
        pipeline = ApplyPipeline(self.patch, self.playbook)
        try:
            prepared = self._preflight(pipeline)
            refused = self._refusals(prepared)
            if refused is not None or self.dry_run:
                report = refused or self._dry_run_report(prepared)
                if not self.dry_run:
                    self._release_all(prepared)
                return report
            return self._roll_out(pipeline, prepared)
        finally:
            for session in self.sessions.values():
                session.close()

    # -- preflight ------------------------------------------------------------------------

    def _preflight(self, pipeline: ApplyPipeline) -> dict[str, Prepared | HostOutcome]:
        """Begin + plan on every host, in parallel (bounded): nothing is changed here."""
        results: dict[str, Prepared | HostOutcome] = {}

        def one(host: Host) -> Prepared | HostOutcome:
            session = self._session(host)
            try:
                return pipeline.prepare(session, lock=not self.dry_run)
            except OpspatchError as exc:
                return session.refused(exc)

        workers = max(1, min(len(self.hosts), 16))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="preflight") as pool:
            for host, result in zip(self.hosts, pool.map(one, self.hosts), strict=True):
                results[host.name] = result
        return results

    def _refusals(self, prepared: Mapping[str, Prepared | HostOutcome]) -> RunReport | None:
        """A run where the patch does not fit some host is refused before anything changes."""
        outcomes: list[HostOutcome] = []
        refused = False
        for host in self.hosts:
            item = prepared[host.name]
            if isinstance(item, HostOutcome):
                refused = refused or item.outcome == SKIPPED
                outcomes.append(item)
                continue
            problem = item.version_problem
            if problem is None and isinstance(item.plan, NotApplicable):
                problem = item.plan.render()
            if problem is not None:
                refused = True
                outcomes.append(
                    HostOutcome(
                        host.name,
                        SKIPPED,
                        f"not applicable: {problem}",
                        steps=tuple(self._session(host).steps),
                    )
                )
            else:
                outcomes.append(
                    HostOutcome(host.name, SKIPPED, None, steps=tuple(self._session(host).steps))
                )
        if not refused:
            return None
        return RunReport(
            self.run_id,
            "apply",
            self.patch.spec.id,
            tuple(outcomes),
            halted="refused before any change: the patch does not fit every selected host",
            dry_run=self.dry_run,
            refused=True,
        )

    def _dry_run_report(self, prepared: Mapping[str, Prepared | HostOutcome]) -> RunReport:
        outcomes = []
        for host in self.hosts:
            item = prepared[host.name]
            if isinstance(item, HostOutcome):
                outcomes.append(item)
                continue
            plan = item.plan
            file = item.inspection.file
            steps = tuple(self._session(host).steps)
            if isinstance(plan, Applied):
                outcomes.append(
                    HostOutcome(
                        host.name,
                        "would-apply",
                        None,
                        FileChange(file.realpath, plan.sha256_before, plan.sha256_after),
                        steps,
                        diff=plan.diff,
                    )
                )
            else:
                reason = plan.reason if isinstance(plan, AlreadyApplied) else plan.render()
                outcomes.append(
                    HostOutcome(
                        host.name,
                        plan.outcome,
                        reason,
                        FileChange(file.realpath, file.sha256, file.sha256),
                        steps,
                    )
                )
        return RunReport(None, "apply", self.patch.spec.id, tuple(outcomes), dry_run=True)

    def _release_all(self, prepared: Mapping[str, Prepared | HostOutcome]) -> None:
        # Every host that got as far as `begin` may hold our lock (an inspection can fail after
        # the lock was taken); releasing one we do not hold is a harmless refusal.
        for session in self.sessions.values():
            release(session)

    # -- the rollout ---------------------------------------------------------------------------

    def _roll_out(
        self, pipeline: ApplyPipeline, prepared: dict[str, Prepared | HostOutcome]
    ) -> RunReport:
        outcomes: dict[str, HostOutcome] = {}
        # Hosts that failed preflight (unreachable, locked by someone else) count as failures.
        for name, item in prepared.items():
            if isinstance(item, HostOutcome):
                outcomes[name] = item
        names = [h.name for h in self.hosts if h.name not in outcomes]
        plan = plan_rollout(self.playbook, names)
        canaries = [n for b in plan.batches if b.canary for n in b.hosts]
        by_name = {h.name: h for h in self.hosts}
        halted: str | None = self.playbook.halt_reason(
            {n: o.outcome for n, o in outcomes.items()}, canaries=canaries
        )
        lock = threading.Lock()

        def one(name: str) -> HostOutcome:
            session = self._session(by_name[name])
            item = prepared[name]
            assert isinstance(item, Prepared)
            try:
                if isinstance(item.plan, AlreadyApplied):
                    file = item.inspection.file
                    return HostOutcome(
                        name,
                        ALREADY_APPLIED,
                        None,
                        FileChange(file.realpath, file.sha256, file.sha256),
                        tuple(session.steps),
                    )
                return pipeline.apply(session, item)
            except Exception as exc:  # a bug must not lose the other hosts' outcomes
                return HostOutcome(
                    name,
                    NEEDS_ATTENTION,
                    f"internal error: {describe_error(exc)}",
                    steps=tuple(session.steps),
                )
            finally:
                release(session)

        for batch in plan.batches:
            if halted:
                break
            pending = list(batch.hosts)
            running: dict[Future[HostOutcome], str] = {}
            with ThreadPoolExecutor(
                max_workers=max(1, batch.in_flight), thread_name_prefix="rollout"
            ) as pool:
                while pending or running:
                    while pending and len(running) < batch.in_flight and not halted:
                        name = pending.pop(0)
                        running[pool.submit(one, name)] = name
                    if not running:
                        break
                    done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                    for future in done:
                        name = running.pop(future)
                        with lock:
                            outcomes[name] = future.result()
                            self._record_outcome(outcomes[name])
                        halted = halted or self.playbook.halt_reason(
                            {n: o.outcome for n, o in outcomes.items()}, canaries=canaries
                        )
                    if halted:
                        pending.clear()
        for name in names:
            if name not in outcomes:
                session = self._session(by_name[name])
                release(session)
                outcomes[name] = HostOutcome(
                    name, SKIPPED, f"not started: the rollout halted ({halted})"
                )
                self._record_outcome(outcomes[name])
        if halted and self.playbook.on_halt == "rollback-run":
            self._roll_back_run(pipeline, prepared, outcomes)
        for name, outcome in outcomes.items():
            if name not in names:  # preflight failures were not recorded yet
                self._record_outcome(outcome)
        ordered = tuple(outcomes[h.name] for h in self.hosts)
        return RunReport(self.run_id, "apply", self.patch.spec.id, ordered, halted=halted)

    def _roll_back_run(
        self,
        pipeline: ApplyPipeline,
        prepared: Mapping[str, Prepared | HostOutcome],
        outcomes: dict[str, HostOutcome],
    ) -> None:
        """`on_halt = "rollback-run"`: restore every host this run applied."""
        by_name = {h.name: h for h in self.hosts}
        for name, outcome in list(outcomes.items()):
            item = prepared.get(name)
            if (
                outcome.outcome != APPLIED
                or not isinstance(item, Prepared)
                or not isinstance(item.plan, Applied)
            ):
                continue
            session = self._session(by_name[name])
            assert outcome.file is not None
            try:
                assert session.run_id is not None
                session.ops.lock(run_id=session.run_id, timeout=self.playbook.timeouts.lock)
                rolled = pipeline._roll_back(
                    session, outcome.file, item.plan, "the rollout halted (on_halt = rollback-run)"
                )
            finally:
                release(session)
            outcomes[name] = rolled
            self._record_outcome(rolled)

    def _record_outcome(self, outcome: HostOutcome) -> None:
        record_outcome(self.ledger, self.run_id, outcome)


def begin_run(
    ledger: Ledger,
    *,
    command: str,
    patch: LoadedPatch | None,
    hosts: Sequence[Host],
    command_line: str,
    playbook: Playbook | None = None,
    parent_run: str | None = None,
) -> str:
    """Start a ledger run (after checking the chain is intact, as apply must)."""
    ledger.ensure_intact()
    return ledger.begin_run(
        command=command,
        patch_id=patch.spec.id if patch else None,
        patch_sha256=patch.sha256 if patch else None,
        operator=operator_identity(),
        command_line=command_line,
        hosts=[h.name for h in hosts],
        playbook=playbook.name if playbook else None,
        parent_run=parent_run,
    )


def finish_run(ledger: Ledger, report: RunReport) -> None:
    if report.run_id is not None:
        ledger.finish_run(report.run_id, report.outcome)


def local_file_host(python: str, state_dir: str) -> Host:
    """The controller itself as a host, for the `--file` commands: local transport, the given
    interpreter validates the new text, backups and the lock live in `state_dir`."""
    return Host(
        name=f"local:{socket.gethostname()}",
        inventory="local",
        address="localhost",
        port=None,
        user=None,
        identity_file=None,
        known_hosts=None,
        jump=None,
        transport="local",
        state_dir=state_dir,
        vars={},
        engine=EngineSettings(python=python),
        groups=(),
    )
