"""The one place a command's failures become a message and an exit code, for the typer app
(`cli/app.py`) and for `apply --file --yes`, which runs without it (`cli/localapply.py`)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from opspatch.cli.render import print_error
from opspatch.errors import EXIT_BAD_INPUT, OpspatchError, RunInterrupted, exit_code_for


def json_requested(args: Sequence[str]) -> bool:
    """Every command that reports takes --json; an error then is a JSON document on stdout too."""
    args = list(args)
    return "--json" in args[: args.index("--")] if "--" in args else "--json" in args


def exit_reporting(
    run: Callable[[], int], *, as_json: bool, args: Sequence[str] | None = None
) -> NoReturn:
    """Run a command and exit with its code; every failure becomes one message and its code.
    `args` (default: this process's) name the command a Ctrl-C stopped."""
    try:
        code = run()
    except OpspatchError as exc:
        code = exit_code_for(exc)
        print_error(exc.message, hint=exc.hint, exit_code=code, as_json=as_json)
        if isinstance(exc, RunInterrupted):
            # The hosts in flight are abandoned on purpose: exiting normally would join their
            # threads, which is the waiting the operator just refused.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    except KeyboardInterrupt:
        code = exit_code_for(KeyboardInterrupt())
        message, hint = _interrupted(args)
        print_error(message, hint=hint, exit_code=code, as_json=as_json)
    except Exception as exc:
        # Usage errors of the option parser (typer vendors click; older typers use click itself)
        # always mean bad usage (exit 2); shown in the same style as every other error.
        format_message = getattr(exc, "format_message", None)
        if format_message is None or not hasattr(exc, "exit_code"):
            raise
        code = EXIT_BAD_INPUT
        context = getattr(exc, "ctx", None)
        command = context.command_path if context is not None else "opspatch"
        print_error(
            str(format_message()),
            hint=f"see `{command} --help`",
            exit_code=code,
            as_json=as_json,
        )
    sys.exit(code)


def _interrupted(args: Sequence[str] | None) -> tuple[str, str]:
    """What a Ctrl-C that reached the command line stopped, and where to see what it left: a run
    answers a Ctrl-C during its hosts' steps itself (it names the hosts it left), so this one
    came before or after them."""
    command = shlex.join(["opspatch", *(sys.argv[1:] if args is None else args)])
    return (
        f"interrupted (Ctrl-C): `{command}` stopped outside its hosts' steps",
        "`opspatch status` shows where each host stands; a run left unfinished is `interrupted` "
        "in the ledger, and `opspatch recover` finishes or undoes it",
    )
