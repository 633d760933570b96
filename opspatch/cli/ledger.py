"""`opspatch ledger list | show | verify | migrate | copy`: the record of every run. (`ledger
report`, the postmortem timeline, is written in `opspatch.cli.respond` beside the other incident
commands; registered here, so `opspatch ledger ...` loads this group's words whole.)"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from opspatch.cli.context import options
from opspatch.cli.params import JsonOption
from opspatch.cli.render import OUTCOME_STYLE, Column, emit_json, out, table_of
from opspatch.cli.respond import ledger_report
from opspatch.core.ledgerlocation import ledger_location
from opspatch.errors import EXIT_NEEDS_ATTENTION, InputError

ledger_app = typer.Typer(
    no_args_is_help=True, help="The append-only, hash-chained record of every run."
)


@ledger_app.command("list")
def ledger_list(
    limit: Annotated[
        int, typer.Option("--limit", "-n", help="How many runs, newest first.", metavar="LIMIT")
    ] = 20,
    as_json: JsonOption = False,
) -> None:
    """The newest runs: command, patch, operator, controller, status (finished, running,
    interrupted, recovered), who approved the patch."""
    ledger = options.existing_ledger()
    runs = ledger.list_runs(limit=limit) if ledger is not None else []
    if as_json:
        emit_json({"runs": [r.to_json() for r in runs]})
        return
    if ledger is None:
        out.print(f"there is no ledger at {options.ledger_location()}: nothing was recorded there")
        return
    if not runs:
        out.print(f"no runs yet in the ledger {options.ledger_location()}")
        return
    columns = (
        ("run", Column.ID),
        ("command", Column.ID),
        ("patch", Column.ID),
        ("hosts", Column.TEXT),
        ("operator", Column.TEXT),
        ("controller", Column.TEXT),
        ("started", Column.TEXT),
        ("status", Column.ID),
        ("outcome", Column.TEXT),
        ("recovered by", Column.ID),
        ("approved by", Column.TEXT),
    )
    rows = []
    for r in runs:
        style = {"interrupted": "red", "running": "cyan", "recovered": "yellow"}.get(r.status, "")
        rows.append(
            (
                r.run_id,
                r.command,
                r.patch_id or "",
                str(len(r.hosts)),
                r.operator,
                r.controller.hostname,
                r.started_at,
                Text(str(r.status), style=style),
                r.outcome or "",
                r.recovered_by or "",
                ", ".join(r.approved_by or ()),
            )
        )
    out.print(table_of(columns, rows))


@ledger_app.command("show")
def ledger_show(
    run: Annotated[
        str, typer.Argument(help="Run id (a unique prefix is enough)", metavar="RUN_ID")
    ],
    as_json: JsonOption = False,
) -> None:
    """One run: every host's steps with timings, facts, file versions and outcome."""
    detail = options.reading_ledger().get_run(run)
    if as_json:
        emit_json(detail.to_json())
        return
    s = detail.summary
    out.print(f"run {s.run_id}: {s.command} {s.patch_id or ''} by {s.operator}")
    out.print(f"  controller: {s.controller.hostname} (pid {s.controller.pid})")
    if s.approved_by:
        out.print(f"  patch approved by: {', '.join(s.approved_by)}")
    out.print(f"  command line: {s.command_line}")
    out.print(f"  started {s.started_at}, {s.status}{' ' + s.outcome if s.outcome else ''}")
    if s.recovered_by:
        out.print(f"  recovered by run {s.recovered_by}")
    for approval in detail.approvals or ():
        out.print(
            f"  signed by {approval.principal}: the patch's sha256 {approval.patch_sha256}, "
            f"recorded {approval.recorded_at} (`opspatch check` verifies it against a playbook's "
            "allowed_signers)"
        )
    for host in detail.hosts:
        out.print(
            Text(
                f"  {host.host}: {host.outcome or '(no outcome)'}",
                style=OUTCOME_STYLE.get(host.outcome or "", "bold"),
            )
        )
        if host.error:
            out.print(f"    error: {host.error}")
        for step in host.steps:
            if step.status == "started":
                continue
            seconds = f"{step.seconds:.2f}s" if step.seconds is not None else ""
            first_line = step.detail.splitlines()[0] if step.detail else ""
            out.print(f"    {step.step:<22} {step.status:<7} {seconds:>8}  {first_line}")
        for version in host.file_versions:
            out.print(
                f"    file {version.action}: {version.path} {version.sha256_before[:12]} -> {version.sha256_after[:12]}"
            )


@ledger_app.command("verify")
def ledger_verify(as_json: JsonOption = False) -> None:
    """Check the hash chain; name the first broken link (exit 3 if broken); print the head hash.

    Keep the head hash somewhere else (a ticket, a commit): no rewrite of the history up to it
    can reproduce it."""
    report = options.reading_ledger().verify()
    data = report.to_json()
    if as_json:
        emit_json(data)
    elif data.get("ok"):
        out.print(Text(f"ok: {data.get('events_checked')} events", style="green"))
        out.print(f"head {data.get('head_hash')}")
    else:
        out.print(
            Text(f"BROKEN at event {data.get('first_broken')}: {data.get('reason')}", style="red")
        )
    if not as_json:
        for warning in data.get("warnings", []):
            out.print(Text(f"warning: {warning}", style="yellow"))
    if not data.get("ok"):
        raise typer.Exit(EXIT_NEEDS_ATTENTION)


@ledger_app.command("migrate")
def ledger_migrate(
    writer_role: Annotated[
        str | None,
        typer.Option(
            "--writer-role",
            help="PostgreSQL: the role opspatch writes as, granted SELECT and INSERT only.",
            metavar="ROLE",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Create or upgrade the ledger's schema (run as the database owner); refuse a newer one."""
    from opspatch.ledger.database import migrate

    report = migrate(options.ledger_location(), writer_role)
    if as_json:
        emit_json(report.to_json())
        return
    change = (
        f"schema version {report.version_before} -> {report.version}"
        if report.version_before != report.version
        else f"schema version {report.version}, up to date"
    )
    out.print(f"{report.ledger} ({report.backend}): {change}")
    if report.writer_role:
        out.print(f"  {report.writer_role} may SELECT and INSERT the history, nothing more")


@ledger_app.command("copy")
def ledger_copy(
    source: Annotated[
        str,
        typer.Option(
            "--from", help="The ledger to copy: a file or postgresql:// URL.", metavar="FROM"
        ),
    ],
    target: Annotated[
        str,
        typer.Option(
            "--to", help="Where to: empty, or holding the start of the same history.", metavar="TO"
        ),
    ],
    as_json: JsonOption = False,
) -> None:
    """Copy every event and blob into another ledger (SQLite <-> PostgreSQL); same head hash."""
    from opspatch.ledger.store import Ledger

    origin = ledger_location(source, given_by="--from")
    destination = ledger_location(target, given_by="--to")
    if isinstance(origin, Path) and not origin.exists():
        raise InputError(f"--from {origin}: no such ledger file", hint="check the path")
    with Ledger.open(origin) as opened, Ledger.open(destination) as into:
        report = opened.copy_to(into)
    if as_json:
        emit_json(report.to_json())
        return
    out.print(
        f"copied {report.events_copied} events and {report.blobs_copied} blobs "
        f"({report.events_already_there} events were already there); both verify"
    )
    out.print(f"head {report.head_hash}")


ledger_app.command("report")(ledger_report)


def register(app: typer.Typer) -> None:
    app.add_typer(ledger_app, name="ledger")
