"""The fleet file: which patches belong on which hosts, for which releases (`fleet.toml`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, Field, ValidationError

from opspatch.config.files import read_toml
from opspatch.config.lookup import Workspace
from opspatch.core.fileschema import FileSchema, expects, problem, spec_error_from_validation
from opspatch.core.host import Host
from opspatch.core.policy import Playbook
from opspatch.core.remedy import remedy_text
from opspatch.core.spec import LoadedPatch
from opspatch.core.tomlsource import TomlDocument
from opspatch.core.vocabulary import Command
from opspatch.errors import InputError, Location, SelectionError

FLEET_FILE = "fleet.toml"
"""The fleet file's name in the workspace."""


def _release_range(text: str) -> str:
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        raise problem(
            f"{text!r} is not a release range",
            hint='write a PEP 440 range, e.g. releases = ">=0.5.4,<0.5.24"',
        ) from None
    return text


def _selections(items: list[str]) -> list[str]:
    if not items:
        raise problem("names no hosts", hint='hosts = ["gpu-fleet"] (inventory, group or host)')
    if any(not item.strip() for item in items):
        raise problem("has an empty selection")
    return items


class _EntryFile(FileSchema):
    id: Annotated[str, expects("a patch id (a string)", str)]
    hosts: Annotated[
        list[Annotated[str, expects("a host selection (a string)", str)]],
        expects("a list of host selections", list),
        AfterValidator(_selections),
    ]
    releases: Annotated[
        str, expects("a release range (a string)", str), AfterValidator(_release_range)
    ] = ""


class _TeamFile(FileSchema):
    require_approval: Annotated[bool, expects("true or false", bool)] = False
    allowed_signers: (
        Annotated[str, expects("a file name (a string)", str), Field(min_length=1)] | None
    ) = None


class _FleetFile(FileSchema):
    patches: Annotated[list[_EntryFile], expects("an array of [[patches]] tables", list)] = Field(
        default_factory=list
    )
    team: _TeamFile | None = None


@dataclass(frozen=True)
class DesiredPatch:
    """One entry: a patch, the hosts it belongs on, and the releases it is for."""

    patch: LoadedPatch
    hosts: tuple[str, ...]
    """The names of the hosts its selections resolve to, in inventory order."""
    releases: str
    """A PEP 440 range ("" = every release)."""
    location: Location
    """Where the entry is written (for messages that point the operator at it)."""

    def covers(self, release: str) -> bool:
        """Whether a host with `release` installed is one this entry is for.

        Raises:
            InputError: `release` is not a version (a host reporting one is not judged)."""
        if not self.releases:
            return True
        try:
            return SpecifierSet(self.releases).contains(Version(release), prereleases=True)
        except InvalidVersion:
            raise InputError(f"{release!r} is not a release version") from None


@dataclass(frozen=True)
class DesiredState:
    """The fleet file, resolved: every entry with its patch and hosts, and every host named."""

    path: str
    entries: tuple[DesiredPatch, ...]
    hosts: Mapping[str, Host]
    """Every host some entry names, by name."""
    allowed_signers: str | None = None
    """Set when the file's `[team] require_approval` asks a second operator's signature of
    every patch sync applies: the allowed_signers file (absolute) they are verified against."""

    def governing(self, playbook: Playbook) -> Playbook:
        """The playbook a sync applies under: the fleet file's approval over the playbook's
        (the fleet file may ask for one, never waive the playbook's)."""
        if self.allowed_signers is None or playbook.team.require_approval:
            # the playbook's own signers stand: a fleet file must not swap in a friendlier list
            return playbook
        team = replace(playbook.team, require_approval=True, allowed_signers=self.allowed_signers)
        return replace(playbook, team=team)

    def desired_on(self, host: str) -> tuple[DesiredPatch, ...]:
        """The entries that name `host`."""
        return tuple(e for e in self.entries if host in e.hosts)


def fleet_path(workspace: Workspace) -> Path:
    return workspace.root / FLEET_FILE


def load_fleet(workspace: Workspace, path: Path | None = None) -> DesiredState:
    """Read and resolve the fleet file (default: the workspace's `fleet.toml`).

    Raises:
        SpecError: the file is missing or unreadable, not TOML, not a fleet file, or an entry
            names a patch or hosts the workspace does not have (file:line: field).
    """
    path = path or fleet_path(workspace)
    if not path.is_file():
        raise InputError(
            f"{path}: no fleet file",
            hint=f"write {FLEET_FILE} in the workspace (docs/fleet.md): [[patches]] with id, "
            "hosts and releases",
        )
    document = read_toml(path)
    try:
        written = _FleetFile.model_validate(document.data)
    except ValidationError as exc:
        raise spec_error_from_validation(
            exc, document, schema=_FleetFile, data=document.data
        ) from None
    return replace(
        _resolve(workspace, document, written), allowed_signers=_approval(document, written)
    )


def _approval(document: TomlDocument, written: _FleetFile) -> str | None:
    """The allowed_signers file when `[team] require_approval` is true (it needs one)."""
    team = written.team
    if team is None or not team.require_approval:
        return None
    if team.allowed_signers is None:
        raise document.error(
            ("team", "require_approval"),
            "require_approval = true needs allowed_signers, the file the signatures are "
            "verified against",
            hint='add allowed_signers = "allowed_signers" (OpenSSH format, relative to this file)',
        )
    return str(Path(document.path).resolve().parent / team.allowed_signers)


def _resolve(workspace: Workspace, document: TomlDocument, written: _FleetFile) -> DesiredState:
    entries: list[DesiredPatch] = []
    hosts: dict[str, Host] = {}
    seen: dict[str, int] = {}
    for index, entry in enumerate(written.patches):
        where = ("patches", index)
        if entry.id in seen:
            raise document.error(
                (*where, "id"),
                f"patch {entry.id!r} is listed twice (first at line "
                f"{document.line_of(('patches', seen[entry.id], 'id'))})",
                hint="one entry per patch: list every host it belongs on in its hosts",
            )
        seen[entry.id] = index
        if Workspace.is_path("patches", entry.id):
            raise document.error(
                (*where, "id"),
                f"{entry.id!r} is a path; the fleet file names patches by id",
                hint="put the patch in the workspace's patches/ and write its id",
            )
        try:
            patch = workspace.load_patch(entry.id)
        except InputError as exc:
            if exc.message.startswith(f"no patch named {entry.id!r}"):
                raise document.error((*where, "id"), exc.message, hint=exc.hint) from None
            raise  # the patch file itself is wrong: its own file:line says where
        names: list[str] = []
        for number, selection in enumerate(entry.hosts):
            try:
                selected = workspace.hosts(selection)
            except SelectionError as exc:  # an inventory that is itself wrong says its own line
                show = remedy_text(Command.INVENTORY_SHOW, "INVENTORY")
                hint = exc.hint or f"`{show}` lists its hosts and groups"
                raise document.error((*where, "hosts", number), exc.message, hint=hint) from None
            for host in selected:
                hosts.setdefault(host.name, host)
                if host.name not in names:
                    names.append(host.name)
        entries.append(
            DesiredPatch(
                patch=patch,
                hosts=tuple(names),
                releases=entry.releases,
                location=document.location(where),
            )
        )
    return DesiredState(path=document.path, entries=tuple(entries), hosts=hosts)
