"""The sandbox engine's platform plugin: SGLang loads it through entry-point group
`sglang.srt.plugins` (name `opspatch_sandbox_cpu`) in the main process, each scheduler and the
detokenizer, before any of them reads the platform."""

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
