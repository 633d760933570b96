"""The scheduler's side of a live fix: every TP rank applies it at the same scheduling boundary."""

from __future__ import annotations

import importlib
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

from . import answers, hooks, wire

METHOD = "opspatch_live"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
RECEIVER_MODULE = "sglang.srt.managers.scheduler_components.request_receiver"
IO_STRUCT_MODULE = "sglang.srt.managers.io_struct"

BOUNDARY_TIMEOUT_S = 60.0
"""How long the entry rank's socket waits for the request to be taken at a boundary (a long
batch is minutes on no server; a server that takes no step for this long is stuck), and then
again for every rank to apply it."""


class _Ticket:
    """One take or revert on its way: the message injected, and every rank's reply once done."""

    def __init__(self, message: Any) -> None:
        self.message = message
        self.done = threading.Event()
        self.replies: list[dict[str, Any]] = []


class SchedulerBoundary:
    """This scheduler process's live-fix state: its rank, its boundaries, what is queued."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: list[_Ticket] = []
        self._tickets: dict[str, _Ticket] = {}
        self.boundaries = 0
        self.rank: int | None = None
        self.entry = False
        self._message_class: Any = None

    def attach(self, scheduler: Any) -> None:
        """Learn this process's rank from its Scheduler, once it is built."""
        self.rank = tp_rank(scheduler)
        self.entry = self.rank == 0 and getattr(scheduler, "recv_from_tokenizer", None) is not None
        self._message_class = importlib.import_module(IO_STRUCT_MODULE).RpcReqInput

    def submit(
        self, request: dict[str, Any], timeout: float = BOUNDARY_TIMEOUT_S
    ) -> dict[str, Any]:
        """Queue `request` for the next boundary and wait until every rank applied it (on the
        entry rank's socket thread); every rank's reply, or why there is none."""
        if not self.entry:
            return wire.refusal(
                wire.NOT_ENTRY_RANK,
                f"TP rank {self.rank} does not receive the server's requests; send take and revert "
                "to the entry rank's socket (scheduler-tp0 on the head node), which every rank "
                "then applies at one boundary",
            )
        ticket_id = uuid.uuid4().hex
        ticket = _Ticket(
            self._message_class(method=METHOD, parameters={"request": request, "ticket": ticket_id})
        )
        with self._lock:
            self._queued.append(ticket)
            self._tickets[ticket_id] = ticket
        if not ticket.done.wait(timeout):
            with self._lock:
                if ticket in self._queued:  # never taken: withdrawn, nothing applied anywhere
                    self._queued.remove(ticket)
                    del self._tickets[ticket_id]
                    return wire.refusal(
                        wire.NO_BOUNDARY,
                        f"the scheduler reached no scheduling boundary within {timeout:g} s; "
                        "nothing was applied",
                    )
            if not ticket.done.wait(timeout):
                with self._lock:
                    self._tickets.pop(ticket_id, None)
                return wire.refusal(
                    wire.OUTCOME_UNKNOWN,
                    f"the request was taken at a boundary but the ranks did not finish within "
                    f"{timeout:g} s; ask `list` on every rank's socket",
                )
        return every_rank(ticket.replies)

    def take_queued(self) -> list[Any]:
        """The messages to inject at this boundary (the entry rank's; none elsewhere)."""
        if not self.entry:
            return []
        with self._lock:
            taken, self._queued = self._queued, []
        return [ticket.message for ticket in taken]

    def requeue(self, message: Any) -> None:
        """Put back a message a boundary did not read, first for the next one."""
        with self._lock:
            for ticket in self._tickets.values():
                if ticket.message is message and ticket not in self._queued:
                    self._queued.insert(0, ticket)

    def applied(self, ticket_id: str | None, replies: list[dict[str, Any]]) -> None:
        """Every rank's replies to the ticket, gathered on this rank (kept on the entry rank)."""
        with self._lock:
            ticket = self._tickets.get(ticket_id or "")
        if ticket is not None:
            ticket.replies = replies

    def finished(self, ticket_id: str | None) -> None:
        """The barrier after the ticket's method passed: its socket may answer."""
        with self._lock:
            ticket = self._tickets.pop(ticket_id or "", None)
        if ticket is not None:
            ticket.done.set()


STATE = SchedulerBoundary()
"""The one scheduler a process runs."""


def tp_rank(scheduler: Any) -> int | None:
    """The scheduler's rank in its TP group (`tp_group.rank_in_group`; older: `tp_rank`)."""
    rank = getattr(getattr(scheduler, "tp_group", None), "rank_in_group", None)
    if rank is None:
        rank = getattr(scheduler, "tp_rank", None)
    return None if rank is None else int(rank)


