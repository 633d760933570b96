"""Real SGLang for the `sglang` tier: the cached environment and models, and servers.

The engine cache (`OPSPATCH_ENGINE_CACHE`, else `~/.cache/opspatch-tests/engines`) is resolved
at import, before the isolated-HOME fixture runs, so it survives runs; `.ci/run` builds it first
(`opspatch sandbox prepare --engine sglang`), so the tier only starts servers. Where it is not
built, the first test to need it builds it (minutes); where the package index cannot be reached
for that, the test skips with the reason. Servers cost minutes and 2-3 GB each: each module of the
tier shares its servers among its tests (tests/test_incident_real_engine.py, one TP=2 server;
tests/test_sandbox_real.py, a two-node unit; tests/test_judge_real_engine.py, two TP=1 servers;
tests/test_rehearse_real_engine.py, the rehearsal's own).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from opspatch.errors import IndexUnreachable
from opspatch.sandbox.processes import free_port
from opspatch.sandbox.real.build import (
    ENGINE_CACHE_ENV,
    BaseEnv,
    BuildEvent,
    ensure_base,
    ensure_wheel,
)
from opspatch.sandbox.real.hostenv import make_real_host_python
from opspatch.sandbox.real.models import ModelPaths, ensure_models
from opspatch.sandbox.real.release import DEFAULT_REAL_RELEASE
from opspatch.sandbox.real.server import RealServer

ENGINE_CACHE = Path(
    os.environ.get(ENGINE_CACHE_ENV) or Path("~/.cache/opspatch-tests/engines").expanduser()
)


@dataclass(frozen=True)
class RealEngine:
    """The built release: its shared environment, wheel and models."""

    cache: Path
    base: BaseEnv
    wheel: Path
    models: ModelPaths

    def host_python(self, host_dir: Path) -> Path:
        return make_real_host_python(host_dir, self.base, self.wheel)


def _quiet(_: BuildEvent) -> None:
    pass


def real_engine() -> RealEngine:
    """The cached real engine, built when missing; skips the test when the package index cannot
    be reached to build it."""
    try:
        base = ensure_base(ENGINE_CACHE, DEFAULT_REAL_RELEASE, _quiet)
        wheel = ensure_wheel(ENGINE_CACHE, DEFAULT_REAL_RELEASE, lambda _: None)
        models = ensure_models(ENGINE_CACHE, base, _quiet)
    except IndexUnreachable as exc:
        pytest.skip(
            f"real SGLang's environment is not in {ENGINE_CACHE} and cannot be built there "
            f"(`OPSPATCH_ENGINE_CACHE={ENGINE_CACHE} opspatch sandbox prepare --engine sglang`): "
            f"{exc.message}"
        )
    return RealEngine(ENGINE_CACHE, base, wheel, models)


def start_server(
    engine: RealEngine, host_dir: Path, *, tp: int = 1, speculative: bool = True
) -> RealServer:
    """A real server in `host_dir` (its own environment), ready; stopped again if it does not
    come up."""
    python = engine.host_python(host_dir)
    server = RealServer.start(
        python,
        free_port("127.0.0.1", set()),
        engine.models,
        host_dir / "server.log",
        tp=tp,
        speculative=speculative,
    )
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


GREEDY_SCRIPT = """
import json, sys
import torch
from transformers import AutoTokenizer, LlamaForCausalLM
torch.set_num_threads(1)
path, count = sys.argv[1], int(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(path)
model = LlamaForCausalLM.from_pretrained(path).eval()
out = []
for prompt in json.loads(sys.stdin.read()):
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        made = model.generate(ids, max_new_tokens=count, do_sample=False)
    out.append(made[0, ids.shape[1]:].tolist())
print(json.dumps(out))
"""


def transformers_greedy(engine: RealEngine, prompts: list[str], count: int) -> list[list[int]]:
    """The target model's greedy continuations as `transformers` computes them (the reference
    the engine's own kernels are checked against), run with the shared environment's Python."""
    import json
    import subprocess

    done = subprocess.run(
        [str(engine.base.python), "-c", GREEDY_SCRIPT, str(engine.models.target), str(count)],
        input=json.dumps(prompts),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: list[list[int]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
