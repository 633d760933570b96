"""The inventory file's schema: what `inventories/<name>.toml` may say, checked strictly.

An Ansible YAML inventory is turned into this same shape first (`ansible.py`), so both formats
are checked by one schema and reported by the shared translation of a pydantic error
(`opspatch.core.fileschema`): `file:line: field: problem`, with the nearest valid key.

Pure: data in, a validated `InventoryFile` or a `SpecError` out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError

from opspatch.core.fileschema import (
    FieldPath,
    FileSchema,
    SourceDocument,
    problem,
    spec_error_from_validation,
)

NonEmpty = Annotated[str, Field(min_length=1)]
_URL_RE = re.compile(r"^https?://[^\s/]+")


def _url(value: str) -> str:
    if not _URL_RE.match(value):
        raise problem(f"{value!r} is not a server URL", hint='e.g. url = "http://127.0.0.1:30000"')
    return value


class SystemdTable(FileSchema):
    kind: Literal["systemd"]
    unit: NonEmpty


class SupervisorTable(FileSchema):
    kind: Literal["supervisor"]
    program: NonEmpty
    config: NonEmpty | None = None


class CommandTable(FileSchema):
    kind: Literal["command"]
    start: NonEmpty
    pid_file: NonEmpty
    workdir: str | None = None
    stop_timeout: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 30.0


RestartTable = Annotated[SystemdTable | SupervisorTable | CommandTable, Field(discriminator="kind")]


class EngineTable(FileSchema):
    python: NonEmpty | None = None
    url: Annotated[str, AfterValidator(_url)] | None = None
    log_file: NonEmpty | None = None
    speculative: bool | None = None
    env: dict[str, str] = Field(default_factory=dict)
    restart: RestartTable | None = None


class LayerTable(FileSchema):
    """The settings one level writes: `[defaults]`, a group or a host."""

    user: NonEmpty | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    identity_file: NonEmpty | None = None
    known_hosts: NonEmpty | None = None
    transport: Literal["ssh", "local"] | None = None
    state_dir: NonEmpty | None = None
    jump: NonEmpty | None = None
    vars: dict[str, Any] = Field(default_factory=dict)
    engine: EngineTable = Field(default_factory=EngineTable)


class HostTable(LayerTable):
    address: NonEmpty | None = None


class GroupTable(LayerTable):
    hosts: list[str] = Field(default_factory=list)
    children: list[str] = Field(default_factory=list)


class InventoryFile(FileSchema):
    """A whole inventory as written (TOML), or as an Ansible inventory translates to."""

    description: str | None = None
    defaults: LayerTable = Field(default_factory=LayerTable)
    hosts: dict[str, HostTable] = Field(default_factory=dict)
    groups: dict[str, GroupTable] = Field(default_factory=dict)


def validate_inventory(
    data: Any,
    document: SourceDocument,
    *,
    to_document: Callable[[FieldPath], FieldPath] | None = None,
) -> InventoryFile:
    """Check `data` against the schema; `to_document` maps a path in `data` to where it is
    written in `document` (an Ansible variable, for a YAML inventory).

    Raises:
        SpecError: the first problem at its file:line and field, the others in the hint.
    """
    try:
        return InventoryFile.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(
            exc, document, schema=InventoryFile, data=data, to_document=to_document
        ) from None
