"""A remedy names only what the CLI has: every `Command` is a command of the real typer app,
every flag a remedy may give it is one of that command's options, its positional arguments are
the command's, and a remedy naming a flag its command does not take raises when it is built."""

from __future__ import annotations

from typing import Any

import pytest
import typer.main

from opspatch.cli.app import app
from opspatch.cli.patches import releases_without_spec
from opspatch.core.remedy import (
    ARGUMENTS,
    BARE,
    FLAGS,
    CliFlag,
    Option,
    Remedy,
    command_line,
    remedy_text,
)
from opspatch.core.vocabulary import Command

pytestmark = pytest.mark.pure


def _commands(command: Any, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every leaf command of the app by its path (`ledger verify`), groups walked."""
    children = getattr(command, "commands", None)
    if children is None:
        return {" ".join(path): command}
    found: dict[str, Any] = {}
    for name, child in children.items():
        found.update(_commands(child, (*path, name)))
    return found


CLI = _commands(typer.main.get_command(app))


def _options(command: Any) -> set[str]:
    return {
        spelled
        for param in command.params
        if param.param_type_name == "option"
        for spelled in (*param.opts, *param.secondary_opts)
    }


def _arguments(command: Any) -> tuple[str, ...]:
    return tuple(param.name for param in command.params if param.param_type_name == "argument")


@pytest.mark.parametrize("command", list(Command), ids=str)
def test_every_cli_command_is_a_command_of_the_app(command: Command) -> None:
    assert command.cli in CLI, f"`opspatch {command.cli}` is no command of the CLI"


def test_every_command_of_the_app_is_one_command() -> None:
    assert set(CLI) == {command.cli for command in Command}


@pytest.mark.parametrize("command", list(Command), ids=str)
def test_every_flag_a_remedy_may_give_is_an_option_of_its_command(command: Command) -> None:
    missing = {flag.value for flag in FLAGS[command]} - _options(CLI[command.cli])
    assert not missing, f"`opspatch {command.cli}` has no option {sorted(missing)}"


@pytest.mark.parametrize("command", list(Command), ids=str)
def test_positional_arguments_are_the_commands_own(command: Command) -> None:
    assert ARGUMENTS.get(command, ()) == _arguments(CLI[command.cli])


def test_every_flag_is_taken_by_some_command() -> None:
    used = {flag for flags in FLAGS.values() for flag in flags}
    assert used == set(CliFlag)


def test_renders_the_command_line_in_order() -> None:
    remedy = Remedy(
        Command.ROLLBACK, ("fix-1",), (Option(CliFlag.RUN, "r1"), Option(CliFlag.HOSTS, "a,b"))
    )
    assert command_line(remedy) == "opspatch rollback fix-1 --run r1 --hosts a,b"
    assert remedy_text(Command.SANDBOX_DOWN, purge=True) == "opspatch sandbox down --purge"
    assert remedy_text(Command.LEDGER_MIGRATE, writer_role="ROLE") == (
        "opspatch ledger migrate --writer-role ROLE"
    )
    assert remedy_text(Command.LEDGER_VERIFY) == "opspatch ledger verify"


def test_a_flag_the_command_does_not_take_raises_at_construction() -> None:
    with pytest.raises(ValueError, match="takes no --purge"):
        Remedy(Command.RECOVER, options=(Option(CliFlag.PURGE),))
    with pytest.raises(ValueError, match="takes no --run"):
        Remedy.of(Command.RESTART, run="r1")
    with pytest.raises(ValueError, match="no flag --hostz"):
        Remedy.of(Command.RECOVER, hostz="a")
    with pytest.raises(ValueError, match="argument"):
        Remedy.of(Command.RECOVER, "r1")


@pytest.mark.parametrize("command", list(Command), ids=str)
def test_flags_given_bare_are_the_ones_the_cli_takes_bare(command: Command) -> None:
    options = {
        spelled: param
        for param in CLI[command.cli].params
        if param.param_type_name == "option"
        for spelled in param.opts
    }
    for flag in FLAGS[command]:
        # `check --releases` alone: the CLI gives the bare flag an empty value before parsing
        bare = options[flag.value].is_flag or releases_without_spec([flag.value]) != [flag.value]
        assert bare == (flag in BARE.get(command, frozenset())), f"opspatch {command} {flag}"


def test_a_switch_takes_no_value_and_a_flag_needs_one() -> None:
    with pytest.raises(ValueError, match="takes no value"):
        Remedy.of(Command.SANDBOX_DOWN, purge="yes")
    with pytest.raises(ValueError, match="takes a value"):
        Remedy.of(Command.RECOVER, hosts=True)
    assert remedy_text(Command.CHECK, "fix-1", releases=True) == "opspatch check fix-1 --releases"
