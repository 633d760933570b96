"""The stand-in SGLang engine of the sandbox: installation, the incident, real decoding, HTTP API.

Engines are real server processes launched from a host's own virtual environment on a free
loopback port and stopped by pid (see tests/standin.py). Servers that several tests can share are
module-scoped; tests that change a host's files get a fresh host.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opspatch.config.lookup import Workspace
from opspatch.core.edit import Applied, apply_patch, detect
from opspatch.core.spec import PatchSpec
from opspatch.errors import InputError
from opspatch.hosts.agent.measure import op_measure
from opspatch.hosts.measure import Measurement
from opspatch.sandbox.install import (
    engine_source_dir,
    install_standin,
    make_host_python,
    record_hash,
)
from tests.standin import (
    EngineProcess,
    StandinHost,
    http_request,
    launch_engine,
    make_host,
    running_engine,
)

pytestmark = pytest.mark.pure

ATTRIBUTE_ERROR = (
    "AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"
)
GREEDY_16 = {"max_new_tokens": 16, "temperature": 0}
LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( TP0)?\] ")


# -- the fixes, made with opspatch's own patch engine on a host's installed copy ------------------

EAGLE_INIT_GUARD = "eagle-init-guard"


def eagle_init_guard() -> PatchSpec:
    """The incident's real fix, as shipped (`patches/eagle-init-guard.toml`)."""
    return Workspace.discover().load_patch(EAGLE_INIT_GUARD).spec


def guard_part(part: str) -> PatchSpec:
    """Half of eagle-init-guard, for cases that need a partial fix: `early-assignment` (the
    assignment at the start of `EAGLEWorkerV2.__init__`, what the incident's sed did) or
    `class-default` (the class-level attribute alone)."""
    full = eagle_init_guard()
    index = {"class-default": 0, "early-assignment": 1}[part]
    return full.model_copy(
        update={
            "id": f"{EAGLE_INIT_GUARD}-{part}-only",
            "edits": [full.edits[index]],
            "postconditions": [full.postconditions[index]],
        }
    )


def patch_file(path: Path, patch: PatchSpec) -> None:
    """Apply `patch` to the file with `apply_patch` and write the new bytes."""
    outcome = apply_patch(path.read_bytes(), patch)
    assert isinstance(outcome, Applied), outcome
    path.write_bytes(outcome.new_source)


def assert_crashed_on_first_decode(engine: EngineProcess, class_name: str) -> None:
    """The incident's signature: dropped connection, process gone, traceback in the log."""
    with pytest.raises(ConnectionError):
        engine.post("/generate", {"text": "Hello", "sampling_params": GREEDY_16})
    assert engine.wait_exit(timeout=20) != 0
    log = engine.log_text()
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert (
        f"AttributeError: '{class_name}' object has no attribute 'spec_disable_batch_threshold'"
        in log
    )
    assert "SIGQUIT received" in log
    assert "kill_process_tree called" in log


def assert_speculative_decode_works(engine: EngineProcess) -> dict[str, Any]:
    reply = engine.post("/generate", {"text": "Hello", "sampling_params": GREEDY_16})
    assert reply.status == 200, reply.body
    meta = reply.json()["meta_info"]
    assert meta["completion_tokens"] == 16
    assert meta["spec_verify_ct"] > 0
    assert engine.popen.poll() is None
    return dict(reply.json())


# -- installation -------------------------------------------------------------------------------


def test_install_writes_a_pip_style_dist_info_whose_record_matches_every_file(
    tmp_path: Path,
) -> None:
    site_packages = tmp_path / "site-packages"
    package = install_standin(site_packages, version="0.5.10")

    assert package == site_packages.resolve() / "sglang"
    dist_info = site_packages / "sglang-0.5.10.dist-info"
    metadata = (dist_info / "METADATA").read_text()
    assert "Name: sglang\n" in metadata and "Version: 0.5.10\n" in metadata
    assert (dist_info / "INSTALLER").read_text().strip()
    assert (package / "version.py").read_text() == '__version__ = "0.5.10"\n'

    rows = [line.split(",") for line in (dist_info / "RECORD").read_text().splitlines()]
    recorded = {row[0] for row in rows}
    on_disk = {
        p.relative_to(site_packages).as_posix() for p in site_packages.rglob("*") if p.is_file()
    }
    assert recorded == on_disk
    for path, digest, size in rows:
        if path.endswith("/RECORD"):
            assert digest == size == ""
            continue
        data = (site_packages / path).read_bytes()
        assert digest == record_hash(data) and int(size) == len(data)
        assert re.fullmatch(r"sha256=[A-Za-z0-9_-]{43}", digest)
    assert not any("__pycache__" in p for p in recorded)
    assert "sglang/srt/speculative/eagle_worker_v2.py" in recorded


