"""A file put back the way every run does it (the host's backup, else the ledger's copy), and the
steps an undo records."""

from __future__ import annotations

from dataclasses import dataclass

from opspatch.core.vocabulary import FileAction, Step
from opspatch.errors import InputError, RemoteOperationError
from opspatch.hosts.operations import RestoreReply
from opspatch.hosts.results import RemoteFile, file_owner
from opspatch.ledger.records import ContainerRecord, NewFileVersion
from opspatch.runs.fleet.session import HostSession, describe_error

# The codes of an agent that did not answer, or failed part-way: what it wrote is unknown.
_UNKNOWN_EFFECT_CODES = frozenset({"agent-no-reply", "agent-error"})


def effect_unknown(exc: BaseException) -> bool:
    """Only a refusal the agent replied with says a failed exec wrote nothing."""
    if isinstance(exc, RemoteOperationError):
        return exc.code in _UNKNOWN_EFFECT_CODES
    return not isinstance(exc, InputError)


def file_version(
    file: RemoteFile,
    sha256_before: str,
    sha256_after: str,
    *,
    pre_image: bytes | None,
    post_image: bytes | None = None,
    action: FileAction = FileAction.PATCH,
    container: ContainerRecord | None = None,
) -> NewFileVersion:
    """The ledger's record of a change to `file` as it was read: its path, mode and owner kept."""
    return NewFileVersion(
        file.realpath,
        sha256_before,
        sha256_after,
        file.mode,
        file_owner(file),
        pre_image=pre_image,
        post_image=post_image,
        action=action,
        container=container,
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
) -> RestoreReply:
    """From the host's own backup, else the ledger's copy; recorded as a file version."""

    def restore(content: bytes | None = None) -> RestoreReply:
        return session.ops.restore(
            path,
            pre_sha256=pre_sha256,
            content=content,
            current_sha256=post_sha256,
            timeout=timeout,
        )

    with session.step(Step.RESTORE) as note:
        try:
            try:
                restored = restore()
            except RemoteOperationError as exc:
                if exc.code not in ("backup-missing", "backup-hash-mismatch"):
                    raise
                content = session.recorder.stored_image(pre_sha256)
                if content is None:
                    raise
                restored = restore(content)
        except Exception as exc:
            if not effect_unknown(exc):
                raise
            # No reply: the restore may or may not have happened. Ask again: the agent reads
            # the file itself, restores it if it is still the post-image, and purges bytecode.
            again = restore()
            restored = {**again, "sha256_before": post_sha256, "changed": True}
            note["detail"] = (
                f"the first restore did not answer ({describe_error(exc)}); asked again: "
                + (
                    "it had worked"
                    if again["source"] == "already"
                    else f"restored from {again['source']}"
                )
            )
        else:
            note["detail"] = f"back to {restored['sha256_after'][:12]} from {restored['source']}"
    if restored["changed"]:
        session.recorder.file_version(
            session.name,
            NewFileVersion(
                path,
                restored["sha256_before"],
                restored["sha256_after"],
                mode,
                owner,
                pre_image=None,  # what it overwrote: the post-image the ledger holds
                action=FileAction.RESTORE,
                container=session.container,
            ),
        )
    return restored


@dataclass(frozen=True)
class RestoreSteps:
    restart: Step
    ready: Step
    smoke: Step


AFTER_RESTORE = RestoreSteps(
    Step.RESTART_AFTER_RESTORE, Step.READY_AFTER_RESTORE, Step.SMOKE_AFTER_RESTORE
)
"""An undo's steps after a failed proof (and recover's putting a set back)."""
AS_ROLLBACK = RestoreSteps(Step.RESTART, Step.READY, Step.SMOKE)
"""A rollback's steps: the restore is what it is for."""
