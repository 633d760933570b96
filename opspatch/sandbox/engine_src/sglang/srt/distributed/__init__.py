"""Tensor parallelism over torch.distributed (gloo on the CPU), after `sglang.srt.distributed`."""
