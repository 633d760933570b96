"""`opspatch rehearse PATCH`: a hot fix tried on the real release, on this CPU, before a fleet."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from opspatch.core.edit import AlreadyApplied, Applied, apply_patch
from opspatch.core.policy import JudgeSettings, Playbook
from opspatch.core.spec import LoadedPatch, PatchSpec
from opspatch.core.vocabulary import Step
from opspatch.errors import (
    EXIT_BAD_INPUT,
    EXIT_HOST_FAILED,
    EXIT_OK,
    InputError,
    RunInterrupted,
)
from opspatch.hosts.agent.processes import stop_process_tree
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.fleet.connect import transport_factory
from opspatch.runs.report import HostOutcome
from opspatch.sandbox.down import sandbox_down
from opspatch.sandbox.install import host_venv_dir, venv_site_packages
from opspatch.sandbox.layout import Progress, SandboxLayout, host_name, quiet, sandbox_playbook
from opspatch.sandbox.manifest import (
    Manifest,
    RealEngineRecord,
    load_manifest,
    sandbox_inventory,
)
from opspatch.sandbox.processes import proc_text
from opspatch.sandbox.real.build import (
    BaseEnv,
    BuildProgress,
    engine_cache_dir,
    ensure_wheel,
    no_progress,
)
from opspatch.sandbox.real.hostenv import make_real_host_python
from opspatch.sandbox.real.importprobe import probe_imports
from opspatch.sandbox.real.prepare import prepare_real_engine
from opspatch.sandbox.real.release import EngineChoice
from opspatch.sandbox.rehearsal import (
    RehearsalReport,
    Stage,
    StageResult,
    StageStatus,
    Teardown,
    apply_stages,
    baseline_stage,
    import_stage,
    not_reached,
)
from opspatch.sandbox.up import sandbox_up

HOST = host_name(0)
"""The rehearsal's one host: its old server is the judge's baseline (docs/rehearse.md)."""

REHEARSAL_JUDGE = JudgeSettings(
    count=9, max_new_tokens=16, warmup=1, latency_rise=9.0, timeout=1800.0
)
"""Nine prompts of 16 tokens, the fewest on which a change can be significant at alpha 0.01:
tokens and acceptance are exact under greedy decoding, so few prompts prove them; a real decode
here takes seconds. Latency fails only when ten times slower:
the CPU's timing of a GPU engine says little, and this machine's neighbours move it threefold."""


def rehearsal_playbook() -> Playbook:
    """The sandbox's real-engine timeouts, with `REHEARSAL_JUDGE`."""
    return replace(sandbox_playbook(real=True), name="rehearsal", judge=REHEARSAL_JUDGE)


@dataclass(frozen=True)
class ReleaseFile:
    """One target of the patch in the release's wheel: its module, its path in site-packages,
    and its bytes as released and as patched."""

    module: str
    relpath: str
    released: bytes
    patched: bytes


# ---------------------------------------------------------------------------------------------
# the input, checked with nothing started


def _wheel_path(target: PatchSpec, names: set[str]) -> str | None:
    return next((p for p in target.target.module_relpaths() if p in names), None)


def release_files(
    patch: LoadedPatch, engine: EngineChoice, cache: Path | None = None
) -> tuple[ReleaseFile, ...]:
    """Each target of `patch` as the release ships it and as the patch makes it (a file the
    release already carries the change in keeps its bytes).

    Raises:
        InputError: a target of another distribution, a module the release does not ship, a
            release outside the patch's range, an edit that does not fit the released file.
        IndexUnreachable: the release's wheel is not cached and the index does not answer.
    """
    assert engine.version is not None
    version = engine.version
    for part in patch.parts:
        if part.target.distribution.replace("_", "-").lower() != "sglang":
            raise InputError(
                f"{patch.reference}: targets {part.target.module} of the distribution "
                f"{part.target.distribution!r}; a rehearsal runs real SGLang (sglang {version}); nothing was started",
                hint="rehearse a patch of sglang's own modules",
            )
    wheel = ensure_wheel(cache or engine_cache_dir(), version, lambda _: None)
    files = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for part in patch.parts:
            relpath = _wheel_path(part, names)
            if relpath is None:
                raise InputError(
                    f"{patch.reference}: sglang {version} has no module {part.target.module} "
                    f"(no {part.target.module_relpaths()[0]} in {wheel.name}); nothing was started",
                    hint="check the patch's [target] module against the release",
                )
            mismatch = part.target.mismatch(relpath, version)
            if mismatch is not None:
                raise InputError(f"{patch.reference}: {mismatch}; nothing was started")
            files.append(_planned(patch, part, relpath, archive.read(relpath), version))
    return tuple(files)


