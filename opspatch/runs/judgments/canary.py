"""The judge: a changed server against a baseline measured in the same run, metric by metric
(pure: two `Measurement`s in, a `Judgment` out)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from opspatch.core.pairedstats import SignedRank, fewest_pairs, median, signed_rank
from opspatch.core.policy import JudgeSettings
from opspatch.core.verdicts import Divergence, Judgment, MetricVerdict
from opspatch.core.vocabulary import Metric, Verdict
from opspatch.hosts.measure import Decoded, Measurement


def judge(
    canary: Measurement,
    baseline: Measurement | None,
    settings: JudgeSettings,
    *,
    baseline_from: str | None,
    why_no_baseline: str | None = None,
    in_turns: bool = False,
) -> Judgment:
    """Judge `canary` against `baseline` (taken from `baseline_from`, said in the verdict).
    `in_turns`: the two were measured in turns (else one after the other: said in the
    latency figures). A baseline that answered no prompt is none (`why_no_baseline` is then
    said)."""
    if baseline is not None and not any(sample.ok for sample in baseline.samples):
        first = next((s.problem for s in baseline.samples if s.problem), "no prompts")
        why_no_baseline = f"{baseline_from} answered no prompt: {first}"
        baseline = None
    errors = _errors(canary)
    if baseline is None:
        metrics = (errors, *_absolute(canary))
        worst = Verdict.FAIL if errors.verdict == Verdict.FAIL else Verdict.NO_BASELINE
        return Judgment(worst, None, metrics, why_no_baseline or "no baseline was measured")
    pairs = [(b, c) for b, c in zip(baseline.samples, canary.samples, strict=False)]
    metrics = (
        errors,
        _tokens(pairs, settings),
        _speculation(pairs, baseline, canary, settings),
        _latency(Metric.TTFT, pairs, lambda s: s.first_token_seconds, settings, in_turns),
        _latency(Metric.TPOT, pairs, lambda s: s.time_per_output_token, settings, in_turns),
    )
    worst = max((m.verdict for m in metrics), key=lambda v: v.rank)
    return Judgment(worst, baseline_from, metrics, settings=settings, in_turns=in_turns)


def _errors(canary: Measurement) -> MetricVerdict:
    failed = [(i, s) for i, s in enumerate(canary.samples, 1) if not s.ok]
    total = len(canary.samples)
    if not failed:
        return MetricVerdict(Metric.ERRORS, Verdict.PASS, f"{total} of {total} requests answered")
    first, sample = failed[0]
    return MetricVerdict(
        Metric.ERRORS,
        Verdict.FAIL,
        f"{len(failed)} of {total} requests failed; prompt {first}: {sample.problem}",
    )


def _absolute(canary: Measurement) -> tuple[MetricVerdict, ...]:
    """The figures of a server with nothing to compare with: said, never passed."""
    answered = [s for s in canary.samples if s.ok]
    tokens = sum(s.completion_tokens or 0 for s in answered)
    accept = [a for a in (s.accept_length for s in answered) if a is not None]
    ttft = [t for t in (s.first_token_seconds for s in answered) if t is not None]
    tpot = [t for t in (s.time_per_output_token for s in answered) if t is not None]
    return (
        MetricVerdict(Metric.TOKENS, Verdict.NO_BASELINE, f"{tokens} tokens, nothing to compare"),
        MetricVerdict(
            Metric.SPECULATION,
            Verdict.NO_BASELINE,
            f"median accept length {median(accept):.2f}"
            if accept
            else "no speculative decoding reported",
        ),
        MetricVerdict(Metric.TTFT, Verdict.NO_BASELINE, _median_ms(ttft)),
        MetricVerdict(Metric.TPOT, Verdict.NO_BASELINE, _median_ms(tpot)),
    )


def _median_ms(values: Sequence[float]) -> str:
    return f"median {median(values) * 1000:.2f} ms" if values else "not measured"


# -- tokens ---------------------------------------------------------------------------------


def first_divergence(
    index: int, base: Decoded, changed: Decoded, margin: float
) -> Divergence | None:
    """Where two greedy decodes of one prompt first differ: by token id when both sides gave
    ids (a near tie when each side rates the other's token within `margin` nats of its own:
    `_near_tie`), then by the text the client receives (the same ids detokenized differently is
    never a tie); by text alone when a side gave no ids. None when they are equal."""
    if base.output_ids is not None and changed.output_ids is not None:
        ours, theirs = base.output_ids, changed.output_ids
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
        if at is None and len(ours) != len(theirs):  # one stopped earlier: no pair of tokens
            at = min(len(ours), len(theirs))
            return Divergence(index, at, _token(base, at), _token(changed, at), tie=False)
        if at is not None:
            tie, gap = _near_tie(base, changed, at, margin)
            return Divergence(index, at, _token(base, at), _token(changed, at), tie=tie, gap=gap)
        if base.text is None or changed.text is None or base.text == changed.text:
            return None
        return _text_divergence(index, base.text, changed.text, text_only=True)
    text_a, text_b = base.text or "", changed.text or ""
    if text_a == text_b:
        return None
    return _text_divergence(index, text_a, text_b, text_only=False)


def _text_divergence(index: int, text_a: str, text_b: str, *, text_only: bool) -> Divergence:
    at = next(
        (i for i, (a, b) in enumerate(zip(text_a, text_b, strict=False)) if a != b),
        min(len(text_a), len(text_b)),
    )
    shown = (repr(text_a[at : at + 8]), repr(text_b[at : at + 8]))
    return Divergence(index, at, *shown, tie=False if text_only else None, text_only=text_only)


def _near_tie(
    base: Decoded, changed: Decoded, at: int, margin: float
) -> tuple[bool | None, float | None]:
    """Whether the tokens at `at` are a near tie, and the gap: the wider of each side's gap in
    nats between its own token and the other's, by its own logprobs (as vLLM's
    `check_logprobs_close`). (False, None) when a side did not rate the other's token; (None,
    None) when a side gave no logprobs there."""
    ours, theirs = _rated(base, at), _rated(changed, at)
    if ours is None or theirs is None:
        return None, None
    own, other = (base.output_ids or ())[at], (changed.output_ids or ())[at]
    if not {own, other} <= ours.keys() or not {own, other} <= theirs.keys():
        return False, None
    gap = max(ours[own] - ours[other], theirs[other] - theirs[own])
    return gap <= margin, gap


def _rated(sample: Decoded, at: int) -> dict[int, float] | None:
    """The logprobs `sample` gave at position `at` by token id: its top-k and its own token."""
    tops, values = sample.top_ids, sample.top_logprobs
    if tops is None or values is None or at >= len(tops) or at >= len(values) or not tops[at]:
        return None
    rated = dict(zip(tops[at], values[at], strict=False))
    chosen = sample.token_logprobs
    if chosen is not None and at < len(chosen) and sample.output_ids is not None:
        rated.setdefault(sample.output_ids[at], chosen[at])
    return rated


def _token(sample: Decoded, at: int) -> str:
    """A token for the figures: its text when the server told it, and its id."""
    ids = sample.output_ids or ()
    if at >= len(ids):
        return "(end)"
    texts = sample.token_texts or ()
    text = texts[at] if at < len(texts) else None
    return f"{text!r} ({ids[at]})" if text is not None else f"id {ids[at]}"


def _tokens(pairs: Sequence[tuple[Decoded, Decoded]], settings: JudgeSettings) -> MetricVerdict:
    """Prompts that diverge beyond a near tie (or in text alone) fail past `max_untied`; any
    divergence, near ties included, fails past the `max_diverged` fraction; fewer near ties are
    marginal."""
    compared = [(i, b, c) for i, (b, c) in enumerate(pairs, 1) if b.ok and c.ok]
    found = [d for i, b, c in compared if (d := first_divergence(i, b, c, settings.tie_margin))]
    untied = [d for d in found if d.tie is not True]
    rule = f"a near tie within {settings.tie_margin:g} nats, top-{settings.top_k}"
    if any(d.tie is None for d in found):
        rule = "exact (no logprobs to compare)"
    figures = f"{len(found)} of {len(compared)} prompts diverged"
    if found:
        figures += f" ({len(untied)} beyond a near tie, {settings.max_untied} allowed; rule {rule})"
        first = untied[0] if untied else found[0]
        figures += f"; {_said(first)}"
    if len(untied) > settings.max_untied or (
        compared and len(found) / len(compared) > settings.max_diverged
    ):
        verdict = Verdict.FAIL
    elif found:
        verdict = Verdict.MARGINAL
    else:
        verdict = Verdict.PASS
    return MetricVerdict(Metric.TOKENS, verdict, figures, divergences=tuple(found[:10]))


def _said(divergence: Divergence) -> str:
    """One divergence for the figures: where, what each side gave, and how far apart."""
    where = "character" if divergence.text_only else "token"
    said = (
        f"prompt {divergence.prompt} at {where} {divergence.position}: "
        f"{divergence.baseline} -> {divergence.canary}"
    )
    if divergence.text_only:
        return f"{said} (the same token ids, another text)"
    if divergence.gap is not None:
        return f"{said} ({divergence.gap:.2f} nats apart)"
    if divergence.tie is False:
        return f"{said} (outside a side's top-k, or one ended)"
    return said


# -- distributions, pair by pair -------------------------------------------------------------


def compare_pairs(
    pairs: Sequence[tuple[float, float]],
    *,
    worse_when_higher: bool,
    threshold: float,
    alpha: float,
    floor: float = 0.0,
) -> tuple[Verdict, SignedRank, float, float]:
    """The verdict on (baseline, changed) pairs of positive values, the test, the median ratio
    changed / baseline and the median difference: a significant change in the bad direction
    (at `alpha`) of at least `threshold` (a fraction) and `floor` (in the values' unit) fails,
    a smaller significant one is marginal, anything else passes."""
    usable = [(b, c) for b, c in pairs if b > 0 and c > 0]
    test = signed_rank([math.log(c / b) for b, c in usable])
    ratio = median([c / b for b, c in usable]) if usable else 1.0
    difference = median([c - b for b, c in usable]) if usable else 0.0
    sign = 1 if worse_when_higher else -1
    significant = test.p_value < alpha and sign * test.effect > 0
    bad_change, bad_difference = sign * (ratio - 1), sign * difference
    if significant and bad_change >= threshold and bad_difference >= floor:
        return Verdict.FAIL, test, ratio, difference
    if significant and bad_change > 0:
        return Verdict.MARGINAL, test, ratio, difference
    return Verdict.PASS, test, ratio, difference


def _speculation(
    pairs: Sequence[tuple[Decoded, Decoded]],
    baseline: Measurement,
    canary: Measurement,
    settings: JudgeSettings,
) -> MetricVerdict:
    both = [(b, c) for b, c in pairs if b.ok and c.ok]
    accepted = [(b.accept_length, c.accept_length) for b, c in both]
    measured = [(b, c) for b, c in accepted if b is not None and c is not None]
    before = sum(1 for b, _ in accepted if b is not None)
    after = sum(1 for _, c in accepted if c is not None)
    if not measured:
        if before and not after:
            return MetricVerdict(
                Metric.SPECULATION,
                Verdict.FAIL,
                f"speculation stopped: the baseline verified drafts on {before} prompts, "
                "the changed server on none",
            )
        return MetricVerdict(
            Metric.SPECULATION, Verdict.PASS, "no speculative decoding reported on either side"
        )
    verdict, test, ratio, _ = compare_pairs(
        measured,
        worse_when_higher=False,
        threshold=settings.accept_drop,
        alpha=settings.alpha,
    )
    figures = (
        f"median accept length {median([b for b, _ in measured]):.2f} -> "
        f"{median([c for _, c in measured]):.2f} (per prompt {_percent(ratio)}, "
        f"p={test.p_value:.2g}, {len(measured)} prompts)"
        f"; over the set {_set_accept(b for b, _ in both):.2f} -> "
        f"{_set_accept(c for _, c in both):.2f}"
    )
    if baseline.spec_accept_length is not None or canary.spec_accept_length is not None:
        figures += (
            f"; gauge {_gauge(baseline.spec_accept_length)} -> {_gauge(canary.spec_accept_length)}"
        )
    return MetricVerdict(Metric.SPECULATION, verdict, figures, test=test)


def _set_accept(samples: Iterable[Decoded]) -> float:
    """Tokens per verify step over the whole set (what the server's gauge averages)."""
    chosen = [s for s in samples if s.spec_verify_ct]
    verified = sum(s.spec_verify_ct or 0 for s in chosen)
    return sum(s.completion_tokens or 0 for s in chosen) / verified if verified else 0.0


def _gauge(value: float | None) -> str:
    return "absent" if value is None else f"{value:.2f}"


def _percent(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%"


def _latency(
    metric: Metric,
    pairs: Sequence[tuple[Decoded, Decoded]],
    value: Callable[[Decoded], float | None],
    settings: JudgeSettings,
    in_turns: bool,
) -> MetricVerdict:
    timed = [(value(b), value(c)) for b, c in pairs if b.ok and c.ok]
    measured = tuple((b, c) for b, c in timed if b is not None and c is not None)
    verdict = _latency_of(metric, measured, len(timed), settings)
    if not in_turns:
        verdict = replace(verdict, figures=f"{verdict.figures}; measured one after the other")
    return verdict


def _latency_of(
    metric: Metric,
    measured: tuple[tuple[float, float], ...],
    compared: int,
    settings: JudgeSettings,
) -> MetricVerdict:
    """Latency pair by pair (`measured` of `compared` prompts answered on both sides);
    `unmeasured` (never a pass) on fewer pairs than the test needs to reach `alpha` at all
    (`fewest_pairs`): on those few no change could fail."""
    needed = fewest_pairs(settings.alpha)
    if len(measured) < needed:
        return MetricVerdict(
            metric,
            Verdict.UNMEASURED,
            f"{len(measured)} of {compared} prompts timed on both sides, needs {needed} to "
            f"reach alpha {settings.alpha:g} (the rest read by the host only once the server "
            "had finished)",
            timed=measured,
        )
    verdict, test, ratio, difference = compare_pairs(
        measured,
        worse_when_higher=True,
        threshold=settings.latency_rise,
        alpha=settings.alpha,
        floor=settings.latency_floor_ms / 1000,
    )
    how = (
        "first token of a streamed request"
        if metric == Metric.TTFT
        else "(last token - first token) / (tokens - 1), the same request"
    )
    figures = (
        f"median {median([b for b, _ in measured]) * 1000:.2f} -> "
        f"{median([c for _, c in measured]) * 1000:.2f} ms (per prompt {_percent(ratio)}, "
        f"{difference * 1000:+.2f} ms, p={test.p_value:.2g}, {len(measured)} of {compared} "
        f"prompts timed; timed on the host: {how})"
    )
    unsettled = verdict != Verdict.FAIL and ratio - 1 >= settings.latency_rise
    return MetricVerdict(metric, verdict, figures, test=test, timed=measured, unsettled=unsettled)


LATENCY = (Metric.TTFT, Metric.TPOT)


def unconfirmed(judgment: Judgment) -> tuple[Metric, ...]:
    """The latency metrics `judgment` fails, could not time on enough prompts, or saw rise past
    the threshold without telling it from noise: a second measurement decides (`confirm`)."""
    return tuple(
        m.metric for m in judgment.metrics if m.metric in LATENCY and (m.failed or m.unsettled)
    )


def confirm(first: Judgment, second: Judgment) -> Judgment:
    """`first`, each metric of `unconfirmed(first)` decided with `second` (measured again the
    same way: the changed server, and the baseline too where it still serves), and with both
    measurements' pairs pooled (where the baseline was measured again too). A fail stands where
    `second` fails too, or rises past the threshold and the pooled pairs fail; else it is
    marginal. An unmeasured or unsettled metric
    takes the pooled verdict, a fail only where `second` rises past the threshold too. Both
    figures are said."""
    candidates = unconfirmed(first)
    settings = first.settings or JudgeSettings()
    metrics = []
    for metric in first.metrics:
        if metric.metric not in candidates:
            metrics.append(metric)
            continue
        again = second.metric(metric.metric)
        both = metric.timed + again.timed
        pooled = _latency_of(metric.metric, both, len(both), settings)
        if not second.in_turns:
            # one baseline measurement in both (the canary's own, taken before the swap): its
            # pairs are not independent twice, so the second measurement decides alone
            pooled = replace(again, figures=f"not pooled, one baseline: {again.figures}")
        leans = again.failed or again.unsettled or again.verdict == Verdict.UNMEASURED
        if again.verdict == Verdict.FAIL or (pooled.verdict == Verdict.FAIL and leans):
            verdict = Verdict.FAIL
        elif metric.verdict == Verdict.FAIL:
            verdict = (
                Verdict.UNMEASURED if again.verdict == Verdict.UNMEASURED else Verdict.MARGINAL
            )
        elif pooled.verdict == Verdict.FAIL:
            verdict = Verdict.MARGINAL
        else:
            verdict = pooled.verdict
        figures = (
            f"{metric.figures}; measured again: {again.figures}; "
            f"both pooled ({verdict}): {pooled.figures}"
        )
        metrics.append(replace(metric, verdict=verdict, figures=figures, unsettled=False))
    worst = max((m.verdict for m in metrics), key=lambda v: v.rank)
    return replace(first, verdict=worst, metrics=tuple(metrics))
