"""`opspatch bake`: the durable fix for images, a new image on top of one, the patch baked in."""

from __future__ import annotations

import re
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from opspatch.core.host import ContainerRuntime, ContainerSettings, EngineSettings, Host
from opspatch.core.policy import Playbook, plan_rollout
from opspatch.core.reasons import Reason
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import Command, Outcome, Step
from opspatch.errors import HostError, InputError, OpspatchError
from opspatch.hosts.image import (
    BakedFile,
    ImageIdentity,
    ImageRuntime,
    bake_labels,
    build_command,
    build_context,
    earlier_bakes,
)
from opspatch.ledger.records import ContainerRecord
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import misfit_reason
from opspatch.runs.fleet.connect import transport_factory
from opspatch.runs.fleet.fleetrun import FleetRun, per_node
from opspatch.runs.fleet.pipeline import ApplyPipeline, Prepared, PreparedFile
from opspatch.runs.fleet.recorded import run_recorded
from opspatch.runs.fleet.session import HostSession, NoProgress, Progress, describe_error
from opspatch.runs.report import HostOutcome, RunReport

SCRATCH_STATE_DIR = "/var/tmp/opspatch"
"""The agent's state (lock, backups) inside the scratch container: gone with it."""

_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]*\Z")
_TAG_SUFFIX = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class BakeRequest:
    """With `context_dir`, the build context is written there and nothing is built."""

    image: str
    tag: str | None = None
    context_dir: Path | None = None
    runtime: ContainerRuntime = "podman"
    python: str = "python3"


def default_tag(image: str, patch_id: str) -> str:
    """`REPO:TAG-PATCH` for `REPO:TAG` (`latest` when the image names no tag; a digest's repo)."""
    name = image.split("@", 1)[0]
    repo, _, tag = name.rpartition(":")
    if not repo or "/" in tag:  # the colon was a registry's port, not a tag
        repo, tag = name, "latest"
    suffix = _TAG_SUFFIX.sub("-", f"{tag}-{patch_id}")[:128]
    return f"{repo}:{suffix}"


def bake_image(
    patch: LoadedPatch,
    request: BakeRequest,
    playbook: Playbook,
    *,
    ledger: Ledger,
    progress: Progress | None = None,
    image_runtime: ImageRuntime | None = None,
) -> RunReport:
    """Bake `patch` into a new image on top of `request.image`, planned and checked in a
    scratch container of it (a refusal there is recorded; before it nothing is)."""
    progress = progress or NoProgress()
    runtime = image_runtime or ImageRuntime.on_controller(request.runtime)
    tag = request.tag or default_tag(request.image, patch.spec.id)
    _check_request(request, tag)
    base = runtime.inspect(request.image)
    earlier_bakes(base.labels)  # a base whose bake record cannot be carried on is refused now
    if isinstance(runtime.find(tag), ImageIdentity):  # a written context's build would retag it
        raise InputError(
            f"image {tag} exists already; nothing was "
            + ("built" if request.context_dir is None else "written"),
            hint=f"name another with --tag, or remove it (`{request.runtime} rmi {tag}`)",
        )
    scratch = ContainerSettings(request.runtime, f"opspatch-bake-{secrets.token_hex(4)}")
    try:  # a start that fails half-way can leave the container created: remove it whatever
        runtime.start_scratch(base.id, scratch.name)
        host = _scratch_host(tag, scratch, request.python)

        def baked(fleet: FleetRun) -> RunReport:
            bake = _Bake(patch, request, playbook, tag, base, runtime, fleet.recorder.run_id)
            prepared = fleet.preflight(bake.prepare)
            if prepared is None:
                return fleet.cancelled_report()
            item = prepared[host.name]
            if isinstance(item, HostOutcome):  # the scratch container could not be begun
                fleet.record(item)
                return fleet.report({host.name: item}, halted=None, refused=True)
            bake.refuse_misfits(item, fleet)
            outcomes, halted = fleet.execute(
                per_node(lambda session: bake.host(session, item)),
                batches=plan_rollout(playbook, [host.name]).batches,
                halt=lambda _: None,
            )
            return fleet.report(outcomes, halted=halted)

        return run_recorded(
            Command.BAKE,
            baked,
            ledger=ledger,
            hosts=[host],
            factory=transport_factory(),
            playbook=playbook,
            progress=progress,
            patch=patch,
            summary=f"{patch.spec.id} into {tag}, from {request.image}",
        )
    finally:
        runtime.remove(scratch.name)


def _check_request(request: BakeRequest, tag: str) -> None:
    if not _TAG.match(tag) or len(tag) > 255:
        raise InputError(
            f"--tag {tag!r} is not an image name; nothing was built",
            hint="use REPOSITORY[:TAG], letters, digits and . _ - / : only",
        )
    directory = request.context_dir
    if (
        directory is not None
        and directory.exists()
        and (not directory.is_dir() or any(directory.iterdir()))
    ):
        raise InputError(
            f"--dockerfile {directory}: exists and is not an empty directory; nothing was written",
            hint="name a new or empty directory for the build context",
        )


def _scratch_host(tag: str, scratch: ContainerSettings, python: str) -> Host:
    """The scratch container as a host of one: named by the tag the bake builds."""
    return Host.local(
        tag, SCRATCH_STATE_DIR, EngineSettings(python=python), inventory="", container=scratch
    )


