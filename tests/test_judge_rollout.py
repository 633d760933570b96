"""The judge on the sandbox fleet: real stand-in engines, the console script, a real ledger.

A patch the smoke passes but that quietly hurts what the fleet serves is caught by the judge on
the canary and rolled back there (a draft that proposes worse: same answers, fewer accepted
tokens; a changed token; a fixed delay per decode step); the incident's fix is applied with
`no-baseline` (its old servers crash on the judge's first decode); `opspatch judge` of two hosts
running the same code is not a fail; a canary whose server was down is judged against a peer of
its build, measured again in turns with it after the smoke.

Written against the stand-in engine: its draft reads the target's hidden state and positions
(`EagleDraftWorker.draft_forward`: a position off by one proposes worse, the answers stay the
same); its greedy choice is `sglang.srt.layers.sampler.greedy_token`.
"""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faultkit import isolated_home
from tests.fleetkit import GuardedFleet, SandboxFleet, Slot, wait_until
from tests.patchkit import ONE_TOKEN

pytestmark = [pytest.mark.engine, pytest.mark.alone]

JUDGED = """
name = "judged"
canary = 1
batch = "all"
max_failures = 1
[timeouts]
restart = 60
ready = 120
smoke = 120
restore = 60
[judge]
count = 12
max_new_tokens = 48
"""
JUDGED_ONCE = JUDGED.replace('name = "judged"', 'name = "judged-once"') + "repeats = 1\n"
"""One round: tokens and acceptance are the same in every round (greedy; docs/judge.md), so a
test of those metrics alone needs no second (a latency test keeps both)."""


def _module_end(patch_id: str, module: str, code: str) -> str:
    """A patch inserting `code` at the end of `module` (the stand-in's)."""
    body = textwrap.dedent(code).strip()
    return textwrap.dedent(
        f'''
        id = "{patch_id}"
        summary = "judge test: {patch_id}"
        rationale = "a change the smoke passes and the judge must not"
        [target]
        module = "{module}"
        versions = ">=0.5.4"
        [[edits]]
        kind = "insert"
        scope = "<module>"
        position = "end"
        code = \'\'\'
        {{code}}
        \'\'\'
        '''
    ).replace("{code}", body)


WORSE_DRAFT = _module_end(
    "worse-draft",
    "sglang.srt.speculative.eagle_worker_v2",
    """
    _draft_forward = EagleDraftWorker.draft_forward


    def _one_position_ahead(self, forward_batch, req, num_drafts):
        forward_batch.positions.add_(1)  # a port that feeds the draft the wrong position
        return _draft_forward(self, forward_batch, req, num_drafts)


    EagleDraftWorker.draft_forward = _one_position_ahead
    """,
)
SLOWER = _module_end(
    "slower",
    "sglang.srt.speculative.eagle_worker_v2",
    """
    import time as _time

    _forward_batch_generation = EAGLEWorkerV2.forward_batch_generation


    def _slow_forward(self, batch):
        _time.sleep(0.05)  # a fixed delay per decode step
        return _forward_batch_generation(self, batch)


    EAGLEWorkerV2.forward_batch_generation = _slow_forward
    """,
)


@pytest.fixture(scope="module")
def slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slot[GuardedFleet]]:
    """Two guarded hosts shared by the module's tests, each starting where a fresh pair starts
    (`GuardedFleet.at_baseline`; a test that leaves them elsewhere gets a new pair next): a
    judged apply rolled back on the canary leaves them so. The module's own HOME: the pair
    outlives each test's."""
    with isolated_home(tmp_path_factory.mktemp("judge-home")):
        made = Slot(tmp_path_factory, "judge", lambda root: GuardedFleet.up(root, 2))
        try:
            yield made
        finally:
            made.close()


@pytest.fixture
def fleet(slot: Slot[GuardedFleet]) -> SandboxFleet:
    sandbox = slot.ready().fleet
    sandbox.write_playbook("judged", JUDGED)
    sandbox.write_playbook("judged-once", JUDGED_ONCE)
    return sandbox


