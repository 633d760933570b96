"""The agent operations as the controller knows them: one `Operation` descriptor each (its
request and reply TypedDicts, the record its reply is read as, the agent's function), and every
reply read through `read_reply`, so a reply without a field is `agent-bad-reply` naming it."""

from __future__ import annotations

import importlib
import typing
from pathlib import Path
from typing import Any

import pytest

from opspatch.core.jsonrecord import read_keys
from opspatch.errors import RemoteOperationError
from opspatch.hosts import diagnosis, engine, live, liveinstall
from opspatch.hosts.agent import protocol
from opspatch.hosts.channel import agent_modules
from opspatch.hosts.diagnosis import DiagnoseRequest, diagnose_host
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.results import OPERATIONS, Operation
from opspatch.hosts.transport.scripted import Refusal, ScriptedTransport, agent_operation
from tests.test_scripted_transport import scripted_host

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


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_each_reply_type_has_its_records_fields_as_keys(name: str) -> None:
    descriptor: Operation[Any, Any, Any] = OPERATIONS[name]
    reply_keys = set(typing.get_type_hints(descriptor.reply))
    as_read = {descriptor.renamed.get(key, key) for key in reply_keys}
    assert as_read == set(read_keys(descriptor.record)), (descriptor.reply, descriptor.record)
    # and the request the agent's function takes is the descriptor's
    hints = typing.get_type_hints(descriptor.function, vars(protocol))
    assert hints["args"] is descriptor.request and hints["return"] is descriptor.reply


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
    assert "RemoteFile.mtime_ns: missing" in caught.value.message, caught.value.message
    # the same reply, whole, reads
    whole = diagnose_host(
        HostOperations(ScriptedTransport(agent_operation), scripted_host(tmp_path)),
        request,
        timeout=60,
    )
    module = whole.module("json.decoder")
    assert module.file is not None and module.file.realpath.endswith("decoder.py")
    assert module.file.content == Path(module.file.realpath).read_bytes()
