"""The judge's measurement: greedy decodes of a prompt set, timed on the host itself.

Each prompt is sent twice to SGLang's `/generate`: first for one token (its latency is the time
to first token: prefill, one step, the answer), then for `max_new_tokens` with
`return_logprob` and `top_logprobs_num` (its output ids, the top-k ids at every position, and
`meta_info`'s `completion_tokens` and `spec_verify_ct`). A 1-token request rather than a stream:
it works on any server that answers `/generate`, streaming or not, and measures the same
thing. Then `/metrics` is read once for the `sglang:spec_accept_length` gauge. Nothing is
judged here: the controller compares (`opspatch.runs.judgments.canary`).

A server that leaves a field out (no logprobs, no `spec_verify_ct`, no `/metrics`) gives None
for it; the judge says what it could not compare.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from opspatch.hosts.agent.engine import NoAnswer, _http
from opspatch.hosts.agent.protocol import operation

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import DecodeSample, MeasureReply, MeasureRequest

ACCEPT_GAUGE = "sglang:spec_accept_length"


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_tokens(reply: Any) -> tuple[list[int] | None, list[list[int]] | None, list[Any] | None]:
    """The output ids, the top-k ids per position and each token's text, from a `/generate`
    reply (`output_ids`, else the ids of `meta_info.output_token_logprobs`; SGLang writes a
    logprob entry as `[logprob, token_id, text]`), each None when the reply does not carry it."""
    meta = reply.get("meta_info") or {}
    chosen = meta.get("output_token_logprobs")
    ids = reply.get("output_ids")
    if not isinstance(ids, list) and isinstance(chosen, list):
        ids = [entry[1] for entry in chosen if isinstance(entry, list) and len(entry) > 1]
    output_ids = [int(i) for i in ids] if isinstance(ids, list) else None
    tops = meta.get("output_top_logprobs")
    top_ids = None
    if isinstance(tops, list):
        top_ids = [
            [int(entry[1]) for entry in (position or []) if isinstance(entry, list)]
            for position in tops
        ]
    texts = None
    if isinstance(chosen, list) and all(isinstance(e, list) and len(e) > 2 for e in chosen):
        texts = [entry[2] if isinstance(entry[2], str) else None for entry in chosen]
    return output_ids, top_ids, texts


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


def _decode(url: str, body: dict[str, Any], deadline: float) -> tuple[Any, float]:
    """One timed `/generate`: its JSON reply and the seconds it took; a failure raises
    `NoAnswer` or `ValueError` with what went wrong."""
    started = time.monotonic()
    status, raw = _http("POST", url + "/generate", body, timeout=max(1.0, deadline - started))
    seconds = time.monotonic() - started
    if status != 200:
        failure = Refused400 if status == 400 else ValueError
        raise failure(f"/generate answered {status}: {raw[:200]!r}")
    try:
        reply = json.loads(raw)
    except ValueError:
        raise ValueError(f"/generate answered no JSON: {raw[:200]!r}") from None
    if not isinstance(reply, dict):
        raise ValueError(f"/generate answered {type(reply).__name__}, not an object")
    return reply, seconds


def _unsent(prompt: str, problem: str | None) -> DecodeSample:
    return {
        "prompt": prompt,
        "problem": problem,
        "refused": False,
        "text": None,
        "output_ids": None,
        "top_ids": None,
        "token_texts": None,
        "completion_tokens": None,
        "spec_verify_ct": None,
        "seconds": None,
        "first_token_seconds": None,
    }


class Refused400(ValueError):
    """`/generate` answered 400: the request has something this server does not take."""


def _sample(
    url: str, prompt: str, args: MeasureRequest, deadline: float, top_k: int
) -> tuple[DecodeSample, bool]:
    """One prompt's sample, and whether the server gave no answer at all (it is down)."""
    sample = _unsent(prompt, None)
    greedy = {"temperature": 0}
    try:
        if args.get("first_token"):
            once = {"text": prompt, "sampling_params": dict(greedy, max_new_tokens=1)}
            _, sample["first_token_seconds"] = _decode(url, once, deadline)
        body: dict[str, Any] = {
            "text": prompt,
            "sampling_params": dict(greedy, max_new_tokens=int(args["max_new_tokens"])),
        }
        if top_k > 0:
            body.update(return_logprob=True, top_logprobs_num=top_k, return_text_in_logprobs=True)
        reply, sample["seconds"] = _decode(url, body, deadline)
    except NoAnswer as exc:
        sample["problem"] = f"no answer: {exc}"
        sample["refused"] = str(exc).startswith("ConnectionRefusedError")  # engine._http's words
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
    sample["output_ids"], sample["top_ids"], sample["token_texts"] = read_tokens(reply)
    sample["completion_tokens"] = _int_or_none(meta.get("completion_tokens"))
    sample["spec_verify_ct"] = _int_or_none(meta.get("spec_verify_ct"))
    if not sample["completion_tokens"]:
        sample["problem"] = "the server answered 200 with no completion tokens"
    return sample, False


@operation("measure")
def op_measure(args: MeasureRequest) -> MeasureReply:
    """Decode every prompt greedily, one at a time, timed; then read the accept-length gauge.
    A failed request is a sample with its `problem` (the judge fails on it), not a refusal; a
    server that stops answering fails the prompts after it at once instead of waiting each out.
    """
    url = str(args["url"]).rstrip("/")
    deadline = time.monotonic() + float(args.get("timeout") or 600.0)
    top_k = int(args.get("top_logprobs") or 0)
    samples = []
    gone = None  # the first "no answer": the server is down, do not wait on it again
    for prompt in args.get("prompts") or []:
        if gone is not None:
            samples.append(_unsent(str(prompt), f"not sent: an earlier request got {gone}"))
            continue
        try:
            sample, down = _sample(url, str(prompt), args, deadline, top_k)
        except Refused400:
            # a server that takes no logprobs (SGLang's own takes them): ask without, from now
            # on; the judge then compares outputs exactly, and says so
            top_k = 0
            sample, down = _sample(url, str(prompt), args, deadline, top_k)
        if down:
            gone = sample["problem"]
        samples.append(sample)
    gauge = None
    if gone is None:
        try:
            status, raw = _http("GET", url + "/metrics", None, timeout=10.0)
            if status == 200:
                gauge = read_gauge(raw.decode("utf-8", "replace"), ACCEPT_GAUGE)
        except NoAnswer:
            gauge = None
    return {"samples": samples, "spec_accept_length": gauge}
