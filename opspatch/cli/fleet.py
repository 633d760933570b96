"""`opspatch sync | drift` and `plan --fleet`: the fleet file's desired patches against hosts."""

from __future__ import annotations

from itertools import groupby
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from opspatch.cli.context import options
from opspatch.cli.params import AcceptKeysOption, HostsOption, JsonOption, PlaybookOption, YesOption
from opspatch.cli.render import Column, LiveProgress, confirm_or_refuse, emit_json, out, table_of
from opspatch.core.vocabulary import DriftCause, SyncAction
from opspatch.errors import EXIT_HOST_FAILED, EXIT_OK

if TYPE_CHECKING:
    from opspatch.config.fleet import DesiredState
    from opspatch.core.host import Host
    from opspatch.core.spec import LoadedPatch
    from opspatch.ledger.store import Ledger
    from opspatch.runs.commands.sync import FleetPlan, SyncRow

ACTION_STYLE = {
    SyncAction.NOTHING: "green",
    SyncAction.FIXED_UPSTREAM: "cyan",
    SyncAction.APPLY: "yellow",
    SyncAction.NEEDS_PORT: "red",
    SyncAction.RECOVER: "red",
    SyncAction.UNREACHABLE: "red",
}


def _read_fleet(
    hosts: str | None,
) -> tuple[DesiredState, tuple[Host, ...], list[LoadedPatch]]:
    """The fleet file, the hosts to cover (`--hosts`, else every host it names) and the
    workspace's other patches (found on a host, they are `extra`)."""
    from opspatch.config.fleet import load_fleet
    from opspatch.runs.commands.sync import select_hosts

    workspace = options.workspace_dir()
    desired = load_fleet(workspace)
    chosen = select_hosts(desired, options.hosts(hosts) if hosts is not None else None)
    listed = {e.patch.spec.id for e in desired.entries}
    others = [workspace.load_patch(r) for r in sorted(workspace.available("patches"))]
    return desired, chosen, [p for p in others if p.spec.id not in listed]


def read_plan(hosts: str | None, accept_new_host_keys: bool) -> FleetPlan:
    """Every host's desired patches, what is there and what sync would do (nothing changed)."""
    ledger = options.existing_ledger()
    try:
        return _plan(_read_fleet(hosts), accept_new_host_keys, ledger)
    finally:
        if ledger is not None:
            ledger.close()


def _plan(
    read: tuple[DesiredState, tuple[Host, ...], list[LoadedPatch]],
    accept_new_host_keys: bool,
    ledger: Ledger | None,
) -> FleetPlan:
    from opspatch.runs.commands.sync import plan_fleet

    desired, chosen, others = read
    factory = options.connector(accept_new_host_keys=accept_new_host_keys)
    return plan_fleet(desired, chosen, others, factory, ledger)


def _action_cell(row: SyncRow) -> Text:
    return Text(str(row.action), style=ACTION_STYLE.get(row.action, ""))


def print_plan(plan: FleetPlan) -> None:
    columns = (
        ("host", Column.ID),
        ("patch", Column.ID),
        ("desired", Column.ID),
        ("release", Column.ID),
        ("there", Column.ID),
        ("sync", Column.ID),
        ("detail", Column.DETAIL),
    )
    rows = [
        (
            r.host,
            r.patch,
            "yes" if r.desired else "no",
            r.release or "?",
            r.state,
            _action_cell(r),
            r.detail,
        )
        for r in plan.rows
    ]
    out.print(table_of(columns, rows, key=2))  # a row is a host's patch
    _print_redundant(plan)


def _print_redundant(plan: FleetPlan) -> None:
    for row in plan.redundant:
        out.print(
            f"redundant: {row.patch} on {row.host} (release {row.release} has the fix); "
            f"drop it there from {plan.fleet_file}"
        )


def show_desired_plan(hosts: str | None, accept_new_host_keys: bool, as_json: bool) -> None:
    """`plan --fleet`: print the fleet plan; exit 1 only when a host could not be inspected (as
    `status`: a plan is not a check, `sync --check` is), desired patches or not."""
    plan = read_plan(hosts, accept_new_host_keys)
    if as_json:
        emit_json(plan.to_json())
    else:
        print_plan(plan)
    if plan.unreachable:
        raise typer.Exit(EXIT_HOST_FAILED)


