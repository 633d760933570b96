"""The judge in a run: a host's baseline measured before its swap, its verdict after its smoke."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import replace
from typing import TypeGuard

from opspatch.core.host import Unit
from opspatch.core.policy import JudgeSettings
from opspatch.core.reasons import Reason
from opspatch.core.verdicts import Judgment
from opspatch.core.vocabulary import JudgeHosts, Outcome, Step
from opspatch.errors import OpspatchError
from opspatch.hosts.measure import Measurement
from opspatch.runs.fleet.group import Nodes, failing_as, through_head
from opspatch.runs.fleet.session import HostFailed, HostSession, describe_error
from opspatch.runs.judgments.canary import confirm, judge, unconfirmed
from opspatch.runs.report import HostOutcome

OWN_BASELINE = "this host's old server, before the swap"


class JudgeFailed(HostFailed):
    """A judge whose verdict is `fail`: a failed proof, naming the metric(s) and figures."""

    def __init__(self, judgment: Judgment) -> None:
        super().__init__(Outcome.FAILED, judgment.summary(), Reason.JUDGE_FAILED)
        self.judgment = judgment


def measured(session: HostSession, settings: JudgeSettings, step: Step) -> Measurement | str:
    """The judge's prompts decoded on the session's server, or why the agent could not."""
    try:
        return session.engine.measure(settings, step=step)
    except OpspatchError as exc:
        return describe_error(exc)


def answered(measurement: Measurement | str) -> TypeGuard[Measurement]:
    """A server that answered at least one of the judge's prompts."""
    return isinstance(measurement, Measurement) and any(s.ok for s in measurement.samples)


CONFIRM_AFTER_SECONDS = 2.0
"""An episode of load over the first measurement has passed by then; a slower server has not."""

PROMPTS_PER_TURN = 6
"""A prompt's two decodes seconds apart, yet an agent exec per turn cheap beside the decodes."""


def measured_in_turns(
    baseline: HostSession, canary: HostSession, settings: JudgeSettings
) -> tuple[Measurement | str, Measurement | str]:
    """ABBA turns, so that passing load meets both sides alike."""
    prompts = settings.chosen
    parts: dict[str, list[Measurement] | str] = {baseline.name: [], canary.name: []}
    for turn, start in enumerate(range(0, len(prompts), PROMPTS_PER_TURN)):
        chunk = prompts[start : start + PROMPTS_PER_TURN]
        warmup = settings.warmup if turn == 0 else 0
        these = replace(settings, prompts=chunk, count=len(chunk), warmup=warmup)
        for session in (baseline, canary) if turn % 2 == 0 else (canary, baseline):
            done = parts[session.name]
            if isinstance(done, list):
                answer = measured(session, these, Step.JUDGE)
                parts[session.name] = answer if isinstance(answer, str) else [*done, answer]
    return _joined(parts[baseline.name]), _joined(parts[canary.name])


def _joined(parts: list[Measurement] | str) -> Measurement | str:
    """One server's turns as one measurement (the gauge as its last turn read it)."""
    if isinstance(parts, str):
        return parts
    gauges = [m.spec_accept_length for m in parts if m.spec_accept_length is not None]
    samples = tuple(sample for part in parts for sample in part.samples)
    return Measurement(samples, gauges[-1] if gauges else None)


def judge_step(
    session: HostSession,
    settings: JudgeSettings,
    baseline: Measurement | None,
    *,
    baseline_from: str | None,
    why_no_baseline: str | None,
    beside: tuple[HostSession, threading.Lock] | None = None,
) -> Judgment:
    """A latency fail stands only if a second measurement fails too. With `beside`, the peer
    measured in turns is the baseline."""

    def measured_and_judged() -> Judgment:
        base, base_from, in_turns = baseline, baseline_from, False
        if beside is None:
            canary = measured(session, settings, Step.JUDGE)
        else:
            peer, peer_lock = beside
            with peer_lock:
                again, canary = measured_in_turns(peer, session, settings)
            if answered(again):
                base, in_turns = again, True
            else:
                problem = again if isinstance(again, str) else again.problem
                base_from = f"{baseline_from}, measured before the swap (then: {problem})"
        if isinstance(canary, str):
            raise HostFailed(Outcome.FAILED, f"{Step.JUDGE}: {canary}")
        return judge(
            canary,
            base,
            settings,
            baseline_from=base_from,
            why_no_baseline=why_no_baseline,
            in_turns=in_turns,
        )

    with session.step(Step.JUDGE) as note:
        judgment = measured_and_judged()
        if unconfirmed(judgment):
            time.sleep(CONFIRM_AFTER_SECONDS)
            judgment = confirm(judgment, measured_and_judged())
        if judgment.failed:
            raise JudgeFailed(judgment)
        note["detail"] = f"{judgment.summary()}; {judgment.details()}"
    return judgment


