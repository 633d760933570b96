"""Reason codes (issue 43 item 6): every code is made somewhere and reaches the JSON and the
ledger; an error's type becomes its code in one place; apply's refusal clauses come from the
hosts' refusal values."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opspatch.core.reasons import BECOME_REFUSALS, CONTAINER_REFUSALS, Reason
from opspatch.core.vocabulary import Outcome, SyncAction
from opspatch.errors import (
    AnchorError,
    BecomeError,
    ContainerError,
    HostKeyError,
    LeaseHeld,
    LiveRefused,
    LockHeld,
    NotTakenLive,
    OpspatchError,
    PeerNotAllowed,
    RemoteOperationError,
    TargetError,
    TransportError,
)
from opspatch.ledger import Ledger
from opspatch.ledger.records import LeaseHolder
from opspatch.runs.commands.apply import Refusal, refused_because
from opspatch.runs.commands.sync import _LEFT_BECAUSE
from opspatch.runs.fleet.session import refusal_reason
from opspatch.runs.report import HostOutcome
from tests.ledgerkit import begin

pytestmark = pytest.mark.pure

PACKAGE = Path(__file__).resolve().parent.parent / "opspatch"


def test_every_reason_is_made_by_the_code() -> None:
    """A code no code path sets is a word no script can ever read: each is named outside its
    own definition."""
    source = "\n".join(
        path.read_text()
        for path in PACKAGE.rglob("*.py")
        if path != PACKAGE / "core" / "reasons.py"
    )
    made = set(re.findall(r"\bReason\.([A-Z_]+)\b", source))
    assert {r.name for r in Reason} <= made, {r.name for r in Reason} - made


@pytest.mark.parametrize("reason", list(Reason))
def test_every_reason_reaches_the_json_and_the_ledger(reason: Reason, tmp_path: Path) -> None:
    outcome = HostOutcome("h1", Outcome.SKIPPED, "why", reason=reason)
    assert outcome.to_json()["reason"] == reason.value
    ledger = Ledger.open(tmp_path / "ledger.db")
    try:
        run_id = begin(ledger, hosts=("h1",))
        ledger.record_host_outcome(run_id, "h1", outcome.outcome, outcome.error, reason=reason)
        assert ledger.get_run(run_id).host("h1").reason == reason
    finally:
        ledger.close()


def test_an_outcome_without_a_reason_is_written_as_before(tmp_path: Path) -> None:
    """Additive: no `reason` key where there is none, in the JSON and in the ledger's event (an
    older ledger's events read as no code)."""
    outcome = HostOutcome("h1", Outcome.APPLIED)
    assert "reason" not in outcome.to_json()
    ledger = Ledger.open(tmp_path / "ledger.db")
    try:
        run_id = begin(ledger, hosts=("h1",))
        ledger.record_host_outcome(run_id, "h1", "applied")
        assert ledger.get_run(run_id).host("h1").reason is None
        assert "reason" not in ledger.get_run(run_id).host("h1").to_json()
    finally:
        ledger.close()


def _lock_held() -> LockHeld:
    return LockHeld("held by run r1", code="lock-held", data={"run_id": "r1"})


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (_lock_held(), Reason.LOCK_HELD),
        (LeaseHeld("h1 is locked: leased to run r1"), Reason.LEASE_HELD),
        (
            HostKeyError("unknown host key", host="h1", fingerprint="SHA256:x"),
            Reason.HOST_KEY_UNKNOWN,
        ),
        (
            HostKeyError("host key CHANGED", host="h1", fingerprint="SHA256:x", changed=True),
            Reason.HOST_KEY_CHANGED,
        ),
        (
            BecomeError("sudo: a password is required", host="h1", reason="password-missing"),
            Reason.PASSWORD_MISSING,
        ),
        (BecomeError("sudoers says no", host="h1", reason="sudo-denied"), Reason.SUDO_DENIED),
        (BecomeError("sudo: what", host="h1", reason="sudo-failed"), Reason.BECOME_REFUSED),
        (ContainerError("does not exist", reason="container-missing"), Reason.CONTAINER_MISSING),
        (
            ContainerError("is not running", reason="container-not-running"),
            Reason.CONTAINER_NOT_RUNNING,
        ),
        (ContainerError("did not start: what"), Reason.RUNTIME_FAILED),
        (ContainerError("not a code", reason="rlimit"), Reason.RUNTIME_FAILED),
        (NotTakenLive("changed defaults"), Reason.NOT_TAKEN_LIVE),
        (LiveRefused("nobody listens"), Reason.NOT_LISTENING),
        (PeerNotAllowed("listens, not for this user"), Reason.PEER_NOT_ALLOWED),
        (
            RemoteOperationError("no longer holds the host's lock", code="lock-lost"),
            Reason.LOCK_LOST,
        ),
        (TargetError("outside the version range"), Reason.NOT_APPLICABLE),
        (AnchorError("anchor matches nothing"), Reason.NOT_APPLICABLE),
        (TransportError("connection refused", host="h1"), Reason.HOST_ERROR),
        (OpspatchError("anything else"), Reason.HOST_ERROR),
    ],
)
def test_an_errors_type_is_its_refusal_code(error: OpspatchError, reason: Reason) -> None:
    assert refusal_reason(error) == reason