def test_reinstall_replaces_the_previous_version(tmp_path: Path) -> None:
    install_standin(tmp_path, version="0.5.10")
    (tmp_path / "sglang" / "stale_extra.py").write_text("x = 1\n")
    install_standin(tmp_path)

    assert sorted(p.name for p in tmp_path.glob("sglang-*.dist-info")) == [
        "sglang-0.5.23.dist-info"
    ]
    assert not (tmp_path / "sglang" / "stale_extra.py").exists()
    assert not list(tmp_path.glob(".opspatch-standin-*"))


def test_install_refuses_the_controllers_own_site_packages() -> None:
    import site

    with pytest.raises(InputError, match="opspatch's own environment"):
        install_standin(Path(site.getsitepackages()[0]))


def test_install_refuses_a_malformed_version(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a valid distribution version"):
        install_standin(tmp_path, version="0.5.23; rm -rf /")


def test_the_controller_cannot_import_the_standin() -> None:
    spec = importlib.util.find_spec("sglang")
    assert spec is None or engine_source_dir() not in Path(spec.origin or "").parents
    assert not (engine_source_dir() / "__init__.py").exists()
    assert "sglang" not in sys.modules


@pytest.mark.process
def test_host_python_imports_the_hosts_own_copy_and_the_controllers_torch(tmp_path: Path) -> None:
    host = make_host(tmp_path / "host-a")
    probe = (
        "import importlib.util, importlib.metadata, json, sys\n"
        "spec = importlib.util.find_spec('sglang.srt.speculative.eagle_worker_v2')\n"
        "resolved_without_torch = 'torch' not in sys.modules\n"
        "import torch\n"
        "print(json.dumps({'origin': spec.origin, 'version': importlib.metadata.version('sglang'),"
        " 'torch': torch.__version__, 'light': resolved_without_torch}))\n"
    )
    out = subprocess.run(
        [str(host.python), "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    facts = json.loads(out.stdout)

    assert Path(facts["origin"]) == host.eagle_worker_file
    assert facts["version"] == "0.5.23"
    assert facts["torch"]
    assert facts["light"], "resolving the module must not import torch (packages stay light)"


@pytest.mark.process
def test_making_a_host_twice_keeps_what_was_done_to_it(tmp_path: Path) -> None:
    host = make_host(tmp_path / "host-b")
    patch_file(host.eagle_worker_file, eagle_init_guard())
    patched = host.eagle_worker_file.read_bytes()

    assert make_host_python(host.host_dir) == host.python
    assert host.eagle_worker_file.read_bytes() == patched
    assert detect(patched, eagle_init_guard()).state == "applied"


# -- the incident -------------------------------------------------------------------------------


@pytest.mark.engine
def test_incident_healthy_server_crashes_on_its_first_decode(tmp_path: Path) -> None:
    host = make_host(tmp_path / "host")
    with running_engine(host) as engine:
        log = engine.log_text()
        assert "CUDA graph capture failed:" in log and "falling back to eager decode" in log
        assert "Dynamic speculation disable: threshold=" not in log
        assert engine.get("/health").status == 200
        # One token ends at prefill: it never reaches the speculative decode path.
        one_token = {"text": "Hello", "sampling_params": {"max_new_tokens": 1}}
        assert engine.post("/generate", one_token).status == 200

        assert_crashed_on_first_decode(engine, "EAGLEWorkerV2")
        assert ATTRIBUTE_ERROR in engine.log_text()


@pytest.mark.engine
def test_incident_eagle_init_guard_then_restart_serves_speculative_decodes(
    tmp_path: Path,
) -> None:
    host = make_host(tmp_path / "host")
    with running_engine(host) as engine:
        assert_crashed_on_first_decode(engine, "EAGLEWorkerV2")

    patch_file(host.eagle_worker_file, eagle_init_guard())
    with running_engine(host, log_name="engine-after-fix.log") as engine:
        assert_speculative_decode_works(engine)
        # The fix does not hide the capture failure; it makes the half-built worker safe.
        assert "CUDA graph capture failed:" in engine.log_text()
        assert "Scheduler hit an exception" not in engine.log_text()


@pytest.mark.engine
def test_incident_early_assignment_alone_fixes_eagle(tmp_path: Path) -> None:
    host = make_host(tmp_path / "host")
    patch_file(host.eagle_worker_file, guard_part("early-assignment"))
    with running_engine(host) as engine:
        assert_speculative_decode_works(engine)


@pytest.mark.engine
def test_incident_class_level_default_alone_fixes_eagle(tmp_path: Path) -> None:
    host = make_host(tmp_path / "host")
    patch_file(host.eagle_worker_file, guard_part("class-default"))
    with running_engine(host) as engine:
        assert_speculative_decode_works(engine)


@pytest.mark.engine
def test_standalone_worker_needs_the_class_level_default(tmp_path: Path) -> None:
    host = make_host(tmp_path / "host")
    standalone = ["--speculative-algorithm", "STANDALONE"]
    original = host.eagle_worker_file.read_bytes()
    # The incident's own fix (an early assignment in EAGLEWorkerV2.__init__) misses a subclass
    # that does not call that __init__.
    patch_file(host.eagle_worker_file, guard_part("early-assignment"))
    with running_engine(host, standalone) as engine:
        assert engine.get("/health").status == 200
        assert_crashed_on_first_decode(engine, "StandaloneWorkerV2")

    # eagle-init-guard's class-level default covers it.
    host.eagle_worker_file.write_bytes(original)
    patch_file(host.eagle_worker_file, eagle_init_guard())
    with running_engine(host, standalone, log_name="engine-after-fix.log") as engine:
        assert_speculative_decode_works(engine)


@pytest.mark.engine
def test_server_without_speculation_decodes_on_an_unpatched_host(tmp_path: Path) -> None:
    host = make_host(tmp_path / "host")
    log_file = tmp_path / "server.log"
    args = ["--speculative-algorithm", "NONE", "--log-file", str(log_file)]
    engine = launch_engine(host, args)
    try:
        engine.log_path = log_file  # --log-file takes the log lines off stderr
        engine.wait_ready()
        reply = engine.post("/generate", {"text": "Hello", "sampling_params": GREEDY_16})
        assert reply.status == 200
        meta = reply.json()["meta_info"]
        assert meta["completion_tokens"] == 16
        assert "spec_verify_ct" not in meta
        assert "CUDA graph capture" not in log_file.read_text()
    finally:
        exit_status = engine.stop()
    assert exit_status == 0, "SIGTERM is a clean shutdown"
    assert "Shutting down" in log_file.read_text()


@pytest.mark.engine
def test_failed_warmup_logs_it_and_exits_nonzero(tmp_path: Path) -> None:
    host = make_host(tmp_path / "host")
    # The warm-up prompt does not fit a 16-token context: /generate answers 400.
    engine = launch_engine(host, ["--context-length", "16"])
    try:
        assert engine.wait_exit(timeout=60) != 0
    finally:
        engine.stop()
    log = engine.log_text()
    assert "Initialization failed. warmup error:" in log
    assert "The server is fired up and ready to roll!" not in log


@pytest.mark.engine
def test_health_answers_503_until_warmup_is_done(tmp_path: Path) -> None:
    host = make_host(tmp_path / "host")
    delayed = {"SGLANG_STANDIN_WARMUP_DELAY_S": "3"}
    with running_engine(host, env=delayed, wait_ready=False) as engine:
        engine.wait_for_log("Uvicorn running on")
        assert engine.get("/health").status == 503
        assert engine.get("/health_generate").status == 503
        assert engine.get("/ready").status == 503

        engine.wait_ready()
        assert engine.get("/health").status == 200
        assert engine.get("/health_generate").status == 200
        assert engine.get("/ready").json() == {"status": "ready"}


# -- a shared server: HTTP API, dynamic speculation disable ---------------------------------------


@pytest.fixture(scope="module")
def api_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """EAGLE3 with CUDA graphs disabled (so `__init__` completes) and threshold 1."""
    host = make_host(tmp_path_factory.mktemp("api-host"))
    args = ["--disable-cuda-graph", "--spec-disable-batch-threshold", "1"]
    with running_engine(host, args) as engine:
        yield engine


def generate(engine: EngineProcess, body: dict[str, Any]) -> Any:
    reply = engine.post("/generate", body)
    assert reply.status == 200, reply.body
    return reply.json()


@pytest.mark.engine
def test_generate_answers_sglangs_response_shape(api_engine: EngineProcess) -> None:
    out = generate(api_engine, {"text": "Hello", "sampling_params": GREEDY_16})

    assert set(out) == {"text", "output_ids", "meta_info"}
    assert isinstance(out["text"], str) and len(out["text"]) == 16
    assert len(out["output_ids"]) == 16 and all(isinstance(i, int) for i in out["output_ids"])
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 16}
    assert meta["prompt_tokens"] == len("Hello") + 1  # BOS
    assert meta["completion_tokens"] == 16
    assert meta["cached_tokens"] == 0
    assert isinstance(meta["id"], str) and meta["e2e_latency"] > 0
    assert meta["spec_verify_ct"] > 0
    assert 0 <= meta["spec_accept_rate"] <= 1
    assert 1 <= meta["spec_accept_length"] <= 4


@pytest.mark.engine
def test_a_streamed_generate_answers_sglangs_events_each_the_reply_so_far(
    api_engine: EngineProcess,
) -> None:
    body = {
        "text": "The capital of France is",
        "sampling_params": {"max_new_tokens": 24, "temperature": 0},
        "return_logprob": True,
        "top_logprobs_num": 3,
        "return_text_in_logprobs": True,
    }
    whole = generate(api_engine, body)
    reply = api_engine.post("/generate", {**body, "stream": True})
    assert reply.status == 200
    events = reply.body.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and all(e.startswith("data: ") for e in events[:-1])
    chunks = [json.loads(event[len("data: ") :]) for event in events[:-2]]
    assert len(chunks) > 1  # one per step that gave tokens (several tokens a verify step)
    counts = [chunk["meta_info"]["completion_tokens"] for chunk in chunks]
    assert counts == sorted(set(counts)) and counts[-1] == 24
    for chunk in chunks[:-1]:  # each the reply so far, not finished, no speculation figures yet
        meta = chunk["meta_info"]
        assert meta["finish_reason"] is None and "spec_verify_ct" not in meta
        assert chunk["output_ids"] == whole["output_ids"][: meta["completion_tokens"]]
        assert whole["text"].startswith(chunk["text"])
        assert len(meta["output_top_logprobs"]) == meta["completion_tokens"]
    last = chunks[-1]
    assert (last["text"], last["output_ids"]) == (whole["text"], whole["output_ids"])
    same = {"id", "e2e_latency"}  # a request's own
    assert {k: v for k, v in last["meta_info"].items() if k not in same} == {
        k: v for k, v in whole["meta_info"].items() if k not in same
    }
    # SGLang's per-request stream_interval: the first token at once, then every 10 unsent
    # tokens or more (a verify step gives several), and the finish
    sparse = {**body, "sampling_params": {**body["sampling_params"], "stream_interval": 10}}
    events = api_engine.post("/generate", {**sparse, "stream": True}).body.decode().split("\n\n")
    counts = [json.loads(e[len("data: ") :])["meta_info"]["completion_tokens"] for e in events[:-2]]
    assert counts[0] == 1 and counts[-1] == 24 and len(counts) <= 4
    assert all(b - a >= 10 for a, b in zip(counts, counts[1:-1], strict=False)), counts


@pytest.mark.engine
def test_the_judges_measurement_reads_the_streamed_reply_whole(api_engine: EngineProcess) -> None:
    prompts = ["The capital of France is", "def fibonacci(n):"]
    request = {
        "url": api_engine.url,
        "prompts": prompts,
        "max_new_tokens": 32,
        "top_logprobs": 5,
        "warmup": 1,
        "timeout": 60.0,
    }
    measured = Measurement.from_json(op_measure(request))  # type: ignore[arg-type]
    for prompt, sample in zip(prompts, measured.samples, strict=True):
        greedy = {"max_new_tokens": 32, "temperature": 0}
        whole = generate(api_engine, {"text": prompt, "sampling_params": greedy})
        assert sample.ok and (sample.text, sample.output_ids) == (
            whole["text"],
            tuple(whole["output_ids"]),
        )
        assert sample.first_token_seconds is not None and sample.seconds is not None
        assert 0 < sample.first_token_seconds <= sample.seconds
        assert sample.top_ids is not None and sample.top_logprobs is not None
        assert sample.token_logprobs is not None and len(sample.token_logprobs) == 32
        assert sample.spec_verify_ct == whole["meta_info"]["spec_verify_ct"]


@pytest.mark.engine
def test_greedy_decoding_is_deterministic(api_engine: EngineProcess) -> None:
    body = {"text": "The quick brown fox", "sampling_params": GREEDY_16}
    assert generate(api_engine, body)["text"] == generate(api_engine, body)["text"]


@pytest.mark.engine
def test_above_the_threshold_decoding_runs_without_speculation_and_gives_the_same_text(
    api_engine: EngineProcess,
) -> None:
    prompts = ["Hello", "Once upon a time", "What is the capital of France?"]
    alone = [generate(api_engine, {"text": p, "sampling_params": GREEDY_16}) for p in prompts]
    batched = generate(api_engine, {"text": prompts, "sampling_params": GREEDY_16})

    assert all(out["meta_info"]["spec_verify_ct"] > 0 for out in alone)
    assert [out["text"] for out in batched] == [out["text"] for out in alone]
    assert all("spec_verify_ct" not in out["meta_info"] for out in batched)
    assert "batch size 3 > threshold 1, decoding without speculation" in api_engine.log_text()


@pytest.mark.engine
def test_sampled_decoding_with_a_seed_is_reproducible(api_engine: EngineProcess) -> None:
    body = {
        "text": "Hello",
        "sampling_params": {"max_new_tokens": 24, "temperature": 0.8, "seed": 7},
    }
    first, second = generate(api_engine, body), generate(api_engine, body)

    assert first["text"] == second["text"]
    assert first["meta_info"]["completion_tokens"] == 24
    assert generate(api_engine, {"text": "Hello"})["meta_info"]["completion_tokens"] == 128


@pytest.mark.engine
def test_a_stop_string_ends_generation_with_a_stop_reason(api_engine: EngineProcess) -> None:
    full = generate(api_engine, {"text": "Hello", "sampling_params": GREEDY_16})["text"]
    stop = full[3]
    cut = full.index(stop)

    out = generate(api_engine, {"text": "Hello", "sampling_params": {**GREEDY_16, "stop": [stop]}})
    assert out["text"] == full[:cut]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["meta_info"]["completion_tokens"] == cut + 1


@pytest.mark.engine
def test_openai_completions_answer_choices_and_usage(api_engine: EngineProcess) -> None:
    reply = api_engine.post(
        "/v1/completions", {"model": "tiny", "prompt": "Hello", "max_tokens": 8, "temperature": 0}
    )
    assert reply.status == 200
    body = reply.json()
    assert body["object"] == "text_completion"
    assert (
        body["choices"][0]["text"]
        == generate(
            api_engine,
            {"text": "Hello", "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
        )["text"]
    )
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14}


@pytest.mark.engine
def test_openai_chat_completions_answer_a_message(api_engine: EngineProcess) -> None:
    reply = api_engine.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0},
    )
    assert reply.status == 200
    choice = reply.json()["choices"][0]
    assert choice["message"]["role"] == "assistant" and len(choice["message"]["content"]) == 5
    assert reply.json()["usage"]["completion_tokens"] == 5


