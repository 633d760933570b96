"""The judge's verdicts as values (pure): per metric, with its figures, and per server."""

from __future__ import annotations

from dataclasses import dataclass

from opspatch.core.codec import Record, json_field
from opspatch.core.pairedstats import SignedRank
from opspatch.core.policy import JudgeSettings
from opspatch.core.vocabulary import FAILING, Metric, Verdict


@dataclass(frozen=True)
class Divergence(Record):
    """Where one prompt's outputs first differ: the position (in tokens, or in characters when
    the ids are alike or not told), each side's token or text there, and whether it is a near
    tie (None: no logprobs to tell)."""

    prompt: int
    """The prompt's place in the set, from 1."""
    position: int
    baseline: str
    canary: str
    tie: bool | None
    gap: float | None = json_field(default=None, omit_none=True)
    """Nats: the wider of the two sides' gaps between its own token and the other's, by its
    own logprobs; None when a side did not rate the other's token (outside its top-k)."""
    text_only: bool = False
    """The token ids are the same; the text the client receives is not."""


@dataclass(frozen=True)
class MetricVerdict(Record):
    """One metric's verdict, with the figures that decided it (in words, and the test)."""

    metric: Metric
    verdict: Verdict
    figures: str
    test: SignedRank | None = json_field(default=None, omit_none=True)
    divergences: tuple[Divergence, ...] = ()
    timed: tuple[tuple[float, float], ...] = json_field(default=(), written=False)
    """A latency metric's (baseline, changed) pairs, kept to be pooled with a second
    measurement's (`canary.confirm`)."""
    unsettled: bool = json_field(default=False, written=False)
    """A latency rise past the threshold that the test could not tell from noise: measured
    again (`canary.unconfirmed`)."""

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING


@dataclass(frozen=True)
class Judgment(Record):
    """The judge's verdict on one server: the worst of its metrics' (or `no-baseline`), where
    the baseline came from (None: there was none, and `why_no_baseline` says why)."""

    verdict: Verdict
    baseline: str | None
    metrics: tuple[MetricVerdict, ...]
    why_no_baseline: str | None = json_field(default=None, omit_none=True)
    settings: JudgeSettings | None = json_field(default=None, written=False)
    """The settings it was judged by (a second measurement is judged by them too)."""
    in_turns: bool = json_field(default=False, written=False)
    """Its baseline was measured in turns with it (else taken before: a second judgment
    one after the other shares that one baseline measurement)."""

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    def metric(self, metric: Metric) -> MetricVerdict:
        return next(m for m in self.metrics if m.metric == metric)

    def summary(self) -> str:
        """One line: the verdict and, unless it passed, each metric that did not, with its
        figures (a failed proof's reason names the metric)."""
        if self.verdict == Verdict.NO_BASELINE:
            head = f"judge: no baseline ({self.why_no_baseline}); absolute checks passed"
            failed = [m for m in self.metrics if m.verdict in FAILING]
            if failed:
                head = f"judge: fail (no baseline: {self.why_no_baseline})"
            return "; ".join([head, *(f"{m.metric}: {m.figures}" for m in failed)])
        bad = [m for m in self.metrics if m.verdict in FAILING or m.verdict == Verdict.MARGINAL]
        head = f"judge: {self.verdict} against {self.baseline}"
        return "; ".join([head, *(f"{m.metric} {m.verdict}: {m.figures}" for m in bad)])

    def details(self) -> str:
        """Every metric's verdict and figures, one after another (a step's detail)."""
        return "; ".join(f"{m.metric} {m.verdict}: {m.figures}" for m in self.metrics)
