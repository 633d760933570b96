"""The sandbox engine's platform plugin: SGLang loads it through entry-point group
`sglang.srt.plugins` (name `opspatch_sandbox_cpu`) in the main process, each scheduler and the
detokenizer, before any of them reads the platform.

It says this CPU has AMX, through SGLang's own `override_platform`, so that `--attention-backend
intel_amx` is kept: on a CPU without AMX SGLang rewrites it to `torch_native`, which EAGLE
refuses. The kernels that backend calls are opspatch's CPU layer (`sgl_kernel`), which needs no
AMX. One line on stderr per process says it ran (SGLang's logging is not set up yet when the
main process loads plugins). With `SGLANG_STANDIN_LOAD_S` set (`sandbox up --restart-seconds`),
the main process waits that long first, so every start takes that much longer, as a large
model's load would. Copied into sandbox engines only; opspatch never imports it.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

LOAD_ENV = "SGLANG_STANDIN_LOAD_S"
LOADED_LINE = "[opspatch_sandbox_cpu] pid {pid}: platform has_amx=True (intel_amx on opspatch's CPU kernel layer)"


def install() -> None:
    """The entry point: every process of the server calls it once, with no argument."""
    from sglang.srt.runtime_context import override_platform

    override_platform(has_amx=True).install()
    print(LOADED_LINE.format(pid=os.getpid()), file=sys.stderr, flush=True)
    delay = float(os.environ.get(LOAD_ENV) or 0)
    if delay > 0 and multiprocessing.parent_process() is None:  # the main process only
        print(f"[opspatch_sandbox_cpu] {LOAD_ENV}={delay:g}: waiting", file=sys.stderr, flush=True)
        time.sleep(delay)
