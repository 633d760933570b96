"""The judge's measurement of one server, as the controller reads it: the agent's `measure`
(`opspatch.hosts.agent.measure`, run on the host, where the engine URL answers) decodes the
playbook's judge prompts greedily, each in one streamed request timed token by token, with top-k
logprobs; its reply is read here as a `Measurement`, a value the judge compares
(`opspatch.runs.judgments.canary`)."""

from __future__ import annotations

from dataclasses import dataclass

from opspatch.core.codec import Record, json_field
from opspatch.core.host import Host
from opspatch.core.policy import JudgeSettings
from opspatch.hosts.agent.measure import op_measure, read_late
from opspatch.hosts.agent.protocol import MeasureReply, MeasureRequest
from opspatch.hosts.become import RunsAs
from opspatch.hosts.results import Operation


def _rounded_to_microseconds(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)


@dataclass(frozen=True)
class Decoded(Record):
    """One prompt's greedy decode on one server (the agent's `DecodeSample`)."""

    prompt: str
    problem: str | None = None
    """Why the request failed; None when it answered with a completion."""
    refused: bool = False
    """No server listened (the connection was refused), rather than one that dropped it."""
    text: str | None = None
    output_ids: tuple[int, ...] | None = None
    top_ids: tuple[tuple[int, ...], ...] | None = json_field(default=None, written=False)
    """Per output position, the ids of the top-k logprobs (kept, never printed: bulky)."""
    top_logprobs: tuple[tuple[float, ...], ...] | None = json_field(default=None, written=False)
    """Per output position, the logprobs of `top_ids`, in their order."""
    token_logprobs: tuple[float, ...] | None = json_field(default=None, written=False)
    """Per output position, the logprob of the token chosen."""
    token_texts: tuple[str | None, ...] | None = json_field(default=None, written=False)
    completion_tokens: int | None = None
    spec_verify_ct: int | None = None
    seconds: float | None = json_field(default=None, encode=_rounded_to_microseconds)
    """From sending the request to its last token's arrival."""
    first_token_seconds: float | None = json_field(default=None, encode=_rounded_to_microseconds)
    """From sending the request to its first token's arrival (the same streamed request)."""
    server_seconds: float | None = json_field(default=None, encode=_rounded_to_microseconds)
    """The server's own time for the request, receipt to finish (`meta_info.e2e_latency`)."""

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def accept_length(self) -> float | None:
        """Tokens per verify step (`completion_tokens / spec_verify_ct`): None without
        speculation."""
        if not self.completion_tokens or not self.spec_verify_ct:
            return None
        return self.completion_tokens / self.spec_verify_ct

    @property
    def time_per_output_token(self) -> float | None:
        """Seconds per output token after the first, from one streamed request: from the first
        token's arrival to the last's, over the tokens after the first (SGLang's bench_serving
        reckons it so); None when either was not measured, or when the first token reached the
        host only once the server had finished (by its own clock): the last then waited behind
        it, and what was timed is the host's reading, not the decode (a host too busy to read
        the stream as it came, which would make the server look faster than it is)."""
        if self.seconds is None or self.first_token_seconds is None:
            return None
        if read_late(self.first_token_seconds, self.server_seconds, self.completion_tokens):
            return None
        if not self.completion_tokens or self.completion_tokens < 2:
            return None
        later = max(self.seconds - self.first_token_seconds, 0.0)
        return later / (self.completion_tokens - 1)


@dataclass(frozen=True)
class Measurement(Record):
    """One server's decodes of the judge's prompts, and its accept-length gauge (`/metrics`)."""

    samples: tuple[Decoded, ...]
    spec_accept_length: float | None = None

    @property
    def answered(self) -> bool:
        """Whether every prompt was answered with a completion."""
        return all(sample.ok for sample in self.samples)

    @property
    def problem(self) -> str | None:
        """The first failed request's problem, if any."""
        return next((s.problem for s in self.samples if s.problem), None)

    @property
    def no_server(self) -> bool:
        """Whether no server listened at all (its first request was refused): nothing crashed."""
        return bool(self.samples) and self.samples[0].refused


MEASURE = Operation(
    "measure",
    MeasureRequest,
    MeasureReply,
    Measurement,
    op_measure,
    runs_as=RunsAs.LOGIN,
)


def measure_args(host: Host, settings: JudgeSettings) -> MeasureRequest:
    """The agent's `measure` arguments: the judge's prompts and decode settings, the host's
    engine URL."""
    return {
        "url": host.engine.url,
        "prompts": list(settings.chosen),
        "max_new_tokens": settings.max_new_tokens,
        "top_logprobs": settings.top_k,
        "warmup": settings.warmup,
        "repeats": settings.repeats,
        "timeout": settings.timeout,
    }
