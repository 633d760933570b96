"""The incident's build on the real engine: the sandbox's own base patches and their switch."""

from __future__ import annotations

from pathlib import Path

from opspatch.config.patches import load_patch
from opspatch.core.spec import LoadedPatch

BASE_PATCH_DIR = Path(__file__).resolve().with_name("base_patches")
INCIDENT_BUILD = "incident-eagle-spec-disable"
"""The patch set of the incident's build (`base_patches/<id>.toml`)."""
INCIDENT_RELEASES = ("0.5.23",)
"""The real releases the incident's build is made for (its targets' `versions`)."""

FORCE_GRAPHS_ENV = "SGLANG_SPEC_DISABLE_FORCE_GRAPHS"
"""The switch the incident's build reads: set up the plain decode's CUDA graphs even when CUDA
graphs are off, which fails on a machine without CUDA, in `EAGLEWorkerV2.__init__`."""
THRESHOLD_ENV = "SGLANG_SPEC_DISABLE_BATCH_THRESHOLD"
"""The feature's setting: decode batches above this many requests are not drafted (0 = never)."""
INCIDENT_THRESHOLD = 16
"""The threshold the incident's team configured; a fixed host still reads 0 (its `__init__`
stops before the configured value is assigned)."""

INCIDENT_ENV: dict[str, str] = {FORCE_GRAPHS_ENV: "1", THRESHOLD_ENV: str(INCIDENT_THRESHOLD)}
"""The environment of an incident host's engine."""
INCIDENT_SERVER_FLAGS = ("--skip-server-warmup",)
"""The incident's server answered `/health` before its first decode: no 8-token warm-up."""


def base_patch_path(patch_id: str = INCIDENT_BUILD) -> Path:
    """The file of a base patch shipped with opspatch."""
    return BASE_PATCH_DIR / f"{patch_id}.toml"


def load_base_patch(patch_id: str = INCIDENT_BUILD) -> LoadedPatch:
    """A base patch, parsed and validated like any patch file.

    Raises:
        SpecError: the shipped file is broken (a test loads every one).
    """
    return load_patch(base_patch_path(patch_id))


def is_incident_release(version: str | None) -> bool:
    """Whether a real-engine host of SGLang `version` runs the incident's build (None: the
    stand-in, which carries the incident in its own code)."""
    return version in INCIDENT_RELEASES


def base_patches_for(version: str | None) -> tuple[LoadedPatch, ...]:
    """The base patches a real-engine host of SGLang `version` is built with: the incident's
    build where it is made for that release, else none."""
    return (load_base_patch(),) if is_incident_release(version) else ()
