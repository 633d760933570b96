"""What every command needs from the global options: the workspace and the ledger. Heavy
modules (the runs, the SSH transport) are imported by the commands that use them, so `opspatch
--version`, `check` and `schema` start fast; typer is not imported here (`apply --file --yes`
runs without it: `cli/localapply.py`), the shared option types are in `cli/params.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opspatch.config import paths
from opspatch.config.lookup import Workspace
from opspatch.core.ledgerlocation import LedgerLocation, ledger_location
from opspatch.errors import InputError

if TYPE_CHECKING:
    from opspatch.core.host import Host
    from opspatch.core.policy import Playbook
    from opspatch.core.spec import LoadedPatch
    from opspatch.ledger.store import Ledger
    from opspatch.runs.fleet.connect import Connector


@dataclass
class GlobalOptions:
    """The options given before the command (`opspatch -w DIR --ledger FILE|URL <command>`)."""

    workspace: Path | None = None
    ledger: str | None = None

    def workspace_dir(self) -> Workspace:
        return Workspace.discover(self.workspace)

    def ledger_location(self) -> LedgerLocation:
        """`--ledger`, else `OPSPATCH_LEDGER`, else the state directory's file.

        Raises:
            InputError: a PostgreSQL URL that carries a password.
        """
        if self.ledger:
            return ledger_location(self.ledger, given_by="--ledger")
        return paths.default_ledger_location()

    def open_ledger(self) -> Ledger:
        """The ledger a command records in. A file that is not there is created (its first
        use), and that is said on stderr: a ledger deleted or moved since the last command is
        never replaced by an empty one without a word."""
        from opspatch.cli.render import err
        from opspatch.ledger.store import Ledger

        ledger = Ledger.open(self.ledger_location())
        if ledger.created:
            err.print(
                f"opspatch: there was no ledger at {ledger.path}: created a new, empty one "
                "(its first use). If a ledger was expected there, it was moved or deleted: "
                "its history is not in this one."
            )
        return ledger

    def existing_ledger(self) -> Ledger | None:
        """The ledger, or None while it is a file nothing has written yet (a read-only command
        must not create one); a database is always opened."""
        location = self.ledger_location()
        # a -wal without its ledger is a deleted ledger, which `open_ledger` names
        if (
            isinstance(location, Path)
            and not location.exists()
            and not Path(f"{location}-wal").exists()
        ):
            return None
        return self.open_ledger()

    def reading_ledger(self) -> Ledger:
        """The ledger a command only reads; never created.

        Raises:
            InputError: there is no ledger file at its location.
        """
        ledger = self.existing_ledger()
        if ledger is None:
            raise InputError(
                f"there is no ledger at {self.ledger_location()}: nothing was recorded there",
                hint="give --ledger (or OPSPATCH_LEDGER) where the ledger is; a command that "
                "changes hosts creates one where there is none",
            )
        return ledger

    def load_patch(self, reference: str) -> LoadedPatch:
        return self.workspace_dir().load_patch(reference)

    def load_playbook(self, reference: str) -> Playbook:
        return self.workspace_dir().load_playbook(reference)

    def hosts(self, selection: str) -> tuple[Host, ...]:
        return self.workspace_dir().hosts(selection)

    def state_dir(self) -> Path:
        return paths.state_dir()

    def connector(self, *, accept_new_host_keys: bool) -> Connector:
        """How this command reaches hosts: the host-key policy, and the sudo passwords of the
        run (`become`: the inventory's environment variable, else one prompt on the terminal)."""
        from opspatch.cli.render import terminal_password_prompt
        from opspatch.hosts.become import BecomePasswords
        from opspatch.runs.fleet.connect import transport_factory

        passwords = BecomePasswords(prompt=terminal_password_prompt())
        return transport_factory(accept_new_host_keys=accept_new_host_keys, passwords=passwords)


options = GlobalOptions()
"""Set by the root command's callback before any command runs (one process, one command)."""
