"""`live enable` / `live disable` say no more than they checked, fast: the scripted hosts of
tests/livekit.py, with the faults the outside trial looked for.

A host that cannot be locked or read is `failed` with nothing written (not `needs-attention`:
its bytes are the ones it had); an install or a removal whose reply is lost is read back before
its outcome is said (`staged` / `staged-back` when it finished, `failed` when nothing was done,
`needs-attention` part-way); an unreachable host is never `staged`. The report, the exit code
and the ledger's record of the host say the same.
"""

from __future__ import annotations

from typing import Any

import pytest

from opspatch.core.reasons import Reason
from opspatch.errors import TransportError
from opspatch.hosts.transport.scripted import Refusal, agent_operation
from opspatch.runs.commands.live import disable_live, enable_live
from opspatch.runs.report import RunReport
from tests.livekit import files_under, run, scripted_site, site_of
from tests.scriptedkit import Fleet, fleet

pytestmark = pytest.mark.scripted

__all__ = ["fleet"]  # the fixture, used by name

UNTOUCHED = {"other_package.py"}


def on(fleet: Fleet, op: str, fault: Any) -> None:
    """The first host answers `op` with `fault(args)`; every other op as scripted_site does."""
    fake = fleet.hosts[0]
    scripted = fake.fault
    assert scripted is not None

    def answer(asked: str, args: dict[str, Any]) -> Any:
        return fault(args) if asked == op else scripted(asked, args)

    fake.fault = answer


def cut(args: dict[str, Any]) -> None:
    raise TransportError("the connection broke", host="h1", step="exec")


def written_then_cut(args: dict[str, Any]) -> None:
    agent_operation("install_files", args)  # every file is written...
    cut(args)  # ...and the reply lost


def removed_then_cut(args: dict[str, Any]) -> None:
    agent_operation("remove_files", args)
    cut(args)


def recorded(fleet: Fleet, report: RunReport) -> str:
    assert report.run_id is not None
    (host,) = fleet.ledger.get_run(report.run_id).hosts
    assert host.outcome is not None
    return str(host.outcome)


def one_host(fleet: Fleet) -> None:
    fleet.hosts = fleet.hosts[:1]
    scripted_site(fleet)


def test_a_host_whose_lock_cannot_be_written_is_failed_with_nothing_written(
    fleet: Fleet,
) -> None:
    one_host(fleet)
    on(fleet, "lock", lambda args: Refusal("lock-failed", "cannot write the state dir: denied"))
    report = run(fleet, enable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "failed", outcome  # was needs-attention (exit 3)
    assert outcome.reason == Reason.HOST_ERROR, outcome
    assert report.exit_code == 1
    assert recorded(fleet, report) == "failed"
    assert files_under(site_of(fleet)) == UNTOUCHED


def test_a_host_whose_engine_environment_cannot_be_read_is_failed(fleet: Fleet) -> None:
    one_host(fleet)
    on(fleet, "live_site", cut)
    report = run(fleet, enable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "failed", outcome
    assert report.exit_code == 1
    assert recorded(fleet, report) == "failed"


def test_an_unreachable_host_is_failed_never_staged(fleet: Fleet) -> None:
    scripted_site(fleet)
    fleet.hosts[1].gone = True
    report = run(fleet, enable_live)
    outcomes = {h.host: h.outcome for h in report.hosts}
    assert outcomes["h2"] == "failed", report
    assert "staged" not in outcomes.values()  # the run halted at max_failures = 1
    assert report.exit_code == 1
    assert report.to_json()["outcome"] == "failed"


def test_an_install_whose_reply_is_lost_after_it_wrote_is_read_back_and_staged(
    fleet: Fleet,
) -> None:
    one_host(fleet)
    on(fleet, "install_files", written_then_cut)
    report = run(fleet, enable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "staged", outcome  # was needs-attention, without a look
    steps = [str(s.step) for s in outcome.steps]
    assert steps[-2:] == ["live-enable", "reconcile"], steps
    assert report.exit_code == 0
    assert recorded(fleet, report) == "staged"


def test_an_install_lost_before_it_wrote_is_read_back_and_failed(fleet: Fleet) -> None:
    one_host(fleet)
    on(fleet, "install_files", cut)
    report = run(fleet, enable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "failed", outcome
    assert outcome.reason == Reason.HOST_ERROR, outcome
    assert "nothing was changed" in (outcome.error or "")  # the read-back's wording
    assert report.exit_code == 1
    assert files_under(site_of(fleet)) == UNTOUCHED


def test_an_install_whose_read_back_fails_too_needs_attention(fleet: Fleet) -> None:
    one_host(fleet)
    on(fleet, "install_files", written_then_cut)
    scripted = fleet.hosts[0].fault
    assert scripted is not None
    fleet.hosts[0].fault = lambda op, args: cut(args) if op == "file_hashes" else scripted(op, args)
    report = run(fleet, enable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "needs-attention", outcome
    assert outcome.reason == Reason.PART_WAY, outcome
    assert report.exit_code == 3


def test_a_removal_whose_reply_is_lost_after_it_removed_is_read_back_and_staged_back(
    fleet: Fleet,
) -> None:
    one_host(fleet)
    run(fleet, enable_live)
    on(fleet, "remove_files", removed_then_cut)
    report = run(fleet, disable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "staged-back", outcome
    assert report.exit_code == 0
    assert files_under(site_of(fleet)) == UNTOUCHED


def test_a_removal_lost_before_it_removed_is_failed_with_every_file_kept(fleet: Fleet) -> None:
    one_host(fleet)
    run(fleet, enable_live)
    installed = files_under(site_of(fleet))
    on(fleet, "remove_files", cut)
    report = run(fleet, disable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "failed", outcome
    assert outcome.reason == Reason.HOST_ERROR, outcome
    assert report.exit_code == 1
    assert files_under(site_of(fleet)) == installed


def test_an_install_cut_part_way_needs_attention_saying_how_far_it_got(fleet: Fleet) -> None:
    one_host(fleet)

    def half_then_cut(args: dict[str, Any]) -> None:
        files = sorted(args["files"].items())
        agent_operation("install_files", {**args, "files": dict(files[: len(files) // 2])})
        cut(args)

    on(fleet, "install_files", half_then_cut)
    report = run(fleet, enable_live)
    (outcome,) = report.hosts
    assert outcome.outcome == "needs-attention", outcome
    assert outcome.reason == Reason.PART_WAY, outcome  # its wording: how far it got
    assert "read back: 8 of its 17 files are there" in (outcome.error or ""), outcome.error
    assert "`opspatch live enable --hosts h1` again finishes it" in (outcome.error or "")
    assert report.exit_code == 3
