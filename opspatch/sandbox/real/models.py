"""The real-engine sandbox's models: a tiny Llama and its EAGLE-3 draft, made here, cached."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opspatch.errors import InputError
from opspatch.sandbox.dist import engine_source_dir
from opspatch.sandbox.real.build import BaseEnv, BuildEvent, BuildProgress, no_progress
from opspatch.sandbox.real.release import engine_files_dir

MAKE_MODELS = "make_models.py"
CORPUS = "sglang/srt/models/corpus.py"
MODEL_TIMEOUT = 1800.0


@dataclass(frozen=True)
class ModelPaths:
    """A complete pair of models: `target/` (with its tokenizer) and `draft/`."""

    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def draft(self) -> Path:
        return self.root / "draft"

    def report(self) -> dict[str, Any]:
        """What the training said (steps, losses, seconds)."""
        data: dict[str, Any] = json.loads((self.root / "report.json").read_text("utf-8"))
        return data


def _sources() -> tuple[Path, Path]:
    return engine_files_dir() / MAKE_MODELS, engine_source_dir() / CORPUS


def models_key(base: BaseEnv) -> str:
    digest = hashlib.sha256(base.key.encode("ascii"))
    for path in _sources():
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def ensure_models(cache: Path, base: BaseEnv, progress: BuildProgress = no_progress) -> ModelPaths:
    """The cached models for `base`, made when missing (about a minute or two).

    Raises:
        InputError: the script failed (its last lines said).
    """
    root = cache / "models" / models_key(base)
    if (root / "report.json").is_file():
        return ModelPaths(root)
    script, corpus = _sources()
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    progress(BuildEvent(1, 1, "models", f"training in {partial}"))
    tail: deque[str] = deque(maxlen=20)
    with subprocess.Popen(
        [str(base.python), str(script), str(corpus), str(partial)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line.rstrip())
            if line.startswith("make_models:"):
                progress(BuildEvent(1, 1, "models", line.partition(":")[2].strip()))
    if process.returncode != 0 or not (partial / "report.json").is_file():
        said = "\n  ".join(tail)
        raise InputError(f"could not make the sandbox's models ({script.name}):\n  {said}")
    if root.exists():  # another build finished first: keep its models
        shutil.rmtree(partial, ignore_errors=True)
    else:
        partial.rename(root)
    return ModelPaths(root)
