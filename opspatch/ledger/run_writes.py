"""Recording a run: its start, each host's steps, facts, file versions (with their bytes) and
outcome, its end; and an `approve` run, which is one `sign` step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opspatch import __version__
from opspatch.core.codec import check_present
from opspatch.core.filechange import FileChange
from opspatch.core.hostfacts import HostFacts
from opspatch.core.reasons import Reason
from opspatch.core.source import sha256_hex
from opspatch.core.vocabulary import (
    RECORDED_OUTCOMES,
    Command,
    EventKind,
    FileAction,
    Outcome,
    RunOutcome,
    Step,
    StepStatus,
)
from opspatch.errors import LedgerError
from opspatch.ledger.chain import EventRow, canonical_json, store_blob, stored_blob
from opspatch.ledger.database import Database
from opspatch.ledger.events import file_version, require_open_run, start_event
from opspatch.ledger.liveness import ControllerProcess
from opspatch.ledger.records import (
    FileVersion,
    NewFileVersion,
    new_run_id,
    require_sha256,
    require_word,
)
from opspatch.ledger.transactions import RunEvent, Transactions


class RunWrites(Transactions):
    """The writes of a run's lifecycle: `begin_run`, `record_step`, `record_facts`,
    `record_file_version`, `record_host_outcome`, `finish_run`; and `record_approval`."""

    # -- writing --------------------------------------------------------------------------------

    def begin_run(
        self,
        *,
        command: Command,
        patch_id: str | None,
        patch_sha256: str | None,
        operator: str,
        command_line: str,
        hosts: Sequence[str],
        playbook: str | None = None,
        parent_run: str | None = None,
        inventories: Mapping[str, str] | None = None,
        approved_by: Sequence[str] | None = None,
    ) -> str:
        """Record the start of a run and return its new id.

        `command` is the opspatch command (`apply`, `rollback`, `recover`, ...); `parent_run` names
        the run this one rolls back or recovers; `inventories` names, per host, the inventory it
        was taken from (so that `recover` finds the same hosts when another inventory has a host
        of the same name, as `sandbox` and `sandbox-ssh` do). The controller's hostname, pid and process start
        time are recorded so the run can later be told apart as running or interrupted.
        `approved_by` names the principals whose signatures of the patch were verified before
        the run began (left out of the body when None, so older bodies stay byte-identical).

        Raises:
            ValueError: `command` is not a `Command` or `patch_sha256` is not a sha256.
            LedgerError: the ledger cannot be written.
        """
        command = require_word(Command, command, "command")
        if patch_sha256 is not None:
            require_sha256(patch_sha256, "patch_sha256")
        if isinstance(hosts, str):
            raise ValueError("hosts must be a sequence of host names, not one string")
        body = {
            "command": command.value,
            "patch_id": patch_id,
            "patch_sha256": patch_sha256,
            "playbook": playbook,
            "operator": operator,
            "command_line": command_line,
            "hosts": list(hosts),
            "parent_run": parent_run,
            "controller": ControllerProcess.current().to_json(),
            "opspatch_version": __version__,
        }
        if inventories is not None:
            body["inventories"] = dict(inventories)
        if approved_by is not None:
            body["approved_by"] = list(approved_by)

        def write(conn: Database) -> str:
            for _attempt in range(5):
                run_id = new_run_id()
                if start_event(conn, run_id) is None:
                    break
            else:  # pragma: no cover - 24 random bits colliding five times in one second
                raise LedgerError("could not pick an unused run id")
            if parent_run is not None and start_event(conn, parent_run) is None:
                raise LedgerError(f"parent run {parent_run} is not in the ledger")
            self._append(conn, run_id=run_id, kind=EventKind.RUN_STARTED, body=body)
            return run_id

        return self._write(write)

    def record_step(
        self,
        run_id: str,
        host: str,
        step: Step,
        status: StepStatus | str,
        seconds: float | None = None,
        detail: str = "",
    ) -> None:
        """Record that `host` went through `step` with `status` (a `StepStatus`: `started`, `ok`,
        `failed`, `skipped`).

        Raises:
            ValueError: `step` is not a `Step` or `status` not a step status.
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        name = require_word(Step, step, "step")
        word = require_word(StepStatus, status, "status")
        body = {"step": name.value, "status": word.value, "seconds": seconds, "detail": detail}
        canonical_json(body)  # fail before the transaction, which other threads' events share
        self._append_to_run(RunEvent(run_id, EventKind.STEP, host, body))

    def record_facts(self, run_id: str, host: str, facts: HostFacts | Mapping[str, Any]) -> None:
        """Record what was found on `host` (python, sglang, torch versions, GPUs, ...).

        A run records its `HostFacts`. A plain object (facts in an earlier opspatch's shape,
        which ledgers hold and `ledger show` prints as they are) is checked key by key: a key
        `HostFacts` names must hold its type (the machine lookup reads `machine_id` and
        `hostname`); other keys are kept as they are.

        Raises:
            ValueError: a key of `facts` that `HostFacts` names holds another type.
            TypeError, ValueError: `facts` is not JSON-serialisable.
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        if isinstance(facts, HostFacts):
            body = {"facts": facts.to_json()}
        else:
            check_present(HostFacts, facts, "facts")
            body = {"facts": dict(facts)}
        canonical_json(body)  # fail before the transaction, with the caller's own error
        self._append_to_run(RunEvent(run_id, EventKind.FACTS, host, body))

    def record_file_version(self, run_id: str, host: str, version: NewFileVersion) -> FileVersion:
        """Record a change of a file on `host`, storing the full bytes before it (and after it).

        Record it before the swap (backup step), so that a controller killed mid-swap still has
        the pre-image. Returns what was recorded.

        Raises:
            ValueError: a hash is malformed, the bytes do not hash to the hashes given, or
                `action` is unknown.
            LedgerError: the run is unknown or finished, the ledger cannot be written, or (no
                `pre_image`) it holds no bytes under `sha256_before`.
            LedgerIntegrityError: the blob store already holds different bytes under that hash.
        """
        action = require_word(FileAction, version.action, "action")
        sha256_before, sha256_after = version.sha256_before, version.sha256_after
        require_sha256(sha256_before, "sha256_before")
        require_sha256(sha256_after, "sha256_after")
        post_image, container = version.post_image, version.container
        if version.pre_image is not None and sha256_hex(version.pre_image) != sha256_before:
            raise ValueError("pre_image does not hash to sha256_before")
        if post_image is not None and sha256_hex(post_image) != sha256_after:
            raise ValueError("post_image does not hash to sha256_after")

        def write(conn: Database) -> EventRow:
            start = require_open_run(conn, run_id)
            pre_image = version.pre_image
            if pre_image is None:  # what a restore overwrote: the ledger's own bytes
                pre_image = stored_blob(conn, sha256_before)
            body = {
                "patch_id": start.data["patch_id"],
                "action": action.value,
                "sha256_before": sha256_before,
                "sha256_after": sha256_after,
                "mode": int(version.mode),
                "owner": version.owner,
                "size_before": len(pre_image),
            }
            if container is not None:
                body["container"] = container.to_json()
            store_blob(conn, sha256_before, pre_image)
            if post_image is not None:
                store_blob(conn, sha256_after, post_image)
            return self._append(
                conn,
                run_id=run_id,
                kind=EventKind.FILE_VERSION,
                host=host,
                path=version.path,
                body=body,
                pre_image=sha256_before,
                post_image=sha256_after if post_image is not None else None,
            )

        return file_version(self._write(write))

    def record_host_outcome(
        self,
        run_id: str,
        host: str,
        outcome: Outcome | str,
        error: str | None = None,
        file: FileChange | None = None,
        reason: Reason | None = None,
    ) -> None:
        """Record how `host` ended in this run (`applied`, `rolled-back`, `needs-attention`, ...).

        `outcome` is one of the `RECORDED_OUTCOMES` of the vocabulary. `file` is the file the
        host's run was about, as the JSON output shows it. `reason` is the code of `error`,
        written only when there is one (an event of an older run has none). A later outcome for
        the same host supersedes an earlier one (for example after `recover`).

        Raises:
            ValueError: `outcome` is not a recorded host outcome; `file` is not a `FileChange`.
            LedgerError: the run is unknown or finished, or the ledger cannot be written.
        """
        word = require_word(Outcome, outcome, "outcome", RECORDED_OUTCOMES)
        if file is not None and not isinstance(file, FileChange):
            raise ValueError(f"file must be a FileChange, got {type(file).__name__}")
        body = {
            "outcome": word.value,
            "error": error,
            "file": None if file is None else file.to_json(),
        }
        if reason is not None:
            body["reason"] = require_word(Reason, reason, "reason").value
        canonical_json(body)
        self._append_to_run(RunEvent(run_id, EventKind.HOST_OUTCOME, host, body))

    def finish_run(self, run_id: str, outcome: RunOutcome) -> None:
        """Record the end of a run with its overall outcome; nothing can be added to it after.

        Raises:
            ValueError: `outcome` is not a `RunOutcome`.
            LedgerError: the run is unknown or already finished, or the ledger cannot be written.
        """
        body = {"outcome": require_word(RunOutcome, outcome, "outcome").value}

        def write(conn: Database) -> None:
            require_open_run(conn, run_id)
            self._append(conn, run_id=run_id, kind=EventKind.RUN_FINISHED, body=body)

        self._write(write)

    # -- approvals (history: `approve` runs) -----------------------------------------------------

    def record_approval(
        self,
        *,
        patch_id: str | None,
        patch_sha256: str,
        principal: str,
        signature: str,
        operator: str,
        command_line: str,
    ) -> str:
        """Record that `principal` signed `patch_sha256` (`signature`, armored OpenSSH): a finished
        run with command `approve` and one `sign` step; returns the run id.

        Raises:
            ValueError: `patch_sha256` is not a sha256, or `principal` is empty.
            LedgerError: the ledger cannot be written.
        """
        if not principal.strip():
            raise ValueError("principal must not be empty")
        run_id = self.begin_run(
            command=Command.APPROVE,
            patch_id=patch_id,
            patch_sha256=patch_sha256,
            operator=operator,
            command_line=command_line,
            hosts=[],
        )
        self.record_step(run_id, principal, Step.SIGN, StepStatus.OK, detail=signature)
        self.finish_run(run_id, RunOutcome.OK)
        return run_id
