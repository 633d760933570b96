"""The `opspatch` command line: builds objects, prints, maps errors to exit codes.

Only the CLI modules (this one and `cli_sandbox.py`) know typer. Results go to stdout (a diff, a
table, or one JSON document with `--json`); progress, logs and errors go to stderr. Exit codes
(architecture.md): 0 every host reached the goal; 1 a host failed (and was restored); 2 bad input,
configuration or usage (nothing was changed); 3 needs attention. `errors.exit_code_for` decides
for errors, `RunReport.exit_code` for runs.
"""

from __future__ import annotations

import json
import shlex
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from opspatch import __version__
from opspatch.config import paths
from opspatch.config.inventory import inventory_show_json, inventory_show_table
from opspatch.config.lookup import Workspace
from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, PlanOutcome, apply_patch
from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.spec import LoadedPatch, patch_json_schema
from opspatch.core.tomlsource import parse_field_path
from opspatch.errors import (
    EXIT_BAD_INPUT,
    EXIT_NEEDS_ATTENTION,
    EXIT_OK,
    ConfirmationRequired,
    InputError,
    LedgerIntegrityError,
    Location,
    OpspatchError,
    SpecError,
    TargetError,
    exit_code_for,
)
from opspatch.hosts.operations import open_transport
from opspatch.hosts.transport.base import Transport
from opspatch.ledger.store import Ledger
from opspatch.runs.apply import (
    ApplyPipeline,
    FleetRollout,
    HostOutcome,
    HostSession,
    RunReport,
    TransportFactory,
    begin_run,
    finish_run,
    local_file_host,
    release,
)
from opspatch.runs.localfile import distribution_version_for
from opspatch.runs.restore import RecoverRun, RollbackFleet
from opspatch.runs.status import fleet_status

app = typer.Typer(
    name="opspatch",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help=(
        "Safe, structural hot fixes for live SGLang inference fleets: typed patch files anchored on "
        "code structure, validated, applied atomically with byte-exact backups, smoke-tested, rolled "
        "back on failure, recorded in a ledger."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
ledger_app = typer.Typer(
    no_args_is_help=True, help="The append-only, hash-chained record of every run."
)
inventory_app = typer.Typer(
    no_args_is_help=True, help="Inventories: hosts, groups, engine settings."
)
app.add_typer(ledger_app, name="ledger")
app.add_typer(inventory_app, name="inventory")

# Piped output is read by people in logs and by scripts: tables get room instead of 80 columns.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(
    stderr=True, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else 160
)


class _Options:
    workspace: Path | None = None
    ledger: Path | None = None


_options = _Options()

# Options shared by several commands.
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
HostsOption = Annotated[
    str | None,
    typer.Option(
        "--hosts", "-H", help="Inventory, group, host, comma list or glob (e.g. gpu-fleet)."
    ),
]
FileOption = Annotated[Path | None, typer.Option("--file", "-f", help="A local source file.")]
PlaybookOption = Annotated[
    str, typer.Option("--playbook", "-p", help="Rollout policy: a playbook name or a .toml path.")
]
AcceptKeysOption = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys",
        help="Trust SSH host keys seen for the first time (recorded in known_hosts).",
    ),
]


def _print_version(value: bool) -> None:
    if value:
        out.print(f"opspatch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _global(
    workspace: Annotated[
        Path | None,
        typer.Option(
            "--workspace",
            "-w",
            help="Folder holding patches/, inventories/, playbooks/ (default: $OPSPATCH_HOME or .)",
        ),
    ] = None,
    ledger: Annotated[
        Path | None,
        typer.Option("--ledger", help="Ledger file (default: $OPSPATCH_LEDGER or the state dir)."),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", is_eager=True, callback=_print_version
        ),
    ] = False,
) -> None:
    _options.workspace = workspace
    _options.ledger = ledger


# ---------------------------------------------------------------------------------------------
# building objects


def _workspace() -> Workspace:
    return Workspace.discover(_options.workspace)


def _load(reference: str) -> LoadedPatch:
    return _workspace().load_patch(reference)


def _playbook(reference: str) -> Playbook:
    return _workspace().load_playbook(reference)


