"""`opspatch live enable` / `live disable`: opspatch's live plugin installed into (and removed
from) each host's engine environment, as recorded runs (runs/commands/live.py)."""

from __future__ import annotations

import typer

from opspatch.cli.context import AcceptKeysOption, HostsOption, JsonOption, YesOption, options
from opspatch.cli.render import LiveProgress, confirm_or_refuse, finish
from opspatch.errors import InputError

live_app = typer.Typer(
    no_args_is_help=True,
    help="Live fixes: install or remove opspatch's SGLang plugin in the engines' environments.",
)


@live_app.command("enable")
def live_enable(
    hosts: HostsOption = None,
    yes: YesOption = False,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Install the live plugin (opspatch_live) into each host's engine environment; it loads
    at the engine's next restart. Needs live = true in the inventory."""
    from opspatch.runs.commands.live import enable_live

    if hosts is None:
        raise InputError("live enable needs --hosts TARGET", hint="opspatch live enable --hosts T")
    selected = options.hosts(hosts)
    names = [h.name for h in selected]
    confirm_or_refuse(
        f"Install opspatch's live plugin on {len(names)} host(s): {', '.join(names)}? It loads "
        "when each engine next restarts.",
        yes=yes,
    )
    with LiveProgress(names, enabled=not as_json) as progress:
        report = enable_live(
            ledger=options.open_ledger(),
            hosts=selected,
            factory=options.connector(accept_new_host_keys=accept_new_host_keys),
            playbook=options.load_playbook("default"),
            progress=progress,
        )
    finish(report, as_json)


@live_app.command("disable")
def live_disable(
    hosts: HostsOption = None,
    yes: YesOption = False,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Remove the files `live enable` installed (each only if unchanged); a running engine
    keeps the plugin loaded until it restarts."""
    from opspatch.runs.commands.live import disable_live

    if hosts is None:
        raise InputError(
            "live disable needs --hosts TARGET", hint="opspatch live disable --hosts T"
        )
    selected = options.hosts(hosts)
    names = [h.name for h in selected]
    confirm_or_refuse(
        f"Remove opspatch's live plugin from {len(names)} host(s): {', '.join(names)}?", yes=yes
    )
    with LiveProgress(names, enabled=not as_json) as progress:
        report = disable_live(
            ledger=options.open_ledger(),
            hosts=selected,
            factory=options.connector(accept_new_host_keys=accept_new_host_keys),
            playbook=options.load_playbook("default"),
            progress=progress,
        )
    finish(report, as_json)


def register(app: typer.Typer) -> None:
    app.add_typer(live_app, name="live")
