"""What every command needs from the global options: the workspace, the ledger, and the shared
option types. Heavy modules (the runs, the SSH transport) are imported by the commands that use
them, so `opspatch --version`, `check` and `schema` start fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from opspatch.config import paths
from opspatch.config.lookup import Workspace

if TYPE_CHECKING:
    from opspatch.core.host import Host
    from opspatch.core.policy import Playbook
    from opspatch.core.spec import LoadedPatch
    from opspatch.ledger.store import Ledger


@dataclass
class GlobalOptions:
    """The options given before the command (`opspatch -w DIR --ledger FILE <command>`)."""

    workspace: Path | None = None
    ledger: Path | None = None

    def workspace_dir(self) -> Workspace:
        return Workspace.discover(self.workspace)

    def ledger_path(self) -> Path:
        return self.ledger or paths.default_ledger_path()

    def open_ledger(self) -> Ledger:
        from opspatch.ledger.store import Ledger

        return Ledger.open(self.ledger_path())

    def load_patch(self, reference: str) -> LoadedPatch:
        from opspatch.core.spec import load_patch

        return load_patch(self.workspace_dir().find("patches", reference))

    def load_playbook(self, reference: str) -> Playbook:
        from opspatch.config.playbook import load_playbook

        return load_playbook(reference, self.workspace_dir().search_dirs("playbooks"))

    def hosts(self, selection: str) -> tuple[Host, ...]:
        from opspatch.config.inventory import resolve_workspace_hosts

        return resolve_workspace_hosts(selection, self.workspace_dir())

    def state_dir(self) -> Path:
        return paths.state_dir()


options = GlobalOptions()
"""Set by the root command's callback before any command runs (one process, one command)."""


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
PatchArgument = Annotated[
    str, typer.Argument(help="Patch id (looked up in patches/) or a .toml path")
]