def _ledger() -> Ledger:
    return Ledger.open(_options.ledger or paths.default_ledger_path())


def _hosts(selection: str) -> tuple[Host, ...]:
    return _workspace().hosts(selection)


def _factory(accept_new_host_keys: bool) -> TransportFactory:
    def make(host: Host) -> Transport:
        return open_transport(host, accept_new_host_keys=accept_new_host_keys)

    return make


def _command_line() -> str:
    return " ".join(shlex.quote(a) for a in ["opspatch", *sys.argv[1:]])


def _one_target(file: Path | None, hosts: str | None, command: str) -> None:
    if (file is None) == (hosts is None):
        raise InputError(
            f"{command} needs exactly one of --file PATH or --hosts TARGET",
            hint=f"opspatch {command} ... --hosts gpu-fleet   or   opspatch {command} ... --file PATH",
        )


# ---------------------------------------------------------------------------------------------
# printing


def _emit_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def print_diff(diff: str, console: Console = out) -> None:
    """A unified diff, coloured on a terminal and plain when piped."""
    for line in diff.splitlines():
        style = ""
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("@@"):
            style = "cyan"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        console.print(Text(line, style=style))


_OUTCOME_STYLE = {
    "applied": "green",
    "already-applied": "green",
    "restored": "green",
    "would-apply": "cyan",
    "rolled-back": "yellow",
    "skipped": "yellow",
    "failed": "red",
    "needs-attention": "bold red",
    "not-applicable": "yellow",
}


def _short_path(path: str, width: int = 48) -> str:
    """The end of a long path (the module part is what tells files apart)."""
    return path if len(path) <= width else "…" + path[-(width - 1) :]


def print_report(report: RunReport) -> None:
    """The summary table of a run, then the reason for every host that did not reach the goal."""
    title = f"{report.command} {report.patch or ''}".strip()
    if report.run_id:
        title += f"  (run {report.run_id})"
    table = Table(title=title, title_justify="left")
    for column in ("host", "outcome", "file", "sha256", "steps", "seconds"):
        table.add_column(column)
    for host in report.hosts:
        sha = ""
        if host.file is not None and host.file.sha256_before and host.file.sha256_after:
            before, after = host.file.sha256_before[:12], host.file.sha256_after[:12]
            sha = before if before == after else f"{before} -> {after}"
        seconds = sum(s.seconds for s in host.steps)
        table.add_row(
            host.host,
            Text(host.outcome, style=_OUTCOME_STYLE.get(host.outcome, "")),
            _short_path(host.file.path) if host.file else "",
            sha,
            " ".join(s.step for s in host.steps if s.status == "ok"),
            f"{seconds:.1f}",
        )
    out.print(table)
    for host in report.hosts:
        if host.error:
            out.print(
                Text(f"{host.host}: {host.error}", style=_OUTCOME_STYLE.get(host.outcome, ""))
            )
        if host.note:
            out.print(f"{host.host}: {host.note}")
    if report.halted:
        out.print(Text(f"halted: {report.halted}", style="red"))
    out.print(f"outcome: {report.outcome} (exit {report.exit_code})")


