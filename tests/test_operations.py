"""The agent operations as the controller knows them: one `Operation` descriptor each (its
request and reply TypedDicts, the record its reply is read as, the agent's function, who runs
it), and every reply read through `read_reply`, so a reply without a field is `agent-bad-reply`
naming it."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.core.codec import UNREAD, Record
from opspatch.errors import RemoteOperationError
from opspatch.hosts import diagnosis, engine, live, liveinstall
from opspatch.hosts.agent import protocol
from opspatch.hosts.agent.protocol import AgentRequest, OperationReply
from opspatch.hosts.agentcall import AgentCaller
from opspatch.hosts.become import RunsAs
from opspatch.hosts.channel import AgentAnswer, agent_modules
from opspatch.hosts.diagnosis import DiagnoseRequest, diagnose_host
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.results import OPERATIONS, Operation
from opspatch.hosts.transport.base import Transport
from opspatch.hosts.transport.scripted import Refusal, ScriptedTransport, agent_operation
from opspatch.runs.commands.local_files import local_file_host
from tests.scriptedkit import scripted_host

pytestmark = pytest.mark.scripted

assert engine.SMOKE and diagnosis.DIAGNOSE and live.LIVE and liveinstall.LIVE_SITE  # registered


def _agent_operations() -> dict[str, Any]:
    for name, _ in agent_modules():
        importlib.import_module(name)  # each registers its operations
    return dict(protocol.OPERATIONS)


def test_every_agent_operation_has_one_descriptor_naming_its_function() -> None:
    agent = _agent_operations()
    assert len(agent) == 22  # 16, measure (the judge), live, live enable's three, file_hashes
    assert set(OPERATIONS) == set(agent)
    for name, descriptor in OPERATIONS.items():
        assert descriptor.name == name
        assert descriptor.function is agent[name], name


RUNS_AS = {
    "facts": RunsAs.READ,
    "resolve": RunsAs.READ,
    "read": RunsAs.READ,
    "inspect": RunsAs.READ,
    "wait_ready": RunsAs.READ,
    "wait_drained": RunsAs.READ,
    "smoke": RunsAs.READ,
    "live_site": RunsAs.READ,
    "file_hashes": RunsAs.READ,
    "lock": RunsAs.CHANGE,
    "unlock": RunsAs.CHANGE,
    "swap": RunsAs.CHANGE,
    "restore": RunsAs.CHANGE,
    "live": RunsAs.CHANGE,
    "install_files": RunsAs.CHANGE,
    "remove_files": RunsAs.CHANGE,
    "restart": RunsAs.RESTART,
    "stop": RunsAs.RESTART,
    "start": RunsAs.RESTART,
    "whoami": RunsAs.LOGIN,
    "measure": RunsAs.LOGIN,
    "diagnose": RunsAs.LOGIN,
}
"""Who runs each operation with `become`: every operation is decided here, once, as a row."""


class Refuses:
    """An endpoint that refuses every exec, and keeps who each ran as: the login user as a file
    only its owner may read would (`permission-denied`), a raised one as `denied-<user>`."""

    def __init__(self) -> None:
        self.users: list[str | None] = []

    def answer(self, request: AgentRequest, *, as_user: str | None, timeout: float) -> AgentAnswer:
        self.users.append(as_user)
        code = "permission-denied" if as_user is None else f"denied-{as_user}"
        reply: OperationReply = {"status": "refused", "code": code, "message": "no", "data": {}}
        return AgentAnswer({"replies": [reply] * len(request["ops"]), "identity": None})


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_each_operation_runs_as_its_descriptor_says_on_a_host_with_become(name: str) -> None:
    """`runs_as` is the one fact the caller reads: a change is sent raised, a restart as root
    (systemd), a read as the login user and again raised when it may not read, and a login
    operation never raised."""
    assert set(RUNS_AS) == set(OPERATIONS)  # a new operation is decided in RUNS_AS
    descriptor: Operation[Any, Any, Any] = OPERATIONS[name]
    assert descriptor.runs_as is RUNS_AS[name]
    inventory = parse_inventory(
        '[hosts.gpu-01]\naddress = "a"\nbecome = true\nbecome_user = "sglang"\n'
        'engine = { python = "/usr/bin/python3", '
        'restart = { kind = "systemd", unit = "sglang.service" } }\n',
        "inventory.toml",
    )
    endpoint = Refuses()
    caller = AgentCaller(cast(Transport, endpoint), inventory.host("gpu-01"))
    with pytest.raises(RemoteOperationError) as caught:
        caller.call(name, {}, timeout=5)
    sent_as = {
        RunsAs.LOGIN: [None],
        RunsAs.READ: [None, "sglang"],  # asked again raised
        RunsAs.CHANGE: ["sglang"],
        RunsAs.RESTART: ["root"],
    }[descriptor.runs_as]
    assert endpoint.users == sent_as
    assert caught.value.code == (
        "permission-denied" if sent_as == [None] else f"denied-{sent_as[-1]}"
    )


def read_keys(record: type) -> set[str]:
    """The keys a record is read from: its fields' keys, less the derived and unread ones."""
    fields = [f for f in dataclasses.fields(record) if f.init and not f.metadata.get(UNREAD)]
    return {f.metadata.get("alias", f.name) for f in fields}


