"""`opspatch sandbox up|status|down`: the local fleet of stand-in engines, from the command line.

Thin on purpose: every decision is in `opspatch.sandbox.fleet`; this module parses options,
prints results on stdout (a table, or one JSON document with `--json`) and progress on stderr.
Errors are raised as opspatch errors and turned into one message and an exit code by
`opspatch.cli.main`; a host that did not come up makes `up` exit 1 after the report is printed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from opspatch.config.lookup import Workspace
from opspatch.errors import EXIT_HOST_FAILED
from opspatch.sandbox.fleet import (
    MAX_HOSTS,
    DownReport,
    HostStatus,
    SandboxLayout,
    StatusReport,
    UpReport,
    sandbox_down,
    sandbox_status,
    sandbox_up,
)

sandbox_app = typer.Typer(
    name="sandbox",
    no_args_is_help=True,
    rich_markup_mode=None,
    help=(
        "A local fleet of stand-in SGLang engines (no GPU, no remote host): "
        "`up`, then `opspatch apply eagle-init-guard --hosts sandbox`."
    ),
)

_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False, soft_wrap=True)

JsonOption = Annotated[bool, typer.Option("--json", help="One JSON document on stdout")]


def _emit_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    sys.stdout.flush()


def _progress(message: str) -> None:
    _err.print(message, markup=False)


def _workspace(ctx: typer.Context) -> Workspace:
    # `--workspace` is an option of the root command (opspatch -w DIR sandbox status).
    explicit = ctx.find_root().params.get("workspace")
    return Workspace.discover(Path(explicit) if explicit else None)


@sandbox_app.command()
def up(
    hosts: Annotated[
        int | None,
        typer.Option(
            "--hosts",
            "-n",
            help=f"How many hosts (1-{MAX_HOSTS}; default: as many as the sandbox has, else 3)",
        ),
    ] = None,
    ssh: Annotated[
        bool,
        typer.Option(
            "--ssh", help="Also run a private sshd per host on 127.0.0.2, ... (sandbox-ssh)"
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Create and start the sandbox hosts, wait until they are ready, write the inventories.

    Safe to run again: running hosts are left alone, stopped ones started, ports kept, and
    patched files never reinstalled.
    """
    report = sandbox_up(SandboxLayout.default(), hosts=hosts, ssh=ssh, progress=_progress)
    if as_json:
        _emit_json(report.to_json())
    else:
        _print_up(report)
    if not report.ok:
        raise typer.Exit(EXIT_HOST_FAILED)


@sandbox_app.command()
def status(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Each host: engine pid, port, /health, the patches its file carries, its ssh address."""
    report = sandbox_status(SandboxLayout.default(), _workspace(ctx))
    if as_json:
        _emit_json(report.to_json())
    else:
        _print_status(report)


@sandbox_app.command()
def down(
    purge: Annotated[
        bool,
        typer.Option(
            "--purge", help="Also remove the host folders, the manifest and the inventories"
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Stop every sandbox engine and sshd by pid; remove nothing unless --purge."""
    report = sandbox_down(SandboxLayout.default(), purge=purge, progress=_progress)
    if as_json:
        _emit_json(report.to_json())
    else:
        _print_down(report)


# ---------------------------------------------------------------------------------------------
# printing


def _print_up(report: UpReport) -> None:
    table = Table(title=f"sandbox {report.root}", title_justify="left")
    for column in ("host", "outcome", "pid", "url", "ssh"):
        table.add_column(column)
    for host in report.hosts:
        ssh = f"{host.ssh.address}:{host.ssh.port}" if host.ssh and host.ssh.port else "-"
        style = "red" if host.outcome == "failed" else ""
        table.add_row(host.host, host.outcome, str(host.pid or "-"), host.url, ssh, style=style)
    _out.print(table)
    for host in report.hosts:
        if host.error:
            _out.print(f"{host.host}: {host.error}", markup=False)
    if report.inventory:
        _out.print(f"inventory: {report.inventory} (--hosts sandbox)", markup=False)
    if report.ssh_inventory:
        _out.print(f"inventory: {report.ssh_inventory} (--hosts sandbox-ssh)", markup=False)
    if not report.ok:
        _out.print("not every host is ready; the inventories were not updated", markup=False)


def _health_text(host: HostStatus) -> str:
    if host.health is None:
        return host.health_detail
    return str(host.health)


def _carried(host: HostStatus) -> str:
    """The patches the host's files carry; partial or undecidable ones are marked."""
    shown = [
        p.patch if p.state == "applied" else f"{p.patch} ({p.state})"
        for p in host.patches
        if p.state != "not-applied"
    ]
    return ", ".join(shown) or "none"


def _print_status(report: StatusReport) -> None:
    table = Table(title=f"sandbox {report.root}", title_justify="left")
    for column in ("host", "pid", "port", "health", "carries", "ssh"):
        table.add_column(column)
    for host in report.hosts:
        pid = str(host.pid) if host.pid is not None else "stopped"
        patches = _carried(host)
        ssh = "-"
        if host.ssh is not None and host.ssh.port:
            ssh = f"{host.ssh.address}:{host.ssh.port}" + ("" if host.ssh_running else " (stopped)")
        table.add_row(host.host, pid, str(host.port), _health_text(host), patches, ssh)
    _out.print(table)
    for host in report.hosts:
        for note in host.notes:
            _err.print(f"{host.host}: {note}", markup=False)
    for note in report.notes:
        _err.print(note, markup=False)


def _print_down(report: DownReport) -> None:
    for host in report.hosts:
        parts = []
        if host.stopped:
            parts.append(f"engine stopped (pids {', '.join(map(str, host.stopped))})")
        if host.sshd_stopped:
            parts.append(f"sshd stopped (pid {host.sshd_stopped})")
        _out.print(f"{host.host}: {'; '.join(parts) or 'was not running'}", markup=False)
    for path in report.removed:
        _out.print(f"removed {path}", markup=False)
    for note in report.notes:
        _out.print(note, markup=False)
