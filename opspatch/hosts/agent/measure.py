"""The judge's measurement: greedy decodes of a prompt set, timed on the host itself."""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any

from opspatch.hosts.agent.engine import NoAnswer, _http
from opspatch.hosts.agent.protocol import operation

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import DecodeSample, MeasureReply, MeasureRequest

ACCEPT_GAUGE = "sglang:spec_accept_length"
STREAM_END = b"[DONE]"
LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs")
"""The `meta_info` lists with one entry per output token (sliced per chunk when the server runs
with `--incremental-streaming-output`)."""


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_tokens(reply: Any) -> dict[str, Any]:
    """From a `/generate` reply: `output_ids` (else the ids of `meta_info.output_token_logprobs`;
    SGLang writes a logprob entry as `[logprob, token_id, text]`), each token's logprob and text,
    and per position the top logprobs' ids and values; each None when the reply does not carry
    it."""
    meta = reply.get("meta_info") or {}
    chosen = meta.get("output_token_logprobs")
    entries = (
        [e for e in chosen if isinstance(e, list) and len(e) > 1]
        if isinstance(chosen, list)
        else None
    )
    ids = reply.get("output_ids")
    if not isinstance(ids, list) and entries is not None:
        ids = [entry[1] for entry in entries]
    tops = meta.get("output_top_logprobs")
    top_ids = top_values = None
    if isinstance(tops, list):
        rows = [[e for e in (position or []) if isinstance(e, list)] for position in tops]
        top_ids = [[int(entry[1]) for entry in row] for row in rows]
        top_values = [[_float_or_none(entry[0]) for entry in row] for row in rows]
        if any(value is None for row in top_values for value in row):
            top_values = None
    texts = logprobs = None
    if entries is not None and isinstance(chosen, list) and len(entries) == len(chosen):
        logprobs = [_float_or_none(entry[0]) for entry in entries]
        if None in logprobs:
            logprobs = None
        if all(len(entry) > 2 for entry in entries):
            texts = [entry[2] if isinstance(entry[2], str) else None for entry in entries]
    return {
        "output_ids": [int(i) for i in ids] if isinstance(ids, list) else None,
        "top_ids": top_ids,
        "top_logprobs": top_values,
        "token_logprobs": logprobs,
        "token_texts": texts,
    }


def read_gauge(text: str, name: str) -> float | None:
    """The mean of a Prometheus gauge's samples (one per rank), or None when absent."""
    values = []
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            try:
                values.append(float(line.rsplit(None, 1)[-1]))
            except ValueError:
                continue
    return sum(values) / len(values) if values else None


def read_accept_gauge(text: str) -> float | None:
    """The `sglang:spec_accept_length` gauge, None where the server has not set it yet: SGLang
    sets it to the acceptance of its last `--decode-log-interval` (40) decode steps, and it reads
    0 before the first of them (a freshly started server), which is no acceptance of any
    decode."""
    value = read_gauge(text, ACCEPT_GAUGE)
    return value if value else None


def is_whole(chunk: dict[str, Any]) -> bool:
    """Whether a streamed chunk holds the whole reply so far (SGLang's default) rather than only
    its new part (`--incremental-streaming-output`): as many ids as its `completion_tokens`."""
    ids = chunk.get("output_ids")
    counted = (chunk.get("meta_info") or {}).get("completion_tokens")
    return not isinstance(ids, list) or len(ids) == counted


def merged(whole: dict[str, Any] | None, chunk: dict[str, Any]) -> dict[str, Any]:
    """The reply so far with one more streamed chunk (the chunk itself when it `is_whole`)."""
    if whole is None or is_whole(chunk):
        return chunk
    meta = chunk.get("meta_info") or {}
    ids = chunk.get("output_ids") or []
    before = whole.get("meta_info") or {}
    joined = dict(meta)
    for key in LOGPROB_KEYS:
        if isinstance(meta.get(key), list):
            joined[key] = list(before.get(key) or []) + meta[key]
    return {
        "text": (whole.get("text") or "") + (chunk.get("text") or ""),
        "output_ids": list(whole.get("output_ids") or []) + ids,
        "meta_info": joined,
    }


_COUNT = re.compile(rb'"completion_tokens":\s*(\d+)')
"""A chunk's token count, found without parsing it (the key's quotes are escaped in any text)."""


def _token_count(data: bytes) -> int:
    """The tokens a streamed chunk says the reply holds so far: its `completion_tokens`, read
    cheaply so that nothing slow runs between two chunks' arrivals (else its ids counted)."""
    found = _COUNT.search(data)
    if found is not None:
        return int(found.group(1))
    chunk = _json_object(data)
    if "error" in chunk:
        raise ValueError(f"/generate streamed an error: {str(chunk['error'])[:200]}")
    ids = chunk.get("output_ids")
    return len(ids) if isinstance(ids, list) else 0


