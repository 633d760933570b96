"""The judge's statistics and verdicts (pure): the signed-rank test against worked values, each
metric's verdict on made-up measurements, and, over many seeded synthetic runs, the A/A
false-positive rate (at most 1 in 100) and the power against the changes the judge exists for
(a 5% drop in acceptance length, a doubled time per output token, one changed token).

The synthetic servers: 24 prompts whose acceptance lengths lie between 1.5 and 4 and whose
times per token differ by prompt; every run of a server draws its own noise (2% on acceptance
length, 15% on each time), and `spec_verify_ct` is a whole number of verify steps over 64
tokens, as a server counts them.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from opspatch.core.pairedstats import median, ranks, signed_rank
from opspatch.core.policy import MIN_JUDGE_PROMPTS, JudgeSettings
from opspatch.core.vocabulary import Metric, Verdict
from opspatch.hosts.measure import Decoded, Measurement
from opspatch.runs.judgments.canary import (
    compare_pairs,
    confirm,
    first_divergence,
    judge,
    unconfirmed,
)

pytestmark = pytest.mark.pure

SETTINGS = JudgeSettings()
PROMPTS = 24
TOKENS = 64
VOCABULARY = 60


# -- the signed-rank test ----------------------------------------------------------------------


def test_ranks_share_the_mean_rank_of_a_tie_and_count_each_tie() -> None:
    assert ranks([3.0, 1.0, 2.0, 2.0]) == ([4.0, 1.0, 2.5, 2.5], [1, 2, 1])


def test_signed_rank_of_eight_positive_differences_matches_the_worked_normal_approximation() -> (
    None
):
    test = signed_rank([1, 2, 3, 4, 5, 6, 7, 8])
    # W+ = 36, mean 18, variance 8*9*17/24 = 51, z = (18 - 0.5) / sqrt(51)
    assert test.statistic == 36
    assert test.z == pytest.approx(17.5 / math.sqrt(51))
    assert test.p_value == pytest.approx(math.erfc(17.5 / math.sqrt(51) / math.sqrt(2)))
    assert test.effect == 1.0


def test_signed_rank_leaves_zeros_out_and_says_nothing_of_no_difference() -> None:
    assert signed_rank([0.0] * 10).p_value == 1.0
    test = signed_rank([0.0, 0.0, 1.0, -1.0])
    assert (test.pairs, test.nonzero, test.effect) == (4, 2, 0.0)


def test_the_tie_correction_takes_the_ties_out_of_the_variance() -> None:
    test = signed_rank([1.0] * 6 + [-1.0])
    # every |d| tied: ranks 4 each, W+ = 24, mean 14, variance 7*8*15/24 - (7**3 - 7)/48 = 28
    assert test.statistic == 24
    assert test.z == pytest.approx((24 - 14 - 0.5) / math.sqrt(28))


def test_median_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


# -- synthetic servers ---------------------------------------------------------------------------


def workload(seed: int) -> list[tuple[float, float]]:
    """Per prompt: its acceptance length and its time per output token (seconds)."""
    rng = random.Random(seed)
    return [(rng.uniform(1.5, 4.0), rng.uniform(0.004, 0.012)) for _ in range(PROMPTS)]


def server(
    rng: random.Random,
    prompts: list[tuple[float, float]],
    *,
    accept_scale: float = 1.0,
    tpot_scale: float = 1.0,
    changed_token: int | None = None,
) -> Measurement:
    """One run of a server over the workload: greedy outputs fixed per prompt (token `i * 7 +
    position` mod the vocabulary), top-5 ids around each, noisy speculation and times."""
    samples = []
    for index, (accept, tpot) in enumerate(prompts):
        ids = [(index * 7 + position) % VOCABULARY for position in range(TOKENS)]
        if changed_token is not None and index == 0:
            ids[changed_token] = (ids[changed_token] + VOCABULARY // 2) % VOCABULARY
        top = [(i, (i + 1) % VOCABULARY, (i + 2) % VOCABULARY) for i in ids]
        drawn = accept * accept_scale * math.exp(rng.gauss(0, 0.02))
        first = 0.02 * math.exp(rng.gauss(0, 0.15))
        per_token = tpot * tpot_scale * math.exp(rng.gauss(0, 0.15))
        samples.append(
            Decoded(
                prompt=f"prompt {index}",
                text="".join(chr(97 + i % 26) for i in ids),
                output_ids=tuple(ids),
                top_ids=tuple(top),
                top_logprobs=((-0.1, -2.5, -3.0),) * TOKENS,
                token_logprobs=(-0.1,) * TOKENS,
                completion_tokens=TOKENS,
                spec_verify_ct=max(1, round(TOKENS / drawn)),
                seconds=first + per_token * (TOKENS - 1),
                first_token_seconds=first,
            )
        )
    return Measurement(tuple(samples), spec_accept_length=None)


def judged(seed: int, **change: float | int) -> Verdict:
    prompts = workload(seed)
    rng = random.Random(seed * 7919 + 1)
    baseline = server(rng, prompts)
    canary = server(rng, prompts, **change)  # type: ignore[arg-type]
    return judge(canary, baseline, SETTINGS, baseline_from="the same host").verdict


RUNS = 400


def test_a_over_a_fails_at_most_one_run_in_a_hundred() -> None:
    verdicts = [judged(seed) for seed in range(RUNS)]
    failed = sum(v == Verdict.FAIL for v in verdicts)
    assert failed <= RUNS / 100, failed
    assert sum(v == Verdict.PASS for v in verdicts) >= RUNS * 0.97


@pytest.mark.parametrize(
    ("change", "metric"),
    [
        ({"accept_scale": 0.95}, Metric.SPECULATION),
        ({"tpot_scale": 2.0}, Metric.TPOT),
    ],
    ids=["acceptance-down-5pct", "tpot-doubled"],
)
def test_the_judge_fails_a_change_in_at_least_95_runs_in_100(
    change: dict[str, float], metric: Metric
) -> None:
    failed = 0
    for seed in range(200):
        prompts = workload(seed)
        rng = random.Random(seed)
        verdict = judge(
            server(rng, prompts, **change),
            server(rng, prompts),
            SETTINGS,
            baseline_from="the same host",
        )
        failed += verdict.metric(metric).verdict == Verdict.FAIL
    assert failed >= 190, failed


def test_one_changed_token_outside_the_top_k_fails_the_tokens_and_names_where() -> None:
    prompts = workload(1)
    rng = random.Random(1)
    verdict = judge(
        server(rng, prompts, changed_token=10),
        server(rng, prompts),
        SETTINGS,
        baseline_from="the same host",
    )
    tokens = verdict.metric(Metric.TOKENS)
    assert verdict.verdict == Verdict.FAIL and tokens.verdict == Verdict.FAIL
    assert tokens.divergences[0].prompt == 1 and tokens.divergences[0].position == 10
    assert tokens.divergences[0].tie is False and tokens.divergences[0].gap is None
    assert "1 of 24 prompts diverged (1 beyond a near tie, 0 allowed" in tokens.figures
    assert "tokens fail" in verdict.summary()


# -- one metric at a time ----------------------------------------------------------------------


def sample(ids: list[int], top: list[dict[int, float]] | None, **fields: object) -> Decoded:
    """A decode of `ids`; `top`: per position, the top logprobs by token id (the chosen token's
    among them)."""
    rated = {}
    if top is not None:
        rated = {
            "top_ids": tuple(tuple(position) for position in top),
            "top_logprobs": tuple(tuple(position.values()) for position in top),
            "token_logprobs": tuple(position[i] for i, position in zip(ids, top, strict=True)),
        }
    return Decoded(
        prompt="p",
        output_ids=tuple(ids),
        completion_tokens=len(ids),
        **rated,  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    )


def test_a_divergence_both_sides_rate_within_the_margin_is_a_near_tie() -> None:
    base = sample([1, 2, 3], [{1: 0.0}, {2: -0.60, 9: -0.75}, {3: 0.0}])
    changed = sample([1, 9, 3], [{1: 0.0}, {9: -0.70, 2: -0.72}, {3: 0.0}])
    found = first_divergence(4, base, changed, SETTINGS.tie_margin)
    assert found is not None
    assert (found.prompt, found.position, found.tie) == (4, 1, True)
    assert found.gap == pytest.approx(0.15)  # the wider side: the baseline's -0.60 vs -0.75


def test_a_divergence_within_the_top_k_but_wider_than_the_margin_is_no_tie() -> None:
    # the context window off by one: the new token is in the old side's top 5, 1.2 nats down
    base = sample([1, 2, 3], [{1: 0.0}, {2: -0.3, 4: -1.0, 9: -1.5, 5: -2.0, 6: -2.2}, {3: 0.0}])
    changed = sample([1, 9, 3], [{1: 0.0}, {9: -0.5, 2: -0.5, 4: -1.9}, {3: 0.0}])
    found = first_divergence(1, base, changed, SETTINGS.tie_margin)
    assert found is not None and found.tie is False
    assert found.gap == pytest.approx(1.2)


def test_a_divergence_outside_one_sides_top_k_is_no_tie_with_no_gap() -> None:
    base = sample([1, 2, 3], [{1: 0.0}, {2: -0.1, 9: -0.2}, {3: 0.0}])
    changed = sample([1, 9, 3], [{1: 0.0}, {9: -0.1, 5: -0.2}, {3: 0.0}])  # 2 not rated here
    found = first_divergence(1, base, changed, SETTINGS.tie_margin)
    assert found is not None and (found.tie, found.gap) == (False, None)


CONTEXT_WINDOW = [{1: 0.0}, {2: -0.3, 9: -1.5, 4: -1.6}, {3: 0.0}]
"""A prompt whose second token the changed server picks from the old side's top-k, 1.2 nats
below the old choice (the issue's context window off by one: 4 of 24 answers so changed)."""


def test_prompts_diverging_beyond_a_tie_fail_past_the_playbooks_threshold() -> None:
    base = [sample([1, 2, 3], CONTEXT_WINDOW) for _ in range(24)]
    moved = sample([1, 9, 3], [{1: 0.0}, {9: -0.5, 2: -0.5}, {3: 0.0}])
    changed = Measurement((moved,) * 4 + tuple(base[4:]))
    tokens = judge(changed, Measurement(tuple(base)), SETTINGS, baseline_from="h").metric(
        Metric.TOKENS
    )
    assert tokens.verdict == Verdict.FAIL  # was marginal: each token within the other's top-5
    assert "4 of 24 prompts diverged (4 beyond a near tie, 0 allowed" in tokens.figures
    assert "1.20 nats apart" in tokens.figures
    lenient = replace(SETTINGS, max_untied=4)
    tokens = judge(changed, Measurement(tuple(base)), lenient, baseline_from="h").metric(
        Metric.TOKENS
    )
    assert tokens.verdict == Verdict.MARGINAL  # 4 allowed, and 4 of 24 within max_diverged


def test_the_same_ids_with_another_text_fail_the_tokens() -> None:
    # a detokenizer change: a leading space dropped on 17 of 24 answers, the ids alike
    base = [sample([1, 2, 3], CONTEXT_WINDOW, text=" Paris is") for _ in range(24)]
    dropped = replace(base[0], text="Paris is")
    changed = Measurement((dropped,) * 17 + tuple(base[17:]))
    tokens = judge(changed, Measurement(tuple(base)), SETTINGS, baseline_from="h").metric(
        Metric.TOKENS
    )
    assert tokens.verdict == Verdict.FAIL  # was pass: ids compared only
    assert tokens.divergences[0].text_only and tokens.divergences[0].tie is False
    assert "17 of 24 prompts diverged (17 beyond a near tie" in tokens.figures
    assert "prompt 1 at character 0: ' Paris i' -> 'Paris is' (the same token ids" in (
        tokens.figures
    )


def test_without_logprobs_outputs_are_compared_exactly_and_the_figures_say_so() -> None:
    base = Measurement(tuple(sample([1, 2, i], None) for i in range(10)))
    changed = Measurement((sample([1, 5, 0], None), *base.samples[1:]))
    tokens = judge(changed, base, SETTINGS, baseline_from="h").metric(Metric.TOKENS)
    assert tokens.verdict == Verdict.FAIL
    assert "rule exact (no logprobs to compare)" in tokens.figures


def test_a_few_near_ties_are_marginal_and_many_fail() -> None:
    top = [{1: 0.0}, {2: -0.6, 9: -0.7}, {3: 0.0}]
    base = [sample([1, 2, 3], top) for _ in range(8)]
    near = sample([1, 9, 3], [{1: 0.0}, {9: -0.6, 2: -0.7}, {3: 0.0}])
    one = judge(
        Measurement((near, *base[1:])), Measurement(tuple(base)), SETTINGS, baseline_from="h"
    )
    assert one.metric(Metric.TOKENS).verdict == Verdict.MARGINAL
    many = judge(
        Measurement((near,) * 3 + tuple(base[3:])),
        Measurement(tuple(base)),
        SETTINGS,
        baseline_from="h",
    )
    assert many.metric(Metric.TOKENS).verdict == Verdict.FAIL  # 3 of 8 > max_diverged 0.25


def test_any_failed_request_fails_the_judge() -> None:
    base = Measurement(tuple(sample([1, 2], None) for _ in range(8)))
    broken = replace(base.samples[3], problem="no answer: ConnectionRefusedError")
    verdict = judge(
        Measurement((*base.samples[:3], broken, *base.samples[4:])),
        base,
        SETTINGS,
        baseline_from="h",
    )
    assert verdict.verdict == Verdict.FAIL
    assert verdict.metric(Metric.ERRORS).figures.startswith("1 of 8 requests failed; prompt 4")


def test_speculation_that_stopped_fails() -> None:
    base = Measurement(tuple(sample([1, 2, 3, 4], None, spec_verify_ct=2) for _ in range(8)))
    plain = Measurement(tuple(sample([1, 2, 3, 4], None) for _ in range(8)))
    speculation = judge(plain, base, SETTINGS, baseline_from="h").metric(Metric.SPECULATION)
    assert speculation.verdict == Verdict.FAIL
    assert "speculation stopped" in speculation.figures


def test_no_baseline_is_its_own_word_never_a_pass() -> None:
    canary = Measurement(tuple(sample([1, 2, 3], None, spec_verify_ct=1) for _ in range(8)))
    down = Measurement(
        tuple(replace(s, problem="no answer: connection refused") for s in canary.samples)
    )
    for baseline in (None, down):
        verdict = judge(canary, baseline, SETTINGS, baseline_from="host b")
        assert verdict.verdict == Verdict.NO_BASELINE and verdict.baseline is None
        assert {m.verdict for m in verdict.metrics} == {Verdict.PASS, Verdict.NO_BASELINE}
    assert "host b answered no prompt" in (
        judge(canary, down, SETTINGS, baseline_from="host b").why_no_baseline or ""
    )
    failing = Measurement((replace(canary.samples[0], problem="500"), *canary.samples[1:]))
    assert judge(failing, None, SETTINGS, baseline_from=None).verdict == Verdict.FAIL


def test_a_first_token_read_after_the_server_finished_times_no_decode() -> None:
    read_late = Decoded(
        "p", completion_tokens=64, seconds=0.0502, first_token_seconds=0.050, server_seconds=0.04
    )
    assert read_late.first_token_seconds == 0.050  # still what the client waited for it
    assert read_late.time_per_output_token is None  # the last came right behind: no decode
    in_time = replace(read_late, seconds=0.1, first_token_seconds=0.01, server_seconds=0.095)
    assert in_time.time_per_output_token == pytest.approx(0.09 / 63)


def read_late(measurement: Measurement, keep: int = 0) -> Measurement:
    """`measurement` as a host too busy to read its streams as they came would time it (each last
    token right behind its first: a time per token near 0), but its first `keep` prompts."""
    return Measurement(
        tuple(
            s
            if i < keep
            else replace(
                s,
                first_token_seconds=(s.seconds or 0) + 0.001,
                seconds=(s.seconds or 0) + 0.0011,
                server_seconds=s.seconds,
            )
            for i, s in enumerate(measurement.samples)
        )
    )


def test_a_baseline_read_late_is_no_reason_to_fail_the_time_per_token() -> None:
    prompts = workload(6)
    rng = random.Random(6)
    canary = server(rng, prompts)
    late = read_late(server(rng, prompts))
    tpot = judge(canary, late, SETTINGS, baseline_from="itself").metric(Metric.TPOT)
    assert tpot.verdict != Verdict.FAIL and tpot.test is None  # no near-zero baseline compared


@pytest.mark.parametrize("timed", [0, 1, 2, 7])
def test_a_latency_timed_on_too_few_prompts_is_unmeasured_and_fails_the_judgment(
    timed: int,
) -> None:
    """The slower-tpot case seen on a loaded host (1 of 12 prompts timed, p=1.0: a pass): a
    test on fewer pairs than a playbook may decode prompts cannot fail, so it never passes."""
    prompts = workload(7)
    rng = random.Random(7)
    slower = server(rng, prompts, tpot_scale=2.0)
    judgment = judge(
        slower, read_late(server(rng, prompts), keep=timed), SETTINGS, baseline_from="x"
    )
    tpot = judgment.metric(Metric.TPOT)
    assert (tpot.verdict, judgment.verdict) == (Verdict.UNMEASURED, Verdict.UNMEASURED)
    assert judgment.failed and tpot.failed and tpot.test is None
    assert judgment.metric(Metric.TTFT).verdict == Verdict.PASS  # timed on every prompt
    assert unconfirmed(judgment) == (Metric.TPOT,)  # measured again before the verdict stands


def test_a_latency_timed_on_as_many_prompts_as_a_playbook_decodes_is_judged() -> None:
    prompts = workload(8)
    rng = random.Random(8)
    slower = server(rng, prompts, tpot_scale=2.0)
    base = read_late(server(rng, prompts), keep=MIN_JUDGE_PROMPTS)
    tpot = judge(slower, base, SETTINGS, baseline_from="x", in_turns=True).metric(Metric.TPOT)
    assert tpot.verdict == Verdict.FAIL and tpot.test is not None
    assert tpot.test.pairs == MIN_JUDGE_PROMPTS


def test_an_unmeasured_latency_takes_the_verdict_of_the_measurement_again() -> None:
    prompts = workload(9)
    rng = random.Random(9)
    baseline = server(rng, prompts)
    first = judge(server(rng, prompts), read_late(baseline, keep=1), SETTINGS, baseline_from="x")
    timed = confirm(first, judge(server(rng, prompts), baseline, SETTINGS, baseline_from="x"))
    assert (timed.verdict, timed.metric(Metric.TPOT).verdict) == (Verdict.PASS, Verdict.PASS)
    slow = server(rng, prompts, tpot_scale=2.0)
    again = judge(slow, baseline, SETTINGS, baseline_from="x", in_turns=True)
    assert confirm(first, again).metric(Metric.TPOT).verdict == Verdict.FAIL
    still = judge(server(rng, prompts), read_late(baseline), SETTINGS, baseline_from="x")
    assert confirm(first, still).verdict == Verdict.UNMEASURED


def test_a_latency_fail_the_second_measurement_cannot_time_stands() -> None:
    prompts = workload(10)
    rng = random.Random(10)
    baseline = server(rng, prompts)
    first = judge(server(rng, prompts, tpot_scale=2.0), baseline, SETTINGS, baseline_from="x")
    # the baseline measured again (in turns) and read late: the second timed no pair
    untimed = judge(
        server(rng, prompts), read_late(baseline), SETTINGS, baseline_from="x", in_turns=True
    )
    assert confirm(first, untimed).metric(Metric.TPOT).verdict == Verdict.FAIL


def test_a_slower_but_small_rise_is_marginal_and_a_rise_under_the_floor_passes() -> None:
    base = [(0.010 * (1 + i / 10), 0.0) for i in range(16)]
    slower = [(b, b * 1.2) for b, _ in base]
    verdict, _, ratio, _ = compare_pairs(
        slower, worse_when_higher=True, threshold=0.5, alpha=0.01, floor=0.001
    )
    assert verdict == Verdict.MARGINAL and ratio == pytest.approx(1.2)
    tiny = [(b / 1000, b / 1000 * 3) for b, _ in base]  # three times as slow, microseconds
    assert (
        compare_pairs(tiny, worse_when_higher=True, threshold=0.5, alpha=0.01, floor=0.001)[0]
        == Verdict.MARGINAL
    )


def test_measured_apart_a_latency_fail_a_second_measurement_does_not_repeat_is_marginal() -> None:
    prompts = workload(3)
    rng = random.Random(3)
    baseline = server(rng, prompts)
    slow = server(rng, prompts, tpot_scale=2.0)  # a load came between the two measurements
    first = judge(slow, baseline, SETTINGS, baseline_from="itself")
    assert unconfirmed(first) == (Metric.TPOT,)
    assert "measured one after the other" in first.metric(Metric.TPOT).figures
    second = judge(server(rng, prompts), baseline, SETTINGS, baseline_from="itself")
    confirmed = confirm(first, second)
    tpot = confirmed.metric(Metric.TPOT)
    assert (confirmed.verdict, tpot.verdict) == (Verdict.MARGINAL, Verdict.MARGINAL)
    assert "measured again: median" in tpot.figures  # both measurements' figures said
    assert confirmed.metric(Metric.SPECULATION) == first.metric(Metric.SPECULATION)


def test_measured_apart_a_latency_fail_the_second_measurement_repeats_stands() -> None:
    prompts = workload(4)
    rng = random.Random(4)
    baseline = server(rng, prompts)
    first = judge(server(rng, prompts, tpot_scale=2.0), baseline, SETTINGS, baseline_from="x")
    second = judge(server(rng, prompts, tpot_scale=2.0), baseline, SETTINGS, baseline_from="x")
    confirmed = confirm(first, second)
    assert confirmed.verdict == Verdict.FAIL


def test_measured_in_turns_a_latency_fail_needs_no_confirmation_and_says_no_order() -> None:
    prompts = workload(5)
    rng = random.Random(5)
    baseline = server(rng, prompts)
    slow = server(rng, prompts, tpot_scale=2.0)
    judgment = judge(slow, baseline, SETTINGS, baseline_from="a peer", in_turns=True)
    assert judgment.metric(Metric.TPOT).verdict == Verdict.FAIL
    assert "one after the other" not in judgment.metric(Metric.TPOT).figures


def timed(tpots: list[float]) -> Measurement:
    """A server whose prompts took these times per token (16 tokens after the first)."""
    return Measurement(
        tuple(
            Decoded(
                f"p{i}",
                text="same",
                completion_tokens=17,
                first_token_seconds=0.02,
                seconds=0.02 + 16 * tpot,
                server_seconds=0.02 + 16 * tpot + 0.001,
            )
            for i, tpot in enumerate(tpots)
        )
    )


# a step four times as long on a loaded host: most prompts 4x, a few pairs turned the other way
# by a burst of load on the baseline's decode (the real engine beside other work, 12 prompts)
BASE = [0.010, 0.012, 0.011, 0.013, 0.010, 0.012, 0.014, 0.011, 0.070, 0.080, 0.090, 0.075]
SLOW = [0.040, 0.048, 0.044, 0.052, 0.040, 0.048, 0.056, 0.044, 0.060, 0.030, 0.035, 0.025]


def test_a_large_rise_the_test_cannot_tell_is_measured_again_and_pooled_it_fails() -> None:
    first = judge(timed(SLOW), timed(BASE), SETTINGS, baseline_from="x", in_turns=True)
    tpot = first.metric(Metric.TPOT)
    assert tpot.verdict == Verdict.PASS and tpot.test is not None and tpot.test.p_value > 0.01
    assert unconfirmed(first) == (Metric.TPOT,)  # per prompt +300%: unsettled, not a pass yet
    # in turns: the baseline measured again too, pooled even where it timed the same (the
    # judgment says it was measured again; equal figures are no sign of one measurement)
    for again in (timed([b * 1.01 for b in BASE]), timed(BASE)):
        second = judge(timed(SLOW), again, SETTINGS, baseline_from="x", in_turns=True)
        decided = confirm(first, second)
        tpot = decided.metric(Metric.TPOT)
        assert (decided.verdict, tpot.verdict) == (Verdict.FAIL, Verdict.FAIL)
    # one after the other, one baseline measurement in both: not pooled (not independent)
    alone = confirm(first, judge(timed(SLOW), timed(BASE), SETTINGS, baseline_from="x"))
    assert alone.metric(Metric.TPOT).verdict == Verdict.PASS


def test_a_large_rise_the_second_measurement_does_not_repeat_is_not_a_fail() -> None:
    first = judge(timed(SLOW), timed(BASE), SETTINGS, baseline_from="x", in_turns=True)
    same = judge(timed(BASE), timed(BASE), SETTINGS, baseline_from="x", in_turns=True)
    decided = confirm(first, same)
    assert decided.metric(Metric.TPOT).verdict in (Verdict.PASS, Verdict.MARGINAL)
    assert not decided.failed
