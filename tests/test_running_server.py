"""What code a running server runs, from the ledger (`runs.judgments.running`), as a table: a
server is stale when the code it runs differs from its file's bytes, not merely when it started
before the file last changed. A live revert (or take) since its start changes what it runs; a
swap with no restart and no live step does not; the ledger's last recorded engine start orders
the file's versions before the server whatever the two clocks say.

Pure."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from opspatch.core.vocabulary import FileAction, Step, StepStatus
from opspatch.hosts.results import RemoteFile, ServerProcess
from opspatch.ledger.store import FileVersion, StepRecord
from opspatch.runs.judgments.running import epoch, live_changes, running_sha256, stale

pytestmark = pytest.mark.pure

PRE, POST = "a" * 64, "b" * 64
T0 = 1_800_000_000.0
STARTED = T0 + 100
"""When the server started (the host's clock); every file below last changed at T0 + 1000."""


def stamp(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def version(event_id: int, run: str, before: str, after: str, at: float) -> FileVersion:
    action = FileAction.PATCH if after == POST else FileAction.RESTORE
    return FileVersion(
        event_id, run, "p", "h1", "/f.py", action, before, after, 0o644, "root:root", 1, before,
        after, stamp(at),
    )  # fmt: skip


def step(event_id: int, run: str, name: Step, at: float, ok: bool = True) -> tuple[str, StepRecord]:
    status = StepStatus.OK if ok else StepStatus.FAILED
    return run, StepRecord(event_id, name, status, 0.1, "", stamp(at))


def file(sha256: str, changed: float = T0 + 1000) -> RemoteFile:
    return RemoteFile("/f.py", "/f.py", None, b"", sha256, 1, 0o644, 0, 0, "root", "root",
                      int(changed * 1e9), 1)  # fmt: skip


# One row per case: the file's history, the host's steps, the file now, the server: stale?
APPLIED = [version(2, "A", PRE, POST, T0 + 50)]
RESTARTED = [step(1, "A", Step.LIVE, T0 + 40), step(3, "A", Step.SWAP, T0 + 51)]
RESTARTED += [step(4, "A", Step.RESTART, T0 + 60)]
PUT_BACK = [version(10, "R", POST, PRE, T0 + 999)]
TAKEN = [step(3, "A", Step.SWAP, T0 + 501), step(4, "A", Step.LIVE, T0 + 502)]
LIVE_APPLIED = [version(2, "A", PRE, POST, T0 + 500)]
CHECKED = [step(1, "A", Step.LIVE, T0 + 499)]  # apply --live's preflight `check`
LISTED = [step(9, "R", Step.LIVE, T0 + 990)]  # rollback's `list`

ROWS = [
    ("no server", [], [], file(PRE), None, False),
    ("start unknown", [], [], file(PRE), ServerProcess(1, None), False),
    ("started after the last write", APPLIED + PUT_BACK, RESTARTED, file(PRE), T0 + 2000, False),
    # a swap with no restart and no live step since: the server runs what the file held
    ("rollback killed after its swap", APPLIED + PUT_BACK, RESTARTED, file(PRE), STARTED, True),
    (
        "rollback killed after its swap, the host's clock behind (start before the apply's "
        "record, after its recorded restart)",
        APPLIED + PUT_BACK,
        RESTARTED,
        file(PRE),
        T0 + 30,
        True,
    ),
    (
        "rollback --restart never, not live (its `list` is no change)",
        APPLIED + PUT_BACK,
        RESTARTED + LISTED,
        file(PRE),
        STARTED,
        True,
    ),
    ("nothing recorded: as before, its start says", [], [], file(PRE), STARTED, True),
    # live steps since the start change what it runs
    ("live apply", LIVE_APPLIED, CHECKED + TAKEN, file(POST), STARTED, False),
    (
        "live apply, then live rollback with no restart",
        LIVE_APPLIED + PUT_BACK,
        CHECKED + TAKEN + LISTED + [step(11, "R", Step.LIVE_REVERT, T0 + 995)],
        file(PRE),
        STARTED,
        False,
    ),
    (
        "live apply, then a rollback whose revert failed: the fix still held",
        LIVE_APPLIED + PUT_BACK,
        CHECKED + TAKEN + LISTED + [step(11, "R", Step.LIVE_REVERT, T0 + 995, ok=False)],
        file(PRE),
        STARTED,
        True,
    ),
    (
        "live apply on a unit, then live rollback with no restart, its revert read back",
        LIVE_APPLIED + PUT_BACK,
        CHECKED
        + TAKEN
        + LISTED
        + [step(11, "R", Step.LIVE_REVERT, T0 + 995), step(12, "R", Step.LIVE_READBACK, T0 + 996)],
        file(PRE),
        STARTED,
        False,
    ),
    (
        "live apply on a unit, then a rollback whose revert answered ok but a node still lists "
        "the fix (its read-back failed): the fix still held",
        LIVE_APPLIED + PUT_BACK,
        CHECKED
        + TAKEN
        + LISTED
        + [step(11, "R", Step.LIVE_REVERT, T0 + 995)]
        + [step(12, "R", Step.LIVE_READBACK, T0 + 996, ok=False)],
        file(PRE),
        STARTED,
        True,
    ),
    (
        "live apply on a unit whose take's read-back failed, reverted, read back and restored",
        LIVE_APPLIED + [version(8, "A", POST, PRE, T0 + 700)],
        CHECKED
        + TAKEN
        + [step(5, "A", Step.LIVE_READBACK, T0 + 503, ok=False)]
        + [step(6, "A", Step.LIVE_REVERT, T0 + 504), step(7, "A", Step.LIVE_READBACK, T0 + 505)],
        file(PRE),
        STARTED,
        False,
    ),
    (
        "live apply whose take failed, reverted and restored",
        LIVE_APPLIED + [version(7, "A", POST, PRE, T0 + 700)],
        CHECKED
        + [step(3, "A", Step.SWAP, T0 + 501), step(4, "A", Step.LIVE, T0 + 502, ok=False)]
        + [step(5, "A", Step.LIVE_REVERT, T0 + 503)],
        file(PRE),
        STARTED,
        False,
    ),
    (
        "live apply interrupted before its take: its check took nothing",
        LIVE_APPLIED,
        CHECKED + [step(3, "A", Step.SWAP, T0 + 501)],
        file(POST),
        STARTED,
        True,
    ),
    (
        "a take by a run whose file versions are not recorded",
        [],
        TAKEN,
        file(POST),
        STARTED,
        True,
    ),
    (
        "a live take before the last recorded restart runs nowhere now",
        LIVE_APPLIED + PUT_BACK,
        CHECKED
        + TAKEN
        + [step(6, "B", Step.RESTART, T0 + 600)]
        + [step(11, "R", Step.LIVE_REVERT, T0 + 90)],  # before the start: in another process
        file(PRE),
        T0 + 605,
        True,
    ),
]


@pytest.mark.parametrize(
    ("history", "steps", "now", "started", "expected"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_a_server_is_stale_when_it_runs_other_bytes_than_its_file(
    history: list[FileVersion],
    steps: list[tuple[str, StepRecord]],
    now: RemoteFile,
    started: float | ServerProcess | None,
    expected: bool,
) -> None:
    server = ServerProcess(4242, started) if isinstance(started, float) else started
    assert stale(server, now, history, steps) is expected


def test_what_it_runs_is_named_by_bytes() -> None:
    assert running_sha256(STARTED, APPLIED + PUT_BACK, RESTARTED) == POST
    steps = CHECKED + TAKEN + [step(11, "R", Step.LIVE_REVERT, T0 + 995)]
    assert running_sha256(STARTED, LIVE_APPLIED + PUT_BACK, steps) == PRE
    assert running_sha256(STARTED, LIVE_APPLIED, CHECKED) == PRE  # its pre-image at the start
    assert running_sha256(STARTED, [], []) is None


def test_only_takes_after_their_runs_swap_and_reverts_are_live_changes() -> None:
    started = [("A", StepRecord(8, Step.LIVE_REVERT, StepStatus.STARTED, None, "", stamp(T0)))]
    found = live_changes(CHECKED + TAKEN + LISTED + started + RESTARTED[1:])
    assert [(c.run_id, c.step, c.event_id) for c in found] == [("A", Step.LIVE, 4)]
    assert found[0].at == epoch(stamp(T0 + 502)) == T0 + 502