@pytest.mark.engine
def test_server_info_and_model_info(api_engine: EngineProcess) -> None:
    generate(api_engine, {"text": "Hello", "sampling_params": GREEDY_16})
    info = api_engine.get("/server_info").json()
    assert info["version"] == "0.5.23"
    assert info["speculative_algorithm"] == "EAGLE3"
    assert info["spec_disable_batch_threshold"] == 1
    assert info["port"] == api_engine.port
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1
    assert api_engine.get("/get_server_info").json()["version"] == "0.5.23"

    model = api_engine.get("/model_info").json()
    assert model["model_path"] == "tiny" and model["is_generation"] is True
    assert api_engine.get("/get_model_info").json() == model


BAD_GENERATE_BODIES = {
    "not json": b"{not json",
    "not an object": b"[1, 2]",
    "missing text": b'{"sampling_params": {"max_new_tokens": 4}}',
    "text not a string": b'{"text": 5}',
    "negative max_new_tokens": b'{"text": "a", "sampling_params": {"max_new_tokens": -1}}',
    "fractional max_new_tokens": b'{"text": "a", "sampling_params": {"max_new_tokens": 1.5}}',
    "unknown sampling param": b'{"text": "a", "sampling_params": {"max_tokens": 4}}',
    "negative temperature": b'{"text": "a", "sampling_params": {"temperature": -1}}',
    "top_p zero": b'{"text": "a", "sampling_params": {"top_p": 0}}',
    "unknown field": b'{"text": "a", "prompt": "b"}',
    "beyond the context": b'{"text": "a", "sampling_params": {"max_new_tokens": 5000}}',
    "token id out of range": b'{"input_ids": [0, 9999]}',
}