def test_a_sudo_refusal_or_an_unusable_container_is_the_hosts_code_not_its_class() -> None:
    """Every code a `BecomeError` or a `ContainerError` carries is its own, each one of its
    class; the class's own word only where nothing finer is known."""
    assert BECOME_REFUSALS.isdisjoint(CONTAINER_REFUSALS)
    for reason in BECOME_REFUSALS:
        assert refusal_reason(BecomeError("sudo", host="h1", reason=reason)) == reason
    for reason in CONTAINER_REFUSALS:
        assert refusal_reason(ContainerError("container", reason=reason)) == reason


def _refusal(host: str, reason: Reason, *holders: LeaseHolder) -> Refusal:
    return Refusal(reason, HostOutcome(host, Outcome.SKIPPED, "why", reason=reason), holders)


def test_apply_refusal_clauses_come_from_the_hosts_refusals() -> None:
    """One clause per kind, in the order an operator fixes them, each naming its hosts (this
    test keeps the wording of each checked once; the run tests assert the codes)."""
    holder = LeaseHolder("id", "h7", "r9", "ana@ctl", "ctl-1", 1.0, 30.0)
    clauses = refused_because(
        [
            _refusal("h9", Reason.NOT_TAKEN_LIVE),
            _refusal("hA", Reason.PEER_NOT_ALLOWED),
            _refusal("h8", Reason.NOT_LISTENING),
            _refusal("h7", Reason.LEASE_HELD, holder),
            _refusal("h6", Reason.PASSWORD_REJECTED),
            _refusal("h6b", Reason.BECOME_REFUSED),
            _refusal("h5", Reason.HOST_KEY_CHANGED),
            _refusal("h4", Reason.HOST_KEY_UNKNOWN),
            _refusal("h3", Reason.LOCK_HELD),
            _refusal("h2", Reason.HOST_ERROR),
            _refusal("h2b", Reason.CONTAINER_MISSING),
            _refusal("h1", Reason.NOT_APPLICABLE),
            _refusal("h0", Reason.UNIT_NOT_ALIKE),
        ]
    )
    assert clauses[:4] == [
        "h1 cannot take the patch: it does not fit there, or the host's settings are refused "
        "(see each host's error)",
        "h3, h2, h2b could not be begun (unreachable, locked by another run, or its container "
        "unusable: see each host's error); fix that or leave the host out of --hosts",
        "h4, h5 could not be reached safely (SSH host key unknown; check its fingerprint, then "
        "re-run with --accept-new-host-keys)",
        "privileges cannot be raised on h6, h6b (sudo; see each host's error)",
    ]
    assert clauses[4].startswith("h7 is leased to run r9"), clauses[4]
    assert clauses[5:] == [
        "h8 do not listen for live fixes (see each host's error)",
        "the live plugin on hA refuses this user (run the agent as root or as the engine's "
        "user: `become`)",
        "the change cannot be taken live on h9 (see each host's error); apply without --live "
        "to apply it with a restart",
        "h0 refused (see each host's error)",
    ]


def test_a_changed_host_key_alone_is_said_so() -> None:
    (clause,) = refused_because([_refusal("h1", Reason.HOST_KEY_CHANGED)])
    assert (
        clause
        == "h1 could not be reached safely (SSH host key changed; it is never accepted by a flag)"
    )


def test_every_refusal_is_said() -> None:
    """A refusal of any code refuses the run with a clause naming its host: none is silent."""
    for reason in Reason:
        clauses = refused_because([_refusal("h1", reason)])
        assert clauses, reason


def test_every_host_sync_leaves_alone_has_a_code() -> None:
    """sync records a `skipped` host for every action not at goal: each with its code."""
    assert set(_LEFT_BECAUSE) == {a for a in SyncAction if not a.at_goal}


def test_every_reason_is_listed_in_the_cli_reference() -> None:
    """docs/cli.md lists the codes a script may read in `--json`: none missing."""
    listed = set(re.findall(r"`([a-z-]+)`", (PACKAGE.parent / "docs" / "cli.md").read_text()))
    assert {r.value for r in Reason} <= listed, {r.value for r in Reason} - listed
