"""Comparing two servers on the same prompts (pure, standard library only)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opspatch.core.codec import Record, json_field


def _rounded(digits: int) -> Callable[[float], float]:
    return lambda value: round(value, digits)


@dataclass(frozen=True)
class SignedRank(Record):
    """Wilcoxon's signed-rank test of paired differences (zero differences left out, as
    Wilcoxon did), two-sided."""

    pairs: int
    """Differences given, zeros included."""
    nonzero: int
    """Differences that are not zero: the test's sample."""
    statistic: float = json_field(encode=_rounded(3))
    """W+: the sum of the ranks of the positive differences."""
    z: float = json_field(encode=_rounded(3))
    p_value: float = json_field(encode=_rounded(6))
    effect: float = json_field(encode=_rounded(3))
    """The matched-pairs rank-biserial correlation, (W+ - W-) / (W+ + W-), from -1 (every
    difference negative) to 1 (every one positive); 0 when every difference is zero."""


def ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """The rank of each value (1-based, tied values sharing their mean rank) and the size of
    each group of ties."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranked = [0.0] * len(values)
    ties: list[int] = []
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        mean_rank = (start + end) / 2 + 1
        for position in range(start, end + 1):
            ranked[order[position]] = mean_rank
        ties.append(end - start + 1)
        start = end + 1
    return ranked, ties


def signed_rank(differences: Sequence[float]) -> SignedRank:
    """Wilcoxon's signed-rank test of `differences` (changed minus baseline, per pair).

    The normal approximation is used at every size, with the variance corrected for ties and a
    continuity correction of one half, which keeps it conservative for the small sets a judge
    decodes (8 to a few dozen prompts). No difference other than zero: p = 1.
    """
    nonzero = [d for d in differences if d != 0]
    n = len(nonzero)
    if n == 0:
        return SignedRank(len(differences), 0, 0.0, 0.0, 1.0, 0.0)
    ranked, ties = ranks([abs(d) for d in nonzero])
    plus = sum(r for r, d in zip(ranked, nonzero, strict=False) if d > 0)
    total = n * (n + 1) / 2
    mean = total / 2
    variance = n * (n + 1) * (2 * n + 1) / 24 - sum(t**3 - t for t in ties) / 48
    if variance <= 0:
        z = 0.0
    else:
        z = math.copysign(max(abs(plus - mean) - 0.5, 0.0), plus - mean) / math.sqrt(variance)
    p_value = min(1.0, math.erfc(abs(z) / math.sqrt(2)))
    effect = (plus - (total - plus)) / total
    return SignedRank(len(differences), n, plus, z, p_value, effect)


def median(values: Sequence[float]) -> float:
    """The median (the mean of the two middle values of an even count).

    Raises:
        ValueError: `values` is empty.
    """
    if not values:
        raise ValueError("the median of no values")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def fewest_pairs(alpha: float) -> int:
    """The fewest pairs on which `signed_rank` can reach `alpha` (every difference one way):
    on fewer, no change, however large, is significant."""
    n = 1
    while signed_rank([float(i) for i in range(1, n + 1)]).p_value >= alpha:
        n += 1
    return n