def every_rank(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """The entry rank's answer: its own reply, `ok` only when every rank's is, the first other
    rank's refusal when its own has none, and `ranks`: every rank's reply in rank order."""
    if not replies:
        return wire.refusal(wire.PLUGIN_ERROR, "no rank answered; the engine's log says why")
    combined = dict(replies[0])
    combined["ok"] = all(reply.get("ok") is True for reply in replies)
    if not combined["ok"] and not combined.get("refused"):
        failed = next(reply for reply in replies if reply.get("ok") is not True)
        refused = dict(
            failed.get("refused") or {"code": wire.PLUGIN_ERROR, "message": "no reason given"}
        )
        rank = (failed.get("process") or {}).get("rank")
        refused["message"] = f"TP rank {rank}: {refused.get('message')}"
        combined["refused"] = refused
    combined["ranks"] = replies
    return combined


def _gather(scheduler: Any, own: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's `own`, in rank order, over the TP group's CPU (gloo) group."""
    group: Any = getattr(scheduler, "tp_group", None)
    size = int(getattr(group, "world_size", 1) or 1)
    if size == 1:
        return [own]
    import torch.distributed as dist  # present wherever a scheduler runs; never at plugin load

    everyone: list[Any] = [None] * size
    dist.all_gather_object(everyone, own, group=group.cpu_group)
    return everyone


def opspatch_live(scheduler: Any, request: Any = None, ticket: str | None = None) -> None:
    """`Scheduler.opspatch_live`: called by `handle_rpc_request` on every rank at one boundary."""
    if ticket is None and isinstance(request, dict) and "ticket" in request:
        # releases that call `func(recv_req.parameters)`: the whole dict as one argument
        request, ticket = request.get("request"), request.get("ticket")
    if isinstance(request, dict):
        own = dict(answers.apply_here(request))
    else:
        own = wire.refusal(wire.BAD_REQUEST, "the RPC carried no request object")
    process = answers.describe("scheduler", STATE.rank)
    process["boundary"] = STATE.boundaries
    own["process"] = process
    STATE.applied(ticket, _gather(scheduler, own))


def _handle_rpc_request(
    original: Callable[..., Any], scheduler: Any, recv_req: Any, *args: Any, **kwargs: Any
) -> Any:
    if getattr(recv_req, "method", None) != METHOD:
        return original(scheduler, recv_req, *args, **kwargs)
    original(scheduler, recv_req, *args, **kwargs)  # our method on this rank, then the barrier
    STATE.finished((getattr(recv_req, "parameters", None) or {}).get("ticket"))
    return None  # answered on the socket: nothing for the tokenizer or an RPC caller


def _pull_raw_reqs(original: Callable[..., Any], receiver: Any, *args: Any, **kwargs: Any) -> Any:
    pulled = original(receiver, *args, **kwargs)
    STATE.boundaries += 1
    if pulled is None:  # not the entry rank: it takes what the entry rank broadcasts
        return pulled
    return [*pulled, *STATE.take_queued()]


class _Injecting:
    """The entry rank's `recv_from_tokenizer` for one boundary: the queued messages first."""

    def __init__(self, inner: Any, messages: list[Any]) -> None:
        self._inner = inner
        self.left = list(messages)

    def recv_pyobj(self, *args: Any, **kwargs: Any) -> Any:
        return self.left.pop(0) if self.left else self._inner.recv_pyobj(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _recv_requests(original: Callable[..., Any], scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    STATE.boundaries += 1
    injected = STATE.take_queued()
    inner = getattr(scheduler, "recv_from_tokenizer", None)
    if not injected or inner is None:
        return original(scheduler, *args, **kwargs)
    proxy = _Injecting(inner, injected)
    scheduler.recv_from_tokenizer = proxy
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        scheduler.recv_from_tokenizer = inner
        for message in proxy.left:  # not read this time (a receive limit): the next boundary
            STATE.requeue(message)


def install(listen: Callable[[int | None], None]) -> bool:
    """Hook the scheduler classes this process has loaded (it imports none); `listen(rank)` is
    called when a Scheduler is built. False when this process has no Scheduler class."""
    scheduler_module = sys.modules.get(SCHEDULER_MODULE)
    scheduler_class = getattr(scheduler_module, "Scheduler", None)
    if scheduler_class is None:
        return False
    receiver = getattr(sys.modules.get(RECEIVER_MODULE), "SchedulerRequestReceiver", None)
    if receiver is None or not hooks.around(receiver, "_pull_raw_reqs", _pull_raw_reqs):
        hooks.around(scheduler_class, "recv_requests", _recv_requests)
    hooks.around(scheduler_class, "handle_rpc_request", _handle_rpc_request)
    if getattr(scheduler_class, METHOD, None) is None:
        setattr(scheduler_class, METHOD, opspatch_live)

    def attach_and_listen(scheduler: Any) -> None:
        STATE.attach(scheduler)
        listen(STATE.rank)

    hooks.after_init(scheduler_class, attach_and_listen)
    return True
