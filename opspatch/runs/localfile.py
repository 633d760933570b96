"""Runs on a file of the controller's own disk: `plan`, `apply` and `rollback` with `--file`.

They use the host agent too (local transport, a lock and backups under `<state>/local`), so a
local file gets the same host-side compile check, atomic write and ledger record as a fleet; only
the restart is skipped. The file must be the patch's module (its path ends in the module's path)
and its distribution's version (from the `*.dist-info` beside it, or `--target-version`) inside
the patch's range.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, apply_patch
from opspatch.core.gate import version_gate
from opspatch.core.host import EngineSettings, Host
from opspatch.core.policy import Playbook
from opspatch.core.source import sha256_hex
from opspatch.core.spec import LoadedPatch, Target
from opspatch.core.tomlsource import parse_field_path
from opspatch.core.vocabulary import Outcome
from opspatch.errors import InputError, Location, OpspatchError, SpecError, TargetError
from opspatch.ledger.store import Ledger, RunDetail
from opspatch.runs.connect import transport_factory
from opspatch.runs.pipeline import ApplyPipeline
from opspatch.runs.recorded import recorded_run
from opspatch.runs.report import FileChange, HostOutcome, RunReport
from opspatch.runs.restore import rollback_hosts
from opspatch.runs.session import HostSession, NoProgress


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def distribution_version_for(file: Path, target: Target) -> str | None:
    """The version in `<site>/<distribution>-<version>.dist-info/METADATA` beside the package that
    holds `file`, or None when the file is not inside an installed distribution (a checkout)."""
    resolved = file.resolve().as_posix()
    for relpath in target.module_relpaths():
        if resolved.endswith("/" + relpath):
            site = Path(resolved[: -len(relpath) - 1])
            break
    else:
        return None
    wanted = _normalize(target.distribution)
    for info in sorted(site.glob("*.dist-info")):
        name = info.name[: -len(".dist-info")]
        dist, _, version = name.partition("-")
        if _normalize(dist) != wanted:
            continue
        metadata = info / "METADATA"
        if metadata.is_file():
            headers = HeaderParser().parsestr(
                metadata.read_text(encoding="utf-8", errors="replace")
            )
            return headers.get("Version") or version or None
        return version or None
    return None


def local_file_host(python: str, state_dir: str) -> Host:
    """The controller itself as a host, for the `--file` commands: local transport, the given
    interpreter validates the new text, backups and the lock live in `state_dir`. Its name,
    `local:<hostname>`, is what the ledger and every outcome call it."""
    return Host.local(f"local:{socket.gethostname()}", state_dir, EngineSettings(python=python))


def not_applicable_error(
    loaded: LoadedPatch, target: str, outcome: NotApplicable, *, part: int = 0
) -> SpecError:
    """A NotApplicable outcome as an error naming the patch file, line and field, and the target
    (`part`: which target of a patch set; its fields are `targets[part]....`)."""
    reason = f"{target}: {outcome.reason}"
    if loaded.is_set:
        reason = f"{loaded.parts[part].target.module} ({reason})"
    if outcome.candidates:
        reason += "\n" + "\n".join(f"    {c}" for c in outcome.candidates)
    if outcome.field:
        field: Sequence[str | int] = parse_field_path(outcome.field)
        if loaded.is_set:
            inside = field[1:] if field[0] == "target" else field
            field = loaded.target_field(part, *inside)
        return SpecError(loaded.location(field), reason)
    if loaded.is_set:
        return SpecError(loaded.location(loaded.target_field(part)), reason)
    return SpecError(Location(loaded.path), reason)


@dataclass(frozen=True)
class LocalPlan:
    """A patch planned on a local file: the file, its distribution's version (if known) and the
    plan's outcome."""

    file: Path
    version: str | None
    outcome: Applied | AlreadyApplied | NotApplicable


