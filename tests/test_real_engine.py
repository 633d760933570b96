"""Real SGLang 0.5.23 on this machine's CPU, made and started by opspatch's real-engine parts:
the shared environment, a host's own layer, the CPU kernel layer, the platform plugin and the
models, one TP=2 EAGLE-3 server (two scheduler ranks over gloo) shared by the module
(tests/realkit.py). The sandbox's own path, a two-node server, is tests/test_sandbox_real.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import pytest

from opspatch.sandbox.processes import is_running, proc_text
from opspatch.sandbox.real.launch import EAGLE_DRAFT_TOKENS
from opspatch.sandbox.real.server import RealServer
from tests.realkit import RealEngine, real_engine, start_server, transformers_greedy

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(1800)]  # a real start: minutes

CORPUS_PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "Speculative decoding makes",
    "The quick brown fox",
    "Water boils at",
    "A good engineer reads",
    "In the morning the market",
    "The train leaves the station",
]
META_INFO_KEYS = {
    "completion_tokens",
    "prompt_tokens",
    "finish_reason",
    "cached_tokens",
    "e2e_latency",
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
}


@pytest.fixture(scope="module")
def engine() -> RealEngine:
    return real_engine()


@pytest.fixture(scope="module")
def server(engine: RealEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    started = start_server(engine, tmp_path_factory.mktemp("real-tp2"), tp=2)
    yield started
    started.stop()


def test_greedy_text_is_the_models_own_with_eagle3_verifying(
    server: RealServer, engine: RealEngine
) -> None:
    replies = [server.generate(prompt, 24) for prompt in CORPUS_PROMPTS[:3]]
    expected = transformers_greedy(engine, CORPUS_PROMPTS[:3], 24)
    assert [reply["output_ids"] for reply in replies] == expected
    assert "small village" in replies[1]["text"]  # language, from the project's own corpus
    for reply in replies:
        meta = reply["meta_info"]
        assert meta.keys() >= META_INFO_KEYS, sorted(META_INFO_KEYS - meta.keys())
        assert meta["completion_tokens"] == 24
        assert meta["spec_verify_ct"] > 0
        assert len(meta["spec_correct_drafts_histogram"]) == EAGLE_DRAFT_TOKENS
        assert sum(meta["spec_correct_drafts_histogram"]) == meta["spec_verify_ct"]


def test_the_draft_is_accepted(server: RealServer) -> None:
    lengths = [server.generate(p, 32)["meta_info"]["spec_accept_length"] for p in CORPUS_PROMPTS]
    assert statistics.median(lengths) >= 1.5, lengths


def test_the_platform_plugin_ran_in_every_process_and_kept_intel_amx(server: RealServer) -> None:
    log = server.log.read_text(encoding="utf-8", errors="replace")
    loaded = {
        line.split()[2].rstrip(":") for line in log.splitlines() if "[opspatch_sandbox_cpu]" in line
    }
    assert len(loaded) >= 4, loaded  # the main process, both schedulers, the detokenizer
    assert "fallback to torch_native" not in log


def test_stop_ends_every_process_of_the_server(server: RealServer) -> None:
    pids = server.pids()
    schedulers = [p for p in pids if "sglang::scheduler" in (proc_text(p, "cmdline") or "")]
    assert len(schedulers) == 2, pids
    server.stop()
    assert [pid for pid in pids if is_running(pid)] == []
