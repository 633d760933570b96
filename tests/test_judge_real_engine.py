"""The canary judge on real SGLang 0.5.23 (CPU, TP=1, EAGLE-3): two real servers made by `sandbox
up --engine sglang --live`, shared by the module's tests in order, each judged as an operator runs
it (`opspatch judge`, `apply --playbook` with a `[judge]`):

- A/A: the two servers, the same code, judged in turns: a pass (no metric fails);
- a patch to real SGLang's EAGLE path that keeps every answer and lowers acceptance (the draft's
  carried hidden state dropped between its steps) fails `speculation` with `tokens` passing, and
  is rolled back: the fix reverted in the running engine and the file restored, no restart;
- a patch that changes one token (greedy verification turns ' a' into 'x') fails `tokens`,
  naming the token, and is rolled back;
- A/A judged for latency passes; a patch that makes every decode step four times as long and
  keeps every answer and accepted token (tests/data/judge/slower-decode-step.toml), taken live
  and judged in turns with the peer, fails `tpot`; `rollback --restart never` takes it out.

A judgment of the same code whose latency is `unmeasured` (the host read too few streams in
time: the load's doing) is taken again; the slowed server is judged until tpot fails, at most
`SLOWED_JUDGMENTS` times (beside busy loops one judgment may miss it).

The patches are taken live (`apply --live`): a real start costs a minute or more here, and a
restart-based apply and its rollback would cost two per patch; the judge's verdict and the
rollback are the same code either way (docs/judge.md). The prompts are the model's own text,
where its draft is accepted (accept length 3.0, the most a 2-step chain allows), so a draft made
worse shows on every prompt; on prompts the model never saw the draft is accepted less (about
1.6) and a draft change shows on fewer prompts.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fleetkit import SandboxFleet
from tests.realkit import real_engine

# a real start of two servers, and their judged decodes, on a loaded machine
pytestmark = [pytest.mark.sglang, pytest.mark.alone, pytest.mark.timeout(1500)]

CANARY, PEER = "sandbox-01", "sandbox-02"
SLOWER = Path(__file__).resolve().parent / "data" / "judge" / "slower-decode-step.toml"
PROMPTS = (
    "The capital of France is",
    "The capital city of France",
    "Once upon a time",
    "Hello, and welcome to",
    "The quick brown fox",
    "Water boils at",
    "A good engineer reads",
    "What is the capital of France?",
    "Speculative decoding makes",
    "The history of the city",
    "In the morning the market",
    "The train leaves the station",
    "When a server crashes on its first request,",
    "The moon goes around the earth",
)
JUDGED = f"""
name = "judged"
canary = 1
batch = "all"
max_failures = 1
[timeouts]
smoke = 300
[judge]
prompts = "prompts.txt"
count = {len(PROMPTS)}
max_new_tokens = 24
repeats = 1
"""
"""The exact metrics' judge: one round (latency is the `latency` playbook's)."""
LATENCY = """
name = "latency"
[judge]
prompts = "prompts.txt"
count = 12
max_new_tokens = 16
warmup = 1
"""
"""Short prompts, since the slowed server's decodes take four times as long; two rounds (the
default `repeats`): a prompt's faster decode is its sample."""
EAGLE = "sglang.srt.speculative.eagle_worker_v2"
DRAFT_STATE_DROPPED = f"""
id = "draft-state-dropped"
summary = "judge test: EAGLE's draft gets zeros for its own hidden state between its steps"
rationale = "a port that drops the draft's carried state: the answers stay, fewer drafts are right"
[target]
module = "{EAGLE}"
distribution = "sglang"
versions = "==0.5.23"
[[edits]]
kind = "insert"
scope = "EagleDraftWorker.draft_forward"
position = "start"
code = "forward_batch.spec_info.hidden_states = torch.zeros_like(forward_batch.spec_info.hidden_states)"
"""
A, X = 262, 90  # the model's tokens ' a' and 'x'
ONE_TOKEN = f"""
id = "one-token"
summary = "judge test: greedy verification turns one token of the vocabulary into another"
rationale = "a change the smoke passes and the judge must not"
[target]
module = "sglang.srt.speculative.eagle_utils"
distribution = "sglang"
versions = "==0.5.23"
[[edits]]
kind = "insert"
scope = "eagle_sample"
position = "after"
anchor = {{ matches = "target_predict = torch.argmax(next_token_logits, dim=-1)" }}
code = "target_predict = torch.where(target_predict == {A}, {X}, target_predict)"
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxFleet]:
    real_engine()  # skips, with the reason, where the index cannot be reached to build it
    folder = tmp_path_factory.mktemp("judge-real")
    sandbox = SandboxFleet(folder, 2, engine="sglang", extra=("--live",))
    try:
        sandbox.up()  # `--live`: the plugin installed before the engines' first start
        guard = sandbox.opspatch(
            "apply", "eagle-init-guard", "--hosts", "sandbox", "--live", "--yes"
        )
        assert guard.code == 0, guard.stdout + guard.stderr
        (sandbox.workspace / "playbooks" / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
        sandbox.write_playbook("judged", JUDGED)
        sandbox.write_playbook("latency", LATENCY)
        yield sandbox
    finally:
        sandbox.close()


def _metrics(judgment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["metric"]: m for m in judgment["metrics"]}


def _decode(fleet: SandboxFleet, name: str, prompt: str) -> dict[str, Any]:
    body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 24}}
    request = urllib.request.Request(
        f"http://127.0.0.1:{fleet.port(name)}/generate",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - loopback
        reply: dict[str, Any] = json.loads(response.read())
    return reply


def _file_sha(fleet: SandboxFleet, name: str, module: str) -> str:
    python = Path(fleet.hosts[name].engine.python or "")
    relative = module.replace(".", "/") + ".py"
    found = sorted(python.parent.parent.glob(f"lib/python*/site-packages/{relative}"))
    return hashlib.sha256(found[0].read_bytes()).hexdigest()


def test_a_over_a_on_two_real_servers_passes(fleet: SandboxFleet) -> None:
    metrics = _judged_in_turns(fleet, "judged")
    assert not [m for m in metrics.values() if m["verdict"] == "fail"], metrics
    assert f"0 of {len(PROMPTS)} prompts diverged" in metrics["tokens"]["figures"]
    # the draft is really accepted, so the speculation check means something
    median = float(metrics["speculation"]["figures"].split("median accept length ")[1].split()[0])
    assert median >= 2.0, metrics["speculation"]


def _caught_and_rolled_back(
    fleet: SandboxFleet, patch_id: str, text: str, module: str
) -> dict[str, dict[str, Any]]:
    """Apply `patch_id` live on the canary under the judged playbook: the judge fails it, the
    fix is reverted in the running engine and the file restored, no restart. Its metrics."""
    fleet.write_patch(patch_id, text)
    before_sha, before_pid = _file_sha(fleet, CANARY, module), fleet.pid(CANARY)
    run = fleet.opspatch(
        "apply", patch_id, "--hosts", CANARY, "--live", "--playbook", "judged", "--yes", "--json"
    )
    assert run.code == 1, run.stdout + run.stderr
    host = run.json()["hosts"][0]
    assert (host["outcome"], host["reason"]) == ("rolled-back", "judge-failed"), host
    steps = [(s["step"], s["status"]) for s in host["steps"]]
    assert ("judge", "failed") in steps and steps[-2:] == [("live-revert", "ok"), ("restore", "ok")]
    assert _file_sha(fleet, CANARY, module) == before_sha
    assert fleet.pid(CANARY) == before_pid  # taken and reverted live, never restarted
    return _metrics(host["judgment"])


def test_a_draft_accepted_less_with_every_answer_kept_is_caught_and_rolled_back(
    fleet: SandboxFleet,
) -> None:
    before = _decode(fleet, CANARY, PROMPTS[2])
    metrics = _caught_and_rolled_back(fleet, "draft-state-dropped", DRAFT_STATE_DROPPED, EAGLE)
    assert metrics["speculation"]["verdict"] == "fail", metrics["speculation"]
    assert metrics["tokens"]["verdict"] == "pass", metrics["tokens"]  # every answer the same
    assert metrics["errors"]["verdict"] == "pass"
    # reverted in the running engine: the same answer, verified in as few steps as before
    after = _decode(fleet, CANARY, PROMPTS[2])
    assert after["output_ids"] == before["output_ids"]
    assert after["meta_info"]["spec_verify_ct"] == before["meta_info"]["spec_verify_ct"]


def test_a_patch_that_changes_one_token_is_caught_and_rolled_back(fleet: SandboxFleet) -> None:
    before = _decode(fleet, CANARY, PROMPTS[2])
    assert A in before["output_ids"][1:], before  # the token changed is in this answer
    metrics = _caught_and_rolled_back(
        fleet, "one-token", ONE_TOKEN, "sglang.srt.speculative.eagle_utils"
    )
    tokens = metrics["tokens"]
    assert tokens["verdict"] == "fail", tokens
    assert any(
        d["baseline"] == f"' a' ({A})" and d["canary"] == f"'x' ({X})" and d["tie"] is False
        for d in tokens["divergences"]
    ), tokens
    assert _decode(fleet, CANARY, PROMPTS[2])["output_ids"] == before["output_ids"]


def test_a_slower_decode_step_with_every_answer_kept_fails_tpot_and_a_over_a_does_not(
    fleet: SandboxFleet,
) -> None:
    """Every decode step waits three times its own time once done (tests/data/judge/
    slower-decode-step.toml): four times as long at any load; the judge fails at +50%. Judged
    in turns with the unchanged peer, two rounds over the prompts, a prompt's faster decode its
    sample: a burst of load on this shared machine (one decode of 16 tokens 10 to 40 times its
    usual time, seen on either side) no longer turns a pair the other way (docs/judge.md).
    Judged again until tpot fails, at most `SLOWED_JUDGMENTS` times: beside busy loops a whole
    request is mostly the wait for a core outside the slowed step (the same 16 tokens 0.5 to
    2.5 s on the slowed server, 0.2 to 1.3 s on its peer), so one judgment's power is a rate
    that falls with the load, as for the stand-in's (tests/test_judge_aa.py)."""
    same = _judged_in_turns(fleet, "latency")
    for latency in ("ttft", "tpot"):
        assert same[latency]["verdict"] != "fail", same[latency]
    fleet.write_patch("slower-decode-step", SLOWER.read_text(encoding="utf-8"))
    pid, sha = fleet.pid(CANARY), _file_sha(fleet, CANARY, EAGLE)
    taken = fleet.opspatch(
        "apply", "slower-decode-step", "--hosts", CANARY, "--live", "--yes", "--json"
    )
    assert taken.code == 0, taken.stdout + taken.stderr
    try:
        verdicts = []
        for _ in range(SLOWED_JUDGMENTS):
            verdicts.append(_judged(fleet, "latency")["tpot"]["verdict"])
            if verdicts[-1] == "fail":
                break
        print(f"the slowed server's tpot: {verdicts}")
        assert "fail" in verdicts, verdicts
    finally:
        back = fleet.opspatch(
            "rollback", "slower-decode-step", "--hosts", CANARY, "--restart", "never",
            "--yes", "--json",
        )  # fmt: skip
        assert back.code == 0, back.stdout + back.stderr
    assert _file_sha(fleet, CANARY, EAGLE) == sha and fleet.pid(CANARY) == pid