def _planned(
    patch: LoadedPatch, part: PatchSpec, relpath: str, released: bytes, version: str
) -> ReleaseFile:
    plan = apply_patch(released, part)
    if isinstance(plan, Applied):
        return ReleaseFile(part.target.module, relpath, released, plan.new_source)
    if isinstance(plan, AlreadyApplied):
        return ReleaseFile(part.target.module, relpath, released, released)
    raise InputError(
        f"{patch.reference}: does not fit sglang {version}'s {relpath}: {plan.reason}; "
        "nothing was started",
        hint=f"`opspatch check {patch.reference} --releases` shows where it fits",
    )


# ---------------------------------------------------------------------------------------------
# the rehearsal


AFTER_STOP = "the rehearsal is torn down: its servers stopped, its folder removed"
"""What a rehearsal's apply says a second Ctrl-C leads to: no `recover` (its ledger goes with
the folder), the teardown (`rehearse`)."""


class RehearsalApplyProgress:
    """The apply's steps as progress lines (the run engine's `Progress`), its Ctrl-C lines
    ending with the rehearsal's teardown (`AFTER_STOP`)."""

    def __init__(self, say: Progress) -> None:
        self._say = say

    def run_started(self, run_id: str, summary: str) -> None:
        self._say(f"apply: {summary}")

    def update(self, host: str, step: Step, status: str) -> None:
        self._say(f"apply: {step} {status}")

    def notice(self, text: str) -> None:
        self._say(text)

    def after_stop(self, run_id: str | None) -> str | None:
        return AFTER_STOP


@dataclass
class _Rehearsal:
    """One rehearsal's state: its folder, its sandbox and the stages so far."""

    patch: LoadedPatch
    engine: EngineChoice
    files: tuple[ReleaseFile, ...]
    root: Path
    progress: Progress
    build_progress: BuildProgress
    stages: list[StageResult]

    @property
    def layout(self) -> SandboxLayout:
        return SandboxLayout(self.root / "state")


def _release_stage(rehearsal: _Rehearsal) -> tuple[StageResult, RealEngineRecord, Path]:
    """The release's environment (cached) and the rehearsal's host with it: made here, before
    `sandbox up` (which is handed the environment, not looking for it again), so `up` finds its
    `sglang` installed and applies no base patch (the incident's build): the rehearsal runs the
    release as pip installs it."""
    started = time.monotonic()
    rehearsal.progress(f"real SGLang {rehearsal.engine.version}: its environment and models")
    record = prepare_real_engine(rehearsal.engine, rehearsal.build_progress)
    host_dir = rehearsal.layout.host_dir(HOST)
    rehearsal.progress(f"{HOST}: making its environment in {host_dir}")
    assert rehearsal.engine.version is not None
    base = BaseEnv(Path(record.base), rehearsal.engine.version, key="")
    python = make_real_host_python(host_dir, base, Path(record.wheel))
    detail = f"sglang {rehearsal.engine.version} installed on a host of its own"
    seconds = time.monotonic() - started
    return StageResult(Stage.RELEASE, StageStatus.PASSED, detail, seconds), record, python


def _import_stage(rehearsal: _Rehearsal, python: Path) -> StageResult:
    """The patched modules imported in the host's interpreter, with the engine's environment."""
    started = time.monotonic()
    site = venv_site_packages(host_venv_dir(rehearsal.layout.host_dir(HOST)))
    modules = {f.module: (site / f.relpath, f.patched) for f in rehearsal.files}
    rehearsal.progress(f"import: {', '.join(modules)} with the patch")
    env = Manifest(engine=rehearsal.engine).engine_env()
    probe = probe_imports(python, modules, env, rehearsal.layout.host_dir(HOST))
    return import_stage(tuple(modules), probe, time.monotonic() - started)


def rehearse(
    patch: LoadedPatch,
    engine: EngineChoice,
    *,
    progress: Progress = quiet,
    build_progress: BuildProgress = no_progress,
    cache: Path | None = None,
) -> RehearsalReport:
    """Rehearse `patch` on real `engine` (see the module's doc); the folder is removed and every
    server stopped before this returns or raises.

    Raises:
        InputError: bad input (`release_files`), nothing started; a Ctrl-C (after the teardown:
            nothing was rehearsed); the release's environment cannot be built
            (`IndexUnreachable` when the index does not answer).
    """
    files = release_files(patch, engine, cache)
    head = f"{patch.spec.id} on sglang {engine.version}"
    if all(f.patched == f.released for f in files):
        detail = "the release already carries the change: nothing to rehearse"
        stage = StageResult(Stage.INSTALL, StageStatus.PASSED, detail)
        return RehearsalReport(patch.spec.id, engine.label, EXIT_OK, stages=(stage,))
    root = Path(tempfile.mkdtemp(prefix="opspatch-rehearse-"))
    progress(f"rehearsing {head} in {root}")
    rehearsal = _Rehearsal(patch, engine, files, root, progress, build_progress, [])
    interrupted = False
    exit_code: int = EXIT_BAD_INPUT
    host: HostOutcome | None = None
    try:
        with engines_temp_in(root / "tmp"):
            exit_code, host = _run(rehearsal)
    except (KeyboardInterrupt, RunInterrupted):
        interrupted = True
    finally:
        teardown = tear_down(rehearsal.layout, root, progress)
    if interrupted:
        raise InputError(
            f"interrupted: the rehearsal of {head} was stopped, its servers too and its folder "
            "removed; nothing was rehearsed"
        )
    return RehearsalReport(
        patch.spec.id,
        engine.label,
        exit_code,
        stages=tuple(rehearsal.stages),
        host=host,
        teardown=teardown,
    )


