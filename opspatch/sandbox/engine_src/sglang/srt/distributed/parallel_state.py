"""The tensor-parallel group: one torch.distributed process group over gloo, on the CPU.

Every scheduler process (one per TP rank, on whichever node) joins it at start; joining waits
until every rank of every node has joined (at most `--dist-timeout` seconds). Rank 0 hosts the
rendezvous store at `--dist-init-addr`. Nothing rejoins: a rank that leaves breaks the group, and
the next collective of every other rank fails (or, where the loss is silent, waits out the
timeout), as with SGLang's NCCL groups.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

_LOOPBACK_HOSTS = ("localhost", "::1")


@dataclass(frozen=True)
class GroupCoordinator:
    """A rank's view of its group, with SGLang's names: `rank` (in the world), `ranks` (the
    group's world ranks), `rank_in_group`, `world_size`, and `cpu_group`, the gloo process group
    that control messages and barriers use (None for a group of one)."""

    rank: int
    world_size: int
    cpu_group: Any = None

    @property
    def ranks(self) -> list[int]:
        return list(range(self.world_size))

    @property
    def rank_in_group(self) -> int:
        return self.rank

    @property
    def is_first_rank(self) -> bool:
        return self.rank == 0


_TP: GroupCoordinator | None = None


def get_tp_group() -> GroupCoordinator:
    return _TP if _TP is not None else GroupCoordinator(0, 1)


def init_distributed_environment(
    world_size: int, rank: int, init_address: str | None, timeout_s: int | None
) -> GroupCoordinator:
    """Join the TP group (a no-op for one rank); returns this rank's view of it."""
    global _TP
    if world_size > 1:
        assert init_address is not None
        host = init_address.rpartition(":")[0].strip("[]")
        if host.startswith("127.") or host in _LOOPBACK_HOSTS:
            # gloo picks its interface from the host name by default; a group on loopback must
            # not depend on how this machine's name resolves.
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        logger.info(
            f"Init torch distributed begin. backend=gloo, world_size={world_size}, rank={rank}, "
            f"dist_init_addr={init_address}"
        )
        kwargs: dict[str, Any] = {}
        if timeout_s is not None:
            kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend="gloo",
            init_method=f"tcp://{init_address}",
            world_size=world_size,
            rank=rank,
            **kwargs,
        )
        logger.info("Init torch distributed ends.")
        # The TP group is the whole world here, and the world's backend is gloo already: its
        # default group is the TP group's CPU group as well.
        _TP = GroupCoordinator(rank, world_size, dist.group.WORLD)
    else:
        _TP = GroupCoordinator(rank, world_size)
    return _TP


def tensor_model_parallel_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over the TP ranks, in place (every rank gets the sum)."""
    if get_tp_group().world_size > 1:
        dist.all_reduce(tensor)
    return tensor


def broadcast_pyobj(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank (pickled over the group)."""
    if get_tp_group().world_size == 1:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def barrier(group: Any = None) -> None:
    """Wait until every rank of `group` (default: the TP group) reaches this point."""
    if get_tp_group().world_size > 1:
        dist.barrier(group=group)
