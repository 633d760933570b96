"""The inventory file's schema: what `inventories/<name>.toml` may say, checked strictly."""

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


_USER_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]*\$?|#[0-9]+)$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PASSWORD_SOURCE_HINT = (
    "keep the password out of the inventory: export it in an environment variable on the "
    'controller and name that variable here, e.g. become_password_env = "OPSPATCH_BECOME_PASSWORD" '
    "(or run on a terminal and opspatch asks once per run)"
)


def _become_user(value: str) -> str:
    if not _USER_RE.match(value):
        raise problem(f"{value!r} is not a user name", hint='e.g. become_user = "root" or "sglang"')
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME_RE.match(value):
        raise problem(
            f"{value!r} is not an environment variable name",
            hint='e.g. become_password_env = "OPSPATCH_BECOME_PASSWORD"',
        )
    return value


SECRET_KEYS = ("become_password", "become_pass")
"""Keys an operator may try for the sudo password; refused, pointing at the env source."""

ROUTER_SECRET_KEYS = ("admin_key", "api_key", "key")
"""Keys an operator may try for the router's admin key; refused, pointing at `admin_key_env`."""
ROUTER_KEY_HINT = (
    "keep the router's admin key out of the inventory: export it in an environment variable on "
    "the controller and name that variable here, e.g. router = { ..., admin_key_env = "
    '"OPSPATCH_ROUTER_KEY" }'
)


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


class ContainerRestartTable(FileSchema):
    kind: Literal["container"]
    stop_timeout: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 10.0
    pid_file: NonEmpty | None = None


RestartTable = Annotated[
    SystemdTable | SupervisorTable | CommandTable | ContainerRestartTable,
    Field(discriminator="kind"),
]

_CONTAINER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _container_name(value: str) -> str:
    if not _CONTAINER_NAME_RE.match(value):
        raise problem(
            f"{value!r} is not a container name (letters, digits, _ . -, not first)",
            hint='e.g. container = { runtime = "podman", name = "sglang-0" }',
        )
    return value


class ContainerTable(FileSchema):
    """`container = { runtime = "podman" | "docker", name = "..." }`."""

    runtime: Literal["podman", "docker"]
    name: Annotated[str, AfterValidator(_container_name)]


class EngineTable(FileSchema):
    python: NonEmpty | None = None
    url: Annotated[str, AfterValidator(_url)] | None = None
    log_file: NonEmpty | None = None
    speculative: bool | None = None
    env: dict[str, str] = Field(default_factory=dict)
    restart: RestartTable | None = None


class RouterTable(FileSchema):
    """`router = { url, worker_url, admin_key_env }`; merged key by key across levels, so a
    group names the router and a host may name its own worker URL."""

    url: Annotated[str, AfterValidator(_url)] | None = None
    worker_url: Annotated[str, AfterValidator(_url)] | None = None
    admin_key_env: Annotated[str, AfterValidator(_env_name)] | None = None


class LayerTable(FileSchema):
    """The settings one level writes: `[defaults]`, a group or a host."""

    user: NonEmpty | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    identity_file: NonEmpty | None = None
    known_hosts: NonEmpty | None = None
    transport: Literal["ssh", "local"] | None = None
    state_dir: NonEmpty | None = None
    jump: NonEmpty | None = None
    become: bool | None = None
    become_user: Annotated[str, AfterValidator(_become_user)] | None = None
    become_method: Literal["sudo"] | None = None
    become_password_env: Annotated[str, AfterValidator(_env_name)] | None = None
    container: ContainerTable | None = None
    live: bool | None = None
    """Whether live fixes may be taken on this host's engine (`opspatch live enable`, `apply
    --live`); off unless an inventory level says `live = true`."""
    agent: Literal["resident", "per-exec"] | None = None
    """How the host agent runs: one process per host and user for the run (`resident`, the
    default) or a fresh interpreter per request (`per-exec`)."""
    vars: dict[str, Any] = Field(default_factory=dict)
    engine: EngineTable = Field(default_factory=EngineTable)
    router: RouterTable = Field(default_factory=RouterTable)


class HostTable(LayerTable):
    address: NonEmpty | None = None


class GroupTable(LayerTable):
    hosts: list[str] = Field(default_factory=list)
    children: list[str] = Field(default_factory=list)


class UnitTable(FileSchema):
    """`[units.NAME]`: the hosts that form one multi-node server. `hosts` in node-rank order
    unless `head` names another of them (the head is then rank 0, the others follow in the
    order written). Checked against the hosts in `resolve` (unknown, repeated, in two units)."""

    hosts: list[str] = Field(default_factory=list)
    head: NonEmpty | None = None


class InventoryFile(FileSchema):
    """A whole inventory as written (TOML), or as an Ansible inventory translates to."""

    description: str | None = None
    defaults: LayerTable = Field(default_factory=LayerTable)
    hosts: dict[str, HostTable] = Field(default_factory=dict)
    groups: dict[str, GroupTable] = Field(default_factory=dict)
    units: dict[str, UnitTable] = Field(default_factory=dict)


def validate_inventory(
    data: Any,
    document: SourceDocument,
    *,
    to_document: Callable[[FieldPath], FieldPath] | None = None,
) -> InventoryFile:
    """Check `data` against the schema; `to_document` maps a path in `data` to where it is
    written in `document` (an Ansible variable, for a YAML inventory).

    Raises:
        SpecError: the first problem at its file:line and field, the others in the hint; a
            password written in the inventory is refused whatever else is wrong.
    """
    _refuse_secrets(data, document, to_document or (lambda path: path))
    try:
        return InventoryFile.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(
            exc, document, schema=InventoryFile, data=data, to_document=to_document
        ) from None


def _refuse_secrets(
    data: Any, document: SourceDocument, to_document: Callable[[FieldPath], FieldPath]
) -> None:
    """A sudo password written into the inventory is refused at its line: inventories are
    committed, copied and printed; secrets come from the environment or the terminal."""
    if not isinstance(data, dict):
        return
    layers: list[tuple[FieldPath, Any]] = [(("defaults",), data.get("defaults"))]
    for section in ("hosts", "groups"):
        table = data.get(section)
        if isinstance(table, dict):
            layers.extend(((section, str(name)), layer) for name, layer in table.items())
    for where, layer in layers:
        if not isinstance(layer, dict):
            continue
        for key in SECRET_KEYS:
            if key in layer:
                raise document.error(
                    to_document((*where, key)),
                    "a password does not belong in an inventory",
                    hint=PASSWORD_SOURCE_HINT,
                )
        router = layer.get("router")
        router_keys = router if isinstance(router, dict) else {}
        for key in ROUTER_SECRET_KEYS:
            if key in router_keys:
                raise document.error(
                    to_document((*where, "router", key)),
                    "a router key does not belong in an inventory",
                    hint=ROUTER_KEY_HINT,
                )
