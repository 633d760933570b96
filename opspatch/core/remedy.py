"""What an operator runs next, as a value: `Remedy(command, arguments, options)` (pure).

A hint or note that tells the operator to run `opspatch recover --hosts H` names a command of the
CLI and its flags. Written by hand, a renamed flag would leave every such hint naming a flag that
no longer exists, and nothing would notice. So a remedy is built as a value: the command is a
`CliCommand`, each flag a `CliFlag`; the flags each command takes (`FLAGS`, those given without a
value in `BARE`) and its positional arguments (`ARGUMENTS`) are written here once, and a remedy
that does not fit them raises at construction. tests/test_remedy.py walks the real typer app
(`opspatch.cli.app`) and checks these tables against it, so renaming a flag in the CLI fails that
test until the table follows.

`command_line` is the one function that renders a remedy to its text. Hints and notes are
sentences that carry the command in the middle and are read below the CLI (a host's note folds
an error's hint, the ledger stores notes), so they hold the rendered text, made by that function
where the sentence is written (docs/architecture.md, "Remedies").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from opspatch.core.vocabulary import Word

PROGRAM = "opspatch"
"""The console script every remedy starts with."""


class CliCommand(Word):
    """A command of the `opspatch` CLI, spelled as typed after `opspatch` (groups included)."""

    APPLY = "apply"
    APPROVE = "approve"
    BAKE = "bake"
    CHECK = "check"
    DIAGNOSE = "diagnose"
    EXPORT = "export"
    JUDGE = "judge"
    LINT_INIT = "lint-init"
    PLAN = "plan"
    RECOVER = "recover"
    RESTART = "restart"
    ROLLBACK = "rollback"
    SMOKE = "smoke"
    STATUS = "status"
    SYNC = "sync"
    UNLOCK = "unlock"
    ADOPT = "adopt"
    INVENTORY_SHOW = "inventory show"
    LEDGER_COPY = "ledger copy"
    LEDGER_LIST = "ledger list"
    LEDGER_MIGRATE = "ledger migrate"
    LEDGER_REPORT = "ledger report"
    LEDGER_SHOW = "ledger show"
    LEDGER_VERIFY = "ledger verify"
    LIVE_DISABLE = "live disable"
    LIVE_ENABLE = "live enable"
    SANDBOX_DOWN = "sandbox down"
    SANDBOX_REINSTALL = "sandbox reinstall"
    SANDBOX_STATUS = "sandbox status"
    SANDBOX_UP = "sandbox up"


class CliFlag(Word):
    """A long option a remedy may name, spelled as on the command line."""

    BASELINE = "--baseline"
    CONTAINERS = "--containers"
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


FLAGS: Mapping[CliCommand, frozenset[CliFlag]] = {
    CliCommand.APPLY: frozenset({CliFlag.HOSTS, CliFlag.ROOT, CliFlag.RESTART}),
    CliCommand.APPROVE: frozenset({CliFlag.KEY, CliFlag.PRINCIPAL}),
    CliCommand.BAKE: frozenset(),
    CliCommand.CHECK: frozenset({CliFlag.RELEASES}),
    CliCommand.DIAGNOSE: frozenset({CliFlag.HOSTS}),
    CliCommand.EXPORT: frozenset({CliFlag.RELEASE, CliFlag.FORMAT}),
    CliCommand.LINT_INIT: frozenset({CliFlag.HOSTS, CliFlag.WRITE_PATCH}),
    CliCommand.PLAN: frozenset({CliFlag.HOSTS, CliFlag.ROOT}),
    CliCommand.RECOVER: frozenset({CliFlag.HOSTS, CliFlag.RUN}),
    CliCommand.RESTART: frozenset({CliFlag.HOSTS}),
    CliCommand.ROLLBACK: frozenset({CliFlag.HOSTS, CliFlag.RUN, CliFlag.ROOT, CliFlag.RESTART}),
    CliCommand.SMOKE: frozenset({CliFlag.HOSTS}),
    CliCommand.JUDGE: frozenset({CliFlag.HOSTS, CliFlag.BASELINE}),
    CliCommand.STATUS: frozenset({CliFlag.HOSTS}),
    CliCommand.SYNC: frozenset({CliFlag.HOSTS}),
    CliCommand.UNLOCK: frozenset({CliFlag.HOSTS}),
    CliCommand.ADOPT: frozenset({CliFlag.HOSTS}),
    CliCommand.INVENTORY_SHOW: frozenset(),
    CliCommand.LEDGER_COPY: frozenset(),
    CliCommand.LEDGER_LIST: frozenset(),
    CliCommand.LEDGER_MIGRATE: frozenset({CliFlag.WRITER_ROLE}),
    CliCommand.LEDGER_REPORT: frozenset(),
    CliCommand.LEDGER_SHOW: frozenset(),
    CliCommand.LEDGER_VERIFY: frozenset(),
    CliCommand.LIVE_DISABLE: frozenset({CliFlag.HOSTS}),
    CliCommand.LIVE_ENABLE: frozenset({CliFlag.HOSTS}),
    CliCommand.SANDBOX_DOWN: frozenset({CliFlag.PURGE}),
    CliCommand.SANDBOX_REINSTALL: frozenset({CliFlag.VERSION, CliFlag.RESTART}),
    CliCommand.SANDBOX_STATUS: frozenset(),
    CliCommand.SANDBOX_UP: frozenset(
        {CliFlag.SSH, CliFlag.INSTALL, CliFlag.CONTAINERS, CliFlag.ROUTER}
    ),
}
"""The flags a remedy may give each command (a subset of the command's options)."""

ARGUMENTS: Mapping[CliCommand, tuple[str, ...]] = {
    CliCommand.APPLY: ("patch",),
    CliCommand.APPROVE: ("patch",),
    CliCommand.BAKE: ("patch",),
    CliCommand.CHECK: ("patches",),
    CliCommand.EXPORT: ("patch",),
    CliCommand.PLAN: ("patch",),
    CliCommand.ROLLBACK: ("patch",),
    CliCommand.INVENTORY_SHOW: ("target",),
    CliCommand.LEDGER_REPORT: ("run",),
    CliCommand.LEDGER_SHOW: ("run",),
    CliCommand.SANDBOX_REINSTALL: ("host",),
}
"""The positional arguments of each command, by the names the CLI gives them (none: absent)."""

BARE: Mapping[CliCommand, frozenset[CliFlag]] = {
    CliCommand.CHECK: frozenset({CliFlag.RELEASES}),
    CliCommand.SANDBOX_DOWN: frozenset({CliFlag.PURGE}),
    CliCommand.SANDBOX_REINSTALL: frozenset({CliFlag.RESTART}),
    CliCommand.SANDBOX_UP: frozenset({CliFlag.SSH, CliFlag.CONTAINERS, CliFlag.ROUTER}),
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

    command: CliCommand
    arguments: tuple[str, ...] = ()
    options: tuple[Option, ...] = ()

    def __post_init__(self) -> None:
        taken = FLAGS[self.command]
        bare = BARE.get(self.command, frozenset())
        for option in self.options:
            if option.flag not in taken:
                raise ValueError(f"`{PROGRAM} {self.command}` takes no {option.flag}")
            if (option.value is None) != (option.flag in bare):
                needs = "no value" if option.flag in bare else "a value"
                raise ValueError(f"`{PROGRAM} {self.command} {option.flag}` takes {needs}")
        if len(self.arguments) > len(ARGUMENTS.get(self.command, ())):
            raise ValueError(
                f"`{PROGRAM} {self.command}` takes {len(ARGUMENTS.get(self.command, ()))} "
                f"argument(s), not {len(self.arguments)}"
            )

    @classmethod
    def of(cls, command: CliCommand, *arguments: str, **options: str | bool) -> Remedy:
        """A remedy from keyword flags: `Remedy.of(CliCommand.RECOVER, hosts=host)`; a keyword
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
    words = [PROGRAM, remedy.command.value, *remedy.arguments]
    for option in remedy.options:
        words.append(option.flag.value)
        if option.value is not None:
            words.append(option.value)
    return " ".join(words)


def remedy_text(command: CliCommand, *arguments: str, **options: str | bool) -> str:
    """`command_line(Remedy.of(...))`: the text of a remedy built where a sentence names it."""
    return command_line(Remedy.of(command, *arguments, **options))
