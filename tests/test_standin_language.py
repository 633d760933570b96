"""What the stand-in serves for judging, over real servers: greedy text that reads as language,
speculative decoding that is exact and really speculative (acceptance between 1.5 and 4 tokens
per verify step, varying by prompt), SGLang's logprob fields on `/generate`, and the speculative
gauges on `/metrics`. (TP=2 against TP=1: tests/test_standin_processes.py.)

Engines are real process trees on free loopback ports (tests/standin.py), stopped by pid.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.standin import (
    EngineProcess,
    StandinHost,
    make_host,
    running_engine,
    standin_module,
)

pytestmark = pytest.mark.engine

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Hello",
    "Once upon a time",
    "The quick brown fox",
    "What is the capital of France?",
    "abc xyz",
)
GREEDY_64 = {"max_new_tokens": 64, "temperature": 0}
# One decode log (and so one update of the gauges) per decode step.
SPECULATIVE = ("--disable-cuda-graph", "--decode-log-interval", "1")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> StandinHost:
    return make_host(tmp_path_factory.mktemp("language-host"))


@pytest.fixture(scope="module")
def speculative(host: StandinHost) -> Iterator[EngineProcess]:
    with running_engine(host, SPECULATIVE, log_name="eagle.log") as engine:
        yield engine


@pytest.fixture(scope="module")
def plain(host: StandinHost) -> Iterator[EngineProcess]:
    args = ("--speculative-algorithm", "NONE")
    with running_engine(host, args, log_name="plain.log") as engine:
        yield engine


def generate(engine: EngineProcess, body: dict[str, Any]) -> Any:
    reply = engine.post("/generate", body)
    assert reply.status == 200, reply.body
    return reply.json()


def greedy(engine: EngineProcess, prompt: str, **fields: Any) -> Any:
    return generate(engine, {"text": prompt, "sampling_params": GREEDY_64, **fields})


def test_greedy_text_reads_as_language(speculative: EngineProcess) -> None:
    text = greedy(speculative, "The capital of France is")["text"]

    assert text.startswith(" Paris. ")
    corpus = " ".join(standin_module("models/corpus.py").DOCUMENTS).lower()
    words = re.findall(r"[a-z]+", text.lower())[:-1]  # the last may be cut off
    assert len(words) >= 8 and all(word in set(re.findall(r"[a-z]+", corpus)) for word in words)


def test_speculative_greedy_output_and_logprobs_equal_plain_greedy(
    speculative: EngineProcess, plain: EngineProcess
) -> None:
    fields = {"return_logprob": True, "top_logprobs_num": 3}
    for prompt in PROMPTS:
        spec, alone = greedy(speculative, prompt, **fields), greedy(plain, prompt, **fields)
        assert spec["output_ids"] == alone["output_ids"], prompt
        assert spec["text"] == alone["text"]
        for key in ("output_token_logprobs", "output_top_logprobs"):
            assert spec["meta_info"][key] == alone["meta_info"][key], (prompt, key)
        assert spec["meta_info"]["spec_verify_ct"] > 0
        assert "spec_verify_ct" not in alone["meta_info"]


def test_acceptance_is_realistic_and_varies_by_prompt(speculative: EngineProcess) -> None:
    lengths = []
    for prompt in PROMPTS:
        meta = greedy(speculative, prompt)["meta_info"]
        length = meta["completion_tokens"] / meta["spec_verify_ct"]
        assert meta["spec_accept_length"] == pytest.approx(length)
        assert 1.5 <= length <= 4, (prompt, meta)
        # some drafts rejected, some accepted: speculation really runs
        correct, proposed = meta["spec_num_correct_drafts"], meta["spec_num_proposed_drafts"]
        assert 0 < correct < proposed, (prompt, meta)
        assert meta["spec_accept_rate"] == pytest.approx(correct / proposed)
        # real SGLang's names and histogram: per verify step, how many drafts were correct
        histogram = meta["spec_correct_drafts_histogram"]
        assert sum(histogram) == meta["spec_verify_ct"], (prompt, meta)
        assert sum(n * steps for n, steps in enumerate(histogram)) == correct, (prompt, meta)
        lengths.append(length)
    assert len(set(lengths)) >= 3, lengths


def test_logprobs_come_in_sglangs_shapes(speculative: EngineProcess) -> None:
    out = greedy(
        speculative,
        "Hello",
        return_logprob=True,
        top_logprobs_num=5,
        return_text_in_logprobs=True,
    )
    meta, ids = out["meta_info"], out["output_ids"]

    chosen = meta["output_token_logprobs"]
    assert [entry[1] for entry in chosen] == ids
    assert "".join(entry[2] for entry in chosen) == out["text"]
    assert all(isinstance(entry[0], float) and entry[0] <= 0 for entry in chosen)
    top = meta["output_top_logprobs"]
    assert len(top) == len(ids) == meta["completion_tokens"]
    for position, candidates in enumerate(top):
        assert len(candidates) == 5
        values = [candidate[0] for candidate in candidates]
        assert values == sorted(values, reverse=True)
        # greedy: the chosen token is the most likely one, with the same logprob
        assert candidates[0][:2] == chosen[position][:2]
        assert len({candidate[1] for candidate in candidates}) == 5

    bare = greedy(speculative, "Hello", return_logprob=True)["meta_info"]
    assert [entry[:2] for entry in bare["output_token_logprobs"]] == [e[:2] for e in chosen]
    assert all(entry[2] is None for entry in bare["output_token_logprobs"])
    assert "output_top_logprobs" not in bare
    assert "output_token_logprobs" not in greedy(speculative, "Hello")["meta_info"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"return_logprob": "yes"}, "return_logprob must be true or false"),
        ({"return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num must be"),
        ({"return_logprob": True, "top_logprobs_num": 1000}, "at most the vocabulary size"),
        ({"return_logprob": True, "logprob_start_len": 0}, "logprob_start_len must be -1"),
    ],
)
def test_bad_logprob_fields_answer_400_with_a_message(
    speculative: EngineProcess, fields: dict[str, Any], message: str
) -> None:
    reply = speculative.post("/generate", {"text": "a", **fields})
    assert reply.status == 400
    assert message in reply.json()["error"]["message"]


def gauge(engine: EngineProcess, name: str) -> float:
    reply = engine.get("/metrics")
    assert reply.status == 200
    pattern = rf"^sglang:{name}\{{([^}}]*)\}} (\S+)$"
    match = re.search(pattern, reply.body.decode(), re.M)
    assert match is not None, reply.body.decode()
    assert 'tp_rank="0"' in match.group(1) and 'model_name="tiny"' in match.group(1)
    return float(match.group(2))


def test_metrics_export_the_speculative_gauges(
    speculative: EngineProcess, plain: EngineProcess
) -> None:
    meta = greedy(speculative, "Once upon a time")["meta_info"]
    # the last decode step's figures (one decode log per step here)
    assert 1 <= gauge(speculative, "spec_accept_length") <= 4
    assert 0 <= gauge(speculative, "spec_accept_rate") <= 1
    assert meta["spec_verify_ct"] > 0

    greedy(plain, "Once upon a time")
    assert gauge(plain, "spec_accept_length") == 0
    assert gauge(plain, "spec_accept_rate") == 0
