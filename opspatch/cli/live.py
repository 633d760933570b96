"""`opspatch live enable` / `live disable`: opspatch's live plugin installed into (and removed
from) each host's engine environment, as recorded runs (runs/commands/live.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from opspatch.cli.context import options
from opspatch.cli.params import AcceptKeysOption, HostsOption, JsonOption, YesOption
from opspatch.cli.render import LiveProgress, confirm_or_refuse, finish
from opspatch.errors import InputError

if TYPE_CHECKING:
    from opspatch.runs.report import RunReport

live_app = typer.Typer(
    no_args_is_help=True,
    help="Live fixes: install or remove opspatch's SGLang plugin in the engines' environments.",
)

LiveRun = Callable[..., "RunReport"]
"""`enable_live` or `disable_live` (runs/commands/live.py), called with the run's keywords."""


def _live_command(
    verb: str, run: Callable[[], LiveRun], question: Callable[[list[str]], str], help: str
) -> None:
    """Register `live VERB`: check --hosts, confirm `question(names)`, then one recorded run of
    `run()` (imported when the command runs) with its progress, printed as every run is."""

    @live_app.command(verb, help=help)
    def command(
        hosts: HostsOption = None,
        yes: YesOption = False,
        accept_new_host_keys: AcceptKeysOption = False,
        as_json: JsonOption = False,
    ) -> None:
        if hosts is None:
            raise InputError(
                f"live {verb} needs --hosts TARGET", hint=f"opspatch live {verb} --hosts T"
            )
        selected = options.hosts(hosts)
        names = [h.name for h in selected]
        confirm_or_refuse(question(names), yes=yes)
        with LiveProgress(names, enabled=not as_json) as progress:
            report = run()(
                ledger=options.open_ledger(),
                hosts=selected,
                factory=options.connector(accept_new_host_keys=accept_new_host_keys),
                playbook=options.load_playbook("default"),
                progress=progress,
            )
        finish(report, as_json)


def _enable() -> LiveRun:
    from opspatch.runs.commands.live import enable_live

    return enable_live


def _disable() -> LiveRun:
    from opspatch.runs.commands.live import disable_live

    return disable_live


_live_command(
    "enable",
    _enable,
    lambda names: (
        f"Install opspatch's live plugin on {len(names)} host(s): {', '.join(names)}? "
        "It loads when each engine next restarts."
    ),
    help="Install the live plugin (opspatch_live) into each host's engine environment; it loads "
    "at the engine's next restart. Needs live = true in the inventory.",
)
_live_command(
    "disable",
    _disable,
    lambda names: f"Remove opspatch's live plugin from {len(names)} host(s): {', '.join(names)}?",
    help="Remove the files `live enable` installed (each only if unchanged); a running engine "
    "keeps the plugin loaded until it restarts (`opspatch restart` restarts it out of it).",
)


def register(app: typer.Typer) -> None:
    app.add_typer(live_app, name="live")
