"""The option types several commands share (typer's `Annotated` parameters)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
LeaseExpiryOption = Annotated[
    float | None,
    typer.Option(
        "--lease-expiry",
        min=0.5,
        help="Seconds this run's lease on its hosts outlives its last heartbeat (default: the "
        "playbook's [team] lease_expiry, 60).",
        metavar="SECONDS",
    ),
]
HostsOption = Annotated[
    str | None,
    typer.Option(
        "--hosts",
        "-H",
        help="Inventory, group, unit, host, comma list or glob (e.g. gpu-fleet).",
        metavar="TARGET",
    ),
]
FileOption = Annotated[
    Path | None, typer.Option("--file", "-f", help="A local source file.", metavar="PATH")
]
PlaybookOption = Annotated[
    str,
    typer.Option(
        "--playbook",
        "-p",
        help="Rollout policy: a playbook name or a .toml path.",
        metavar="PLAYBOOK",
    ),
]
AcceptKeysOption = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys",
        help="Trust SSH host keys seen for the first time (recorded in known_hosts).",
    ),
]
PatchArgument = Annotated[
    str, typer.Argument(help="Patch id (looked up in patches/) or a .toml path", metavar="PATCH")
]
