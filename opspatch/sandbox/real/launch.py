"""How a real SGLang server is started on the CPU: its flags and environment (pure)."""

from __future__ import annotations

import os
from pathlib import Path

CPU_ENV: dict[str, str] = {"SGLANG_USE_CPU_ENGINE": "1", "TRITON_INTERPRET": "1"}
OMP_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
CPU_FLAGS: tuple[str, ...] = (
    "--device",
    "cpu",
    "--disable-cuda-graph",
    "--mem-fraction-static",
    "0.5",
    "--max-total-tokens",
    "4096",
    "--sleep-on-idle",
    "--attention-backend",
    "intel_amx",
    "--dtype",
    "float32",
    "--enable-metrics",
)
EAGLE_STEPS, EAGLE_TOPK, EAGLE_DRAFT_TOKENS = 2, 1, 3


def eagle_flags(draft: Path) -> tuple[str, ...]:
    return (
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
        "--speculative-num-steps",
        str(EAGLE_STEPS),
        "--speculative-eagle-topk",
        str(EAGLE_TOPK),
        "--speculative-num-draft-tokens",
        str(EAGLE_DRAFT_TOKENS),
    )


def server_args(target: Path, draft: Path | None, tp: int = 1) -> tuple[str, ...]:
    """`launch_server`'s arguments after `--host/--port`: the model, the CPU flags, EAGLE-3
    when `draft` is given, `--tp-size` above 1. A unit's node adds its own `--tp-size`."""
    args: tuple[str, ...] = ("--model-path", str(target), *CPU_FLAGS)
    if draft is not None:
        args += eagle_flags(draft)
    if tp > 1:
        args += ("--tp-size", str(tp))
    return args


def cpu_env(ranks: int, cores: list[int] | None = None) -> dict[str, str]:
    """The engine's environment for `ranks` scheduler processes on this machine: with more
    than one, rank r bound to core `cores[r % len(cores)]` (the cores this process may use)."""
    env = dict(CPU_ENV)
    if ranks > 1:
        usable = sorted(cores if cores is not None else os.sched_getaffinity(0))
        env[OMP_BIND_ENV] = "|".join(str(usable[rank % len(usable)]) for rank in range(ranks))
    return env
