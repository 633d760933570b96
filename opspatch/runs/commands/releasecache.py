"""The release cache of `check --releases`: where it is, and the record of what was proven."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from opspatch.analysis.proofs import (
    ProofCoverage,
    ReleaseProofs,
    combined_coverage,
    proof_coverage,
    proof_key,
)
from opspatch.core.spec import PatchSpec

if TYPE_CHECKING:
    from opspatch.analysis.portability import ReleaseMatrix


def release_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`$OPSPATCH_CACHE`, else under `$XDG_CACHE_HOME` or `~/.cache`."""
    env = os.environ if environ is None else environ
    if env.get("OPSPATCH_CACHE"):
        return Path(env["OPSPATCH_CACHE"]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "opspatch" / "releases"
    home = Path(env.get("HOME") or Path.home())
    return home / ".cache" / "opspatch" / "releases"


def normalize_name(distribution: str) -> str:
    """PEP 503 name with `_` as wheels spell it: `SGLang-Router` -> `sglang_router`."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


def _proofs_path(patch: PatchSpec, cache: Path) -> Path:
    # per module too: each file of a patch set has its own edits, so its own proofs
    root = cache / normalize_name(patch.target.distribution) / "proofs"
    return root / patch.id / f"{patch.target.module}.json"


def read_proofs(patch: PatchSpec, cache: Path) -> ReleaseProofs | None:
    """None when there are none or they cannot be read: nothing is proven, `check` says."""
    path = _proofs_path(patch, cache)
    try:
        return ReleaseProofs.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def record_proofs(patch: PatchSpec, matrix: ReleaseMatrix, cache: Path) -> str | None:
    """Merged atomically (a record of other edits is replaced); else why not."""
    key = proof_key(patch)
    previous = read_proofs(patch, cache)
    if previous is None or previous.key != key:
        previous = ReleaseProofs(patch_id=patch.id, key=key)
    path = _proofs_path(patch, cache)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(
            json.dumps(previous.merged(matrix).to_json(), indent=1) + "\n", encoding="utf-8"
        )
        partial.replace(path)
    except OSError as exc:
        return f"the results could not be recorded for `check` ({path}: {exc.strerror})"
    return None


def release_coverage(
    parts: Sequence[PatchSpec], cache: Path | None = None, reference: str | None = None
) -> ProofCoverage:
    """The releases `check --releases` proved the patch on, from the cache alone; each of
    `parts` is proven on its own file."""
    cache = cache or release_cache_dir()
    coverage = combined_coverage([proof_coverage(p, read_proofs(p, cache)) for p in parts])
    return replace(coverage, patch_id=reference) if reference else coverage
