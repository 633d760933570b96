"""What an operator runs next, as a value: `Remedy(command, arguments, options)` (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from opspatch.core.vocabulary import Command, Word

PROGRAM = "opspatch"
"""The console script every remedy starts with."""


class CliFlag(Word):
    """A long option a remedy may name, spelled as on the command line."""

    BASELINE = "--baseline"
    CONTAINERS = "--containers"
    DECODE = "--decode"
    FORMAT = "--format"
    HOSTS = "--hosts"
    INSTALL = "--install"
    KEY = "--key"
    PRINCIPAL = "--principal"
    PURGE = "--purge"
    RELEASE = "--release"
    RELEASES = "--releases"
    RESTART = "--restart"
    ROOT = "--root"
    ROUTER = "--router"
    RUN = "--run"
    SSH = "--ssh"
    VERSION = "--version"
    WRITE_PATCH = "--write-patch"
    WRITER_ROLE = "--writer-role"


FLAGS: Mapping[Command, frozenset[CliFlag]] = {
    Command.APPLY: frozenset({CliFlag.HOSTS, CliFlag.ROOT, CliFlag.RESTART}),
    Command.APPROVE: frozenset({CliFlag.KEY, CliFlag.PRINCIPAL}),
    Command.BAKE: frozenset(),
    Command.CHECK: frozenset({CliFlag.RELEASES}),
    Command.DIAGNOSE: frozenset({CliFlag.HOSTS, CliFlag.DECODE}),
    Command.DRIFT: frozenset(),
    Command.EXPORT: frozenset({CliFlag.RELEASE, CliFlag.FORMAT}),
    Command.LINT_INIT: frozenset({CliFlag.HOSTS, CliFlag.WRITE_PATCH}),
    Command.PLAN: frozenset({CliFlag.HOSTS, CliFlag.ROOT}),
    Command.REHEARSE: frozenset(),
    Command.RECOVER: frozenset({CliFlag.HOSTS, CliFlag.RUN}),
    Command.RESTART: frozenset({CliFlag.HOSTS}),
    Command.ROLLBACK: frozenset({CliFlag.HOSTS, CliFlag.RUN, CliFlag.ROOT, CliFlag.RESTART}),
    Command.SMOKE: frozenset({CliFlag.HOSTS}),
    Command.JUDGE: frozenset({CliFlag.HOSTS, CliFlag.BASELINE}),
    Command.SCHEMA: frozenset(),
    Command.STATUS: frozenset({CliFlag.HOSTS}),
    Command.SYNC: frozenset({CliFlag.HOSTS}),
    Command.UNLOCK: frozenset({CliFlag.HOSTS}),
    Command.ADOPT: frozenset({CliFlag.HOSTS}),
    Command.INVENTORY_SHOW: frozenset(),
    Command.LEDGER_COPY: frozenset(),
    Command.LEDGER_LIST: frozenset(),
    Command.LEDGER_MIGRATE: frozenset({CliFlag.WRITER_ROLE}),
    Command.LEDGER_REPORT: frozenset(),
    Command.LEDGER_SHOW: frozenset(),
    Command.LEDGER_VERIFY: frozenset(),
    Command.LIVE_DISABLE: frozenset({CliFlag.HOSTS}),
    Command.LIVE_ENABLE: frozenset({CliFlag.HOSTS}),
    Command.SANDBOX_DOWN: frozenset({CliFlag.PURGE}),
    Command.SANDBOX_LOAD: frozenset(),
    Command.SANDBOX_PREPARE: frozenset(),
    Command.SANDBOX_REINSTALL: frozenset({CliFlag.VERSION, CliFlag.RESTART}),
    Command.SANDBOX_STATUS: frozenset(),
    Command.SANDBOX_UP: frozenset(
        {CliFlag.SSH, CliFlag.INSTALL, CliFlag.CONTAINERS, CliFlag.ROUTER}
    ),
}
"""The flags a remedy may give each command (a subset of the command's options)."""

ARGUMENTS: Mapping[Command, tuple[str, ...]] = {
    Command.APPLY: ("patch",),
    Command.APPROVE: ("patch",),
    Command.BAKE: ("patch",),
    Command.CHECK: ("patches",),
    Command.EXPORT: ("patch",),
    Command.PLAN: ("patch",),
    Command.REHEARSE: ("patch",),
    Command.ROLLBACK: ("patch",),
    Command.INVENTORY_SHOW: ("target",),
    Command.LEDGER_REPORT: ("run",),
    Command.LEDGER_SHOW: ("run",),
    Command.SANDBOX_REINSTALL: ("host",),
}
"""The positional arguments of each command, by the names the CLI gives them (none: absent)."""

BARE: Mapping[Command, frozenset[CliFlag]] = {
    Command.CHECK: frozenset({CliFlag.RELEASES}),
    Command.DIAGNOSE: frozenset({CliFlag.DECODE}),
    Command.SANDBOX_DOWN: frozenset({CliFlag.PURGE}),
    Command.SANDBOX_REINSTALL: frozenset({CliFlag.RESTART}),
    Command.SANDBOX_UP: frozenset({CliFlag.SSH, CliFlag.CONTAINERS, CliFlag.ROUTER}),
}
"""The flags of `FLAGS` given without a value (a switch; `check --releases` alone is the patch's
own range); every other flag takes one."""


@dataclass(frozen=True)
class Option:
    """One flag of a remedy and its value (None: a switch, such as `--purge`)."""

    flag: CliFlag
    value: str | None = None


@dataclass(frozen=True)
class Remedy:
    """A command line for the operator: the command, its positional arguments (a patch id, a
    run id, or a placeholder such as `RUN`) and its options, in the order they are printed.

    Raises:
        ValueError: the command does not take one of the flags, a switch is given a value or a
            flag that takes one none, or the command takes fewer arguments; a remedy is written
            in opspatch's own code, so this is a bug, found at construction.
    """

    command: Command
    arguments: tuple[str, ...] = ()
    options: tuple[Option, ...] = ()

    def __post_init__(self) -> None:
        taken = FLAGS[self.command]
        bare = BARE.get(self.command, frozenset())
        for option in self.options:
            if option.flag not in taken:
                raise ValueError(f"`{PROGRAM} {self.command.cli}` takes no {option.flag}")
            if (option.value is None) != (option.flag in bare):
                needs = "no value" if option.flag in bare else "a value"
                raise ValueError(f"`{PROGRAM} {self.command.cli} {option.flag}` takes {needs}")
        if len(self.arguments) > len(ARGUMENTS.get(self.command, ())):
            raise ValueError(
                f"`{PROGRAM} {self.command.cli}` takes {len(ARGUMENTS.get(self.command, ()))} "
                f"argument(s), not {len(self.arguments)}"
            )

    @classmethod
    def of(cls, command: Command, *arguments: str, **options: str | bool) -> Remedy:
        """A remedy from keyword flags: `Remedy.of(Command.RECOVER, hosts=host)`; a keyword
        is the flag's name (`writer_role` is `--writer-role`), True a switch.

        Raises:
            ValueError: a keyword names no `CliFlag`, or one the command does not take.
        """
        parsed: list[Option] = []
        for name, value in options.items():
            spelled = "--" + name.replace("_", "-")
            if spelled not in {flag.value for flag in CliFlag}:
                raise ValueError(f"no flag {spelled} is known to remedies")
            if value is False:
                continue
            parsed.append(Option(CliFlag(spelled), None if value is True else value))
        return cls(command, tuple(arguments), tuple(parsed))


def command_line(remedy: Remedy) -> str:
    """The one rendering of a remedy: `opspatch recover --hosts H` (options in their order)."""
    words = [PROGRAM, remedy.command.cli, *remedy.arguments]
    for option in remedy.options:
        words.append(option.flag.value)
        if option.value is not None:
            words.append(option.value)
    return " ".join(words)


def remedy_text(command: Command, *arguments: str, **options: str | bool) -> str:
    """`command_line(Remedy.of(...))`: the text of a remedy built where a sentence names it."""
    return command_line(Remedy.of(command, *arguments, **options))


def recover_after_stop(run_id: str | None) -> str | None:
    """What a run's Ctrl-C lines say becomes of the hosts a second Ctrl-C leaves in flight: the
    recover that finishes them; None for a run that recorded nothing (nothing to recover)."""
    if run_id is None:
        return None
    return f"`{remedy_text(Command.RECOVER, run=run_id)}` finishes what was left in flight"
