"""Base classes of the speculative workers: the draft side and the worker the scheduler calls."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

import torch

from sglang.srt.managers.schedule_batch import GenerationBatchResult, Req, ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

logger = logging.getLogger(__name__)


class EagleDraftWorkerBase(ABC):
    def __init__(self) -> None:
        self.cuda_graph_runner: CudaGraphRunner | None = None

    @abstractmethod
    def draft(self, req: Req, num_drafts: int) -> tuple[list[int], list[torch.Tensor] | None]:
        """Propose `num_drafts` tokens after `req`'s tokens."""


class BaseSpecWorker(ABC):
    """What every speculative worker offers the scheduler.

    Subclasses set `server_args`, `_target_worker` and `_draft_worker` in their `__init__`,
    then call `init_attention_backend()` and `init_cuda_graphs()`.
    """

    def __init__(self) -> None:
        self._additional_graph_memory_usage: dict[str, float] = {}
        self._additional_graph_time_usage: dict[str, float] = {}

    @property
    def target_worker(self) -> TpModelWorker:
        return self._target_worker

    @property
    def draft_worker(self) -> EagleDraftWorkerBase:
        return self._draft_worker

    def init_attention_backend(self) -> None:
        self.attn_backend = self.server_args.attention_backend
        logger.info(f"Attention backend: {self.attn_backend} (eager, cpu)")

    def init_cuda_graphs(self) -> None:
        """Capture decode graphs for the target and the draft; raises where CUDA is unusable."""
        if self.server_args.disable_cuda_graph:
            logger.info("CUDA graphs are disabled (--disable-cuda-graph); decoding eagerly")
            return
        hidden_size = self._target_worker.model.config.hidden_size
        self._target_worker.cuda_graph_runner = CudaGraphRunner("target", hidden_size)
        self._draft_worker.cuda_graph_runner = CudaGraphRunner("draft", hidden_size)

    @abstractmethod
    def forward_batch_generation(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """Run one prefill or decode step for every request of `batch`."""
