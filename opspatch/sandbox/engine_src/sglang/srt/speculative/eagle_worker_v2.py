"""EAGLE speculative decoding, "spec v2": the draft model proposes a chain of tokens, the target
verifies the whole chain in one forward pass.

This file carries the incident's local feature, "dynamic speculation disable", as the incident's
build had it: `EAGLEWorkerV2.__init__` assigns `spec_disable_batch_threshold` only after
`init_cuda_graphs()`, so when capture raises (any host without usable CUDA) and the scheduler
keeps the half-built worker, the first decode step fails with AttributeError.

The draft path has EAGLE's shape. After every target step the worker keeps, per request, the
target's last token and its hidden state at the position before it (`req.spec_info`, set in
`forward_target_only` and `draft_and_verify`); `EagleDraftWorker.draft_forward` runs the draft
head from there, one step per draft token, advancing `forward_batch.positions` after each step's
forward. The draft head attends by position, so a hidden state taken from the wrong row or a
position off by one makes the drafts worse (acceptance drops) while verification keeps every
answer exactly the target's.
"""

from __future__ import annotations

import logging

import torch

from sglang.srt.layers.sampler import greedy_token, sample_token, token_distribution
from sglang.srt.managers.schedule_batch import GenerationBatchResult, Req, ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker, log_weight_load
from sglang.srt.models.tiny_lm import TinyEagleDraft, load_draft_model
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker, EagleDraftWorkerBase
from sglang.srt.speculative.eagle_info import DraftForwardBatch, EagleDraftInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import verify_chain_greedy, verify_chain_sampled

logger = logging.getLogger(__name__)


class EagleDraftWorker(EagleDraftWorkerBase):
    # The draft head's n-gram order (the target's is 12): it agrees with the target often, not
    # always.
    draft_order = 4

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
        self.draft_model: TinyEagleDraft = log_weight_load(
            draft_path,
            lambda: load_draft_model(
                target_worker.model, target_worker.tokenizer, self.draft_order
            ),
        )

    def draft(self, req: Req, num_drafts: int) -> tuple[list[int], list[torch.Tensor] | None]:
        """Propose `num_drafts` tokens after `req`'s; for sampled requests also their
        distributions. The draft starts from what the target's last step left in
        `req.spec_info`: its last token and its hidden state at the position before."""
        spec_info: EagleDraftInput = req.spec_info
        forward_batch = DraftForwardBatch(
            input_ids=torch.tensor([spec_info.verified_id]),
            positions=torch.tensor([len(req.all_ids) - 1]),
            hidden_states=spec_info.hidden_states.unsqueeze(0),
        )
        return self.draft_forward(forward_batch, req, num_drafts)

    def draft_forward(
        self, forward_batch: DraftForwardBatch, req: Req, num_drafts: int
    ) -> tuple[list[int], list[torch.Tensor] | None]:
        drafts: list[int] = []
        draft_probs: list[torch.Tensor] | None = None if req.sampling_params.is_greedy else []
        for _ in range(num_drafts):
            logits_output = self.draft_model(
                forward_batch.input_ids, forward_batch.positions, forward_batch.hidden_states
            )
            logits_row = logits_output.next_token_logits[0]
            if draft_probs is None:
                token = greedy_token(logits_row)
            else:
                probs = token_distribution(
                    self.draft_model.sampling_logits(logits_row), req.sampling_params
                )
                draft_probs.append(probs)
                token = sample_token(probs, req.generator)
            drafts.append(token)
            forward_batch.input_ids = torch.tensor([token])
            hidden_states = logits_output.hidden_states
            forward_batch.hidden_states = hidden_states
            forward_batch.positions.add_(1)
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
            return self.forward_target_only(batch)

        if self.should_disable_speculation(batch.batch_size()):
            return self.forward_target_only(batch)
        return self.draft_and_verify(batch)

    def forward_target_only(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """One token per request from the target; its hidden states start the next draft."""
        result = self._target_worker.forward_batch_generation(batch)
        assert result.hidden_states is not None
        for req, tokens, hidden_states in zip(
            batch.reqs, result.next_token_ids, result.hidden_states, strict=True
        ):
            req.spec_info = EagleDraftInput(verified_id=tokens[-1], hidden_states=hidden_states)
        return result

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
        logits_rows: list[torch.Tensor] = []
        proposed: list[int] = []
        accepted: list[int] = []
        target_model = self._target_worker.model
        for req in batch.reqs:
            # Never draft past the request's budget: the verified token is always one more.
            num_drafts = max(0, min(self.speculative_num_steps, req.remaining_tokens - 1))
            drafts, draft_probs = self._draft_worker.draft(req, num_drafts)
            prefix_length = len(req.all_ids)
            # Row i: the target's prediction after the prefix and drafts[:i].
            verify_output = self._target_worker.forward(req.all_ids + drafts, prefix_length - 1)
            verify_rows = verify_output.next_token_logits
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
            # The next draft starts from the target's hidden state at the position before its
            # last token: row num_accepted (the last accepted draft's position).
            req.spec_info = EagleDraftInput(
                verified_id=tokens[-1], hidden_states=verify_output.hidden_states[num_accepted]
            )
            next_token_ids.append(tokens)
            logits_rows.append(verify_rows[: len(tokens)])
            proposed.append(num_drafts)
            accepted.append(num_accepted)
        return GenerationBatchResult(
            next_token_ids=next_token_ids,
            next_token_logits=logits_rows,
            proposed_drafts=proposed,
            accepted_drafts=accepted,
        )