def _parts(hint: Any) -> list[Any]:
    return [hint, *(part for arg in typing.get_args(hint) for part in _parts(arg))]


def _read_as(hint: Any, reply_hint: Any) -> tuple[type, Any] | None:
    """The record a field is read as and the TypedDict its reply key holds, if it is one."""
    records = [t for t in _parts(hint) if isinstance(t, type) and issubclass(t, Record)]
    wires = [t for t in _parts(reply_hint) if typing.is_typeddict(t)]
    return (records[0], wires[0]) if len(records) == 1 and len(wires) == 1 else None


def what_it_adds(record: type, reply: Any, renamed: Mapping[str, str]) -> list[str]:
    """What a record read from the wire type `reply` adds to it (empty: a twin of the reply,
    which the controller should read as the reply itself): methods, renamed keys, fields with
    options (bytes decoded, set by the controller, not printed), defaults for keys the reply may
    leave out, and nested records that add to theirs."""
    wire_key = {name: key for key, name in renamed.items()}
    hints, wire = typing.get_type_hints(record), typing.get_type_hints(reply)
    added = [f"{key} -> {name}" for key, name in renamed.items()] + [
        f"{name}()"
        for name, value in vars(record).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    ]
    for spec in dataclasses.fields(record):
        key = spec.metadata.get("alias", wire_key.get(spec.name, spec.name))
        options = {k: v for k, v in spec.metadata.items() if k != "alias"}  # a key, not more
        if options or not spec.init or key not in wire:
            added.append(f"{key}: {options or 'not read from the reply'}")
        elif key not in reply.__required_keys__ and spec.default is not dataclasses.MISSING:
            added.append(f"{key}: a default for a key the reply may leave out")
        elif (pair := _read_as(hints[spec.name], wire[key])) and what_it_adds(*pair, {}):
            added.append(f"{key}: {pair[0].__name__}")
    return added


def twins(record: type, reply: Any, renamed: Mapping[str, str]) -> list[str]:
    """The records, `record` and those read inside it, that add nothing to their wire type."""
    found = [] if what_it_adds(record, reply, renamed) else [record.__name__]
    hints, wire = typing.get_type_hints(record), typing.get_type_hints(reply)
    for spec in dataclasses.fields(record):
        key = spec.metadata.get("alias", spec.name)
        if key in wire and (pair := _read_as(hints[spec.name], wire[key])):
            found += twins(*pair, {})
    return found


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_each_reply_is_read_as_itself_or_as_a_record_that_adds_to_it(name: str) -> None:
    """A reply is defined once, by the agent's TypedDict: the controller reads it as that,
    unless its record adds to it (a method, bytes, a field the controller sets, a nested record
    that adds); a record, or a record in one, that only copies its wire type is a twin."""
    descriptor: Operation[Any, Any, Any] = OPERATIONS[name]
    if descriptor.record is not descriptor.reply:
        reply_keys = set(typing.get_type_hints(descriptor.reply))
        as_read = {descriptor.renamed.get(key, key) for key in reply_keys}
        assert as_read == read_keys(descriptor.record), (descriptor.reply, descriptor.record)
        assert twins(descriptor.record, descriptor.reply, descriptor.renamed) == []
    # and the request the agent's function takes is the descriptor's
    hints = typing.get_type_hints(descriptor.function, vars(protocol))
    assert hints["args"] is descriptor.request and hints["return"] is descriptor.reply


def _inspect_without_origin(reply: dict[str, Any]) -> None:
    del reply["resolved"]["origin"]


def _live_answer_without_socket(reply: dict[str, Any]) -> None:
    reply["answers"] = [{"reply": None, "error": "no whole reply"}]