@pytest.mark.engine
@pytest.mark.parametrize("raw_body", BAD_GENERATE_BODIES.values(), ids=BAD_GENERATE_BODIES.keys())
def test_a_bad_generate_request_answers_400_with_a_message(
    api_engine: EngineProcess, raw_body: bytes
) -> None:
    reply = http_request("POST", api_engine.url + "/generate", raw_body=raw_body)
    assert reply.status == 400
    message = reply.json()["error"]["message"]
    assert isinstance(message, str) and message
    assert api_engine.popen.poll() is None


@pytest.mark.engine
def test_a_bad_openai_request_answers_400_in_openais_shape(api_engine: EngineProcess) -> None:
    reply = api_engine.post("/v1/completions", {"prompt": "a", "max_tokens": -3})
    assert reply.status == 400
    assert reply.json()["object"] == "error" and reply.json()["code"] == 400


@pytest.mark.engine
def test_unknown_routes_and_methods(api_engine: EngineProcess) -> None:
    assert api_engine.get("/nope").status == 404
    assert api_engine.get("/generate").status == 405


@pytest.mark.engine
def test_the_log_follows_sglangs_format_and_start_up_order(api_engine: EngineProcess) -> None:
    lines = api_engine.log_text().splitlines()
    assert all(LOG_LINE.match(line) for line in lines), [x for x in lines if not LOG_LINE.match(x)]
    text = "\n".join(lines)
    order = [
        "] server_args={",
        "Load weight begin",
        "Load weight end",
        "Dynamic speculation disable: threshold=1",
        f"Uvicorn running on http://127.0.0.1:{api_engine.port} (Press CTRL+C to quit)",
        "The server is fired up and ready to roll!",
    ]
    positions = [text.index(marker) for marker in order]
    assert positions == sorted(positions)


