"""Which engine a sandbox runs and what a real SGLang release needs (pure): `--engine`, the
shared environment's requirements from the wheel's METADATA, the torchvision guard, the cache's
place, the launch flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from opspatch.core.wheelrecord import record_sha256s
from opspatch.errors import InputError
from opspatch.sandbox.layout import SandboxLayout
from opspatch.sandbox.manifest import (
    HostRecord,
    Manifest,
    RealEngineRecord,
    RouterRecord,
    sandbox_inventory,
)
from opspatch.sandbox.real.basepatches import base_patch_target
from opspatch.sandbox.real.build import engine_cache_dir
from opspatch.sandbox.real.launch import cpu_env, server_args
from opspatch.sandbox.real.release import (
    DEFAULT_REAL_RELEASE,
    STANDIN,
    EngineChoice,
    base_requirements,
    constraints_file,
    guard_torchvision_meta,
    parse_engine,
)
from tests.sglang_wheels import WheelUnavailable, release_file

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("text", "choice"),
    [
        ("standin", STANDIN),
        ("sglang", EngineChoice("sglang", DEFAULT_REAL_RELEASE)),
        ("sglang==0.5.23", EngineChoice("sglang", "0.5.23")),
    ],
)
def test_engine_choices(text: str, choice: EngineChoice) -> None:
    assert parse_engine(text) == choice
    assert EngineChoice.from_json(choice.to_json()) == choice


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("sglang==0.5.10", "runs real SGLang 0.5.23 only, not 0.5.10"),
        ("vllm", "expected standin, sglang or sglang==VERSION"),
        ("standin==1", "expected standin, sglang or sglang==VERSION"),
    ],
)
def test_other_engines_are_refused_by_name(text: str, said: str) -> None:
    with pytest.raises(InputError, match=said):
        parse_engine(text)


METADATA = """Metadata-Version: 2.4
Name: sglang
Requires-Dist: aiohttp
Requires-Dist: flashinfer_python[cu13]==0.7.2
Requires-Dist: torch==2.14.1
Requires-Dist: Torch_Memory_Saver>=0.0.9
Requires-Dist: transformers==5.19.0
Requires-Dist: av==16.1.0; sys_platform == "linux" and platform_machine == "aarch64"
Requires-Dist: pytest; extra == "test"
"""


def test_requirements_drop_the_gpu_and_add_what_the_cpu_path_needs() -> None:
    here = {"sys_platform": "linux", "platform_machine": "x86_64"}
    assert base_requirements(METADATA, here) == [
        "aiohttp",
        "torch==2.13.0",
        "torchvision",
        "transformers==5.19.0",
        "triton",
    ]


def test_every_requirement_of_the_real_release_is_pinned() -> None:
    try:
        metadata = release_file("0.5.23", "sglang-0.5.23.dist-info/METADATA").decode()
    except WheelUnavailable as exc:
        pytest.skip(str(exc))
    pinned = {
        line.split("==")[0].lower().replace("_", "-")
        for line in constraints_file("0.5.23").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    names = {
        r.split("=")[0].split(">")[0].split("<")[0].lower().replace("_", "-")
        for r in base_requirements(metadata)
    }
    assert names - pinned == set()


TORCHVISION = """import torchvision.extension  # noqa: F401

@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    pass

@torch.library.register_fake("torchvision::qnms")
def meta_qnms(dets, scores, iou_threshold):
    pass
"""


def test_torchvision_guard_guards_both_and_is_idempotent() -> None:
    guarded = guard_torchvision_meta(TORCHVISION)
    assert '@torch.library.register_fake("torchvision::nms")\n' not in guarded
    assert guarded.count("if torchvision.extension._has_ops() else (lambda fn: fn)") == 2
    assert guard_torchvision_meta(guarded) == guarded
    compile(guarded, "_meta_registrations.py", "exec")
    with pytest.raises(ValueError, match="torchvision::nms"):
        guard_torchvision_meta("import torch\n")


def test_engine_cache_place() -> None:
    assert engine_cache_dir({"OPSPATCH_ENGINE_CACHE": "/c", "HOME": "/h"}) == Path("/c")
    assert engine_cache_dir({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/opspatch/engines")
    assert engine_cache_dir({"HOME": "/h"}) == Path("/h/.cache/opspatch/engines")


def test_launch_flags_and_environment() -> None:
    args = server_args(Path("/m/target"), Path("/m/draft"), tp=2)
    assert args[:2] == ("--model-path", "/m/target")
    assert "--sleep-on-idle" in args and args[args.index("--attention-backend") + 1] == "intel_amx"
    assert args[args.index("--speculative-draft-model-path") + 1] == "/m/draft"
    assert args[-2:] == ("--tp-size", "2")
    assert "--speculative-algorithm" not in server_args(Path("/t"), None)
    assert cpu_env(1, [0, 1]) == {"SGLANG_USE_CPU_ENGINE": "1", "TRITON_INTERPRET": "1"}
    assert cpu_env(2, [0, 1])["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1"
    assert cpu_env(3, [4, 6])["SGLANG_CPU_OMP_THREADS_BIND"] == "4|6|4"


def test_the_real_releases_record_is_read_with_its_quoted_paths() -> None:
    """Real 0.5.23's RECORD quotes paths with commas in them (CSV); each reads as its path."""
    try:
        text = release_file("0.5.23", "sglang-0.5.23.dist-info/RECORD").decode()
    except WheelUnavailable as exc:
        pytest.skip(str(exc))
    found = record_sha256s(text)
    quoted = "sglang/kernels/ops/communication/configs/sp_collective/world=16,H=7168,device_name=NVIDIA_GB200.json"
    assert found[quoted] is not None
    assert len(found) == len(text.splitlines())
    assert found["sglang/srt/speculative/eagle_worker_v2.py"] is not None


def test_a_base_patch_reaches_its_host_with_no_router_and_no_unit(tmp_path: Path) -> None:
    """`up --router --engine sglang` applies the incident's build before any engine or the
    router runs: a target with the router would drain it first and fail (no router yet)."""
    manifest = Manifest(
        hosts=(HostRecord(name="sandbox-01", port=30001),),
        router=RouterRecord(port=30100, prometheus_port=30101),
        engine=EngineChoice("sglang", DEFAULT_REAL_RELEASE),
        real=RealEngineRecord("/base", "/sglang.whl", "/target", "/draft"),
    )
    layout = SandboxLayout(tmp_path)
    assert sandbox_inventory(layout, manifest, over_ssh=False).host("sandbox-01").router
    target = base_patch_target(layout, manifest, "sandbox-01")
    assert target.name == "sandbox-01"
    assert target.router is None
    assert target.unit is None
