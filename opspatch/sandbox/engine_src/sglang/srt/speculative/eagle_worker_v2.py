"""EAGLE speculative decoding, "spec v2": the draft model proposes a chain of tokens, the target
verifies the whole chain in one forward pass.

This file carries the incident's local feature, "dynamic speculation disable", as the incident's
build had it: `EAGLEWorkerV2.__init__` assigns `spec_disable_batch_threshold` only after
`init_cuda_graphs()`, so when capture raises (any host without usable CUDA) and the scheduler
keeps the half-built worker, the first decode step fails with AttributeError.
"""

from __future__ import annotations

import logging

import torch

from sglang.srt.layers.sampler import greedy_token, sample_token, token_distribution
from sglang.srt.managers.schedule_batch import GenerationBatchResult, Req, ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker, log_weight_load
from sglang.srt.models.tiny_lm import TinyCausalLM, load_draft_model
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker, EagleDraftWorkerBase
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import verify_chain_greedy, verify_chain_sampled

logger = logging.getLogger(__name__)


class EagleDraftWorker(EagleDraftWorkerBase):
    # The draft is the target with this fraction of its output weights nudged.
    draft_perturbation = 0.10

    def __init__(
        self,
        server_args: ServerArgs,
        gpu_id: int,
        nccl_port: int,
        target_worker: TpModelWorker,
    ):
        super().__init__()
        self.server_args = server_args
        self.gpu_id = gpu_id
        self.nccl_port = nccl_port
        self.target_worker = target_worker
        self.topk = server_args.speculative_eagle_topk
        self.speculative_num_steps = server_args.speculative_num_steps
        draft_path = server_args.speculative_draft_model_path or f"{server_args.model_path}-draft"
        self.draft_model: TinyCausalLM = log_weight_load(
            draft_path,
            lambda: load_draft_model(target_worker.model, draft_path, self.draft_perturbation),
        )

    def draft(self, req: Req, num_drafts: int) -> tuple[list[int], list[torch.Tensor] | None]:
        """Propose `num_drafts` tokens one by one; for sampled requests also their distributions."""
        drafts: list[int] = []
        draft_probs: list[torch.Tensor] | None = None if req.sampling_params.is_greedy else []
        prefix = req.all_ids
        for _ in range(num_drafts):
            logits_row = self.draft_model(torch.tensor(prefix + drafts, dtype=torch.long))[-1]
            if draft_probs is None:
                drafts.append(greedy_token(logits_row))
            else:
                probs = token_distribution(
                    self.draft_model.sampling_logits(logits_row), req.sampling_params
                )
                draft_probs.append(probs)
                drafts.append(sample_token(probs, req.generator))
        return drafts, draft_probs


class EAGLEWorkerV2(BaseSpecWorker):
    @property
    def draft_model_path(self):
        return self.server_args.speculative_draft_model_path

    def __init__(
        self,
        server_args: ServerArgs,
        gpu_id: int,
        nccl_port: int,
        target_worker: TpModelWorker,
    ):
        super().__init__()

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

        self._draft_worker = EagleDraftWorker(
            server_args,
            gpu_id,
            nccl_port,
            target_worker,
        )

        self.init_attention_backend()
        self.init_cuda_graphs()

        # Dynamic speculation disable: above this many running requests, decode without
        # speculation, which costs more than it saves under high concurrency. 0 = never.
        self.spec_disable_batch_threshold = server_args.spec_disable_batch_threshold
        logger.info(f"Dynamic speculation disable: threshold={self.spec_disable_batch_threshold}")

    def forward_batch_generation(self, batch: ScheduleBatch) -> GenerationBatchResult:
        if batch.forward_mode.is_extend():
            # Prefill: the target produces the first token; there is nothing to verify yet.
            return self._target_worker.forward_batch_generation(batch)

        if self.should_disable_speculation(batch.batch_size()):
            return self._target_worker.forward_batch_generation(batch)
        return self.draft_and_verify(batch)

    def should_disable_speculation(self, batch_size: int) -> bool:
        threshold = self.spec_disable_batch_threshold
        disable = threshold > 0 and batch_size > threshold
        if disable != self.speculation_disabled:
            self.speculation_disabled = disable
            if disable:
                logger.info(
                    f"Dynamic speculation disable: batch size {batch_size} > threshold "
                    f"{threshold}, decoding without speculation"
                )
            else:
                logger.info(
                    f"Dynamic speculation disable: batch size {batch_size} <= threshold "
                    f"{threshold}, speculation re-enabled"
                )
        return disable

    def draft_and_verify(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """One speculative step per request: draft a chain, verify it in one target pass."""
        next_token_ids: list[list[int]] = []
        proposed: list[int] = []
        accepted: list[int] = []
        target_model = self._target_worker.model
        for req in batch.reqs:
            # Never draft past the request's budget: the verified token is always one more.
            num_drafts = max(0, min(self.speculative_num_steps, req.remaining_tokens - 1))
            drafts, draft_probs = self._draft_worker.draft(req, num_drafts)
            prefix_length = len(req.origin_input_ids) + len(req.output_ids)
            logits = self._target_worker.forward_logits(req.all_ids + drafts)
            verify_rows = logits[prefix_length - 1 :]
            if draft_probs is None:
                tokens, num_accepted = verify_chain_greedy(drafts, verify_rows)
            else:
                target_probs = [
                    token_distribution(target_model.sampling_logits(row), req.sampling_params)
                    for row in verify_rows
                ]
                tokens, num_accepted = verify_chain_sampled(
                    drafts, draft_probs, target_probs, req.generator
                )
            next_token_ids.append(tokens)
            proposed.append(num_drafts)
            accepted.append(num_accepted)
        return GenerationBatchResult(
            next_token_ids=next_token_ids, proposed_drafts=proposed, accepted_drafts=accepted
        )
