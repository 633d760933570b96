"""How a scheduler receives its requests at a scheduling boundary (SGLang 0.5.13 and later keep
this in `SchedulerRequestReceiver`; the stand-in keeps its shape and names).

The entry rank (TP0 on node 0, the one rank with a pipe from the tokenizer manager) pulls what
arrived (`_pull_raw_reqs`), and the list rides one broadcast over the TP group
(`_broadcast_reqs_across_ranks`), so every rank admits the same requests and runs the same RPCs
at the same step. `local_reqs` are requests the caller decided on the entry rank; they ride the
same broadcast, after the pulled ones. Other ranks pull nothing (None) and take the broadcast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from sglang.srt.distributed.parallel_state import broadcast_pyobj

# Seconds the entry rank waits for a request while idle before the (empty) step that keeps every
# rank's loop in step with it: idle, the loop still turns, as SGLang's does.
IDLE_POLL_S = 0.05


@dataclass(kw_only=True, slots=True, frozen=True)
class SchedulerRequestReceiver:
    recv_from_tokenizer: Connection | None
    tp_rank: int
    tp_size: int
    is_idle: Callable[[], bool]

    def recv_requests(self, local_reqs: list[Any] | None = None) -> list[Any]:
        """What the entry rank received since the last step, the same list on every rank."""
        recv_reqs = self._pull_raw_reqs()
        return self._broadcast_reqs_across_ranks(recv_reqs, local_reqs)

    def _pull_raw_reqs(self) -> list[Any] | None:
        """Everything waiting on the tokenizer pipe (on the entry rank; None on the others)."""
        if self.recv_from_tokenizer is None:
            return None
        recv_reqs: list[Any] = []
        if self.recv_from_tokenizer.poll(IDLE_POLL_S if self.is_idle() else 0.0):
            recv_reqs.append(self.recv_from_tokenizer.recv())
            while self.recv_from_tokenizer.poll(0):
                recv_reqs.append(self.recv_from_tokenizer.recv())
        return recv_reqs

    def _broadcast_reqs_across_ranks(
        self, recv_reqs: list[Any] | None, local_reqs: list[Any] | None = None
    ) -> list[Any]:
        if recv_reqs is not None:
            recv_reqs = [*recv_reqs, *(local_reqs or [])]
        if self.tp_size > 1:
            recv_reqs = broadcast_pyobj(recv_reqs if self.tp_rank == 0 else None, src=0)
        return recv_reqs or []