SLOWED_JUDGMENTS = 5
"""At most this many judgments of the slowed server, each a whole `opspatch judge`."""
UNMEASURED_JUDGMENTS = 3
"""At most this many judgments of the same code while a latency metric is `unmeasured`."""


def _judged_in_turns(fleet: SandboxFleet, playbook: str) -> dict[str, dict[str, Any]]:
    """The metrics of `_judged` taken again while a latency metric is `unmeasured` (the host
    read too few streams in time: the load's doing); skips if that lasts."""
    for _ in range(UNMEASURED_JUDGMENTS):
        metrics = _judged(fleet, playbook)
        if all(metrics[name]["verdict"] != "unmeasured" for name in ("ttft", "tpot")):
            return metrics
    pytest.skip(f"latency unmeasured in {UNMEASURED_JUDGMENTS} judgments at this load: {metrics}")


def _judged(fleet: SandboxFleet, playbook: str) -> dict[str, dict[str, Any]]:
    """`opspatch judge` of the canary in turns with the peer under `playbook`: its metrics.
    The exact metrics pass (every answer and accepted token the same), and the exit code agrees
    with the verdict."""
    run = fleet.opspatch(
        "judge", "--hosts", CANARY, "--baseline", PEER, "--playbook", playbook, "--json",
        timeout=1200,
    )  # fmt: skip
    judgment = run.json()["hosts"][0]["judgment"]
    metrics = _metrics(judgment)
    for name in ("ttft", "tpot"):  # the figures, with -s
        print(f"{name} {metrics[name]['verdict']}: {metrics[name]['figures']}")
    for exact in ("errors", "tokens", "speculation"):
        assert metrics[exact]["verdict"] == "pass", metrics[exact]
    assert run.code == (0 if judgment["verdict"] in ("pass", "marginal") else 1), run.stderr
    return metrics
