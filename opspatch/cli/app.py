"""The `opspatch` command line: the root command and its command groups (errors become exit
codes in `cli/exits.py`)."""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Annotated, NoReturn

import typer
import typer.core

from opspatch import __version__
from opspatch.cli.context import options
from opspatch.cli.exits import exit_reporting, json_requested
from opspatch.cli.render import out, print_error
from opspatch.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK


def _argument_type_not_shown(self: object, ctx: object) -> None:
    return None


# typer 0.29 prints an argument's Python type after its name (`PATCH <str>`) and has no setting
# to stop it; the argument's name already says what its value is.
setattr(typer.core.TyperArgument, "display_type_rich", _argument_type_not_shown)  # noqa: B010


def _root() -> typer.Typer:
    """The root command, with no command group registered yet."""
    root = typer.Typer(
        name="opspatch",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        help=(
            "Safe, structural hot fixes for live SGLang inference fleets: typed patch files "
            "anchored on code structure, validated, applied atomically with byte-exact backups, "
            "smoke-tested, rolled back on failure, recorded in a ledger."
        ),
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    root.callback()(_global)
    return root


def _print_version(value: bool) -> None:
    if value:
        out.print(f"opspatch {__version__}")
        raise typer.Exit(0)


def _global(
    workspace: Annotated[
        Path | None,
        typer.Option(
            "--workspace",
            "-w",
            help="Folder holding patches/, inventories/, playbooks/ (default: $OPSPATCH_HOME or .)",
            metavar="DIR",
        ),
    ] = None,
    ledger_file: Annotated[
        str | None,
        typer.Option(
            "--ledger",
            help="Ledger file or postgresql:// URL, no password (default: $OPSPATCH_LEDGER or "
            "the state dir).",
            metavar="FILE|URL",
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", is_eager=True, callback=_print_version
        ),
    ] = False,
) -> None:
    options.workspace = workspace
    options.ledger = ledger_file


GROUPS: dict[str, frozenset[str]] = {
    "patches": frozenset({"check", "plan", "schema"}),
    "changes": frozenset({"apply", "recover", "restart", "rollback", "unlock"}),
    "bake": frozenset({"bake"}),
    "fleet": frozenset({"drift", "sync"}),
    "inspect": frozenset({"judge", "smoke", "status"}),
    "incident": frozenset({"export", "lint-init"}),
    "ledger": frozenset({"ledger"}),
    "live": frozenset({"live"}),
    "respond": frozenset({"adopt", "diagnose"}),
    "inventory": frozenset({"inventory"}),
    "sandbox": frozenset({"sandbox"}),
    "rehearse": frozenset({"rehearse"}),
    "team": frozenset({"approve"}),
}
"""The command groups (`opspatch.cli.<name>`, in the order `--help` lists their commands) and the
top-level words each registers: a command imports its own group's module only (issue 44)."""

ROOT_OPTIONS_WITH_VALUES = ("--workspace", "-w", "--ledger")
"""The root command's options that take a value (`_global`): what stands before the command."""


def group_module(name: str) -> ModuleType:
    """The module of command group `name` (a key of `GROUPS`), imported on first use."""
    return importlib.import_module(f"opspatch.cli.{name}")


@functools.cache
def full_app() -> typer.Typer:
    """The root with every command group: help, an unknown word, the docs and the tests."""
    every = _root()
    for name in GROUPS:
        group_module(name).register(every)
    return every


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # built when first asked for: a command builds only its own group
        return full_app()
    raise AttributeError(name)


def app_for(args: Sequence[str]) -> typer.Typer:
    """The app to run `args` with: the root and only the group of the command they name (typer
    builds every command it holds, its options read from their signatures, before parsing any:
    a tenth of a quick command's time), or every group when they name none (help, a typo)."""
    word = command_word(args)
    chosen = [name for name, words in GROUPS.items() if word in words]
    if not chosen:
        return full_app()
    one = _root()
    for name in chosen:
        group_module(name).register(one)
    return one


def command_word(args: Sequence[str]) -> str | None:
    """The command `args` name: the first that is neither an option nor a root option's value."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ROOT_OPTIONS_WITH_VALUES:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def group_commands(group: ModuleType) -> frozenset[str]:
    """The top-level command words a group module registers (its commands and sub-groups)."""
    probe = typer.Typer()
    group.register(probe)
    return frozenset(
        [command.name or typer.main.get_command_name(command.callback.__name__)  # type: ignore[union-attr]
         for command in probe.registered_commands]
        + [info.name or "" for info in probe.registered_groups]
    )  # fmt: skip


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point: run the app, turn every failure into one message + exit code."""
    from opspatch.cli.patches import releases_without_spec

    args = releases_without_spec(sys.argv[1:] if argv is None else list(argv))
    as_json = json_requested(args)
    exit_reporting(lambda: _run(args, as_json), as_json=as_json, args=args)


def _run(args: list[str], as_json: bool) -> int:
    """The app's exit code for `args`; typer's own exits and aborts become codes here."""
    try:
        # Without standalone mode, an Exit raised by a command comes back as its exit code.
        returned = app_for(args)(args=args, prog_name="opspatch", standalone_mode=False)
        if returned == EXIT_INTERRUPTED:  # typer's answer to a Ctrl-C: said as every path says it
            raise KeyboardInterrupt
        return returned if isinstance(returned, int) else EXIT_OK
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print_error(
            "aborted; nothing was changed", hint=None, exit_code=EXIT_BAD_INPUT, as_json=as_json
        )
        return EXIT_BAD_INPUT
