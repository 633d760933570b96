"""The one JSON codec (`opspatch.core.codec.Record`, pydantic) on the records outside the ledger: a host
record survives a round trip, its rules (a key left out while None, a field never written, a
value encoded) hold, and an agent reply that does not have a record's shape is refused at the
boundary with the error every caller of an agent operation handles."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from opspatch.core.codec import NOT_WRITTEN, Record, json_field
from opspatch.core.policy import Playbook
from opspatch.core.vocabulary import Outcome, StepStatus
from opspatch.errors import RemoteOperationError
from opspatch.hosts.engine import EngineControl, PromptResult, SmokeResult
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.results import HostFacts
from opspatch.hosts.transport.scripted import Refusal, ScriptedTransport, agent_operation
from opspatch.runs.report import HostOutcome, StepResult
from tests.scriptedkit import scripted_host

pytestmark = pytest.mark.scripted

FACTS: dict[str, Any] = {
    "python_version": "3.10.12",
    "python_executable": "/opt/sglang/venv/bin/python",
    "python_implementation": "CPython",
    "hostname": "gpu-01",
    "platform": "Linux",
    "machine": "x86_64",
    "sglang_version": "0.5.23",
    "torch_version": None,
    "cuda_available": True,
    "cuda_version": "12.4",
    "cuda_device_count": 2,
    "gpu_names": ["NVIDIA H200", "NVIDIA H200"],
    "notes": ["torch not imported"],
    "driver_version": "550.54",
    "gpu_memory_mib": [143771, 143771],
    "machine_id": "0123456789abcdef0123456789abcdef",
}


def test_host_facts_round_trip_through_json_text() -> None:
    facts = HostFacts.from_json(FACTS)
    assert facts.gpu_names == ("NVIDIA H200", "NVIDIA H200")  # arrays read back as tuples
    text = json.dumps(facts.to_json())
    assert json.loads(text) == FACTS  # every key, in the agent's order
    assert list(json.loads(text)) == list(FACTS)
    assert HostFacts.from_json(json.loads(text)) == facts


def test_a_smoke_result_round_trips_and_leaves_out_what_only_the_controller_needs() -> None:
    smoke = SmokeResult(
        ok=False,
        failures=("prompt 1: the server crashed",),
        prompts=(PromptResult("p", False, None, None, None, "the server crashed"),),
        exceptions=({"type": "ValueError", "count": 2},),
        log_tail="Traceback ...",
        lock_released=True,
    )
    document = json.loads(json.dumps(smoke.to_json()))
    assert list(document) == ["ok", "failures", "log_hits", "prompts", "exceptions", "log_tail"]
    assert "lock_released" not in document
    again = SmokeResult.from_json(document)
    assert again.prompts == smoke.prompts and again.exceptions == smoke.exceptions
    assert again.lock_released is False  # not written, so read as its default
    assert again == SmokeResult(**{**smoke.__dict__, "lock_released": False})


def test_a_host_outcome_omits_diff_and_smoke_while_none_and_rounds_seconds() -> None:
    step = StepResult("swap", StepStatus.OK, 0.123456, "done")
    bare = HostOutcome("h1", Outcome.APPLIED, steps=(step,)).to_json()
    assert list(bare) == ["host", "outcome", "error", "note", "file", "steps"]
    assert bare["steps"][0]["seconds"] == 0.123
    assert bare["outcome"] == "applied" and bare["steps"][0]["status"] == "ok"
    with_diff = HostOutcome("h1", Outcome.WOULD_APPLY, diff="--- a\n").to_json()
    assert list(with_diff)[-1] == "diff"


@dataclass(frozen=True)
class Part(Record):
    a: int
    b: float = 0


@dataclass(frozen=True)
class Sample(Record):
    name: str
    when: float = json_field(encode=lambda value: round(value, 1))
    gone: str | None = json_field(default=None, omit_none=True)
    wire: int = json_field(key="on_the_wire", default=0)
    part: Part = json_field(inline=True, default=Part(1))
    doubled: str = field(init=False)
    sent: bytes = json_field(default=b"", decode=str.encode, written=False)
    blob: bytes = field(default=b"", metadata=NOT_WRITTEN)

    def __post_init__(self) -> None:
        object.__setattr__(self, "doubled", self.name * 2)


def test_the_rules_on_a_record_of_their_own() -> None:
    sample = Sample("a", 1.26, blob=b"\x00")
    assert sample.to_json() == {
        "name": "a",
        "when": 1.3,
        "on_the_wire": 0,
        "a": 1,
        "b": 0,
        "doubled": "aa",
    }
    assert list(sample.to_json())[-1] == "doubled"  # derived, written in its place
    assert Sample("a", 1.0, "here", 2).to_json()["gone"] == "here"
    again = Sample.from_json({"name": "a", "when": 1, "on_the_wire": 3, "a": 4, "sent": "xy"})
    assert again == Sample("a", 1, wire=3, part=Part(4), sent=b"xy")
    assert isinstance(again.when, int)  # a number stays as written
    with pytest.raises(ValueError, match=r"Sample\.on_the_wire: Input should be a valid integer"):
        Sample.from_json({"name": "a", "when": 1.0, "on_the_wire": "2"})


@dataclass(frozen=True)
class Reshaped(Record):
    n: int

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "twice": 2 * self.n}


@dataclass(frozen=True)
class Holder(Record):
    inside: Reshaped
    many: tuple[Reshaped, ...] = ()


def test_a_record_written_by_hand_is_written_by_hand_where_it_is_nested() -> None:
    assert Reshaped(1).to_json() == {"n": 1, "twice": 2}
    assert Holder(Reshaped(1), (Reshaped(2),)).to_json() == {
        "inside": {"n": 1, "twice": 2},
        "many": [{"n": 2, "twice": 4}],
    }


# -- replies at the boundary ----------------------------------------------------------------


def test_facts_an_agent_leaves_out_read_as_unknown(tmp_path: Path) -> None:
    sparse = {k: v for k, v in FACTS.items() if not k.startswith(("cuda", "gpu", "driver"))}
    transport = ScriptedTransport(lambda op, args: sparse)
    facts = HostOperations(transport, scripted_host(tmp_path)).facts(timeout=5)
    assert facts.cuda_available is None and facts.gpu_names == () and facts.driver_version is None
    assert facts.hostname == "gpu-01"


@pytest.mark.parametrize(
    ("reply", "named"),
    [
        (
            {k: v for k, v in FACTS.items() if k != "python_version"},
            "HostFacts.python_version: missing",
        ),
        (
            {**FACTS, "cuda_device_count": "two"},
            "HostFacts.cuda_device_count: Input should be a valid integer, got str",
        ),
        (
            {**FACTS, "gpu_names": "NVIDIA H200"},
            "HostFacts.gpu_names: Input should be a valid tuple, got str",
        ),
    ],
)
def test_a_malformed_facts_reply_is_a_remote_error_naming_the_field(
    tmp_path: Path, reply: dict[str, Any], named: str
) -> None:
    transport = ScriptedTransport(lambda op, args: reply)
    with pytest.raises(RemoteOperationError) as caught:
        HostOperations(transport, scripted_host(tmp_path)).facts(timeout=5)
    assert caught.value.code == "agent-bad-reply"
    assert caught.value.host == "h1" and caught.value.step == "facts"
    assert named in caught.value.message, caught.value.message


def test_a_malformed_smoke_reply_is_a_remote_error_naming_the_prompt_field(tmp_path: Path) -> None:
    def handler(op: str, args: dict[str, Any]) -> dict[str, Any] | Refusal:
        if op == "smoke":
            return {"ok": True, "results": [{"prompt": "p", "ok": "yes"}], "failures": []}
        return agent_operation(op, args)

    target = scripted_host(tmp_path)
    ctl = EngineControl(HostOperations(ScriptedTransport(handler), target), target, Playbook())
    with pytest.raises(RemoteOperationError) as caught:
        ctl.smoke(log_offset=None)
    assert caught.value.code == "agent-bad-reply" and caught.value.step == "smoke"
    assert (
        "SmokeResult.prompts[0].ok: Input should be a valid boolean, got str"
        in caught.value.message
    )


def test_a_smoke_reply_says_whether_it_gave_the_lock_back(tmp_path: Path) -> None:
    released = {"released": True, "reason": "released", "previous": None}

    def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "results": [], "failures": [], "released": released}

    target = scripted_host(tmp_path)
    ctl = EngineControl(HostOperations(ScriptedTransport(handler), target), target, Playbook())
    assert ctl.smoke(log_offset=None, release_lock="run-1").lock_released is True