def _whole(chunks: list[bytes]) -> dict[str, Any]:
    """The reply a stream's chunks make, parsed once it has ended: the last chunk when each is
    the reply so far (SGLang's default), else every chunk joined (`merged`)."""
    last = _json_object(chunks[-1])
    if is_whole(last):
        return last
    whole = None
    for data in chunks:
        whole = merged(whole, _json_object(data))
    assert whole is not None
    return whole


class Refused400(ValueError):
    """`/generate` answered 400: the request has something this server does not take."""


def _failed(status: int, raw: bytes) -> ValueError:
    failure = Refused400 if status == 400 else ValueError
    return failure(f"/generate answered {status}: {raw[:200]!r}")


def _streamed(
    url: str, body: dict[str, Any], deadline: float
) -> tuple[dict[str, Any], float | None, float]:
    """One streamed `/generate`: the whole reply, and the seconds to its first token (None when
    the server answered the stream whole) and to its last. A failure raises `NoAnswer` (no
    server, or the stream broke off) or `ValueError` (`Refused400`) with what went wrong."""
    import http.client
    import socket
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url + "/generate", data=json.dumps(dict(body, stream=True)).encode("utf-8"), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    started = time.monotonic()
    chunks: list[bytes] = []  # parsed after the stream ends: nothing slow between two arrivals
    first = last = None
    try:
        with urllib.request.urlopen(request, timeout=max(1.0, deadline - started)) as response:  # noqa: S310 - loopback URL from the inventory
            if response.headers.get_content_type() != "text/event-stream":
                reply = _json_object(response.read())
                return reply, None, time.monotonic() - started
            for line in response:
                now = time.monotonic() - started
                data = line.strip()
                if not data.startswith(b"data:"):
                    continue  # the blank line between events, or a comment
                data = data[len(b"data:") :].strip()
                if data == STREAM_END:
                    break
                before = _token_count(chunks[-1]) if chunks else 0
                chunks.append(data)
                if _token_count(data) > before:
                    first = now if first is None else first
                    last = now
            else:
                raise NoAnswer("the stream ended before its last event (data: [DONE])")
    except urllib.error.HTTPError as exc:
        raise _failed(int(exc.code), exc.read()) from None
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        timed_out = isinstance(reason, socket.timeout)  # TimeoutError from Python 3.10 on
        raise NoAnswer(f"{type(reason).__name__}: {reason}", timed_out) from None
    if not chunks or last is None:
        raise ValueError("/generate streamed no token")
    return _whole(chunks), first, last


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        reply = json.loads(raw)
    except ValueError:
        raise ValueError(f"/generate answered no JSON: {raw[:200]!r}") from None
    if not isinstance(reply, dict):
        raise ValueError(f"/generate answered {type(reply).__name__}, not an object")
    return reply


def _unsent(prompt: str, problem: str | None, refused: bool = False) -> DecodeSample:
    return {
        "prompt": prompt,
        "problem": problem,
        "refused": refused,
        "text": None,
        "output_ids": None,
        "top_ids": None,
        "top_logprobs": None,
        "token_logprobs": None,
        "token_texts": None,
        "completion_tokens": None,
        "spec_verify_ct": None,
        "seconds": None,
        "first_token_seconds": None,
        "server_seconds": None,
    }


RETIMED = 2
"""Times a prompt read late (`read_late`) is decoded again at once: a host too busy to read a
stream as it came is busy for moments, and a latency metric timed on too few prompts is
`unmeasured` (never a pass)."""


def read_late(
    first_token_seconds: float | None, server_seconds: float | None, tokens: int | None
) -> bool:
    """Whether a streamed decode's first token reached the host only once the server had
    finished the request (by its own clock): the last token then waited behind it, and the time
    between the two is the host's reading, not the decode."""
    return (
        first_token_seconds is not None
        and server_seconds is not None
        and bool(tokens)
        and first_token_seconds >= server_seconds
    )


def _body(prompt: str, args: MeasureRequest, top_k: int) -> dict[str, Any]:
    """A greedy streamed decode whose stream carries two events, the first token and the whole
    reply: SGLang's per-request `stream_interval` (the first token goes out at once, then once
    that many tokens are unsent, and at the finish). An event per step would put its work (the
    reply so far serialized, sent, parsed) between the two times measured."""
    tokens = int(args["max_new_tokens"])
    body: dict[str, Any] = {
        "text": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": tokens, "stream_interval": tokens},
    }
    if top_k > 0:
        body.update(return_logprob=True, top_logprobs_num=top_k, return_text_in_logprobs=True)
    return body


