"""Rollout policy: the playbook model (canary, batches, halting, timeouts, smoke and log
checks) and the pure fleet-policy functions (pure)."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from opspatch.core.codec import Record, json_field
from opspatch.core.judgeprompts import DEFAULT_JUDGE_PROMPTS
from opspatch.core.vocabulary import (
    FAILED_OUTCOMES,
    HaltAction,
    JudgeHosts,
    Outcome,
    RestartPolicy,
)

TIMEOUT_STEPS = (
    "lock",
    "inspect",
    "swap",
    "restart",
    "ready",
    "smoke",
    "restore",
    "restore_ready",
    "drain",
    "admit",
)
DEFAULT_FAIL_PATTERNS = (r"Scheduler hit an exception", r"Traceback \(most recent call last\)")
DEFAULT_IGNORE_PATTERNS = (r"post-warmup freeze_gc failed",)
"""Log lines that are no failure, with the traceback logged right after each. Real SGLang 0.5.23
started with `--skip-server-warmup` posts `/freeze_gc` before its HTTP server listens and, when
it loses that race, logs this warning with a traceback; it then serves normally."""
DEFAULT_PROMPTS = ("The capital of France is", "def fibonacci(n):")
MIN_SMOKE_TOKENS = 8  # fewer tokens can end at prefill and never run speculative verify
MAX_SMOKE_TOKENS = 4096


# ---------------------------------------------------------------------------------------------
# the model


@dataclass(frozen=True)
class BatchSize:
    """How many hosts go in one batch: a fixed `count`, or a `percent` of all selected hosts."""

    count: int | None = None
    percent: Decimal | None = None

    def __post_init__(self) -> None:
        if (self.count is None) == (self.percent is None):
            raise ValueError("a BatchSize has either a count or a percent")
        if self.count is not None and self.count < 1:
            raise ValueError("a batch holds at least one host")
        if self.percent is not None and not Decimal(0) < self.percent <= Decimal(100):
            raise ValueError("a batch percentage is above 0 and at most 100")

    def hosts_per_batch(self, selected: int) -> int:
        """Hosts per batch for a selection of `selected` hosts: a percentage rounds up, and a
        batch is never empty (25% of 3 hosts is 1 host, 25% of 5 is 2)."""
        if self.count is not None:
            return self.count
        assert self.percent is not None
        return max(1, math.ceil(Decimal(selected) * self.percent / Decimal(100)))

    def to_json(self) -> int | str:
        """As written in a playbook: a count, `"25%"`, or `"all"` for 100%."""
        if self.count is not None:
            return self.count
        return "all" if self.percent == 100 else f"{self.percent}%"

    def __str__(self) -> str:
        return str(self.to_json())


@dataclass(frozen=True)
class StepTimeouts(Record):
    """Seconds each step may take on one host; the rollout passes them as deadlines."""

    lock: float = 30.0
    inspect: float = 120.0
    swap: float = 60.0
    restart: float = 180.0
    ready: float = 1200.0
    smoke: float = 180.0
    restore: float = 120.0
    restore_ready: float = 1800.0
    """Readiness after a restore has its own, long deadline: an operator shortens `ready` to
    catch a start-up hang, and that must not turn a slow but healthy restore into
    needs-attention."""
    drain: float = 300.0
    """A worker behind a router: until it reports no request running or waiting."""
    admit: float = 120.0
    """A worker behind a router: until the router lists it healthy again."""


@dataclass(frozen=True)
class SmokePrompt(Record):
    """One greedy smoke decode: the prompt and, optionally, a regex its output must contain
    (checked on the host by `opspatch.hosts.agent.checks.judge_reply`)."""

    text: str
    expect: str | None = None


@dataclass(frozen=True)
class SmokeSettings(Record):
    """How a host is proven to decode after a restart."""

    prompts: tuple[SmokePrompt, ...] = tuple(SmokePrompt(p) for p in DEFAULT_PROMPTS)
    max_new_tokens: int = 16
    baseline: bool | Literal["required"] = False
    """Compare the smoke with a greedy decode of the unpatched server (patches that declare
    `preserves_output`). True: best effort, a baseline that cannot be taken is a note on the
    outcome; "required": a host whose baseline cannot be taken is refused before any change."""
    require_spec_verify: bool = True


@dataclass(frozen=True)
class LogSettings(Record):
    """Regular expressions that fail a host when they match the log written since the restart
    (scanned on the host by `opspatch.hosts.agent.checks.scan_log`), and those that pass a line
    over, with the traceback logged right after it (a warning the engine logs with its
    traceback and lives on)."""

    fail_patterns: tuple[str, ...] = DEFAULT_FAIL_PATTERNS
    ignore_patterns: tuple[str, ...] = DEFAULT_IGNORE_PATTERNS


@dataclass(frozen=True)
class RotationSettings(Record):
    """Hosts behind a router: how many of one router's workers may be out of rotation at once
    (`max_unavailable`, a count or a percentage of its workers, rounded up), and whether the
    fleet is already down (`fleet_down`: the incident playbook drains even the last healthy
    worker, since nothing healthy is left to protect)."""

    max_unavailable: BatchSize = json_field(
        default=BatchSize(count=1), encode=lambda size: size.to_json()
    )
    fleet_down: bool = False


MIN_JUDGE_PROMPTS = 9
"""Fewer pairs cannot reach the judge's default significance level, 0.01 (the signed-rank test's
normal approximation: 8 pairs that all agree have p = 0.014; `pairedstats.fewest_pairs`)."""
MAX_JUDGE_WARMUP = 64
MAX_JUDGE_REPEATS = 8
"""More unmeasured requests than this before a measurement is a typo, not a warm-up."""


@dataclass(frozen=True)
class JudgeSettings(Record):
    """The judge (a playbook's `[judge]`): after the smoke passes, a prompt set is decoded on the
    changed server and on a baseline measured in the same run, and compared per metric
    (`opspatch.runs.judgments.canary`). The thresholds say when a difference fails a host."""

    prompts: tuple[str, ...] = DEFAULT_JUDGE_PROMPTS
    prompt_source: str = "built-in"
    """Where the prompts came from: `built-in` or the file the playbook names."""
    count: int = 24
    """How many prompts of the set are decoded (the first `count`)."""
    max_new_tokens: int = 64
    """Enough for a whole number of verify steps to show a few percent of acceptance."""
    top_k: int = 5
    """Top logprobs asked per position: a divergent token's log-probability on the other side is
    known only when it is within that side's top-k."""
    hosts: JudgeHosts = JudgeHosts.CANARY
    alpha: float = 0.01
    """Significance level of every distribution comparison (two-sided)."""
    accept_drop: float = 0.03
    """A significant drop of the median acceptance length beyond this fraction fails."""
    latency_rise: float = 0.5
    """A significant rise of the median time to first token or per output token beyond this
    fraction fails (0.5: half as slow again)."""
    latency_floor_ms: float = 1.0
    """A rise smaller than this many milliseconds is noise, whatever its ratio."""
    max_diverged: float = 0.25
    """The fraction of prompts whose outputs may diverge, near ties included, before tokens
    fail."""
    tie_margin: float = 0.5
    """Nats: where two greedy outputs first differ, a near tie (numerics, not a change) is a pair
    of tokens that each side rates within this margin of each other (vLLM's check with a
    margin); a wider gap, or a token outside a side's top-k, diverges beyond a tie."""
    max_untied: int = 0
    """Prompts that may diverge beyond a near tie (or differ in text with the same token ids)
    before tokens fail."""
    warmup: int = 3
    """Unmeasured requests each server decodes before it is measured: a freshly restarted
    server's first requests are slower, on any code."""
    repeats: int = 2
    """Rounds each server decodes the prompts in; a prompt's fastest decode is its sample (load
    only adds time, and an episode of it rarely lasts into the next round)."""
    timeout: float = 600.0
    """Seconds for the whole prompt set on one server."""

    @property
    def chosen(self) -> tuple[str, ...]:
        """The prompts decoded: the set's first `count`."""
        return self.prompts[: self.count]


DEFAULT_LEASE_EXPIRY = 60.0
"""Seconds a run's lease on its hosts outlives its controller's last heartbeat."""


@dataclass(frozen=True)
class TeamSettings(Record):
    """Several operators on one ledger: how long a run's lease on its hosts outlives its last
    heartbeat (`lease_expiry`, seconds; the heartbeat renews it every third of that), and whether
    an apply needs a second operator's signature of the patch (`require_approval`), verified
    against `allowed_signers` (an OpenSSH allowed_signers file, an absolute path once loaded)."""

    lease_expiry: float = DEFAULT_LEASE_EXPIRY
    require_approval: bool = False
    allowed_signers: str | None = None


@dataclass(frozen=True)
class Playbook(Record):
    """A rollout policy plus its verification procedure (see the module docstring for fields).

    `canary` is a count or a tuple of host names; `max_in_flight` None means the whole batch;
    `source` is the file it was loaded from (not part of equality).
    """

    name: str = "default"
    description: str = ""
    canary: int | tuple[str, ...] = 1
    batch: BatchSize = json_field(
        default=BatchSize(percent=Decimal(25)), encode=lambda batch: batch.to_json()
    )
    max_in_flight: int | None = json_field(
        default=8, encode=lambda limit: "all" if limit is None else limit
    )
    max_failures: int = 1
    on_halt: HaltAction = HaltAction.STOP
    restart: RestartPolicy = RestartPolicy.ALWAYS
    """`always`: restart, wait, smoke after the swap; `never`: stage the patched file only (the
    host is `staged`; `opspatch restart` completes it)."""
    timeouts: StepTimeouts = StepTimeouts()
    smoke: SmokeSettings = SmokeSettings()
    log: LogSettings = LogSettings()
    rotation: RotationSettings = RotationSettings()
    team: TeamSettings = TeamSettings()
    judge: JudgeSettings | None = json_field(default=None, omit_none=True)
    """The judge after the smoke; None (no `[judge]`): the smoke alone proves a host."""
    source: str | None = field(default=None, compare=False)

    def in_flight(self, batch_size: int) -> int:
        """How many hosts of a batch of `batch_size` are worked on at once."""
        if self.max_in_flight is None:
            return batch_size
        return min(self.max_in_flight, batch_size)

    def halt_reason(
        self, outcomes: Mapping[str, str], *, canaries: Collection[str] = ()
    ) -> str | None:
        """Why the rollout must stop now, given each finished host's outcome; None to go on.

        A host that needs attention always halts (its state is unknown); so does any failed
        canary (that is what a canary is for); otherwise `max_failures` failed hosts halt.
        Failed means an outcome in `FAILED_OUTCOMES`.
        """
        attention = sorted(h for h, o in outcomes.items() if o == Outcome.NEEDS_ATTENTION)
        if attention:
            return f"{_hosts_text(attention)} need{'s' if len(attention) == 1 else ''} attention"
        failed = sorted(h for h, o in outcomes.items() if o in FAILED_OUTCOMES)
        failed_canaries = [h for h in failed if h in canaries]
        if failed_canaries:
            return f"canary {_hosts_text(failed_canaries)} failed"
        if len(failed) >= self.max_failures:
            return (
                f"{len(failed)} host{'s' if len(failed) != 1 else ''} failed ({_hosts_text(failed)}); "
                f"the playbook halts at max_failures = {self.max_failures}"
            )
        return None


def _hosts_text(hosts: Sequence[str]) -> str:
    return ", ".join(hosts[:5]) + (f" and {len(hosts) - 5} more" if len(hosts) > 5 else "")


# ---------------------------------------------------------------------------------------------
# planning


@dataclass(frozen=True)
class Batch(Record):
    """Hosts rolled out together; `in_flight` of them at once. Canary batches come first."""

    hosts: tuple[str, ...]
    canary: bool
    in_flight: int


@dataclass(frozen=True)
class RolloutPlan(Record):
    """The order a rollout takes, and notes on choices the operator may not expect."""

    batches: tuple[Batch, ...]
    notes: tuple[str, ...] = ()

    @property
    def canaries(self) -> tuple[str, ...]:
        return tuple(h for b in self.batches if b.canary for h in b.hosts)


def plan_rollout(playbook: Playbook, hosts: Sequence[str]) -> RolloutPlan:
    """Split the selected `hosts` (in selection order) into batches: canaries, then the rest.

    The canaries form one batch: the first `canary` hosts of the selection, or the named ones
    that are selected (in the playbook's order). The others follow in batches of
    `playbook.batch` hosts, a percentage being of all selected hosts (canaries included),
    rounded up. Named canaries that are not selected are left out, with a note.

    Raises:
        ValueError: a host appears twice in `hosts` (the selection should have merged them).
    """
    duplicates = sorted({h for h in hosts if list(hosts).count(h) > 1})
    if duplicates:
        raise ValueError(f"hosts selected twice: {', '.join(duplicates)}")
    if not hosts:
        return RolloutPlan(batches=(), notes=("no hosts are selected",))
    notes: list[str] = []
    if isinstance(playbook.canary, int):
        canaries = tuple(hosts[: playbook.canary])
        if playbook.canary > len(hosts):
            notes.append(
                f"canary = {playbook.canary} but {len(hosts)} host"
                f"{'s are' if len(hosts) != 1 else ' is'} selected: every host is a canary"
            )
    else:
        canaries = tuple(h for h in playbook.canary if h in hosts)
        absent = [h for h in playbook.canary if h not in hosts]
        if absent:
            notes.append(f"canary {_hosts_text(absent)} not selected; left out of this rollout")
        if not canaries:
            notes.append("none of the named canaries is selected: this rollout has no canary")
    batches: list[Batch] = []
    if canaries:
        batches.append(Batch(canaries, True, playbook.in_flight(len(canaries))))
    rest = [h for h in hosts if h not in canaries]
    size = playbook.batch.hosts_per_batch(len(hosts))
    for start in range(0, len(rest), size):
        chunk = tuple(rest[start : start + size])
        batches.append(Batch(chunk, False, playbook.in_flight(len(chunk))))
    return RolloutPlan(batches=tuple(batches), notes=tuple(notes))


def plan_batches(playbook: Playbook, hosts: Sequence[str]) -> list[list[str]]:
    """`plan_rollout` as plain lists of host names, canary batch first.

    Raises:
        ValueError: a host appears twice in `hosts`.
    """
    return [list(batch.hosts) for batch in plan_rollout(playbook, hosts).batches]