def _run(rehearsal: _Rehearsal) -> tuple[int, HostOutcome | None]:
    """The stages, in order; (exit code, the apply's host outcome or None)."""
    stage, record, python = _release_stage(rehearsal)
    rehearsal.stages.append(stage)
    stage = _import_stage(rehearsal, python)
    rehearsal.stages.append(stage)
    if stage.status == StageStatus.FAILED:
        rehearsal.stages.extend(not_reached(Stage.IMPORT))
        return EXIT_HOST_FAILED, None
    started = time.monotonic()
    layout = rehearsal.layout
    up = sandbox_up(
        layout,
        hosts=1,
        engine=rehearsal.engine,
        live=False,
        progress=rehearsal.progress,
        prepared=record,
    )
    (server,) = up.hosts
    up_seconds = time.monotonic() - started
    if not up.ok:
        detail = f"the unpatched server did not start: {server.error}"
        stage = StageResult(Stage.BASELINE, StageStatus.FAILED, detail, up_seconds)
        rehearsal.stages.append(stage)
        rehearsal.stages.extend(not_reached(Stage.BASELINE))
        return EXIT_BAD_INPUT, None
    ready = f"the unpatched server ready in {server.ready_seconds or 0:.0f} s (pid {server.pid})"
    manifest = load_manifest(layout)
    assert manifest is not None
    target = sandbox_inventory(layout, manifest, over_ssh=False).host(HOST)
    with Ledger.open(layout.state_dir / "ledger.sqlite3") as ledger:
        run = apply_to_hosts(
            rehearsal.patch,
            [target],
            rehearsal_playbook(),
            factory=transport_factory(),
            ledger=ledger,
            progress=RehearsalApplyProgress(rehearsal.progress),
        )
    (outcome,) = run.hosts
    rehearsal.stages.append(baseline_stage(ready, up_seconds, outcome))
    rehearsal.stages.extend(apply_stages(outcome))
    return run.exit_code, outcome


# ---------------------------------------------------------------------------------------------
# the teardown


ENGINE_TEMP_ROOM = 94
"""The longest `TMPDIR` a real server can use: it binds ZeroMQ IPC sockets at
`$TMPDIR/tmpXXXXXXXX`, and a socket's path holds 107 characters at most."""


@contextlib.contextmanager
def engines_temp_in(folder: Path) -> Iterator[None]:
    """`TMPDIR` in the rehearsal's folder for the processes started meanwhile (they inherit this
    environment): a real server leaves its IPC sockets, Prometheus files and inductor cache in
    `$TMPDIR` at each start, and the teardown removes the folder. Where that path is too long
    for a socket, `$TMPDIR` is left as it is (and so are the servers' files in it)."""
    if len(str(folder)) > ENGINE_TEMP_ROOM:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(folder)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Ctrl-C ignored while the servers are stopped (a second one must not leave them running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _working_in(root: Path) -> list[int]:
    """Every process but this one whose working folder is in `root` (removed or not)."""
    inside = str(root.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if (cwd == inside or cwd.startswith(inside + "/")) and proc_text(int(entry.name), "stat"):
            found.append(int(entry.name))
    return found


def tear_down(layout: SandboxLayout, root: Path, progress: Progress = quiet) -> Teardown:
    """Stop the rehearsal's sandbox (`sandbox down --purge`), then any process still working in
    its folder (a server the apply started while it was being stopped), and remove the folder."""
    progress(f"stopping the rehearsal's servers and removing {root} (Ctrl-C waits for it)")
    problem = None
    stopped: list[int] = []
    with _sigint_held():
        try:
            down = sandbox_down(layout, purge=True)
            stopped += [pid for host in down.hosts for pid in host.stopped]
        except InputError as exc:
            problem = exc.message
        for _ in range(2):  # again after the removal: a start in flight then finds no Python
            for pid in _working_in(root):
                stopped += stop_process_tree(pid, 30.0)
            shutil.rmtree(root, ignore_errors=True)
    removed = not root.exists()
    if not removed:
        problem = problem or f"{root} could not be removed"
    return Teardown(tuple(sorted(set(stopped))), str(root), removed, problem)