def plan_local_file(loaded: LoadedPatch, file: Path, target_version: str | None) -> LocalPlan:
    """Check that `file` is the patch's target and plan the patch on its bytes (pure otherwise).

    Raises:
        InputError: there is no such file.
        TargetError: the file is not the patch's module, or its version is outside the range.
    """
    loaded.only_target("--file")
    if not file.is_file():
        raise InputError(f"{file}: no such file")
    version = target_version or distribution_version_for(file, loaded.spec.target)
    path = str(file.resolve())
    field: tuple[str, str] = ("target", "module")
    mismatch = loaded.spec.target.mismatch(path, None)
    if mismatch is None:
        field = ("target", "versions")
        mismatch = version_gate(
            loaded.spec.target, path, owner=None, owner_version=None, installed_version=version
        )
    if mismatch:
        raise TargetError(
            f"{loaded.location(field)}: {mismatch}",
            hint="check that the file is the module and release this patch is for"
            + ("" if version else "; pass --target-version when no dist-info says"),
        )
    return LocalPlan(file, version, apply_patch(file.read_bytes(), loaded.spec))


def apply_local_file(
    loaded: LoadedPatch, plan: LocalPlan, *, python: str, ledger: Ledger, state_dir: Path
) -> RunReport:
    """Apply a planned patch to the local file, recorded in the ledger (nothing to restart).

    Raises:
        SpecError: the plan says the patch does not fit the file.
    """
    if isinstance(plan.outcome, NotApplicable):
        raise not_applicable_error(loaded, str(plan.file), plan.outcome)
    host = local_file_host(python, str(state_dir / "local"))
    if isinstance(plan.outcome, AlreadyApplied):
        sha = sha256_hex(plan.file.read_bytes())
        already = HostOutcome(
            host.name,
            Outcome.ALREADY_APPLIED,
            file=FileChange(str(plan.file.resolve()), sha, sha),
            note=plan.outcome.reason,
        )
        return RunReport(None, "apply", loaded.spec.id, hosts=(already,))
    playbook = Playbook()
    with recorded_run(ledger, command="apply", patch=loaded, hosts=[host]) as run:
        pipeline = ApplyPipeline(
            loaded, playbook, restart_engine=False, unrestarted=Outcome.APPLIED
        )
        if isinstance(plan.outcome, Applied):
            pipeline.reuse(plan.outcome)
        with HostSession(
            host,
            transport_factory(),
            playbook,
            recorder=run,
            progress=NoProgress(),
        ) as session:
            try:
                prepared = pipeline.prepare(
                    session,
                    lock=True,
                    paths=[str(plan.file.resolve())],
                    installed_version=plan.version,
                )
                if prepared.pending:
                    result = pipeline.apply(session, prepared)
                else:
                    result = session.outcome(Outcome.ALREADY_APPLIED)
            except OpspatchError as exc:
                result = session.refused(exc)
            finally:
                session.lock.release()
            run.outcome(result)
        return run.finish(RunReport(run.run_id, "apply", loaded.spec.id, hosts=(result,)))


def rollback_local_file(
    file: Path,
    *,
    patch: LoadedPatch | None = None,
    source_run: RunDetail | None = None,
    python: str,
    ledger: Ledger,
    state_dir: Path,
) -> RunReport:
    """Restore the pre-image opspatch recorded for `file` by `patch` (or by the run
    `source_run`), where the file is still what opspatch wrote.

    Raises:
        InputError: no such file, or the ledger has no change by this patch (run) to it.
    """
    if patch is not None:
        patch.only_target("rollback --file")
    if not file.is_file():
        raise InputError(f"{file}: no such file")
    host = local_file_host(python, str(state_dir / "local"))
    path = str(file.resolve())
    history = ledger.file_history(host.name, path)
    if source_run is not None:
        by = f"run {source_run.run_id}"
        recorded = any(v.run_id == source_run.run_id for v in history)
    else:
        by = patch.spec.id if patch else "?"
        recorded = bool(history)
    if not recorded:
        raise InputError(
            f"the ledger has no change by {by} to {path} on this machine",
            hint="rollback restores what opspatch recorded; see `opspatch ledger list`",
        )
    return rollback_hosts(
        ledger=ledger,
        hosts=[host],
        factory=transport_factory(),
        playbook=Playbook(),
        patch=patch,
        source_run=source_run,
        restart_engine=False,
        only_path=path,
    )
