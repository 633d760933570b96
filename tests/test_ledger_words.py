"""The ledger's words are types: what it is given is refused at write time when it is not one of
its words (or values), naming the field, and every word a real ledger holds reads back as one.

A run's `command` is a `Command`, its outcome a `RunOutcome`, an event's kind an `EventKind`, a
step's name a `Step`, a file version's action a `FileAction`; a host outcome's `file` is a
`FileChange` and a host's facts a `HostFacts` (or, as earlier ledgers hold them, an object whose
keys `HostFacts` names carry its types).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from opspatch.core.filechange import FileChange, SetFile
from opspatch.core.hostfacts import HostFacts
from opspatch.core.vocabulary import (
    Command,
    EventKind,
    FileAction,
    Outcome,
    RunOutcome,
    Step,
    StepStatus,
)
from opspatch.ledger import Ledger, NewFileVersion
from opspatch.ledger.chain import ROW_COLUMNS, EventRow
from tests.ledgerkit import begin
from tests.scriptedkit import Fleet, fleet  # noqa: F401 (the fixture, used by name)

pytestmark = pytest.mark.pure

DATA = Path(__file__).parent / "data"
FACTS = HostFacts(
    python_version="3.11.9",
    python_executable="/usr/bin/python3",
    python_implementation="CPython",
    hostname="gpu7",
    platform="Linux-6.8",
    machine="x86_64",
    sglang_version="0.5.23",
    gpu_names=("H200",),
    machine_id="a" * 32,
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    with Ledger.open(tmp_path / "ledger.sqlite3") as opened:
        yield opened


def rows(path: Path) -> list[EventRow]:
    conn = sqlite3.connect(str(path))
    try:
        return [EventRow(*r) for r in conn.execute(f"SELECT {ROW_COLUMNS} FROM events ORDER BY id")]
    finally:
        conn.close()


def words_of(events: list[EventRow]) -> dict[str, set[str]]:
    """Every word the events hold, by what it names (as stored: plain strings)."""
    found: dict[str, set[str]] = {
        "kind": set(),
        "command": set(),
        "run_outcome": set(),
        "step": set(),
        "status": set(),
        "action": set(),
        "outcome": set(),
    }
    for row in events:
        found["kind"].add(row.kind)
        data = row.data
        if row.kind == "run-started":
            found["command"].add(data["command"])
        elif row.kind == "run-finished":
            found["run_outcome"].add(data["outcome"])
        elif row.kind == "step":
            found["step"].add(data["step"])
            found["status"].add(data["status"])
        elif row.kind == "file-version":
            found["action"].add(data["action"])
        elif row.kind == "host-outcome":
            found["outcome"].add(data["outcome"])
    return found


def assert_every_word_parses(events: list[EventRow]) -> dict[str, set[str]]:
    words = words_of(events)
    for vocabulary, key in [
        (EventKind, "kind"),
        (Command, "command"),
        (RunOutcome, "run_outcome"),
        (Step, "step"),
        (StepStatus, "status"),
        (FileAction, "action"),
        (Outcome, "outcome"),
    ]:
        for word in words[key]:
            assert vocabulary(word).value == word, (key, word)
    return words


# ---------------------------------------------------------------------------------------------
# refused at write time, naming the field; nothing is written


@pytest.mark.parametrize("outcome", ["succeeded", "applied", "OK", ""])
def test_a_run_outcome_that_is_not_a_run_outcome_is_refused_at_finish(
    ledger: Ledger, outcome: str
) -> None:
    run_id = begin(ledger)
    with pytest.raises(ValueError, match=r"^outcome must be one of ok, failed, refused"):
        ledger.finish_run(run_id, outcome)  # type: ignore[arg-type]
    assert ledger.verify().events_checked == 1
    ledger.finish_run(run_id, RunOutcome.NEEDS_ATTENTION)
    (summary,) = ledger.list_runs()
    assert summary.outcome is RunOutcome.NEEDS_ATTENTION


def test_a_file_that_is_not_a_file_change_is_refused_at_write(ledger: Ledger) -> None:
    run_id = begin(ledger)
    as_dict = {"path": "/srv/x.py", "sha256_before": "a" * 64, "sha256_after": "b" * 64}
    with pytest.raises(ValueError, match="^file must be a FileChange, got dict"):
        ledger.record_host_outcome(run_id, "gpu-01", Outcome.APPLIED, file=as_dict)  # type: ignore[arg-type]
    assert ledger.verify().events_checked == 1


@pytest.mark.parametrize(
    ("facts", "named"),
    [
        (
            {"machine_id": 7, "hostname": "gpu7"},
            "facts.machine_id: Input should be a valid string, got int",
        ),
        ({"hostname": None}, "facts.hostname: Input should be a valid string, got NoneType"),
        ({"gpu_names": "H200"}, "facts.gpu_names: Input should be a valid tuple, got str"),
        (
            {"cuda_available": "yes"},
            "facts.cuda_available: Input should be a valid boolean, got str",
        ),
    ],
)
def test_facts_whose_known_keys_have_the_wrong_type_are_refused_naming_the_key(
    ledger: Ledger, facts: dict[str, Any], named: str
) -> None:
    run_id = begin(ledger)
    with pytest.raises(ValueError, match=f"^{named}$"):
        ledger.record_facts(run_id, "gpu-01", facts)
    assert ledger.verify().events_checked == 1


def test_host_facts_are_recorded_as_their_json(ledger: Ledger) -> None:
    run_id = begin(ledger)
    ledger.record_facts(run_id, "gpu-01", FACTS)
    ledger.record_facts(run_id, "gpu-02", {"python": "3.11.9", "note": "an earlier shape"})
    detail = ledger.get_run(run_id)
    assert detail.host("gpu-01").facts == FACTS.to_json()
    assert HostFacts.from_json(detail.host("gpu-01").facts or {}) == FACTS
    assert detail.host("gpu-02").facts == {"python": "3.11.9", "note": "an earlier shape"}


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ("step", "step"),
        ("command", "command"),
        ("action", "action"),
    ],
)
def test_a_word_outside_its_vocabulary_is_refused_naming_the_field(
    ledger: Ledger, call: str, field: str
) -> None:
    run_id = begin(ledger)
    with pytest.raises(ValueError, match=f"^{field} must be one of "):
        if call == "step":
            ledger.record_step(run_id, "gpu-01", "deploy", StepStatus.OK)  # type: ignore[arg-type]
        elif call == "command":
            begin(ledger, command="deploy")
        else:
            ledger.record_file_version(
                run_id,
                "gpu-01",
                NewFileVersion(
                    path="/srv/x.py",
                    sha256_before=sha(b"old"),
                    sha256_after=sha(b"new"),
                    mode=0o644,
                    owner="root:root",
                    pre_image=b"old",
                    action="undo",
                ),  # type: ignore[arg-type]
            )
    assert ledger.verify().events_checked == 1


# ---------------------------------------------------------------------------------------------
# read back as types


def test_a_patch_sets_file_reads_back_as_the_file_change_and_prints_as_stored(
    ledger: Ledger, tmp_path: Path
) -> None:
    files = (
        SetFile("/srv/a.py", sha(b"a0"), sha(b"a1"), sha(b"a1")),
        SetFile("/srv/b.py", sha(b"b0"), sha(b"b1"), sha(b"b0")),
    )
    change = FileChange("/srv/a.py", sha(b"a0"), sha(b"a1"), set_files=files)
    run_id = begin(ledger)
    ledger.record_host_outcome(run_id, "gpu-01", Outcome.NEEDS_ATTENTION, "partly", file=change)
    ledger.finish_run(run_id, RunOutcome.NEEDS_ATTENTION)
    record = ledger.get_run(run_id).host("gpu-01")
    assert record.file == change
    assert record.file is not None and str(record.file.set_state) == "partly-applied"
    stored = json.loads(
        next(r for r in rows(tmp_path / "ledger.sqlite3") if r.kind == "host-outcome").body
    )["file"]
    printed = record.to_json()["file"]
    assert json.dumps(printed) == json.dumps(stored)  # the same keys, in the same order
    assert list(printed) == ["path", "set", "sha256_after", "sha256_before"]
    (_, outcome, said), *_ = ledger.outcomes_since(["gpu-01"], 0)
    assert outcome is Outcome.NEEDS_ATTENTION and said == change


def test_every_word_of_the_golden_ledger_parses(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    conn = sqlite3.connect(str(path))
    conn.executescript((DATA / "ledger_v1.sql").read_text(encoding="utf-8"))
    conn.close()
    words = assert_every_word_parses(rows(path))
    assert words["action"] == {"patch", "restore"}
    with Ledger.open(path) as ledger:
        for summary in ledger.list_runs():
            assert isinstance(summary.command, Command)
            assert isinstance(summary.outcome, RunOutcome)
            detail = ledger.get_run(summary.run_id)
            for host in detail.hosts:
                assert all(isinstance(s.step, Step) for s in host.steps)
                assert all(isinstance(v.action, FileAction) for v in host.file_versions)
                assert host.file is None or isinstance(host.file, FileChange)


@pytest.mark.scripted
def test_every_word_a_real_run_records_parses(fleet: Fleet, tmp_path: Path) -> None:  # noqa: F811
    """An apply halted by a failed smoke and rolled back (on_halt = rollback-run), a rollback
    of the rest and a recover: a ledger written by the runs themselves."""
    from opspatch.core.policy import BatchSize, Playbook
    from opspatch.runs.commands.rollback import rollback_hosts

    fleet.hosts[2].smoke_ok = False
    halting = Playbook(
        canary=0, batch=BatchSize(count=1), max_in_flight=1, max_failures=1, on_halt="stop"
    )
    fleet.apply(halting)
    rollback_hosts(
        ledger=fleet.ledger,
        hosts=[h.host() for h in fleet.hosts],
        factory=fleet.factory,
        playbook=Playbook(max_in_flight=1),
        patch=fleet.patch,
    )
    fleet.hosts[1].smoke_ok = False
    fleet.apply(
        Playbook(canary=0, batch=BatchSize(count=10), max_failures=1, on_halt="rollback-run")
    )
    fleet.recover(*fleet.hosts)
    words = assert_every_word_parses(rows(Path(fleet.ledger.path)))
    assert {"apply", "rollback", "recover"} <= words["command"]
    assert {"begin", "swap", "restart", "ready", "smoke", "restore"} <= words["step"]
    assert words["action"] == {"patch", "restore"}
    assert set(words["kind"]) == {k.value for k in EventKind}
    for summary in fleet.ledger.list_runs():
        detail = fleet.ledger.get_run(summary.run_id)
        assert isinstance(detail.summary.outcome, RunOutcome)
        for host in detail.hosts:
            assert host.file is None or isinstance(host.file, FileChange)
            if host.facts is not None:
                HostFacts.from_json(host.facts)  # a run records its HostFacts
