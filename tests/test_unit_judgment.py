"""Whether a unit's nodes agree before a patch touches any (pure): the same release, the same
pre-image of every target file; else the odd node and what differs, as values."""

from __future__ import annotations

import pytest

from opspatch.core.host import Unit
from opspatch.hosts.agent.protocol import ResolveReply
from opspatch.hosts.results import HostFacts, HostInspection, RemoteFile
from opspatch.runs.judgments.units import (
    Difference,
    NodeReading,
    NotUniform,
    Uniform,
    UnitFact,
    judge_unit,
)

pytestmark = pytest.mark.pure

UNIT = Unit("kimi-a", ("n0", "n1"))
TRIO = Unit("kimi-b", ("m0", "m1", "m2"))
EAGLE = "sglang.srt.speculative.eagle_worker_v2"
SCHED = "sglang.srt.managers.scheduler"


def node(host: str, release: str | None = "0.5.23", eagle: str = "aa") -> NodeReading:
    return NodeReading(host, release, {EAGLE: eagle, SCHED: "bb"})


def test_nodes_that_agree_make_a_uniform_unit() -> None:
    judged = judge_unit(UNIT, {"n0": node("n0"), "n1": node("n1")})
    assert judged == Uniform("kimi-a", "0.5.23", {EAGLE: "aa", SCHED: "bb"})
    assert judged.describe() == "unit kimi-a is uniform (release 0.5.23)"


def test_a_node_on_another_release_is_named_with_both_values() -> None:
    judged = judge_unit(UNIT, {"n0": node("n0"), "n1": node("n1", "0.5.24")})
    assert isinstance(judged, NotUniform)
    # two nodes: the head's value is the reference, so the other node is the odd one
    assert judged.differences == (
        Difference("n1", UnitFact.RELEASE, "release", "0.5.24", "0.5.23", ("n0",)),
    )
    assert judged.odd_nodes == ("n1",)
    assert judged.describe() == (
        "unit kimi-a is not uniform:\n  n1: release 0.5.24, the others (n0) 0.5.23"
    )


def test_the_majority_is_the_reference_even_against_the_head() -> None:
    odd_head = node("m0", eagle="ff")
    judged = judge_unit(TRIO, {"m0": odd_head, "m1": node("m1"), "m2": node("m2")})
    assert isinstance(judged, NotUniform)
    assert judged.differences == (
        Difference("m0", UnitFact.PRE_IMAGE, EAGLE, "ff", "aa", ("m1", "m2")),
    )
    assert judged.differences[0].describe() == (
        f"m0: {EAGLE} pre-image sha256 ff, the others (m1, m2) aa"
    )


def test_every_difference_of_every_node_is_named() -> None:
    odd = NodeReading("m2", "0.5.24", {EAGLE: "aa", SCHED: None})  # no such file on m2
    judged = judge_unit(TRIO, {"m0": node("m0"), "m1": node("m1"), "m2": odd})
    assert isinstance(judged, NotUniform)
    assert [(d.node, d.fact, d.key, d.value) for d in judged.differences] == [
        ("m2", UnitFact.RELEASE, "release", "0.5.24"),
        ("m2", UnitFact.PRE_IMAGE, SCHED, None),
    ]
    assert "(none)" in judged.differences[1].describe()


def test_a_target_only_some_nodes_hold_is_a_difference() -> None:
    extra = NodeReading("n1", "0.5.23", {EAGLE: "aa", SCHED: "bb", "sglang.x": "cc"})
    judged = judge_unit(UNIT, {"n0": node("n0"), "n1": extra})
    assert isinstance(judged, NotUniform)
    assert judged.differences == (
        Difference("n1", UnitFact.PRE_IMAGE, "sglang.x", "cc", None, ("n0",)),
    )


def test_a_node_not_inspected_makes_the_unit_not_uniform() -> None:
    judged = judge_unit(TRIO, {"m0": node("m0"), "m2": node("m2")})
    assert isinstance(judged, NotUniform)
    assert judged.odd_nodes == ("m1",)
    assert judged.differences[0].fact is UnitFact.UNREAD
    assert judged.differences[0].describe() == "m1: not inspected"
    assert isinstance(judge_unit(UNIT, {}), NotUniform)


def inspection(release: str | None, sha256: str, distribution: str | None = None) -> HostInspection:
    facts = HostFacts(
        python_version="3.11",
        python_executable="/venv/bin/python",
        python_implementation="CPython",
        hostname="h",
        platform="linux",
        machine="x86_64",
        sglang_version=release,
    )
    module: ResolveReply = {
        "module": EAGLE,
        "origin": "/v/eagle.py",
        "realpath": "/v/eagle.py",
        "is_symlink": False,
        "is_package": False,
        "distribution": "sglang",
        "distribution_version": distribution,
        "record_sha256": None,
    }
    file = RemoteFile(
        path="/v/eagle.py",
        realpath="/v/eagle.py",
        symlink_target=None,
        content=b"x",
        sha256=sha256,
        size=1,
        mode=0o644,
        uid=0,
        gid=0,
        owner=None,
        group=None,
        mtime_ns=0,
        nlink=1,
    )
    return HostInspection(facts=facts, module=module, file=file)


def test_a_reading_comes_from_the_nodes_inspections() -> None:
    reading = NodeReading.read("n0", {EAGLE: inspection("0.5.23", "aa")})
    assert reading == NodeReading("n0", "0.5.23", {EAGLE: "aa"})
    # without the facts' version, the target's distribution says the release
    assert NodeReading.read("n1", {EAGLE: inspection(None, "ab", "0.5.23")}).release == "0.5.23"