class LiveProgress:
    """A line per host with its current step and elapsed time (rich Live on a terminal, plain
    lines otherwise), on stderr."""

    def __init__(self, hosts: Sequence[str], *, enabled: bool) -> None:
        self.enabled = enabled
        self.state = {h: ("waiting", "", time.monotonic()) for h in hosts}
        self.started = {h: time.monotonic() for h in hosts}
        self.lock = threading.Lock()
        self.live: Live | None = None

    def __enter__(self) -> LiveProgress:
        if self.enabled and err.is_terminal:
            self.live = Live(self._render(), console=err, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def _render(self) -> Table:
        table = Table(show_header=True, box=None)
        for column in ("host", "step", "status", "elapsed"):
            table.add_column(column)
        now = time.monotonic()
        for host, (step, status, _) in self.state.items():
            table.add_row(host, step, status, f"{now - self.started[host]:.1f}s")
        return table

    def update(self, host: str, step: str, status: str) -> None:
        if not self.enabled:
            return
        with self.lock:
            self.state[host] = (step, status, time.monotonic())
            if self.live is not None:
                self.live.update(self._render())
            elif status != "running":
                err.print(f"{host}: {step} {status} ({time.monotonic() - self.started[host]:.1f}s)")


def confirm_or_refuse(question: str, *, yes: bool) -> None:
    """The confirmation rule: `--yes` proceeds; a terminal is asked; anything else is refused.

    Raises:
        ConfirmationRequired: no terminal and no `--yes` (exit 2, nothing changed).
    """
    if yes:
        return
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise ConfirmationRequired(
            f"{question} needs confirmation and there is no terminal to ask on; nothing was changed",
            hint="re-run with --yes to proceed without asking",
        )
    if not typer.confirm(question, default=False, err=True):
        raise ConfirmationRequired("not confirmed; nothing was changed")


def not_applicable_error(loaded: LoadedPatch, target: str, outcome: NotApplicable) -> OpspatchError:
    """A NotApplicable outcome as an error naming the patch file, line and field, and the target."""
    reason = f"{target}: {outcome.reason}"
    if outcome.candidates:
        reason += "\n" + "\n".join(f"    {c}" for c in outcome.candidates)
    if outcome.field:
        location = loaded.location(parse_field_path(outcome.field))
        return SpecError(location, reason)
    return SpecError(Location(loaded.path), reason)


def _finish(report: RunReport, as_json: bool) -> NoReturn:
    if as_json:
        _emit_json(report.to_json())
    else:
        print_report(report)
    raise typer.Exit(report.exit_code)


# ---------------------------------------------------------------------------------------------
# patch files


@app.command()
def schema() -> None:
    """Print the JSON Schema of patch files (point your editor's TOML validation at it)."""
    _emit_json(patch_json_schema())


@app.command()
def check(
    patches: Annotated[
        list[str] | None,
        typer.Argument(help="Patch ids or .toml paths (default: every patch in the workspace)"),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Lint patch files: schema, snippets parse, anchors well-formed."""
    workspace = _workspace()
    references = patches or sorted(workspace.available("patches"))
    if not references:
        raise InputError(
            "no patches to check", hint="give patch ids or paths, or add patches/*.toml"
        )
    results = []
    for reference in references:
        try:
            loaded = workspace.load_patch(reference)
        except OpspatchError as exc:
            results.append({"patch": reference, "ok": False, "error": exc.render()})
            continue
        spec = loaded.spec
        results.append(
            {
                "patch": spec.id,
                "ok": True,
                "file": loaded.path,
                "sha256": loaded.sha256,
                "target": f"{spec.target.module} ({spec.target.distribution} {spec.target.versions or 'any'})",
                "edits": len(spec.edits),
                "postconditions": len(spec.postconditions),
            }
        )
    failed = [r for r in results if not r["ok"]]
    if as_json:
        _emit_json({"ok": not failed, "patches": results})
    else:
        for result in results:
            if result["ok"]:
                out.print(
                    Text.assemble(
                        ("ok", "green"),
                        f"    {result['patch']}  {result['file']}  "
                        f"{result['edits']} edit(s), {result['postconditions']} postcondition(s)  "
                        f"-> {result['target']}",
                    )
                )
            else:  # Text, not markup: the message quotes the file, which may hold `[/x]`
                out.print(Text.assemble(("error", "red"), f" {result['error']}"))
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)


# ---------------------------------------------------------------------------------------------
# local files


def _check_local_target(loaded: LoadedPatch, file: Path, target_version: str | None) -> str | None:
    version = target_version or distribution_version_for(file, loaded.spec.target)
    mismatch = loaded.spec.target.mismatch(str(file.resolve()), version)
    if mismatch:
        field = (
            ("target", "versions") if "outside the versions" in mismatch else ("target", "module")
        )
        raise TargetError(
            f"{loaded.location(field)}: {mismatch}",
            hint="check that the file is the module and release this patch is for"
            + ("" if version else "; pass --target-version when no dist-info says"),
        )
    return version


def _plan_json(
    loaded: LoadedPatch, file: Path, version: str | None, outcome: PlanOutcome
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "patch": loaded.spec.id,
        "patch_file": loaded.path,
        "file": str(file),
        "version": version,
        "outcome": outcome.outcome,
    }
    if isinstance(outcome, Applied):
        doc.update(
            sha256_before=outcome.sha256_before,
            sha256_after=outcome.sha256_after,
            diff=outcome.diff,
        )
    elif isinstance(outcome, AlreadyApplied):
        doc["reason"] = outcome.reason
    else:
        doc.update(reason=outcome.reason, field=outcome.field, candidates=list(outcome.candidates))
    return doc


def _local_file(file: Path) -> Path:
    if not file.is_file():
        raise InputError(f"{file}: no such file")
    return file


def _plan_file(
    loaded: LoadedPatch, file: Path, target_version: str | None, as_json: bool
) -> PlanOutcome:
    version = _check_local_target(loaded, _local_file(file), target_version)
    outcome = apply_patch(file.read_bytes(), loaded.spec)
    if as_json:
        _emit_json(_plan_json(loaded, file, version, outcome))
        if isinstance(outcome, NotApplicable):
            raise typer.Exit(EXIT_BAD_INPUT)
        return outcome
    if isinstance(outcome, NotApplicable):
        raise not_applicable_error(loaded, str(file), outcome)
    if isinstance(outcome, AlreadyApplied):
        out.print(f"{file}: already applied: {outcome.reason}")
        return outcome
    print_diff(outcome.diff)
    err.print(
        f"{loaded.spec.id}: {len(outcome.edits)} edit(s) in {', '.join(outcome.edited_scopes)}; "
        f"sha256 {outcome.sha256_before[:12]} -> {outcome.sha256_after[:12]}"
    )
    return outcome


def _apply_file(
    loaded: LoadedPatch,
    file: Path,
    *,
    python: str,
    target_version: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    version = _check_local_target(loaded, _local_file(file), target_version)
    outcome = apply_patch(file.read_bytes(), loaded.spec)
    if isinstance(outcome, NotApplicable):
        raise not_applicable_error(loaded, str(file), outcome)
    if isinstance(outcome, AlreadyApplied):
        report = RunReport(
            None,
            "apply",
            loaded.spec.id,
            (HostOutcome("local", "already-applied", None, note=outcome.reason),),
        )
        _finish(report, as_json)
    if not as_json:
        print_diff(outcome.diff, err)
    confirm_or_refuse(f"Apply {loaded.spec.id} to {file}?", yes=yes)
    ledger = _ledger()
    host = local_file_host(python, str(paths.state_dir() / "local"))
    run_id = begin_run(
        ledger, command="apply", patch=loaded, hosts=[host], command_line=_command_line()
    )
    playbook = Playbook()
    session = HostSession(
        host,
        _factory(False),
        playbook,
        ledger=ledger,
        run_id=run_id,
        progress=LiveProgress([], enabled=False),
    )
    pipeline = ApplyPipeline(loaded, playbook, restart_engine=False)
    try:
        prepared = pipeline.prepare(
            session, lock=True, path=str(file.resolve()), installed_version=version
        )
        if isinstance(prepared.plan, Applied):
            result = pipeline.apply(session, prepared)
        else:
            result = HostOutcome(host.name, "already-applied", None, steps=tuple(session.steps))
    finally:
        release(session)
        session.close()
    session.record_outcome(result)
    report = RunReport(run_id, "apply", loaded.spec.id, (result,))
    finish_run(ledger, report)
    _finish(report, as_json)


def _rollback_file(
    loaded: LoadedPatch, file: Path, *, python: str, yes: bool, as_json: bool
) -> None:
    _local_file(file)
    confirm_or_refuse(f"Restore {file} to its state before {loaded.spec.id}?", yes=yes)
    ledger = _ledger()
    host = local_file_host(python, str(paths.state_dir() / "local"))
    if not ledger.file_history(host.name, str(file.resolve())):
        raise InputError(
            f"the ledger has no change by {loaded.spec.id} to {file.resolve()} on this machine",
            hint="rollback restores what opspatch recorded; see `opspatch ledger list`",
        )
    run_id = begin_run(
        ledger, command="rollback", patch=loaded, hosts=[host], command_line=_command_line()
    )
    fleet = RollbackFleet(
        ledger=ledger,
        run_id=run_id,
        hosts=[host],
        factory=_factory(False),
        playbook=Playbook(),
        patch=loaded,
        restart_engine=False,
        only_path=str(file.resolve()),
    )
    report = fleet.run()
    finish_run(ledger, report)
    _finish(report, as_json)


# ---------------------------------------------------------------------------------------------
# plan / apply / rollback / recover


@app.command()
def plan(
    patch: Annotated[str, typer.Argument(help="Patch id (looked up in patches/) or a .toml path")],
    file: FileOption = None,
    hosts: HostsOption = None,
    target_version: Annotated[
        str | None,
        typer.Option(
            "--target-version", help="The file's distribution version, when no dist-info says."
        ),
    ] = None,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Show the diff a patch would make (per host: facts, file, diff or why not); change nothing."""
    _one_target(file, hosts, "plan")
    loaded = _load(patch)
    if file is not None:
        _plan_file(loaded, file, target_version, as_json)
        return
    assert hosts is not None
    _apply_hosts(
        loaded,
        hosts,
        playbook_ref="default",
        dry_run=True,
        yes=True,
        accept=accept_new_host_keys,
        as_json=as_json,
    )


@app.command()
def apply(
    patch: Annotated[str, typer.Argument(help="Patch id (looked up in patches/) or a .toml path")],
    file: FileOption = None,
    hosts: HostsOption = None,
    playbook: PlaybookOption = "default",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show every host's plan; change nothing.")
    ] = False,
    yes: YesOption = False,
    python: Annotated[
        str,
        typer.Option("--python", help="With --file: the interpreter that validates the new text."),
    ] = sys.executable,
    target_version: Annotated[
        str | None,
        typer.Option("--target-version", help="With --file: the distribution's version."),
    ] = None,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Apply a patch: to a local file, or across hosts (lock, swap, restart, smoke, roll back on failure)."""
    _one_target(file, hosts, "apply")
    loaded = _load(patch)
    if file is not None:
        if dry_run:
            _plan_file(loaded, file, target_version, as_json)
            return
        _apply_file(
            loaded, file, python=python, target_version=target_version, yes=yes, as_json=as_json
        )
        return
    assert hosts is not None
    _apply_hosts(
        loaded,
        hosts,
        playbook_ref=playbook,
        dry_run=dry_run,
        yes=yes,
        accept=accept_new_host_keys,
        as_json=as_json,
    )


def _apply_hosts(
    loaded: LoadedPatch,
    selection: str,
    *,
    playbook_ref: str,
    dry_run: bool,
    yes: bool,
    accept: bool,
    as_json: bool,
) -> None:
    selected = _hosts(selection)
    playbook = _playbook(playbook_ref)
    names = [h.name for h in selected]
    ledger: Ledger | None = None
    run_id: str | None = None
    if not dry_run:
        confirm_or_refuse(
            f"Apply {loaded.spec.id} to {len(names)} host(s): {', '.join(names)} (playbook {playbook.name})?",
            yes=yes,
        )
        ledger = _ledger()
        run_id = begin_run(
            ledger,
            command="apply",
            patch=loaded,
            hosts=selected,
            command_line=_command_line(),
            playbook=playbook,
        )
        err.print(
            f"run {run_id}: {loaded.spec.id} on {len(names)} host(s), playbook {playbook.name}"
        )
    with LiveProgress(names, enabled=not as_json) as progress:
        rollout = FleetRollout(
            patch=loaded,
            playbook=playbook,
            hosts=selected,
            factory=_factory(accept),
            ledger=ledger,
            run_id=run_id,
            progress=progress,
            dry_run=dry_run,
        )
        report = rollout.run()
    if ledger is not None:
        finish_run(ledger, report)
    if dry_run and not as_json:
        for host in report.hosts:
            out.print(Text(f"== {host.host}: {host.outcome}", style="bold"))
            for step in host.steps:
                if step.step == "inspect" and step.detail:
                    out.print(f"   {step.detail}")
            if host.diff:
                print_diff(host.diff)
            elif host.error:
                out.print(f"   {host.error}")
        if report.halted:
            out.print(Text(report.halted, style="red"))
        raise typer.Exit(report.exit_code)
    _finish(report, as_json)


@app.command()
def rollback(
    patch: Annotated[str | None, typer.Argument(help="Patch id or path (or use --run)")] = None,
    run: Annotated[
        str | None, typer.Option("--run", help="Undo the changes of this run id")
    ] = None,
    file: FileOption = None,
    hosts: HostsOption = None,
    playbook: PlaybookOption = "default",
    yes: YesOption = False,
    python: Annotated[
        str, typer.Option("--python", help="With --file: the interpreter.")
    ] = sys.executable,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Restore the pre-images opspatch recorded (where the file is still what opspatch wrote), restart, smoke."""
    if (patch is None) == (run is None):
        raise InputError("rollback needs exactly one of PATCH or --run RUN_ID")
    ledger = _ledger()
    if file is not None and hosts is None and patch is not None:
        _rollback_file(_load(patch), file, python=python, yes=yes, as_json=as_json)
        return
    source_run = ledger.get_run(run) if run is not None else None
    if hosts is None and source_run is not None and file is None:
        selected = tuple(h for h in _hosts_of_run(source_run.summary.hosts))
    else:
        _one_target(file, hosts, "rollback")
        if file is not None:
            raise InputError("rollback --file takes a PATCH, not --run")
        assert hosts is not None
        selected = _hosts(hosts)
    loaded = _load(patch) if patch is not None else None
    names = [h.name for h in selected]
    what = loaded.spec.id if loaded else f"run {run}"
    confirm_or_refuse(f"Roll back {what} on {len(names)} host(s): {', '.join(names)}?", yes=yes)
    playbook_obj = _playbook(playbook)
    run_id = begin_run(
        ledger,
        command="rollback",
        patch=loaded,
        hosts=selected,
        command_line=_command_line(),
        playbook=playbook_obj,
        parent_run=source_run.run_id if source_run else None,
    )
    with LiveProgress(names, enabled=not as_json) as progress:
        report = RollbackFleet(
            ledger=ledger,
            run_id=run_id,
            hosts=selected,
            factory=_factory(accept_new_host_keys),
            playbook=playbook_obj,
            patch=loaded,
            source_run=source_run,
            progress=progress,
        ).run()
    finish_run(ledger, report)
    _finish(report, as_json)


def _hosts_of_run(names: Sequence[str]) -> tuple[Host, ...]:
    """The inventory hosts of a recorded run (looked up by name across the workspace's inventories)."""
    return _hosts(",".join(names))


@app.command()
def recover(
    run: Annotated[
        str | None, typer.Option("--run", help="The interrupted run (default: the newest one)")
    ] = None,
    playbook: PlaybookOption = "default",
    yes: YesOption = False,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Bring every host of an interrupted run to a known state (finish it, or restore)."""
    ledger = _ledger()
    if run is None:
        interrupted = [r for r in ledger.list_runs(limit=200) if r.status == "interrupted"]
        if not interrupted:
            raise InputError("no interrupted run in the ledger", hint="opspatch ledger list")
        run = interrupted[0].run_id
    detail = ledger.get_run(run)
    if detail.summary.status != "interrupted":
        raise InputError(
            f"run {detail.run_id} is {detail.summary.status}, not interrupted",
            hint="recover is for runs whose controller died part-way",
        )
    selected = _hosts_of_run(detail.summary.hosts)
    loaded: LoadedPatch | None = None
    if detail.summary.patch_id:
        try:
            loaded = _load(detail.summary.patch_id)
        except OpspatchError:
            loaded = None
    confirm_or_refuse(f"Recover run {detail.run_id} on {len(selected)} host(s)?", yes=yes)
    playbook_obj = _playbook(playbook)
    run_id = begin_run(
        ledger,
        command="recover",
        patch=loaded,
        hosts=selected,
        command_line=_command_line(),
        playbook=playbook_obj,
        parent_run=detail.run_id,
    )
    with LiveProgress([h.name for h in selected], enabled=not as_json) as progress:
        report = RecoverRun(
            ledger=ledger,
            run_id=run_id,
            interrupted=detail,
            hosts=selected,
            factory=_factory(accept_new_host_keys),
            playbook=playbook_obj,
            patch=loaded,
            progress=progress,
        ).run()
    finish_run(ledger, report)
    _finish(report, as_json)


# ---------------------------------------------------------------------------------------------
# status / smoke


@app.command()
def status(
    hosts: HostsOption = None,
    patch: Annotated[
        list[str] | None, typer.Option("--patch", help="Only these patches (repeatable).")
    ] = None,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """What is applied where: applied, not applied, drifted, unreachable (checked live against the ledger)."""
    if hosts is None:
        raise InputError("status needs --hosts TARGET", hint="opspatch status --hosts gpu-fleet")
    selected = _hosts(hosts)
    workspace = _workspace()
    references = patch or sorted(workspace.available("patches"))
    patches = [workspace.load_patch(r) for r in references]
    ledger_path = _options.ledger or paths.default_ledger_path()
    ledger = Ledger.open(ledger_path) if ledger_path.exists() else None
    results = fleet_status(selected, patches, _factory(accept_new_host_keys), ledger)
    if as_json:
        _emit_json({"hosts": [h.name for h in selected], "status": [r.to_json() for r in results]})
    else:
        table = Table()
        for column in ("host", "patch", "state", "file", "sha256", "detail"):
            table.add_column(column)
        styles = {"applied": "green", "not-applied": "", "drifted": "yellow", "unreachable": "red"}
        for r in results:
            table.add_row(
                r.host,
                r.patch,
                Text(r.state, style=styles.get(r.state, "")),
                r.path or "",
                (r.sha256 or "")[:12],
                r.detail,
            )
        out.print(table)
    if any(r.state == "unreachable" for r in results):
        raise typer.Exit(1)


@app.command()
def smoke(
    hosts: HostsOption = None,
    playbook: PlaybookOption = "default",
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Run the playbook's smoke decode (and a scan of the log it writes) on each host; change nothing."""
    if hosts is None:
        raise InputError("smoke needs --hosts TARGET")
    selected = _hosts(hosts)
    playbook_obj = _playbook(playbook)
    results: list[dict[str, Any]] = []
    worst = EXIT_OK
    factory = _factory(accept_new_host_keys)
    for host in selected:
        session = HostSession(
            host,
            factory,
            playbook_obj,
            ledger=None,
            run_id=None,
            progress=LiveProgress([], enabled=False),
        )
        try:
            result = session.engine.smoke(log_offset=None)
            results.append({"host": host.name, "ok": result.ok, **result.to_json()})
            worst = max(worst, 0 if result.ok else 1)
        except OpspatchError as exc:
            results.append({"host": host.name, "ok": False, "failures": [exc.message]})
            worst = max(worst, 1)
        finally:
            session.close()
    if as_json:
        _emit_json({"hosts": results})
    else:
        for item in results:
            style = "green" if item["ok"] else "red"
            summary = "ok" if item["ok"] else "; ".join(item.get("failures", []))
            out.print(Text(f"{item['host']}: {summary}", style=style))
            for prompt in item.get("prompts", []):
                out.print(
                    f"   {prompt['prompt']!r} -> {prompt['text']!r} (spec_verify_ct {prompt['spec_verify_ct']})"
                )
    raise typer.Exit(worst)


# ---------------------------------------------------------------------------------------------
# ledger


@ledger_app.command("list")
def ledger_list(
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many runs, newest first.")] = 20,
    as_json: JsonOption = False,
) -> None:
    """The newest runs: command, patch, operator, status (finished, running, interrupted)."""
    runs = _ledger().list_runs(limit=limit)
    if as_json:
        _emit_json({"runs": [r.to_json() for r in runs]})
        return
    table = Table()
    for column in ("run", "command", "patch", "hosts", "operator", "started", "status", "outcome"):
        table.add_column(column)
    for r in runs:
        style = {"interrupted": "red", "running": "cyan"}.get(r.status, "")
        table.add_row(
            r.run_id,
            r.command,
            r.patch_id or "",
            str(len(r.hosts)),
            r.operator,
            r.started_at,
            Text(r.status, style=style),
            r.outcome or "",
        )
    out.print(table)


@ledger_app.command("show")
def ledger_show(
    run: Annotated[str, typer.Argument(help="Run id (a unique prefix is enough)")],
    as_json: JsonOption = False,
) -> None:
    """One run: every host's steps with timings, facts, file versions and outcome."""
    detail = _ledger().get_run(run)
    if as_json:
        _emit_json(detail.to_json())
        return
    s = detail.summary
    out.print(f"run {s.run_id}: {s.command} {s.patch_id or ''} by {s.operator}")
    out.print(f"  command line: {s.command_line}")
    out.print(f"  started {s.started_at}, {s.status}{' ' + s.outcome if s.outcome else ''}")
    for host in detail.hosts:
        out.print(
            Text(
                f"  {host.host}: {host.outcome or '(no outcome)'}",
                style=_OUTCOME_STYLE.get(host.outcome or "", "bold"),
            )
        )
        if host.error:
            out.print(f"    error: {host.error}")
        for step in host.steps:
            if step.status == "started":
                continue
            seconds = f"{step.seconds:.2f}s" if step.seconds is not None else ""
            out.print(
                f"    {step.step:<22} {step.status:<7} {seconds:>8}  {step.detail.splitlines()[0] if step.detail else ''}"
            )
        for version in host.file_versions:
            out.print(
                f"    file {version.action}: {version.path} {version.sha256_before[:12]} -> {version.sha256_after[:12]}"
            )


@ledger_app.command("verify")
def ledger_verify(as_json: JsonOption = False) -> None:
    """Check the hash chain; name the first broken link (exit 3 if broken)."""
    report = _ledger().verify()
    if as_json:
        _emit_json(report.to_json())
    else:
        data = report.to_json()
        if data.get("ok"):
            out.print(
                Text(
                    f"ok: {data.get('events_checked')} events, head {str(data.get('head_hash'))[:16]}",
                    style="green",
                )
            )
        else:
            out.print(
                Text(
                    f"BROKEN at event {data.get('first_broken')}: {data.get('reason')}", style="red"
                )
            )
        for warning in data.get("warnings", []):
            out.print(Text(f"warning: {warning}", style="yellow"))
    if not report.to_json().get("ok"):
        raise typer.Exit(EXIT_NEEDS_ATTENTION)


# ---------------------------------------------------------------------------------------------
# inventory


@inventory_app.command("show")
def inventory_show(
    target: Annotated[str, typer.Argument(help="Inventory, group, host, comma list or glob")],
    as_json: JsonOption = False,
) -> None:
    """The resolved hosts of a selection and their settings (merged defaults, groups, host)."""
    hosts = _hosts(target)
    if as_json:
        _emit_json(inventory_show_json(hosts, selection=target))
        return
    shown = inventory_show_table(hosts, selection=target)
    table = Table(title=shown.title, title_justify="left")
    for column in shown.columns:
        table.add_column(column)
    for row in shown.rows:
        table.add_row(*row)
    out.print(table)


# ---------------------------------------------------------------------------------------------
# entry point


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point: run the app, turn every failure into one message + exit code."""
    try:
        # Without standalone mode, an Exit raised by a command comes back as its exit code.
        returned = app(args=argv, prog_name="opspatch", standalone_mode=False)
        code = returned if isinstance(returned, int) else EXIT_OK
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        err.print("aborted; nothing was changed")
        code = EXIT_BAD_INPUT
    except LedgerIntegrityError as exc:
        err.print(Text(f"error: {exc.render()}", style="red"))
        code = exit_code_for(exc)
    except OpspatchError as exc:
        err.print(Text(f"error: {exc.render()}", style="red"))
        code = exit_code_for(exc)
    except KeyboardInterrupt:
        err.print("interrupted")
        code = exit_code_for(KeyboardInterrupt())
    except Exception as exc:
        # Usage errors of the option parser (typer vendors click; older typers use click itself):
        # they know how to show themselves and always mean bad usage (exit 2).
        show = getattr(exc, "show", None)
        if show is None or not hasattr(exc, "exit_code"):
            raise
        show()
        code = EXIT_BAD_INPUT
    sys.exit(code)


def _register_subcommands() -> None:
    try:
        from opspatch.cli.sandbox import sandbox_app
    except ImportError:  # pragma: no cover - the sandbox sub-app ships with the package
        return
    app.add_typer(sandbox_app, name="sandbox")


_register_subcommands()
