"""Which engine a sandbox runs, and what a real SGLang release needs to run on the CPU (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement

from opspatch.errors import InputError

EngineKind = Literal["standin", "sglang"]
ENGINE_KINDS: tuple[EngineKind, ...] = ("standin", "sglang")

REAL_RELEASES = ("0.5.23",)
"""Releases the real-engine sandbox runs: each proven here end to end (its pins, the CPU kernel
layer's ops, the platform plugin, TP=2, EAGLE-3). Another release is refused by name."""
DEFAULT_REAL_RELEASE = "0.5.23"

TORCH_REQUIREMENT = "torch==2.13.0"
"""The CPU build (it installs from this machine's disk); SGLang's own pin is a CUDA build."""

GPU_ONLY = frozenset(
    {
        "cuda-python",
        "flash-attn-4",
        "flashinfer-python",
        "humming-kernels",
        "nvidia-cutlass-dsl",
        "nvidia-mathdx",
        "nvshmem4py-cu13",
        "quack-kernels",
        "sgl-deep-ep",
        "sgl-deep-gemm",
        "sgl-flash-mla",
        "sglang-kernel",
        "tilelang",
        "torch-memory-saver",
        "torchaudio",
        "torchcodec",
    }
)
"""Requirements of the wheel that only a GPU uses (CUDA kernels, CUDA-linked builds)."""

NOT_ON_THE_TEXT_PATH = frozenset(
    {"deepseek-recipe", "kernels", "modelscope", "timm", "tml-renderers", "torch"}
)
"""Requirements the CPU text path never imports (`torch` is replaced by `TORCH_REQUIREMENT`)."""

CPU_EXTRAS = ("triton", "torchvision")
"""What the CPU path needs beyond the wheel's list: Triton's interpreter runs EAGLE's Triton
kernels (`TRITON_INTERPRET=1`), and SGLang imports torchvision at start."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine of a sandbox: the stand-in (`version` None), or real SGLang `version`."""

    kind: EngineKind = "standin"
    version: str | None = None

    @property
    def real(self) -> bool:
        return self.kind == "sglang"

    @property
    def label(self) -> str:
        """As `--engine` takes it: `standin`, or `sglang==0.5.23`."""
        return self.kind if self.version is None else f"{self.kind}=={self.version}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": self.version}

    @classmethod
    def from_json(cls, data: Any) -> EngineChoice:
        """Raises ValueError for a kind or release this opspatch does not run."""
        if data is None:
            return STANDIN
        kind, version = data["kind"], data.get("version")
        if kind == "standin":
            return STANDIN
        if kind != "sglang" or version not in REAL_RELEASES:
            raise ValueError(f"unknown engine {kind!r} {version!r}")
        return cls("sglang", str(version))


STANDIN = EngineChoice()


def parse_engine(text: str) -> EngineChoice:
    """`standin`, `sglang` (the default real release) or `sglang==VERSION`.

    Raises:
        InputError: another word, or a release the real-engine sandbox does not run (named,
            with the ones it runs).
    """
    word, sep, version = text.strip().partition("==")
    if word == "standin" and not sep:
        return STANDIN
    if word != "sglang":
        raise InputError(
            f"--engine {text!r}: expected standin, sglang or sglang==VERSION",
            hint="standin: the fast stand-in engine (the default); sglang: real SGLang "
            f"{DEFAULT_REAL_RELEASE} on the CPU",
        )
    version = version.strip() or DEFAULT_REAL_RELEASE
    return real_release(
        version,
        given_as=f"--engine sglang=={version}",
        instead=f"--engine sglang (= {DEFAULT_REAL_RELEASE}), or --engine standin",
    )


def real_release(version: str, *, given_as: str, instead: str) -> EngineChoice:
    """Real SGLang `version`, where the sandbox runs it (`sandbox up --engine`, `rehearse
    --release`: one rule, one message). `given_as`: the option as typed; `instead`: what to use.

    Raises:
        InputError: a release not in `REAL_RELEASES`, named with the ones it runs.
    """
    if version not in REAL_RELEASES:
        raise InputError(
            f"{given_as}: the sandbox runs real SGLang {', '.join(REAL_RELEASES)} "
            f"only, not {version} (each release needs its own pinned environment and a CPU "
            "kernel layer proven on it)",
            hint=f"use {instead}",
        )
    return EngineChoice("sglang", version)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_requirements(metadata: str, environment: dict[str, str] | None = None) -> list[str]:
    """The requirements of a release's shared environment, from its wheel's METADATA: each
    `Requires-Dist` that applies here (no extra, its marker true), less `GPU_ONLY` and
    `NOT_ON_THE_TEXT_PATH`, plus the CPU torch and `CPU_EXTRAS`; sorted by name.

    Raises:
        ValueError: a `Requires-Dist` line that is no requirement.
    """
    dropped = GPU_ONLY | NOT_ON_THE_TEXT_PATH
    wanted: dict[str, str] = {}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        text = line.partition(":")[2].strip()
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise ValueError(f"not a requirement: {text!r} ({exc})") from None
        marker_env = {**(environment or {}), "extra": ""}
        if requirement.marker is not None and not requirement.marker.evaluate(marker_env):
            continue
        name = _normalized(requirement.name)
        if name not in dropped:
            wanted[name] = f"{requirement.name}{requirement.specifier}"
    for extra in CPU_EXTRAS:
        wanted.setdefault(extra, extra)
    wanted["torch"] = TORCH_REQUIREMENT
    return [wanted[name] for name in sorted(wanted)]


def engine_files_dir() -> Path:
    """Package data copied into engine environments only: the CPU kernel layer, the platform
    plugin, the model maker and the constraints files."""
    return Path(__file__).resolve().parent / "engine_files"


def constraints_file(version: str) -> Path:
    """The pins of release `version`'s shared environment."""
    return engine_files_dir() / "constraints" / f"sglang-{version}.txt"


TORCHVISION_META = "torchvision/_meta_registrations.py"
_UNGUARDED = '@torch.library.register_fake("torchvision::{op}")'
_GUARDED = (
    '@(torch.library.register_fake("torchvision::{op}") '
    "if torchvision.extension._has_ops() else (lambda fn: fn))  # opspatch: CPU torch"
)


def guard_torchvision_meta(text: str) -> str:
    """`torchvision/_meta_registrations.py` with its two unguarded fake registrations guarded
    as the file guards the others (by `extension._has_ops()`): PyPI's torchvision is linked
    against CUDA, so beside a CPU torch its ops never load and those two decorators raise
    "operator torchvision::nms does not exist" at import. Already guarded text is returned as
    it is.

    Raises:
        ValueError: the file does not hold each decorator exactly once (another release).
    """
    for op in ("nms", "qnms"):
        unguarded, guarded = _UNGUARDED.format(op=op), _GUARDED.format(op=op)
        if text.count(guarded) == 1:
            continue
        if text.count(unguarded) != 1:
            raise ValueError(f"{TORCHVISION_META}: expected one {unguarded} line")
        text = text.replace(unguarded, guarded)
    return text
