"""CUDA graph capture for the decode step.

The capture is real: it asks torch for a CUDA stream and records a graph on it. On a host without
CUDA (or with CUDA hidden by `CUDA_VISIBLE_DEVICES=`) torch raises, as SGLang's capture would on
hardware it cannot use; that failure is what the incident hinges on. The stand-in decodes on the
CPU either way: a captured graph is kept only to show that capture worked.
"""

from __future__ import annotations

import logging
import time

import torch

logger = logging.getLogger(__name__)

DEFAULT_CAPTURE_BATCH_SIZES = (1, 2, 4, 8)


class CudaGraphRunner:
    """Captures one graph per batch size; raises whatever torch raises when it cannot."""

    def __init__(
        self,
        name: str,
        hidden_size: int,
        batch_sizes: tuple[int, ...] = DEFAULT_CAPTURE_BATCH_SIZES,
    ):
        self.name = name
        self.graphs: dict[int, tuple[object, torch.Tensor, torch.Tensor]] = {}
        logger.info(
            f"Capture cuda graph begin ({name}). This can take up to several minutes. "
            f"bs={list(batch_sizes)}"
        )
        started = time.perf_counter()
        stream = torch.cuda.Stream()
        for batch_size in batch_sizes:
            static_input = torch.zeros((batch_size, hidden_size), device="cuda")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                static_output = static_input * 2.0 + 1.0
            self.graphs[batch_size] = (graph, static_input, static_output)
        logger.info(
            f"Capture cuda graph end ({name}). Time elapsed: {time.perf_counter() - started:.2f} s"
        )

    @property
    def captured_batch_sizes(self) -> list[int]:
        return sorted(self.graphs)