def _host(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(h for h in doc["hosts"] if h["host"] == name)


def _metric(judgment: dict[str, Any], metric: str) -> dict[str, Any]:
    return next(m for m in judgment["metrics"] if m["metric"] == metric)


def _passed_unless_untimed(judgment: dict[str, Any]) -> bool:
    """Whether the same code on both sides was judged so: a pass or marginal, or `unmeasured`
    on a latency metric alone (a host too busy to read enough of its streams in time: the
    load's doing, how often never asserted; docs/judge.md). Whether it passed."""
    unmeasured = {m["metric"] for m in judgment["metrics"] if m["verdict"] == "unmeasured"}
    others = {m["verdict"] for m in judgment["metrics"] if m["verdict"] != "unmeasured"}
    assert unmeasured <= {"ttft", "tpot"} and others <= {"pass", "marginal"}, judgment
    return not unmeasured


@pytest.mark.parametrize(
    ("patch_id", "text", "metric"),
    [
        ("worse-draft", WORSE_DRAFT, "speculation"),
        ("one-token", ONE_TOKEN, "tokens"),
        ("slower", SLOWER, "tpot"),
    ],
)
def test_a_change_the_smoke_passes_is_caught_by_the_judge_and_rolled_back_on_the_canary(
    fleet: SandboxFleet, patch_id: str, text: str, metric: str
) -> None:
    fleet.write_patch(patch_id, text)
    canary, other = fleet.names
    pre = {n: fleet.sha(n) for n in fleet.names}
    playbook = "judged" if metric == "tpot" else "judged-once"
    run = fleet.opspatch(
        "apply", patch_id, "--hosts", fleet.inventory, "--playbook", playbook, "--yes", "--json"
    )
    assert run.code == 1, run.stdout + run.stderr
    doc = run.json()
    host = _host(doc, canary)
    assert host["outcome"] == "rolled-back", host
    steps = [(s["step"], s["status"]) for s in host["steps"]]
    assert ("smoke", "ok") in steps and ("judge", "failed") in steps, steps
    assert ("judge-baseline", "ok") in steps
    judgment = host["judgment"]
    assert judgment["verdict"] == "fail"
    assert judgment["baseline"] == "this host's old server, before the swap"
    assert _metric(judgment, metric)["verdict"] == "fail", judgment
    assert f"{metric} fail" in host["error"]
    assert _host(doc, other)["outcome"] == "skipped" and doc["halted"]
    assert {n: fleet.sha(n) for n in fleet.names} == pre
    # the ledger keeps the verdict and its figures in the judge step's detail
    report = fleet.opspatch("ledger", "report", doc["run_id"])
    assert report.code == 0, report.stderr
    assert f"{metric} fail" in report.stdout


def test_the_incident_fix_is_applied_with_no_baseline_when_the_old_servers_crash(
    tmp_path: Path,
) -> None:
    sandbox = SandboxFleet(tmp_path, 1).up()
    try:
        sandbox.write_playbook("judged", JUDGED)
        (name,) = sandbox.names
        run = sandbox.opspatch(
            "apply", "eagle-init-guard", "--hosts", name, "--playbook", "judged", "--yes", "--json"
        )
        assert run.code == 0, run.stdout + run.stderr
        host = _host(run.json(), name)
        assert host["outcome"] == "applied"
        judgment = host["judgment"]
        assert judgment["verdict"] == "no-baseline" and judgment["baseline"] is None
        assert "the old server failed the judge's prompts" in judgment["why_no_baseline"]
        assert _metric(judgment, "errors")["verdict"] == "pass"
    finally:
        sandbox.close()


def test_judge_of_two_hosts_running_the_same_code_is_not_a_fail(fleet: SandboxFleet) -> None:
    first, second = fleet.names
    run = fleet.opspatch(
        "judge", "--hosts", second, "--baseline", first, "--playbook", "judged", "--json"
    )
    (host,) = run.json()["hosts"]
    judgment = host["judgment"]
    assert run.code == (0 if _passed_unless_untimed(judgment) else 1), run.stdout + run.stderr
    assert _metric(judgment, "tokens")["verdict"] == "pass"
    assert _metric(judgment, "speculation")["verdict"] == "pass"
    assert "rule" not in _metric(judgment, "tokens")["figures"]  # no prompt diverged
    table = fleet.opspatch("judge", "--hosts", second, "--baseline", first, "--playbook", "judged")
    assert f"{second}: " in table.stdout and "speculation" in table.stdout, table.stderr


HARMLESS = _module_end(
    "harmless",
    "sglang.srt.speculative.eagle_worker_v2",
    """
    JUDGE_TEST_HARMLESS = True  # changes nothing the server does
    """,
)


def test_a_canary_without_a_server_is_judged_against_a_peer_measured_in_turns_with_it(
    fleet: SandboxFleet,
) -> None:
    canary, peer = fleet.names
    pid = fleet.pid(canary)
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)  # the engine's shell and the server under it
    assert wait_until(lambda: fleet.generate(canary) is None, timeout=60)
    fleet.write_patch("harmless", HARMLESS)
    run = fleet.opspatch(
        "apply", "harmless", "--hosts", fleet.inventory, "--playbook", "judged", "--yes", "--json"
    )
    host = _host(run.json(), canary)
    judgment = host["judgment"]
    assert judgment["baseline"] == f"{peer} (same release and build, not yet changed)", judgment
    for metric in ("ttft", "tpot"):  # measured in turns, not one after the other
        assert "one after the other" not in _metric(judgment, metric)["figures"]
    # what the judge said is what happened: applied on both, or (latency untimed) rolled back
    # on the canary and the run halted before the peer
    passed = _passed_unless_untimed(judgment)
    assert run.code == (0 if passed else 1), run.stdout + run.stderr
    assert host["outcome"] == ("applied" if passed else "rolled-back"), host
    assert _host(run.json(), peer)["outcome"] == ("applied" if passed else "skipped")
