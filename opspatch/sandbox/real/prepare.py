"""What `sandbox up --engine sglang` does before any engine starts: the release's shared
environment and the models made or found in the cache (`prepare_real_engine`, also
`opspatch sandbox prepare`), and each host's own layer on top (`make_real_host`), with the
sandbox's base patches applied where its `sglang` was just installed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opspatch.sandbox.dist import installed_entries
from opspatch.sandbox.install import host_venv_dir
from opspatch.sandbox.layout import Progress, SandboxLayout
from opspatch.sandbox.manifest import Manifest, RealEngineRecord
from opspatch.sandbox.real.basepatches import apply_base_patches, base_patches_for
from opspatch.sandbox.real.build import (
    BaseEnv,
    BuildProgress,
    engine_cache_dir,
    ensure_base,
    ensure_wheel,
    no_progress,
)
from opspatch.sandbox.real.hostenv import make_real_host_python
from opspatch.sandbox.real.models import ensure_models
from opspatch.sandbox.real.release import EngineChoice


def prepare_real_engine(
    engine: EngineChoice, progress: BuildProgress = no_progress, cache: Path | None = None
) -> RealEngineRecord:
    """The release's shared environment, wheel and models, built where not cached.

    Raises:
        IndexUnreachable: something to download and the package index does not answer.
        InputError: a build failed otherwise.
    """
    assert engine.version is not None, "the stand-in needs no preparing"
    cache = cache or engine_cache_dir()
    base = ensure_base(cache, engine.version, progress)
    wheel = ensure_wheel(cache, engine.version, lambda _: None)
    models = ensure_models(cache, base, progress)
    return RealEngineRecord(str(base.path), str(wheel), str(models.target), str(models.draft))


@dataclass(frozen=True)
class RealHost:
    """A host's environment for real SGLang: its interpreter, and whether `sglang` was
    installed just now (else it was there, patched or not)."""

    python: Path
    installed_now: bool


def make_real_host(
    layout: SandboxLayout, manifest: Manifest, host: str, progress: Progress
) -> RealHost:
    """Give `host` its environment (`hostenv.make_real_host_python`) and, where its `sglang`
    was just installed, the sandbox's base patches.

    Raises:
        HostError: the environment could not be made, or a base patch did not apply.
    """
    assert manifest.real is not None and manifest.engine.version is not None
    real = manifest.real
    host_dir = layout.host_dir(host)
    site_packages = sorted(host_venv_dir(host_dir).glob("lib/python3*/site-packages"))
    fresh = not site_packages or not any(installed_entries(site_packages[0]))
    base = BaseEnv(Path(real.base), manifest.engine.version, key="")
    python = make_real_host_python(host_dir, base, Path(real.wheel))
    if fresh:
        apply_base_patches(layout, manifest, host, base_patches_for(manifest.engine), progress)
    return RealHost(python, fresh)