# -- greedy speculative decoding is lossless ----------------------------------------------------

# Runs in the host's interpreter: the offline Engine of the stand-in, one per configuration,
# answering one JSON request per line. The test process never imports the stand-in's `sglang`.
_DRIVER = r"""
import json, sys
import torch
from sglang.srt.entrypoints.engine import Engine
from sglang.srt.layers.sampler import sample_token
from sglang.srt.speculative.spec_utils import verify_chain_sampled
engines = {}
def engine(algorithm, steps):
    if (algorithm, steps) not in engines:
        engines[algorithm, steps] = Engine(
            speculative_algorithm=algorithm, speculative_num_steps=steps, disable_cuda_graph=True
        )
    return engines[algorithm, steps]
def compare_greedy(q):
    params = {"max_new_tokens": q["max_new_tokens"], "temperature": 0}
    plain = engine("NONE", 1).generate(input_ids=q["input_ids"], sampling_params=params)
    spec = engine(q["algorithm"], q["steps"]).generate(input_ids=q["input_ids"], sampling_params=params)
    return {"plain": plain["output_ids"], "spec": spec["output_ids"],
            "verify_ct": spec["meta_info"].get("spec_verify_ct", 0),
            "accept_rate": spec["meta_info"].get("spec_accept_rate")}
def verify_sampled(q):
    # One draft from q, verified against p: how often each token comes out first.
    generator = torch.Generator().manual_seed(q["seed"])
    p = torch.tensor(q["p"], dtype=torch.float64)
    d = torch.tensor(q["q"], dtype=torch.float64)
    counts = [0] * len(q["p"])
    for _ in range(q["n"]):
        draft = sample_token(d, generator)
        tokens, _ = verify_chain_sampled([draft], [d], [p, p], generator)
        counts[tokens[0]] += 1
    return {"counts": counts}
for line in sys.stdin:
    q = json.loads(line)
    answer = {"greedy": compare_greedy, "verify_sampled": verify_sampled}[q.pop("kind")](q)
    print(json.dumps(answer), flush=True)
"""


