"""Commands of a team sharing one ledger: `approve` (a second operator's signature of a patch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opspatch.cli.context import options
from opspatch.cli.params import JsonOption, PatchArgument
from opspatch.cli.render import emit_json, out


def approve(
    patch: PatchArgument,
    key: Annotated[
        Path,
        typer.Option(
            "--key",
            help="Your SSH private key (or its .pub, with the key in ssh-agent) to sign with.",
            metavar="KEY",
        ),
    ],
    principal: Annotated[
        str | None,
        typer.Option(
            "--principal",
            help="Who signs, as the playbook's allowed_signers names you (default: your user "
            "name).",
            metavar="P",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Sign a patch's sha256 with OpenSSH (`ssh-keygen -Y sign -n opspatch`) and record it in the
    ledger: the approval a playbook with `[team] require_approval = true` asks of a second
    operator before apply."""
    from opspatch.ledger.store import operator_identity
    from opspatch.runs.fleet.recorded import command_line
    from opspatch.runs.judgments.approval import approve_patch

    loaded = options.load_patch(patch)
    operator = operator_identity()
    approval = approve_patch(
        options.open_ledger(),
        loaded,
        key=key,
        principal=principal or operator.split("@", 1)[0],
        operator=operator,
        command_line=command_line(),
    )
    if as_json:
        emit_json(approval.to_json())
    else:
        out.print(
            f"{approval.principal} approved {loaded.spec.id} (sha256 {loaded.sha256[:12]}) in "
            f"run {approval.run_id}",
            markup=False,
        )


def register(app: typer.Typer) -> None:
    app.command()(approve)
