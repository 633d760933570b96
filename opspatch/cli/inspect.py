"""`opspatch status | smoke | judge`: questions to hosts; nothing is locked, changed or recorded."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from opspatch.cli.context import options
from opspatch.cli.params import AcceptKeysOption, HostsOption, JsonOption, PlaybookOption
from opspatch.cli.render import STATE_STYLE, Column, emit_json, one_line, out, table_of
from opspatch.errors import InputError

STATUS_COLUMNS = (
    ("host", Column.ID),
    ("patch", Column.ID),
    ("state", Column.ID),
    ("file", Column.PATH),
    ("sha256", Column.ID),
    ("detail", Column.DETAIL),
)
"""The status table's columns: a row per host and patch (the key of a detail printed below)."""


def status(
    hosts: HostsOption = None,
    patch: Annotated[
        list[str] | None,
        typer.Option("--patch", help="Only these patches (repeatable).", metavar="PATCH"),
    ] = None,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """What is applied where: applied, not applied, drifted, unreachable (checked live against the ledger)."""
    from opspatch.runs.commands.status import exit_code, fleet_status

    if hosts is None:
        raise InputError("status needs --hosts TARGET", hint="opspatch status --hosts gpu-fleet")
    selected = options.hosts(hosts)
    workspace = options.workspace_dir()
    references = patch or sorted(workspace.available("patches"))
    patches = [workspace.load_patch(r) for r in references]
    ledger = options.existing_ledger()
    factory = options.connector(accept_new_host_keys=accept_new_host_keys)
    results = fleet_status(selected, patches, factory, ledger)
    if as_json:
        emit_json({"hosts": [h.name for h in selected], "status": [r.to_json() for r in results]})
    else:
        rows = [
            (
                r.host,
                r.patch,
                Text(str(r.state), style=STATE_STYLE.get(r.state, "")),
                r.path or "",
                (r.sha256 or "")[:12],
                f"{r.detail} ({r.written_by.describe()})" if r.written_by else r.detail,
            )
            for r in results
        ]
        out.print(table_of(STATUS_COLUMNS, rows, key=2))  # a row is a host's patch
    raise typer.Exit(exit_code(results))


def smoke(
    hosts: HostsOption = None,
    playbook: PlaybookOption = "default",
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Every failure in full (paths, log lines).")
    ] = False,
) -> None:
    """Run the playbook's smoke decode (and a scan of the log it writes) on each host; change nothing."""
    from opspatch.runs.commands.smoke import smoke_hosts

    if hosts is None:
        raise InputError("smoke needs --hosts TARGET", hint="opspatch smoke --hosts gpu-fleet")
    report = smoke_hosts(
        options.hosts(hosts),
        options.load_playbook(playbook),
        factory=options.connector(accept_new_host_keys=accept_new_host_keys),
    )
    if as_json:
        emit_json(report.to_json())
    else:
        for item in report.hosts:
            style = "green" if item.ok else "red"
            if item.ok:
                summary = "ok"
            elif verbose:
                summary = "; ".join(item.failures)
            else:  # one short line: the first failure; the rest under --verbose and in --json
                more = len(item.failures) - 1
                summary = one_line(item.failures[0] if item.failures else "failed") + (
                    f" (+{more} more: --verbose)" if more > 0 else ""
                )
            server = f"{item.host} (unit {item.unit}'s head)" if item.unit else item.host
            out.print(Text(f"{server}: {summary}", style=style))
            for prompt in item.result.prompts if item.result else ():
                out.print(
                    Text(f"   {smoke_line(prompt.prompt, prompt.text, prompt.spec_verify_ct)}")
                )
    raise typer.Exit(report.exit_code)


def smoke_line(prompt: str, text: str | None, spec_verify_ct: int | None) -> str:
    """One prompt of a smoke decode, in words: no Python `None` for what the server never said."""
    answer = repr(text) if text is not None else "no text (the server gave no completion)"
    verified = f" (spec_verify_ct {spec_verify_ct})" if spec_verify_ct is not None else ""
    return f"{prompt!r} -> {answer}{verified}"


JUDGE_COLUMNS = (("metric", Column.ID), ("verdict", Column.ID), ("figures", Column.DETAIL))
VERDICT_STYLE = {
    "pass": "green",
    "marginal": "yellow",
    "fail": "red",
    "unmeasured": "red",
    "no-baseline": "cyan",
}


def judge(
    hosts: HostsOption = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="The host to compare with (one host of the inventory, or a unit: its head); "
            "without it, only the absolute checks are made and the verdict is no-baseline.",
            metavar="HOST",
        ),
    ] = None,
    playbook: PlaybookOption = "default",
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Judge hosts against a baseline host now: the playbook's judge prompts, compared by tokens, speculation, latency and errors; change nothing."""
    from opspatch.runs.commands.judge import judge_hosts, servers

    if hosts is None:
        raise InputError(
            "judge needs --hosts TARGET", hint="opspatch judge --hosts gpu-2 --baseline gpu-1"
        )
    reference = None
    if baseline is not None:
        chosen = servers(options.hosts(baseline))  # a unit: its head
        if len(chosen) != 1:
            raise InputError(
                f"--baseline {baseline} selects {len(chosen)} servers; the baseline is one",
                hint="name one host of the inventory, or one unit",
            )
        reference = chosen[0]
    report = judge_hosts(
        options.hosts(hosts),
        options.load_playbook(playbook),
        baseline=reference,
        factory=options.connector(accept_new_host_keys=accept_new_host_keys),
    )
    if as_json:
        emit_json(report.to_json())
        raise typer.Exit(report.exit_code)
    if report.baseline_error is not None:
        out.print(Text(f"baseline {one_line(report.baseline_error)}", style="red"))
    for item in report.hosts:
        if item.judgment is None:
            out.print(Text(f"{item.host}: not judged: {one_line(item.error or '')}", style="red"))
            continue
        verdict = item.judgment.verdict
        against = item.judgment.baseline or f"no baseline ({item.judgment.why_no_baseline})"
        server = f"{item.host} (unit {item.unit}'s head)" if item.unit else item.host
        out.print(Text(f"{server}: {verdict} against {against}", style=VERDICT_STYLE[verdict]))
        rows = [
            (m.metric, Text(str(m.verdict), style=VERDICT_STYLE[m.verdict]), m.figures)
            for m in item.judgment.metrics
        ]
        out.print(table_of(JUDGE_COLUMNS, rows))
    raise typer.Exit(report.exit_code)


def register(app: typer.Typer) -> None:
    app.command()(status)
    app.command()(smoke)
    app.command()(judge)
