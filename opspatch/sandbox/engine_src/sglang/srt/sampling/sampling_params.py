"""Sampling parameters of one request, built from the request JSON and validated.

Validation messages follow SGLang's wording where SGLang has one; an unknown parameter is an
error (SGLang rejects it too), so a typo never silently falls back to a default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_NEW_TOKENS = 128
_GREEDY_TEMPERATURE = 1e-6

KNOWN_SAMPLING_PARAMS = (
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
    "sampling_seed",
    "seed",
    "n",
    "stream_interval",
)


class InvalidSamplingParams(ValueError):
    """A request's sampling parameters are malformed; the HTTP layer answers 400."""


@dataclass
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    # A streamed request's output goes out with its first token, then once at least this many
    # tokens are unsent, and when it finishes (SGLang 0.5.23's `OutputStreamer`); None: the
    # server's `stream_interval`, 1.
    stream_interval: int | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_TEMPERATURE or self.top_k == 1

    @classmethod
    def from_request(
        cls, raw: Any, *, default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    ) -> SamplingParams:
        """Build and validate; raises InvalidSamplingParams with a message for the client."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise InvalidSamplingParams("sampling_params must be a JSON object")
        unknown = sorted(set(raw) - set(KNOWN_SAMPLING_PARAMS))
        if unknown:
            raise InvalidSamplingParams(
                f"unknown sampling param(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(KNOWN_SAMPLING_PARAMS)}"
            )
        values: dict[str, Any] = dict(raw)
        if values.get("n", 1) != 1:
            raise InvalidSamplingParams("n must be 1 (the stand-in returns one sample)")
        values.pop("n", None)
        if "seed" in values:
            if "sampling_seed" in values:
                raise InvalidSamplingParams("give either seed or sampling_seed, not both")
            values["sampling_seed"] = values.pop("seed")

        params = cls()
        if values.get("max_new_tokens") is not None:
            params.max_new_tokens = _integer(values, "max_new_tokens")
        else:
            params.max_new_tokens = default_max_new_tokens
        if values.get("temperature") is not None:
            params.temperature = _number(values, "temperature")
        if values.get("top_p") is not None:
            params.top_p = _number(values, "top_p")
        if values.get("top_k") is not None:
            params.top_k = _integer(values, "top_k")
        if values.get("min_p") is not None:
            params.min_p = _number(values, "min_p")
        if values.get("stop") is not None:
            params.stop = _stop_strings(values["stop"])
        for flag in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
            if values.get(flag) is not None:
                if not isinstance(values[flag], bool):
                    raise InvalidSamplingParams(f"{flag} must be true or false")
                setattr(params, flag, values[flag])
        if values.get("sampling_seed") is not None:
            params.sampling_seed = _integer(values, "sampling_seed")
        if values.get("stream_interval") is not None:
            params.stream_interval = _integer(values, "stream_interval")
            if params.stream_interval < 1:
                raise InvalidSamplingParams(
                    f"stream_interval must be at least 1, got {params.stream_interval}."
                )
        params.verify()
        return params

    def verify(self) -> None:
        if self.max_new_tokens < 0:
            raise InvalidSamplingParams(
                f"max_new_tokens must be at least 0, got {self.max_new_tokens}."
            )
        if self.temperature < 0.0:
            raise InvalidSamplingParams(
                f"temperature must be non-negative, got {self.temperature}."
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidSamplingParams(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidSamplingParams(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.top_k < 1 and self.top_k != -1:
            raise InvalidSamplingParams(
                f"top_k must be -1 (disable), or at least 1, got {self.top_k}."
            )


def _integer(values: dict[str, Any], name: str) -> int:
    value = values[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSamplingParams(f"{name} must be an integer, got {value!r}")
    return value


def _number(values: dict[str, Any], name: str) -> float:
    value = values[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidSamplingParams(f"{name} must be a number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidSamplingParams(f"{name} must be finite, got {value!r}")
    return float(value)


def _stop_strings(value: Any) -> list[str]:
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) and s for s in strings):
        raise InvalidSamplingParams("stop must be a non-empty string or a list of them")
    return list(strings)
