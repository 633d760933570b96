"""Does a patched module import in a real release's interpreter? Asked before any server starts."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from opspatch.core.codec import Record

PROBE = """
import importlib, importlib.abc, importlib.util, json, sys, traceback
request = json.loads(sys.stdin.read())
modules = request["modules"]

class Patched(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        entry = modules.get(name)
        if entry is None:
            return None
        package = entry["origin"].endswith("__init__.py")
        spec = importlib.util.spec_from_loader(
            name, self, origin=entry["origin"], is_package=package)
        if package:
            spec.submodule_search_locations = [entry["origin"].rsplit("/", 1)[0]]
        spec.has_location = True
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        entry = modules[module.__name__]
        exec(compile(entry["text"], entry["origin"], "exec"), module.__dict__)

if request["patched"]:
    sys.meta_path.insert(0, Patched())
for name in modules:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith("<")]
        last = frames[-1] if frames else None
        print(json.dumps({
            "module": name, "type": type(exc).__name__, "message": str(exc),
            "file": last.filename if last else None, "line": last.lineno if last else None,
            "function": last.name if last else None}))
        sys.exit(0)
print(json.dumps({"module": None}))
"""
"""Run by the host's Python: imports every module of the request (`patched`: with the texts
given), prints one JSON line: the first failure (module, type, message, innermost frame), or
`{"module": null}`."""

NO_ANSWER = "ProbeFailed"
"""The `type` of a failure that is the probe's own: no answer (it ran past `PROBE_TIMEOUT`, or
its interpreter died before printing one)."""

PROBE_TIMEOUT = 900.0
"""Importing SGLang (torch, transformers, its model registry) takes 10-80 s on a busy 2-core
machine."""


@dataclass(frozen=True)
class ImportFailure(Record):
    """A module whose import raised: the exception and the innermost frame outside importlib."""

    module: str
    type: str
    message: str
    file: str | None = None
    line: int | None = None
    function: str | None = None

    def describe(self) -> str:
        """`Type: message (File "...", line N, in f)`, as the engine's log evidence reads."""
        where = f' (File "{self.file}", line {self.line}, in {self.function})' if self.file else ""
        return f"{self.type}: {self.message}{where}"


@dataclass(frozen=True)
class ProbeResult:
    """What the probe found: `failure` under the patch (None: every module imported) and, when
    there is one, whether the release's own modules import alone (`release_imports`)."""

    failure: ImportFailure | None
    release_imports: bool = True


def _run_probe(
    python: Path,
    modules: Mapping[str, tuple[Path, bytes]],
    *,
    patched: bool,
    env: Mapping[str, str],
    cwd: Path,
) -> ImportFailure | None:
    request = {
        "patched": patched,
        "modules": {
            name: {"origin": str(origin), "text": text.decode("utf-8")}
            for name, (origin, text) in modules.items()
        },
    }
    try:
        done = subprocess.run(
            [str(python), "-c", PROBE],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            cwd=cwd,
            timeout=PROBE_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ImportFailure("", NO_ANSWER, f"the imports did not finish in {PROBE_TIMEOUT:.0f} s")
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        said = tail[0] if tail else f"exit {done.returncode}"
        return ImportFailure("", NO_ANSWER, f"the import probe gave no answer: {said}")
    if answer.get("module") is None:
        return None
    return ImportFailure.from_json(answer)


def probe_imports(
    python: Path, modules: Mapping[str, tuple[Path, bytes]], env: Mapping[str, str], cwd: Path
) -> ProbeResult:
    """Import each module (name -> its installed path and its patched bytes) in `python` with
    the patched text; on a failure, once more without the patch (not when the probe itself gave
    no answer: that proves nothing either way)."""
    failure = _run_probe(python, modules, patched=True, env=env, cwd=cwd)
    if failure is None:
        return ProbeResult(None)
    if failure.type == NO_ANSWER:
        return ProbeResult(failure, release_imports=False)
    control = _run_probe(python, modules, patched=False, env=env, cwd=cwd)
    return ProbeResult(failure, release_imports=control is None)