def _sample(
    url: str, prompt: str, args: MeasureRequest, deadline: float, top_k: int
) -> tuple[DecodeSample, bool]:
    """One prompt's sample, and whether the server gave no answer at all (it is down)."""
    sample = _unsent(prompt, None)
    try:
        reply, sample["first_token_seconds"], sample["seconds"] = _streamed(
            url, _body(prompt, args, top_k), deadline
        )
    except NoAnswer as exc:
        sample["problem"] = f"no answer: {exc}"
        sample["refused"] = str(exc).startswith("ConnectionRefusedError")  # as engine._http's
        return sample, True
    except Refused400 as exc:
        if top_k > 0:
            raise  # perhaps the logprobs it does not take: the caller asks again without
        sample["problem"] = str(exc)
        return sample, False
    except ValueError as exc:
        sample["problem"] = str(exc)
        return sample, False
    meta = reply.get("meta_info") or {}
    sample["text"] = reply.get("text") if isinstance(reply.get("text"), str) else None
    sample.update(read_tokens(reply))  # type: ignore[typeddict-item]
    sample["completion_tokens"] = _int_or_none(meta.get("completion_tokens"))
    sample["spec_verify_ct"] = _int_or_none(meta.get("spec_verify_ct"))
    sample["server_seconds"] = _float_or_none(meta.get("e2e_latency"))
    if not sample["completion_tokens"]:
        sample["problem"] = "the server answered 200 with no completion tokens"
    return sample, False


@operation("measure")
def op_measure(args: MeasureRequest) -> MeasureReply:
    """Warm the server with `warmup` unmeasured decodes, then decode every prompt greedily, one
    at a time, timed, `repeats` rounds over the prompts (a prompt's sample: its fastest decode
    timed in time, `_kept`); a decode read late is decoded again at once, up to `RETIMED` times.
    Then read the accept-length gauge. A failed request is a sample with its `problem` (the
    judge fails on it), not a refusal; a server that stops answering fails the prompts after it
    at once instead of waiting each out."""
    url = str(args["url"]).rstrip("/")
    deadline = time.monotonic() + float(args.get("timeout") or 600.0)
    top_k = int(args.get("top_logprobs") or 0)
    prompts = [str(prompt) for prompt in args.get("prompts") or []]
    warmup = (
        [prompts[i % len(prompts)] for i in range(int(args.get("warmup") or 0))] if prompts else []
    )
    rounds: list[tuple[int | None, str]] = [(None, p) for p in warmup]  # (None: unmeasured)
    rounds += [
        (i, p) for _ in range(max(1, int(args.get("repeats") or 1))) for i, p in enumerate(prompts)
    ]
    gone: DecodeSample | None = None  # the first "no answer": the server is down, do not wait
    tries: list[list[DecodeSample]] = [[] for _ in prompts]
    for index, prompt in rounds:
        if gone is not None:
            if index is not None and not tries[index]:
                said = f"not sent: an earlier request got {gone['problem']}"
                tries[index].append(_unsent(prompt, said, gone["refused"]))
            continue
        for _ in range(1 + (RETIMED if index is not None else 0)):
            try:
                sample, down = _sample(url, prompt, args, deadline, top_k)
            except Refused400:
                # a server that takes no logprobs (SGLang's own takes them): ask without, from
                # now on; the judge then compares outputs exactly, and says so
                top_k = 0
                sample, down = _sample(url, prompt, args, deadline, top_k)
            if down or not _late(sample) or time.monotonic() >= deadline:
                break
        if down:
            gone = sample
        if index is not None:
            tries[index].append(sample)
    gauge = None
    if gone is None:
        try:
            status, raw = _http("GET", url + "/metrics", None, timeout=10.0)
            if status == 200:
                gauge = read_accept_gauge(raw.decode("utf-8", "replace"))
        except NoAnswer:
            gauge = None
    return {"samples": [_kept(each) for each in tries], "spec_accept_length": gauge}


def _late(sample: DecodeSample) -> bool:
    return read_late(
        sample["first_token_seconds"], sample["server_seconds"], sample["completion_tokens"]
    )


def _kept(tries: list[DecodeSample]) -> DecodeSample:
    """A prompt's sample from its decodes: the first that failed (a failure is never hidden by
    a retry), else the fastest whole request read in time: load only ever adds time, and a
    moment of it (a neighbour's burst on a shared host) rarely lasts into another round."""
    failed = [t for t in tries if t["problem"] is not None]
    if failed:
        return failed[0]
    timed = [t for t in tries if not _late(t)] or tries
    return min(timed, key=lambda t: t["seconds"] if t["seconds"] is not None else float("inf"))
