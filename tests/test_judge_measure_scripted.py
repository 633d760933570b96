"""The judge's measurement on the host (`hosts/agent/measure.py`) against a scripted SGLang
`/generate` that streams as SGLang 0.5.23 does (server-sent events: `data: {...}` with the whole
reply so far, or only its new part with `--incremental-streaming-output`, then `data: [DONE]`),
with its delays chosen: the time to first token and per output token come from one streamed
request per prompt, warm-up requests are sent and not measured, and a broken stream is said.

Timings are asserted as lower bounds only (the server sleeps at least so long): nothing here
depends on the machine's speed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from opspatch.core.policy import JudgeSettings
from opspatch.core.vocabulary import Metric, Verdict
from opspatch.hosts.agent.measure import RETIMED, op_measure, read_accept_gauge
from opspatch.hosts.measure import Measurement
from opspatch.runs.judgments.canary import judge
from tests.standin import free_port

pytestmark = pytest.mark.scripted

TOKENS = 8
STEP = 0.015
"""Seconds the scripted server sleeps before each token after the first."""
PREFILL = 0.05
"""Seconds before the first token."""


@dataclass
class Script:
    """How the scripted server answers, and what it was asked."""

    incremental: bool = False
    interval: int | None = 0
    """The `stream_interval` it goes by: 0, the request's; None, 1 (it takes none)."""
    one_token_delay: float = 0.6
    """A request for one token waits this long (the slow 1-token request of issue 42)."""
    error_after: int | None = None
    """Stream this many tokens, then an error event."""
    cut_after: int | None = None
    """Stream this many tokens, then close the connection without [DONE]."""
    e2e_latency: float | None = None
    """What the finished reply's `meta_info.e2e_latency` says; None: the time it really took."""
    read_late: int = 0
    """The first this many streamed requests say they finished at once (`e2e_latency` 0): by the
    server's clock, the host read their first token only once it had finished."""
    delayed: dict[int, float] = field(default_factory=dict)
    """Streamed request number (from 1) -> seconds more before its first token (a burst of load)."""
    bodies: list[dict[str, Any]] = field(default_factory=list)


