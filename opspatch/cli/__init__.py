"""The command line (typer): parses arguments, asks for confirmation, calls one function per
command and prints what it returns. `main` answers `--version` before importing the rest: it is
what scripts and people run to check an installation, and it should answer at once; and it runs
a plain `apply PATCH --file PATH --yes` without typer (`cli/localapply.py`)."""

from __future__ import annotations

import sys
from typing import NoReturn


def main(argv: list[str] | None = None) -> NoReturn:
    """The console script's entry point (`opspatch.cli.app.main` does the work)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:
        from opspatch import __version__

        sys.stdout.write(f"opspatch {__version__}\n")
        sys.exit(0)
    from opspatch.cli.localapply import run_scripted, scripted_local_apply

    scripted = scripted_local_apply(args)
    if scripted is not None:
        run_scripted(scripted)
    from opspatch.cli.app import main as run

    run(args)


__all__ = ["main"]
