"""Incident-response commands that read hosts and the ledger: `diagnose` (what a host really
runs and why it crashed), `adopt` (a hand edit becomes a patch) and `ledger report` (the
postmortem timeline, which the `ledger` group registers)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from opspatch.cli.context import options
from opspatch.cli.params import AcceptKeysOption, HostsOption, JsonOption, PlaybookOption, YesOption
from opspatch.cli.render import confirm_or_refuse, emit_json, err, out, print_diff
from opspatch.errors import InputError

if TYPE_CHECKING:
    from opspatch.core.host import Host

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

SinceOption = Annotated[
    str | None,
    typer.Option(
        "--since", help="A duration back from now: 90s, 30m, 2h, 1d, 1h30m.", metavar="DURATION"
    ),
]


def parse_duration(text: str, option: str = "--since") -> timedelta:
    """`30m`, `2h`, `1d`, `1h30m`, `90s`, `1w` as a timedelta.

    Raises:
        InputError: anything else (one message naming the option).
    """
    value = text.strip().lower()
    parts = _DURATION_PART.findall(value)
    if not value or "".join(n + u for n, u in parts) != value:
        raise InputError(
            f"{option} {text!r}: not a duration",
            hint="use a number and a unit: 90s, 30m, 2h, 1d, 1w, or a sum such as 1h30m",
        )
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise InputError(f"{option} {text!r}: the duration must be more than zero")
    return timedelta(seconds=seconds)


def diagnose(
    hosts: HostsOption = None,
    since: SinceOption = None,
    decode: Annotated[
        bool,
        typer.Option(
            "--decode",
            help="Also run the playbook's smoke decode: proves whether /health lies, and may "
            "crash a broken server (that is what it proves).",
        ),
    ] = False,
    module: Annotated[
        list[str] | None,
        typer.Option(
            "--module", "-m", help="Also judge this module's file (repeatable).", metavar="MODULE"
        ),
    ] = None,
    playbook: PlaybookOption = "default",
    max_log_bytes: Annotated[
        int,
        typer.Option(
            "--max-log-bytes",
            help="Read at most this much of the log, from its end.",
            metavar="BYTES",
        ),
    ] = 32 * 1024 * 1024,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """What each host really runs and why it crashed: the imported files (pristine, patched by
    opspatch, edited outside), bytecode, server, /health, the log since its start, the
    exceptions with their analysis and the patches that fix them. Changes nothing."""
    from opspatch.runs.commands.diagnose import DiagnoseOptions, diagnose_fleet
    from opspatch.runs.judgments.diagnosis_text import render_host, render_summary

    if hosts is None:
        raise InputError(
            "diagnose needs --hosts TARGET", hint="opspatch diagnose --hosts gpu-fleet"
        )
    if max_log_bytes < 4096:
        raise InputError(f"--max-log-bytes {max_log_bytes}: at least 4096")
    window = parse_duration(since) if since is not None else None
    selected = options.hosts(hosts)
    workspace = options.workspace_dir()
    patches = []
    for reference in sorted(workspace.available("patches")):
        try:
            patches.append(workspace.load_patch(reference))
        except InputError as exc:
            err.print(Text(f"warning: patch {reference} left out: {exc.message}", style="yellow"))
    ledger = options.existing_ledger()
    report = diagnose_fleet(
        selected,
        patches,
        options.connector(accept_new_host_keys=accept_new_host_keys),
        ledger,
        DiagnoseOptions(
            since_seconds=window.total_seconds() if window else None,
            decode=decode,
            playbook=options.load_playbook(playbook),
            modules=tuple(module or ()),
            max_log_read=max_log_bytes,
        ),
    )
    if as_json:
        emit_json(report.to_json())
    else:
        for host in report.hosts:
            out.print(Text(render_host(host)))
            out.print()
        out.print(Text(render_summary(report)))
    raise typer.Exit(report.exit_code)


def adopt(
    hosts: HostsOption = None,
    module: Annotated[
        str | None,
        typer.Option("--module", "-m", help="The module whose file was edited.", metavar="MODULE"),
    ] = None,
    patch_id: Annotated[
        str | None,
        typer.Option("--id", help="The new patch's id (patches/ID.toml).", metavar="NEW_ID"),
    ] = None,
    pristine: Annotated[
        Path | None,
        typer.Option(
            "--pristine",
            help="The pristine file (the release's), when no host has it.",
            metavar="FILE",
        ),
    ] = None,
    yes: YesOption = False,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Turn a hand edit on hosts into a diff-kind patch file against the pristine source, and
    record the adoption, so status, rollback and rollout treat it as any other patch."""
    from opspatch.runs.commands.adopt import Pristine, adopt_edit

    if hosts is None or module is None or patch_id is None:
        raise InputError(
            "adopt needs --hosts TARGET, --module M and --id NEW_ID",
            hint="opspatch adopt --hosts gpu-03 --module sglang.srt.x --id gpu03-hand-fix",
        )
    given = None
    if pristine is not None:
        if not pristine.is_file():
            raise InputError(f"--pristine {pristine}: no such file")
        given = Pristine(pristine.read_bytes(), f"--pristine {pristine}")
    selected = options.hosts(hosts)
    workspace = options.workspace_dir()
    confirm_or_refuse(
        f"Adopt the hand edit of {module} on {len(selected)} host(s) as patch {patch_id} "
        f"(writes patches/{patch_id}.toml and a ledger run; nothing on the hosts)?",
        yes=yes,
    )

    def same_inventory() -> tuple[Host, ...]:
        """The rest of the selected hosts' inventories: where a RECORD-verified copy of the
        same release may be found."""
        names = dict.fromkeys(h.inventory for h in selected)
        found = []
        for name in names:
            try:
                found += list(options.hosts(name))
            except InputError:
                continue
        return tuple(found)

    report = adopt_edit(
        hosts=selected,
        module=module,
        patch_id=patch_id,
        patches_dir=workspace.root / "patches",
        known_patch_ids=set(workspace.available("patches")),
        ledger=options.open_ledger(),
        factory=options.connector(accept_new_host_keys=accept_new_host_keys),
        pristine=given,
        reference_hosts=same_inventory,
    )
    if as_json:
        emit_json(report.to_json())
    else:
        out.print(f"wrote {report.patch_path} (pristine from {report.pristine_source})")
        print_diff(report.diff)
        for host in report.run.hosts:
            out.print(f"{host.host}: {host.outcome}: {host.note or host.error or ''}")
        out.print(f"recorded as run {report.run.run_id}; check it with `opspatch check {patch_id}`")
    raise typer.Exit(report.exit_code)