class ScriptedEngine(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, script: Script) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def reply_so_far(
    prompt: str, count: int, finished: bool, e2e_latency: float = 0.1
) -> dict[str, Any]:
    """SGLang's reply after `count` tokens: ids 10.., text 'a'.., logprobs with text."""
    ids = [10 + (len(prompt) + i) % 50 for i in range(count)]
    chosen = [[-0.01 * (i + 1), token, chr(97 + token % 26)] for i, token in enumerate(ids)]
    tops = [[entry, [-3.0, (entry[1] + 1) % 60, "z"]] for entry in chosen]
    meta: dict[str, Any] = {
        "id": "r",
        "finish_reason": {"type": "length", "length": count} if finished else None,
        "prompt_tokens": len(prompt),
        "completion_tokens": count,
        "cached_tokens": 0,
        "output_token_logprobs": chosen,
        "output_top_logprobs": tops,
    }
    if finished:
        meta.update(spec_verify_ct=3, e2e_latency=e2e_latency)
    return {"text": "".join(e[2] for e in chosen), "output_ids": ids, "meta_info": meta}


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedEngine
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self._whole(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        script = self.server.script
        script.bodies.append(body)
        wanted = body["sampling_params"]["max_new_tokens"]
        if wanted == 1:
            time.sleep(script.one_token_delay)
        if not body.get("stream"):
            time.sleep(PREFILL + STEP * (wanted - 1))
            self._whole(200, reply_so_far(body["text"], wanted, True))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        asked = body["sampling_params"].get("stream_interval") or 1
        interval = asked if script.interval == 0 else script.interval or 1
        for event in self._events(body["text"], wanted, interval):
            if event is None:  # the connection dropped mid-stream
                self.wfile.write(b"5\r\ndata:")
                self.close_connection = True
                return
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.write(b"0\r\n\r\n")

    def _events(self, prompt: str, wanted: int, interval: int) -> Iterator[bytes | None]:
        """The first token at once, then once `interval` tokens are unsent, and the last (SGLang
        0.5.23's `OutputStreamer`), each event the reply so far (or its new part)."""
        script = self.server.script
        started = time.monotonic()
        time.sleep(
            PREFILL + script.delayed.get(sum(1 for b in script.bodies if b.get("stream")), 0)
        )
        sent = 0
        for count in range(1, wanted + 1):
            if count > 1:
                time.sleep(STEP)
            if sent and count - sent < interval and count < wanted:
                continue
            if script.error_after is not None and count > script.error_after:
                yield b'data: {"error": {"message": "the scheduler stopped"}}\n\n'
                break
            if script.cut_after is not None and count > script.cut_after:
                yield None
                return
            took = time.monotonic() - started if script.e2e_latency is None else script.e2e_latency
            if sum(1 for b in script.bodies if b.get("stream")) <= script.read_late:
                took = 0.0
            whole = reply_so_far(prompt, count, count == wanted, took)
            if script.incremental:
                whole["text"] = whole["text"][sent:]
                whole["output_ids"] = whole["output_ids"][sent:]
                for key in ("output_token_logprobs", "output_top_logprobs"):
                    whole["meta_info"][key] = whole["meta_info"][key][sent:]
            sent = count
            yield b"data: " + json.dumps(whole).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    def _whole(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def engine() -> Iterator[ScriptedEngine]:
    server = ScriptedEngine(Script())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


def measured(url: str, *, warmup: int = 0, top: int = 2, repeats: int = 1) -> Measurement:
    request = {
        "url": url,
        "prompts": PROMPTS,
        "max_new_tokens": TOKENS,
        "top_logprobs": top,
        "warmup": warmup,
        "repeats": repeats,
        "timeout": 30.0,
    }
    return Measurement.from_json(op_measure(request))  # type: ignore[arg-type]


def test_both_latencies_come_from_one_streamed_request_per_prompt(engine: ScriptedEngine) -> None:
    # the server's own clock says it finished late: the first token always reached the host
    # before, so what is asserted is the arithmetic, whatever this machine's load
    engine.script.e2e_latency = 60.0
    measurement = measured(engine.url)
    bodies = engine.script.bodies
    assert len(bodies) == len(PROMPTS)  # was 2 per prompt: a 1-token request first
    assert all(b["stream"] is True for b in bodies), bodies
    assert {b["sampling_params"]["max_new_tokens"] for b in bodies} == {TOKENS}
    # two events: the first token and the finished reply, no work between them per step
    assert {b["sampling_params"]["stream_interval"] for b in bodies} == {TOKENS}
    for sample in measurement.samples:
        assert sample.ok, sample.problem
        assert sample.first_token_seconds is not None and sample.first_token_seconds >= PREFILL
        tpot = sample.time_per_output_token
        # was about 0: the slow 1-token request (0.6 s) taken as the whole request's first token;
        # half a step of slack: a first event read late on a loaded host shortens the span
        # (0.01487 s against a 0.015 s step, once at load 6)
        assert tpot is not None and tpot >= STEP / 2, tpot


def test_each_prompt_is_decoded_in_rounds_and_its_fastest_decode_is_its_sample(
    engine: ScriptedEngine,
) -> None:
    """A burst of load on one decode of each of two prompts (the first round's first, the
    second round's last): the other round's decode is the prompt's sample."""
    engine.script.e2e_latency = 60.0
    engine.script.delayed = {1: 0.5, 6: 0.5}
    measurement = measured(engine.url, repeats=2)
    assert [b["text"] for b in engine.script.bodies] == PROMPTS * 2
    assert all(s.ok and (s.seconds or 1) < 0.5 for s in measurement.samples)


def test_a_decode_that_failed_in_any_round_is_the_prompts_sample(engine: ScriptedEngine) -> None:
    engine.script.error_after = 0  # every decode streams an error
    measurement = measured(engine.url, repeats=2)
    assert len(engine.script.bodies) == 2 * len(PROMPTS)
    assert all(s.problem and "streamed an error" in s.problem for s in measurement.samples)


def test_a_prompt_read_late_is_decoded_again_and_timed_when_read_in_time(
    engine: ScriptedEngine,
) -> None:
    engine.script.e2e_latency = 60.0
    engine.script.read_late = 2  # the first prompt twice
    measurement = measured(engine.url)
    assert [b["text"] for b in engine.script.bodies] == [PROMPTS[0]] * 3 + PROMPTS[1:]
    assert all(s.time_per_output_token is not None for s in measurement.samples)


def test_a_host_that_reads_every_stream_late_leaves_the_time_per_token_unmeasured(
    engine: ScriptedEngine,
) -> None:
    """Each prompt decoded 1 + `RETIMED` times, then judged: never a pass on no timed pair."""
    engine.script.read_late = 10**6
    late = measured(engine.url, warmup=1)
    bodies = engine.script.bodies
    assert [b["text"] for b in bodies] == PROMPTS[:1] + [p for p in PROMPTS for _ in range(3)]
    assert RETIMED == 2
    assert all(s.ok and s.time_per_output_token is None for s in late.samples)
    settings = JudgeSettings(alpha=0.5)  # the test can reach it on 3 prompts
    judgment = judge(late, late, settings, baseline_from="itself", in_turns=True)
    assert judgment.metric(Metric.TPOT).verdict == Verdict.UNMEASURED
    assert judgment.metric(Metric.TTFT).verdict == Verdict.PASS and judgment.failed


@pytest.mark.parametrize("interval", [None, 3])
def test_the_reply_read_from_the_stream_is_the_whole_reply_with_its_logprobs(
    engine: ScriptedEngine, interval: int | None
) -> None:
    """Whether the server sends an event per step (it takes no `stream_interval`: None) or
    every few tokens, the whole reply so far (its default) or only the new part."""
    engine.script.interval = interval
    whole = reply_so_far(PROMPTS[0], TOKENS, True)
    for incremental in (False, True):
        engine.script.incremental = incremental
        sample = measured(engine.url).samples[0]
        assert sample.text == whole["text"] and sample.output_ids == tuple(whole["output_ids"])
        assert sample.token_texts == tuple(
            e[2] for e in whole["meta_info"]["output_token_logprobs"]
        )
        assert sample.token_logprobs == tuple(
            e[0] for e in whole["meta_info"]["output_token_logprobs"]
        )
        assert sample.top_ids is not None and sample.top_logprobs is not None
        assert sample.top_ids[1] == (whole["output_ids"][1], (whole["output_ids"][1] + 1) % 60)
        assert sample.top_logprobs[1] == (-0.02, -3.0)
        assert (sample.completion_tokens, sample.spec_verify_ct) == (TOKENS, 3)
        assert sample.server_seconds is not None and sample.server_seconds >= PREFILL


def test_warmup_requests_are_sent_first_and_not_measured(engine: ScriptedEngine) -> None:
    measurement = measured(engine.url, warmup=4)
    texts = [body["text"] for body in engine.script.bodies]
    assert texts == [*PROMPTS, PROMPTS[0], *PROMPTS]  # four warm-ups of the prompts in turn
    assert [s.prompt for s in measurement.samples] == PROMPTS
    assert all(b["stream"] and b["sampling_params"]["max_new_tokens"] == TOKENS
               for b in engine.script.bodies)  # fmt: skip


def test_an_error_streamed_is_the_prompts_problem(engine: ScriptedEngine) -> None:
    engine.script.error_after = 3
    measurement = measured(engine.url)
    assert all(s.problem == "/generate streamed an error: {'message': 'the scheduler stopped'}"
               for s in measurement.samples), measurement.samples  # fmt: skip


def test_a_stream_cut_off_is_no_answer_and_the_prompts_after_it_are_not_sent(
    engine: ScriptedEngine,
) -> None:
    engine.script.cut_after = 2
    measurement = measured(engine.url)
    first, *rest = measurement.samples
    assert first.problem is not None and first.problem.startswith("no answer: ")
    assert all(s.problem and s.problem.startswith("not sent: an earlier request got no answer")
               for s in rest)  # fmt: skip
    assert len(engine.script.bodies) == 1 and not measurement.no_server


def test_no_server_during_warmup_is_said_on_every_prompt_as_refused() -> None:
    measurement = measured(f"http://127.0.0.1:{free_port()}", warmup=2)
    assert measurement.no_server and not measurement.answered
    assert "ConnectionRefusedError" in (measurement.problem or "")
    assert len(measurement.samples) == len(PROMPTS)


REAL_METRICS = """# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{engine_type="unified",model_name="m",tp_rank="0"} %s
sglang:spec_accept_length{engine_type="unified",model_name="m",tp_rank="1"} %s
sglang:spec_accept_rate{engine_type="unified",model_name="m",tp_rank="0"} 0.5
"""
"""Real SGLang 0.5.23's `/metrics` (`--enable-metrics`): one sample per TP rank, labelled."""


@pytest.mark.pure
def test_the_accept_gauge_is_the_ranks_mean_and_none_before_sglang_first_sets_it() -> None:
    assert read_accept_gauge(REAL_METRICS % ("2.0", "3.0")) == 2.5
    # a server that has not yet decoded `--decode-log-interval` steps reads 0: not reported
    assert read_accept_gauge(REAL_METRICS % ("0.0", "0.0")) is None
    assert read_accept_gauge("# no speculative gauges\n") is None
