"""The rehearsal's import probe, in a real interpreter: a patched module imported with the
patch's text in place of the installed file (which is not touched), the failure's innermost
frame named, and a failure the unpatched module shares reported as proving nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from opspatch.sandbox.real.importprobe import NO_ANSWER, ProbeResult, probe_imports

pytestmark = pytest.mark.process

RELEASED = "VALUE = 1\n"


def _package(tmp_path: Path, released: str = RELEASED) -> Path:
    package = tmp_path / "site" / "release"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "worker.py").write_text(released)
    return package / "worker.py"


def _probe(tmp_path: Path, installed: Path, patched: str) -> ProbeResult:
    env = {"PYTHONPATH": str(tmp_path / "site")}
    modules = {"release.worker": (installed, patched.encode())}
    return probe_imports(Path(sys.executable), modules, env, tmp_path)


def test_a_patched_module_that_imports_passes_and_the_installed_file_is_untouched(
    tmp_path: Path,
) -> None:
    installed = _package(tmp_path)
    result = _probe(tmp_path, installed, RELEASED + "TWICE = VALUE * 2\n")
    assert result.failure is None
    assert installed.read_text() == RELEASED


def test_a_patch_that_fails_at_import_is_named_with_its_line_in_the_installed_path(
    tmp_path: Path,
) -> None:
    installed = _package(tmp_path)
    patched = RELEASED + "from release import missing_helper\n"
    result = _probe(tmp_path, installed, patched)
    assert result.failure is not None and result.release_imports
    failure = result.failure
    assert (failure.module, failure.type) == ("release.worker", "ImportError")
    assert "cannot import name 'missing_helper'" in failure.message
    assert (failure.file, failure.line, failure.function) == (str(installed), 2, "<module>")
    assert failure.describe().endswith(f'(File "{installed}", line 2, in <module>)')
    assert installed.read_text() == RELEASED


def test_a_module_that_does_not_import_without_the_patch_either_proves_nothing(
    tmp_path: Path,
) -> None:
    installed = _package(tmp_path, released="import no_such_dependency\n")
    result = _probe(tmp_path, installed, "import no_such_dependency\nX = 1\n")
    assert result.failure is not None and result.failure.type == "ModuleNotFoundError"
    assert not result.release_imports


def test_an_interpreter_that_dies_without_an_answer_proves_nothing_and_is_not_asked_again(
    tmp_path: Path,
) -> None:
    installed = _package(tmp_path)
    result = _probe(tmp_path, installed, "import os\nos._exit(3)\n")
    assert result.failure is not None and result.failure.type == NO_ANSWER
    assert result.failure.message == "the import probe gave no answer: exit 3"
    assert not result.release_imports