@dataclass
class _Bake:
    patch: LoadedPatch
    request: BakeRequest
    playbook: Playbook
    tag: str
    base: ImageIdentity
    runtime: ImageRuntime
    run_id: str

    def __post_init__(self) -> None:
        self.pipeline = ApplyPipeline(self.patch, self.playbook, restart_engine=False)

    def prepare(self, session: HostSession) -> Prepared | HostOutcome:
        try:
            return self.pipeline.prepare(session, lock=True)
        except OpspatchError as exc:
            return session.refused(exc)

    def refuse_misfits(self, prepared: Prepared, fleet: FleetRun) -> None:
        """InputError (the run recorded refused): nothing to build."""
        misfit = prepared.misfit
        if misfit is not None:
            fleet.release_all()
            raise InputError(
                f"the patch does not fit image {self.request.image}: "
                f"{misfit_reason(self.patch, misfit)}; nothing was built"
            )
        if not prepared.pending:
            fleet.release_all()
            raise InputError(
                f"image {self.request.image} carries {self.patch.spec.id} already "
                f"({', '.join(f.path for f in prepared.files)}); nothing was built"
            )

    def host(self, session: HostSession, prepared: Prepared) -> HostOutcome:
        """The swap checks the patched files with the image's interpreter, then the image is
        built (or its context written) and its file versions recorded."""
        files = [self._baked(item) for item in prepared.pending]
        try:
            with session.step(Step.SWAP) as note:  # compiled by the image's own interpreter
                for item in prepared.pending:
                    plan = item.applied
                    result = session.ops.swap(
                        item.path,
                        expected_sha256=plan.sha256_before,
                        new_content=plan.new_source,
                        lock_run_id=session.lock.run_id,
                        release_lock=item is prepared.pending[-1],
                        timeout=self.playbook.timeouts.swap,
                    )
                    session.lock.given_back_by(result.lock_released)
                note["detail"] = "checked in a scratch container of the image: " + "; ".join(
                    f"{f.path} {f.sha256_before[:12]} -> {f.sha256_after[:12]}" for f in files
                )
        except OpspatchError as exc:
            return session.outcome(
                Outcome.FAILED,
                f"the image's interpreter refused the patched file: {describe_error(exc)}; "
                "nothing was built",
                file=prepared.change(),
                reason=Reason.STEP_FAILED,
            )
        labels = bake_labels(
            patch_id=self.patch.spec.id,
            patch_sha256=self.patch.sha256,
            files=files,
            run_id=self.run_id,
            base=self.base,
        )
        # Built here, FROM the very image the plan ran on (its id: a tag may have moved since);
        # a context for a pipeline names the reference, and its labels carry the base's digest.
        base = self.request.image if self.request.context_dir is not None else self.base.id
        context = build_context(base, files, labels, prepared.diff())
        if self.request.context_dir is not None:
            directory = self.request.context_dir
            with session.step(Step.CONTEXT) as note:
                _write_context(directory, context)
                note["detail"] = f"{len(context)} file(s) in {directory}"
            self._record(session, prepared, image_id="")
            command = build_command(self.request.runtime, self.tag, str(directory)).render()
            return session.outcome(
                Outcome.BAKED,
                file=prepared.change(),
                note=f"build context written to {directory}; build it with: {command}",
            )
        with tempfile.TemporaryDirectory(prefix="opspatch-bake-") as scratch_dir:
            try:
                with session.step(Step.BUILD) as note:
                    _write_context(Path(scratch_dir), context)
                    built = self.runtime.build(self.tag, scratch_dir)
                    if not built.ok:
                        raise HostError(
                            f"the image was not built: {self.request.runtime} build: "
                            f"{self.runtime.words(built)}",
                            host=self.tag,
                            step="build",
                        )
                    image = self._inspect_built()
                    note["detail"] = f"{self.tag} {image.id[:12]} FROM {self.request.image}"
            except OpspatchError as exc:
                return session.outcome(
                    Outcome.FAILED,
                    f"the bake failed: {describe_error(exc)}",
                    file=prepared.change(),
                    reason=Reason.STEP_FAILED,
                )
        self._record(session, prepared, image_id=image.id)
        return session.outcome(
            Outcome.BAKED,
            file=prepared.change(),
            note=f"image {self.tag} (id {image.id[:12]}) built FROM {self.request.image}, "
            f"labelled {self.patch.spec.id}",
        )

    def _inspect_built(self) -> ImageIdentity:
        """One that cannot be inspected is untagged again: a failed bake leaves no image."""
        try:
            return self.runtime.inspect(self.tag)
        except OpspatchError as exc:
            removed = self.runtime.remove_image(self.tag)
            gone = (
                "the tag was removed again"
                if removed.ok
                else f"removing the tag failed ({self.runtime.words(removed)}): remove it with "
                f"`{self.request.runtime} rmi {self.tag}`"
            )
            raise HostError(
                f"the image was built as {self.tag} but could not be inspected ({exc.message}); "
                f"{gone}",
                host=self.tag,
                step="build",
            ) from None

    def _baked(self, item: PreparedFile) -> BakedFile:
        plan = item.applied
        seen = item.inspection.file
        return BakedFile(
            path=item.path,
            content=plan.new_source,
            mode=seen.mode,
            uid=seen.uid,
            gid=seen.gid,
            sha256_before=plan.sha256_before,
            sha256_after=plan.sha256_after,
        )

    def _record(self, session: HostSession, prepared: Prepared, *, image_id: str) -> None:
        """The container record names the image (no id while only its context is written)."""
        image = ContainerRecord(self.request.runtime, self.tag, image_id, "", self.request.image)
        for item in prepared.pending:
            session.recorder.file_version(session.name, item.version(image))


def _write_context(directory: Path, context: Mapping[str, bytes]) -> None:
    for relative, data in context.items():
        target = directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o644)  # the image's mode is the COPY's --chmod, not the context's