class HostJudge:
    """`take_baseline` before the swap, `__call__` after the smoke; `judgment` once given."""

    def __init__(
        self, settings: JudgeSettings, peers: Sequence[HostSession], peer_lock: threading.Lock
    ) -> None:
        self.settings = settings
        self.peers = peers
        self._peer_lock = (
            peer_lock  # a peer's session is not in flight, but two canaries may ask it
        )
        self.baseline: Measurement | None = None
        self.baseline_from: str | None = None
        self.peer: HostSession | None = None
        """The peer the baseline came from: measured again in turns with the changed server."""
        self.why_no_baseline: str | None = None
        self.judgment: Judgment | None = None

    def take_baseline(self, session: HostSession) -> None:
        """Never a failure of the host: the change has not been made yet."""
        with session.step(Step.JUDGE_BASELINE) as note:
            own = measured(session, self.settings, Step.JUDGE_BASELINE)
            if answered(own):
                self.baseline, self.baseline_from = own, OWN_BASELINE
            elif isinstance(own, Measurement) and not own.no_server:
                self.why_no_baseline = (
                    f"the old server failed the judge's prompts ({own.problem}); no other host "
                    "of its build was asked, it would fail them too"
                )
            else:
                problem = own if isinstance(own, str) else f"no server listens: {own.problem}"
                self.why_no_baseline = f"this host's old server could not be asked ({problem})"
                self._from_peer()
            note["detail"] = (
                f"from {self.baseline_from}"
                if self.baseline is not None
                else f"no baseline: {self.why_no_baseline}"
            )

    def _from_peer(self) -> None:
        tried = []
        for peer in self.peers:
            with self._peer_lock:
                answer = measured(peer, self.settings, Step.JUDGE_BASELINE)
            if answered(answer):
                self.baseline, self.peer = answer, peer
                self.baseline_from = f"{peer.name} (same release and build, not yet changed)"
                return
            problem = answer if isinstance(answer, str) else answer.problem
            tried.append(f"{peer.name}: {problem}")
            if isinstance(answer, Measurement) and not answer.no_server:
                break  # its old code failed the prompts: the next host of its build would too
        if tried:
            self.why_no_baseline = f"{self.why_no_baseline}; nor could {'; '.join(tried)}"

    def through_head(self, nodes: Nodes) -> Judgment:
        """This judge as a group's proof calls it, after the smoke (`judge_through_head`)."""
        return judge_through_head(nodes, self)

    def carried(self, nodes: Nodes, outcomes: list[HostOutcome]) -> list[HostOutcome]:
        """The head's outcome carries the judge's verdict (its JSON `judgment`), once given."""
        if self.judgment is None:
            return outcomes
        return [
            replace(o, judgment=self.judgment) if o.host == nodes.head.name else o for o in outcomes
        ]

    def __call__(self, session: HostSession) -> Judgment:
        try:
            self.judgment = judge_step(
                session,
                self.settings,
                self.baseline,
                baseline_from=self.baseline_from,
                why_no_baseline=self.why_no_baseline,
                beside=(self.peer, self._peer_lock) if self.peer is not None else None,
            )
        except JudgeFailed as failed:
            self.judgment = failed.judgment
            raise
        return self.judgment


def judge_through_head(nodes: Nodes, judge: HostJudge) -> Judgment:
    """Each other node records a `judge` step naming the head's verdict."""
    with failing_as(nodes, nodes.head):
        try:
            judgment = judge(nodes.head)
        except HostFailed as failure:
            through_head(nodes, Step.JUDGE, JUDGED, failure.error, failed=True)
            raise
    through_head(nodes, Step.JUDGE, JUDGED, judgment.summary())
    return judgment


JUDGED = "judged through the head"


class JudgePlan:
    """A unit is judged by its head against its own old server; no node of a unit is another host's
    peer (only the head serves prompts)."""

    def __init__(
        self,
        settings: JudgeSettings,
        *,
        canaries: Collection[str],
        changing: Sequence[str],
        builds: Mapping[str, Hashable],
        sessions: Mapping[str, HostSession],
        units: Mapping[str, Unit] | None = None,
    ) -> None:
        self.settings = settings
        units = units or {}
        everyone = settings.hosts == JudgeHosts.ALL
        servers = [n for n in changing if n not in units or units[n].head == n]
        self.judged = [n for n in servers if everyone or n in canaries]
        alone_later = [n for n in changing if n not in canaries and n not in units]
        self.peers = {
            name: [sessions[n] for n in alone_later if builds.get(n) == builds.get(name)]
            if name in canaries and name not in units
            else []
            for name in self.judged
        }
        self._peer_lock = threading.Lock()

    def for_host(self, name: str) -> HostJudge | None:
        """The judge of host `name`, or None when the playbook does not judge it."""
        if name not in self.judged:
            return None
        return HostJudge(self.settings, self.peers[name], self._peer_lock)