@pytest.mark.parametrize(
    ("operation", "request_", "spoil", "named"),
    [
        (
            "resolve",
            {"module": "json.decoder"},
            lambda reply: reply.update(is_package="no"),
            "ResolveReply.is_package: Input should be a valid boolean, got str",
        ),
        (
            "inspect",
            {"module": "json.decoder", "path": None, "server": None},
            _inspect_without_origin,
            "HostInspection.resolved.origin: missing",
        ),
        (
            "live",
            {
                "fix": {"op": "list"},
                "pid": None,
                "pid_file": None,
                "url": None,
                "env": {},
                "timeout": 5,
            },
            _live_answer_without_socket,
            "LiveEngineReply.answers[0].socket: missing",
        ),
    ],
)
def test_a_reply_read_as_the_agents_own_type_inside_a_record_is_checked_naming_the_field(
    tmp_path: Path,
    operation: str,
    request_: dict[str, Any],
    spoil: Callable[[dict[str, Any]], object],
    named: str,
) -> None:
    """The agent's TypedDict is the one definition of a reply, read as itself or inside the
    record that adds to it (`codec.WIRE`): a reply without a field, or with one of another
    type, is `agent-bad-reply` naming the operation's step and the field."""

    def handler(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal:
        answer = agent_operation(op, args) if op != "live" else _live_reply()
        assert isinstance(answer, dict), answer
        spoil(answer)
        return answer

    ops = HostOperations(ScriptedTransport(handler), scripted_host(tmp_path))
    with pytest.raises(RemoteOperationError) as caught:
        ops.run(OPERATIONS[operation], request_, timeout=5, step=operation)
    assert caught.value.code == "agent-bad-reply" and caught.value.step == operation
    assert named in caught.value.message, caught.value.message


def _live_reply() -> dict[str, Any]:
    return {"server_pid": 1, "folder": "/run", "missing": None, "answers": [], "unread": False}


@pytest.mark.process  # the real agent answers the request, on the local transport
def test_a_diagnose_reply_without_a_field_is_a_bad_reply_naming_it(tmp_path: Path) -> None:
    """The diagnose reply is read through `read_reply` like every other: a module's file
    without its `mtime_ns` is `agent-bad-reply` naming the field, not a KeyError."""

    def handler(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal:
        answer = agent_operation(op, args)
        if op == "diagnose" and isinstance(answer, dict):
            del answer["modules"][0]["file"]["mtime_ns"]
        return answer

    ops = HostOperations(ScriptedTransport(handler), scripted_host(tmp_path))
    request = DiagnoseRequest(modules=("json.decoder",), server=False, log=False, facts=False)
    with pytest.raises(RemoteOperationError) as caught:
        diagnose_host(ops, request, timeout=60)
    assert caught.value.code == "agent-bad-reply" and caught.value.step == "diagnose"
    assert "DiagnosisReply.modules[0].file.mtime_ns: missing" in caught.value.message, (
        caught.value.message
    )
    # the same reply, whole, reads
    whole = diagnose_host(
        HostOperations(ScriptedTransport(agent_operation), scripted_host(tmp_path)),
        request,
        timeout=60,
    )
    module = whole.module("json.decoder")
    assert module.file is not None and module.file.realpath.endswith("decoder.py")
    assert module.file.content == Path(module.file.realpath).read_bytes()


@pytest.mark.parametrize(
    ("reply", "named"),
    [
        (
            {"released": "yes", "reason": "released", "previous": None},
            "UnlockReply.released: Input should be a valid boolean, got str",
        ),
        ({"released": True, "previous": None}, "UnlockReply.reason: missing"),
        (
            {"released": True, "reason": "released", "previous": {"acquired_at": "10"}},
            "UnlockReply.previous.acquired_at: Input should be a number, got str",
        ),
    ],
)
def test_a_reply_read_as_its_wire_type_is_checked_naming_the_field(
    tmp_path: Path, reply: dict[str, Any], named: str
) -> None:
    """An operation whose reply the controller reads as the agent's own TypedDict (no record of
    its own) is still checked at the boundary, through pydantic: `agent-bad-reply` naming the
    field, a string no bool or number (scalars are read strictly)."""
    ops = HostOperations(ScriptedTransport(lambda op, args: reply), scripted_host(tmp_path))
    with pytest.raises(RemoteOperationError) as caught:
        ops.unlock(run_id="run-1", timeout=5)
    assert caught.value.code == "agent-bad-reply" and caught.value.step == "unlock"
    assert named in caught.value.message, caught.value.message


def test_a_reply_read_as_its_wire_type_keeps_what_was_written(tmp_path: Path) -> None:
    """The value is the reply as the agent wrote it: a whole number of seconds stays an int,
    a key the wire type does not name is dropped (a newer agent's addition)."""
    answer = {"released": True, "reason": "released", "newer": 1}
    previous = {"owner": "ops", "run_id": "run-0", "acquired_at": 10, "expires_at": 12.5}
    ops = HostOperations(
        ScriptedTransport(lambda op, args: {**answer, "previous": previous}),
        scripted_host(tmp_path),
    )
    result = ops.unlock(run_id="run-1", timeout=5)
    assert result == {"released": True, "reason": "released", "previous": previous}
    assert type(cast(dict[str, Any], result["previous"])["acquired_at"]) is int


@pytest.mark.parametrize("serves", [True, False])
def test_an_inspection_looks_for_a_running_server_only_where_one_serves(
    tmp_path: Path, serves: bool
) -> None:
    """The look for a running engine reads the host's whole socket table (issue 44: tens of
    milliseconds on a busy host), so a host whose files no server runs (`apply --file`) asks
    the agent for none; an engine's host still names its URL."""
    asked: list[dict[str, Any]] = []

    def agent(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal:
        asked.append(args)
        return agent_operation(op, args)

    host = scripted_host(tmp_path)
    host = dataclasses.replace(host, engine=dataclasses.replace(host.engine, serves=serves))
    target = tmp_path / "mod.py"
    target.write_text("x = 1\n", encoding="utf-8")
    inspection = HostOperations(ScriptedTransport(agent), host).inspect(
        None, path=str(target), timeout=5
    )
    assert inspection.file.content == b"x = 1\n"
    hint = asked[-1]["server"]
    assert (hint is not None) == serves, hint
    if serves:
        assert hint["url"] == host.engine.url
    assert not local_file_host(sys.executable, tmp_path, target).engine.serves  # apply --file