def sync(
    hosts: HostsOption = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Change nothing; exit 1 when a host differs from the fleet file (one line per "
            "host and patch), 0 when every host is as desired.",
        ),
    ] = False,
    playbook: PlaybookOption = "default",
    yes: YesOption = False,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Bring hosts to the patches fleet.toml wants on them (default: every host it names),
    through the apply pipeline; report what needs a port, is fixed upstream or is extra."""
    from opspatch.runs.commands.sync import sync_fleet

    if check:
        plan = read_plan(hosts, accept_new_host_keys)
        if as_json:
            emit_json({**plan.to_json(), "differing": [r.to_json() for r in plan.differing]})
        else:
            for row in plan.differing:
                out.print(f"{row.host}: {row.patch}: {row.action}: {row.detail}", markup=False)
            if not plan.differing:
                out.print(f"every host is as {plan.fleet_file} wants it")
        raise typer.Exit(plan.exit_code)
    read = _read_fleet(hosts)
    desired, chosen, others = read
    ledger = options.open_ledger()
    plan = _plan(read, accept_new_host_keys, ledger)
    to_apply = [r for r in plan.rows if r.action == SyncAction.APPLY]
    if to_apply:
        listed = ", ".join(f"{r.patch} on {r.host}" for r in to_apply)
        confirm_or_refuse(f"Sync: apply {listed}?", yes=yes)
    names = sorted({r.host for r in to_apply})
    with LiveProgress(names, enabled=not as_json and bool(names)) as progress:
        report = sync_fleet(
            desired,
            chosen,
            others,
            options.load_playbook(playbook),
            factory=options.connector(accept_new_host_keys=accept_new_host_keys),
            ledger=ledger,
            progress=progress,
            before=plan,
        )
    if as_json:
        emit_json(report.to_json())
    else:
        for run in report.runs:
            out.print(f"run {run.run_id}: {run.patch} on {len(run.hosts)} host(s): {run.outcome}")
            for host in run.hosts:
                why = f": {host.error}" if host.error else ""
                out.print(f"  {host.host}: {host.outcome}{why}")
        for run in report.left_alone:
            where = ", ".join(h.host for h in run.hosts)
            out.print(f"run {run.run_id}: {run.patch} not written on {where} (recorded why)")
        print_plan(report.after)
    raise typer.Exit(report.exit_code)


def drift(
    hosts: HostsOption = None,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """List hosts whose files differ from what the ledger and fleet.toml expect, grouped by
    cause (upgraded, reinstalled, recreated container, hand edit, patch missing, patch extra),
    each with the command that fixes it; exit 1 when there is any, or when a host could not be
    inspected (named: its drift is unknown)."""
    plan = read_plan(hosts, accept_new_host_keys)
    drifted = sorted(
        (r for r in plan.rows if r.cause is not None),
        key=lambda r: (list(DriftCause).index(r.cause) if r.cause else 0, r.host, r.patch),
    )
    unknown = plan.unreachable  # not inspected: their files are unknown, not "no drift"
    if as_json:
        emit_json(
            {
                "fleet_file": plan.fleet_file,
                "hosts": list(plan.hosts),
                "drift": [r.to_json() for r in drifted],
                "unreachable": [r.to_json() for r in unknown],
            }
        )
    else:
        for cause, rows in groupby(drifted, key=lambda r: r.cause):
            out.print(Text(f"{cause}:", style="bold"))
            for r in rows:
                out.print(f"  {r.host}: {r.patch} ({r.release or '?'}, {r.action}): {r.command}")
        if unknown:
            names = ", ".join(dict.fromkeys(r.host for r in unknown))
            out.print(Text(f"not inspected (drift unknown): {names}", style="bold"))
            for r in unknown:
                out.print(f"  {r.host}: {r.patch}: {r.detail}: {r.command}", markup=False)
        elif not drifted:
            out.print(f"no drift: every file is what the ledger and {plan.fleet_file} expect")
    raise typer.Exit(EXIT_HOST_FAILED if drifted or unknown else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command()(sync)
    app.command()(drift)