def ledger_report(
    run: Annotated[
        str | None,
        typer.Argument(
            help="One run (a unique prefix) and the runs that followed it", metavar="RUN_ID"
        ),
    ] = None,
    since: SinceOption = None,
    as_json: JsonOption = False,
) -> None:
    """The postmortem timeline: every run in the window (default: the last 24 hours), who ran
    it from where, each host's steps with times and outcomes, what changed, what was rolled
    back and why."""
    from opspatch.runs.commands.ledger_report import build_report, empty_report, render_markdown

    if run is not None and since is not None:
        raise InputError("ledger report takes a RUN_ID or --since DURATION, not both")
    window = parse_duration(since) if since is not None else None
    ledger = options.existing_ledger()
    if ledger is None and run is not None:
        raise InputError(
            f"no run {run!r} in the ledger {options.ledger_location()}",
            hint="nothing has been recorded there yet; `opspatch ledger list` shows the runs",
        )
    report = (
        empty_report(str(options.ledger_location()), since=window)
        if ledger is None
        else build_report(ledger, run_id=run, since=window)
    )
    if as_json:
        emit_json(report.to_json())
    else:
        out.file.write(render_markdown(report))


def register(app: typer.Typer) -> None:
    app.command()(diagnose)
    app.command()(adopt)
