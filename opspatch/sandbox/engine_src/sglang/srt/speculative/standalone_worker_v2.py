"""STANDALONE speculative decoding: a separate, weaker draft model instead of an EAGLE head.

As upstream's does, `StandaloneWorkerV2.__init__` does not call `EAGLEWorkerV2.__init__`: it
calls `BaseSpecWorker.__init__` and repeats the argument block. An attribute assigned only in
`EAGLEWorkerV2.__init__` (such as `spec_disable_batch_threshold`) is therefore never set on it;
a class-level default on `EAGLEWorkerV2` is inherited.
"""

from __future__ import annotations

import logging

from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

logger = logging.getLogger(__name__)


class StandaloneDraftWorker(EagleDraftWorker):
    # An independent small model agrees with the target less often than an EAGLE head.
    draft_order = 3


class StandaloneWorkerV2(EAGLEWorkerV2):
    def __init__(
        self,
        server_args: ServerArgs,
        gpu_id: int,
        nccl_port: int,
        target_worker: TpModelWorker,
    ):
        BaseSpecWorker.__init__(self)

        # Parse arguments
        self.server_args = server_args
        self.topk = server_args.speculative_eagle_topk
        self.speculative_num_steps = server_args.speculative_num_steps
        self.speculative_num_draft_tokens = server_args.speculative_num_draft_tokens
        self.gpu_id = gpu_id
        self.device = server_args.device
        self._target_worker = target_worker
        self.page_size = server_args.page_size
        self.speculative_algorithm = SpeculativeAlgorithm.from_string(
            server_args.speculative_algorithm
        )
        self.speculation_disabled = False

        # Create our custom draft worker that doesn't share embeddings/lm_head
        self._draft_worker = StandaloneDraftWorker(
            server_args,
            gpu_id,
            nccl_port,
            target_worker,
        )

        self.init_attention_backend()
        self.init_cuda_graphs()