class DecodeDriver:
    def __init__(self, python: Path) -> None:
        self.process = subprocess.Popen(
            [str(python), "-c", _DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        )

    def ask(self, kind: str, **query: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"kind": kind, **query}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the decode driver exited"
        return dict(json.loads(line))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def decode_driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DecodeDriver]:
    host: StandinHost = make_host(tmp_path_factory.mktemp("driver-host"))
    # STANDALONE needs eagle-init-guard's class-level default to decode at all.
    patch_file(host.eagle_worker_file, eagle_init_guard())
    driver = DecodeDriver(host.python)
    yield driver
    driver.close()


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.lists(st.integers(min_value=1, max_value=96), max_size=40),
    max_new_tokens=st.integers(min_value=1, max_value=48),
    steps=st.integers(min_value=1, max_value=5),
    algorithm=st.sampled_from(["EAGLE3", "STANDALONE"]),
)
@pytest.mark.engine
def test_greedy_speculative_output_equals_plain_greedy_output(
    decode_driver: DecodeDriver, prompt: list[int], max_new_tokens: int, steps: int, algorithm: str
) -> None:
    result = decode_driver.ask(
        "greedy",
        input_ids=[0, *prompt],
        max_new_tokens=max_new_tokens,
        steps=steps,
        algorithm=algorithm,
    )
    assert result["spec"] == result["plain"]
    assert len(result["spec"]) == max_new_tokens
    assert (result["verify_ct"] > 0) == (max_new_tokens > 1)


@pytest.mark.engine
def test_the_draft_is_sometimes_rejected_so_verification_is_really_exercised(
    decode_driver: DecodeDriver,
) -> None:
    rates = [
        decode_driver.ask(
            "greedy",
            input_ids=[0, *range(2 + seed, 12 + seed)],
            max_new_tokens=32,
            steps=3,
            algorithm="EAGLE3",
        )["accept_rate"]
        for seed in range(5)
    ]
    assert all(0 < rate < 1 for rate in rates), rates


@pytest.mark.engine
def test_speculative_sampling_keeps_the_target_distribution(decode_driver: DecodeDriver) -> None:
    target = [0.6, 0.3, 0.1, 0.0]
    draft = [0.1, 0.2, 0.3, 0.4]  # far from the target: accepting every draft would show
    n = 10000
    counts = decode_driver.ask("verify_sampled", p=target, q=draft, n=n, seed=0)["counts"]

    total_variation = sum(abs(c / n - t) for c, t in zip(counts, target, strict=True)) / 2
    assert counts[3] == 0, "a token the target never picks must never come out"
    assert total_variation < 0.02, counts
