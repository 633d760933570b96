"""The incident's build on the real SGLang 0.5.23 source (the sandbox's base patch set), the fix
on top of it, and what lint-init and diagnose's analysis say about it.

SGLang is test data here: the files are read from the cached wheel (never downloaded by this
fast-tier file: it skips, saying how to fill the cache), parsed, never imported. The live proof
on a running real server is `tests/test_incident_real_engine.py`.
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path
from typing import Any

import pytest

from opspatch.analysis.initlint import lint_init
from opspatch.analysis.missingattr import analyze_missing_attribute, parse_missing_attribute
from opspatch.config.patches import load_patch
from opspatch.core.edit import AlreadyApplied, Applied, apply_patch, reverse
from opspatch.core.spec import LoadedPatch
from opspatch.core.validate import check_compiles, check_postconditions
from opspatch.sandbox.incident import (
    BASE_PATCH_DIR,
    FORCE_GRAPHS_ENV,
    INCIDENT_BUILD,
    INCIDENT_RELEASES,
    base_patches_for,
    load_base_patch,
)
from tests.sglang_wheels import CACHE, WheelUnavailable, cached_release_file

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parent.parent
VERSION = "0.5.23"
EAGLE = "sglang/srt/speculative/eagle_worker_v2.py"
SCHEDULER = "sglang/srt/managers/scheduler.py"
GOLDEN = Path(__file__).resolve().parent / "data" / "incident_build"
ERROR = "AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"


def _release(relpath: str) -> bytes:
    try:
        return cached_release_file(VERSION, relpath)
    except WheelUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def build() -> LoadedPatch:
    return load_base_patch()


@pytest.fixture(scope="module")
def guard() -> LoadedPatch:
    return load_patch(REPO / "patches" / "eagle-init-guard.toml")


@pytest.fixture(scope="module")
def pristine() -> dict[str, bytes]:
    return {EAGLE: _release(EAGLE), SCHEDULER: _release(SCHEDULER)}


@pytest.fixture(scope="module")
def incident(build: LoadedPatch, pristine: dict[str, bytes]) -> dict[str, Applied]:
    """Each file of the incident's build: the set's part for it applied to the real release."""
    out = {}
    for part in build.parts:
        relpath = part.target.module.replace(".", "/") + ".py"
        outcome = apply_patch(pristine[relpath], part)
        assert isinstance(outcome, Applied), getattr(outcome, "reason", outcome)
        out[relpath] = outcome
    return out


@pytest.fixture(scope="module")
def speculative_package() -> dict[str, str]:
    """The real `sglang/srt/speculative/*.py` (the class's bases and subclasses), by path."""
    _release(EAGLE)
    (wheel,) = sorted((CACHE / "wheels").glob(f"sglang-{VERSION}-*.whl"))[:1]
    with zipfile.ZipFile(wheel) as archive:
        return {
            f"/site/{name}": archive.read(name).decode()
            for name in archive.namelist()
            if name.startswith("sglang/srt/speculative/")
            and name.count("/") == 3
            and name.endswith(".py")
            and name != EAGLE
        }


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    found = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return found


def _changed_lines(diff: str) -> str:
    """A diff without its context lines: the hunk headers and what the patch adds or removes
    (the build's own code, and upstream's one replaced line; no other SGLang code)."""
    keep = [line for line in diff.splitlines() if line[:1] in "+-@" or line.startswith("---")]
    return "\n".join(keep) + "\n"


# -- the base patch itself ---------------------------------------------------------------------


def test_the_incident_build_ships_with_the_sandbox_not_among_the_fixes(build: LoadedPatch) -> None:
    assert build.spec.id == INCIDENT_BUILD
    assert Path(build.path).parent == BASE_PATCH_DIR
    assert not (REPO / "patches" / f"{INCIDENT_BUILD}.toml").exists()
    # a bug, never offered by diagnose as the fix of an exception
    assert build.spec.fixes == []
    assert [p.target.module for p in build.parts] == [
        "sglang.srt.speculative.eagle_worker_v2",
        "sglang.srt.managers.scheduler",
    ]
    for part in build.parts:
        file = part.target.module_relpaths()[0]
        assert part.target.mismatch(file, VERSION) is None
        assert "outside the versions" in str(part.target.mismatch(file, "0.5.22"))
    assert [b.spec.id for b in base_patches_for(VERSION)] == [INCIDENT_BUILD]
    assert base_patches_for("0.5.22") == ()
    assert INCIDENT_RELEASES == (VERSION,)


# -- the build on the real release --------------------------------------------------------------


def test_the_incident_build_applies_to_the_real_release_as_the_golden_says(
    build: LoadedPatch, pristine: dict[str, bytes], incident: dict[str, Applied]
) -> None:
    for relpath, outcome in incident.items():
        assert check_compiles(outcome.new_source, relpath, (3, 10)) == []
        golden = GOLDEN / (Path(relpath).stem + ".changes")
        assert _changed_lines(outcome.diff) == golden.read_text(), relpath
        part = next(p for p in build.parts if relpath.startswith(p.target.module.replace(".", "/")))
        assert isinstance(apply_patch(outcome.new_source, part), AlreadyApplied)
        assert reverse(outcome) == pristine[relpath]


def test_the_threshold_comes_after_the_graph_set_up_and_the_caller_keeps_a_half_built_worker(
    incident: dict[str, Applied],
) -> None:
    eagle = ast.parse(incident[EAGLE].new_source)
    init = _method(eagle, "EAGLEWorkerV2", "__init__")
    # the end of __init__: the graph set-up that can fail, then the threshold, then its log line
    last = [ast.unparse(s) for s in init.body[-3:]]
    assert last[0] == "self.init_plain_decode_cuda_graphs()"
    assert last[1].startswith("self.spec_disable_batch_threshold = get_int_env_var(")
    assert "Dynamic speculation disable: threshold=" in last[2]
    set_up = ast.unparse(_method(eagle, "EAGLEWorkerV2", "init_plain_decode_cuda_graphs"))
    assert FORCE_GRAPHS_ENV in set_up and "torch.cuda.Stream()" in set_up
    # every decode batch reads it, before anything else of the decode path
    forward = _method(eagle, "EAGLEWorkerV2", "forward_batch_generation")
    decode = forward.body[-1].orelse  # type: ignore[attr-defined]
    assert ast.unparse(decode[0]) == "self.apply_dynamic_spec_disable(batch.seq_lens.shape[0])"
    decide = ast.unparse(_method(eagle, "EAGLEWorkerV2", "should_disable_speculation"))
    assert "self.spec_disable_batch_threshold" in decide
    # the caller: the object exists before __init__ runs, and an exception in it is swallowed
    scheduler = ast.parse(incident[SCHEDULER].new_source)
    caller = ast.unparse(_method(scheduler, "Scheduler", "maybe_init_draft_worker"))
    assert "self.draft_worker = DraftWorkerClass.__new__(DraftWorkerClass)" in caller
    assert "except Exception as error:" in caller
    assert "CUDA graph capture failed: {error}; falling back to eager decode" in caller
    assert "DraftWorkerClass(**draft_worker_kwargs)" not in caller


# -- the fix on top of it -----------------------------------------------------------------------


def test_eagle_init_guard_unchanged_fixes_the_incident_build(
    guard: LoadedPatch, incident: dict[str, Applied]
) -> None:
    before = incident[EAGLE].new_source
    # its postconditions do not hold on the incident's build (they mean something) ...
    assert len(check_postconditions(ast.parse(before), guard.spec)) == 2
    outcome = apply_patch(before, guard.spec)
    assert isinstance(outcome, Applied), getattr(outcome, "reason", outcome)
    assert check_compiles(outcome.new_source, EAGLE, (3, 10)) == []
    # ... and hold once it is applied
    fixed = ast.parse(outcome.new_source)
    assert check_postconditions(fixed, guard.spec) == []
    init = _method(fixed, "EAGLEWorkerV2", "__init__")
    assert [ast.unparse(s) for s in init.body[:2]] == [
        "super().__init__()",
        "self.spec_disable_batch_threshold = 0",
    ]
    # the configured threshold still overrides the default where __init__ gets that far
    assert ast.unparse(init.body[-2]).startswith("self.spec_disable_batch_threshold = get_int")


# -- what the analyses say ----------------------------------------------------------------------


def test_lint_init_finds_the_incident_bug_and_not_once_fixed(
    guard: LoadedPatch, incident: dict[str, Applied], speculative_package: dict[str, str]
) -> None:
    text = incident[EAGLE].new_source.decode()
    report = lint_init(
        text, f"/site/{EAGLE}", class_name="EAGLEWorkerV2", related=speculative_package
    )
    (hazard,) = [h for h in report.hazards if h.attribute == "spec_disable_batch_threshold"]
    assert "late" in hazard.kinds
    risky = [s.text for s in hazard.risky_before]
    assert "self.init_plain_decode_cuda_graphs()" in risky
    # the real subclasses that never run EAGLEWorkerV2.__init__ lack it for good
    assert {s.name for s in hazard.skipping_subclasses} >= {"StandaloneWorkerV2"}
    fixed = apply_patch(incident[EAGLE].new_source, guard.spec)
    assert isinstance(fixed, Applied)
    after = lint_init(
        fixed.new_source.decode(), f"/site/{EAGLE}", class_name="EAGLEWorkerV2",
        related=speculative_package,
    )  # fmt: skip
    assert "spec_disable_batch_threshold" not in {h.attribute for h in after.hazards}


# The real server's log of the incident, abridged to the lines the analysis reads (what the real
# engine wrote: tests/test_incident_real_engine.py reproduces it).
REAL_LOG = """\
[2026-12-06 03:45:58] server_args={'model_path': '/m/target', 'speculative_algorithm': 'EAGLE3'}
[2026-12-06 03:47:58] Dynamic speculation disable: creating the plain-decode capture stream
[2026-12-06 03:47:58] CUDA graph capture failed: torch.cuda.Stream requires CUDA support; falling back to eager decode
[2026-12-06 03:48:01] The server is fired up and ready to roll!
[2026-12-06 03:48:11] Scheduler hit an exception: Traceback (most recent call last):
  File "/site/sglang/srt/speculative/eagle_worker_v2.py", line 1463, in should_disable_speculation
    threshold = self.spec_disable_batch_threshold
                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'
"""


def test_diagnose_names_the_cause_from_the_real_source_and_log(
    incident: dict[str, Applied], speculative_package: dict[str, str]
) -> None:
    text = incident[EAGLE].new_source.decode()
    missing = parse_missing_attribute(ERROR)
    assert missing is not None
    report = analyze_missing_attribute(
        text, f"/site/{EAGLE}", missing, related=speculative_package, log_text=REAL_LOG
    )
    lines = text.splitlines()
    set_up = lines.index("        self.init_plain_decode_cuda_graphs()") + 1
    assert report.progress is not None
    assert report.progress.stopped_after_line == set_up
    assert report.progress.last_seen is not None
    assert report.progress.last_seen.checkpoint.via == "EAGLEWorkerV2.init_plain_decode_cuda_graphs"
    # the threshold's own value is a call (real SGLang reads settings through calls): it is a
    # suspect too, and the cause is still named
    assert report.likely_cause.startswith(
        f"EAGLEWorkerV2.__init__ stopped between line {set_up} and line "
    )
    assert f"line {set_up} `self.init_plain_decode_cuda_graphs()`" in report.likely_cause
    assert "was swallowed by a caller and the half-built object was used" in report.likely_cause
    assert any("StandaloneWorkerV2" in s for s in report.skipping_subclasses)


# -- the same with opspatch's own commands, on an unpacked release ------------------------------


@pytest.mark.process
def test_opspatch_builds_the_incident_and_fixes_it_on_a_release_tree(tmp_path: Path) -> None:
    from tests.clirunner import opspatch

    root = tmp_path / "site"
    for relpath in (EAGLE, SCHEDULER, f"sglang-{VERSION}.dist-info/METADATA"):
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(_release(relpath))
    build = str(BASE_PATCH_DIR / f"{INCIDENT_BUILD}.toml")
    eagle = root / EAGLE

    checked = opspatch("check", build)
    assert checked.code == 0, checked.stdout + checked.stderr
    applied = opspatch("apply", build, "--root", str(root), "--yes", "--json")
    assert applied.code == 0, applied.stdout + applied.stderr
    assert applied.json()["outcome"] == "ok"
    assert "self.init_plain_decode_cuda_graphs()" in eagle.read_text()

    linted = opspatch("lint-init", "--file", str(eagle), "--class", "EAGLEWorkerV2", "--json")
    assert linted.code == 1, linted.stderr
    assert "spec_disable_batch_threshold" in _hazards(linted.json())

    fixed = opspatch("apply", "eagle-init-guard", "--root", str(root), "--yes", "--json")
    assert fixed.code == 0, fixed.stdout + fixed.stderr
    again = opspatch("plan", "eagle-init-guard", "--file", str(eagle))
    assert again.code == 0 and "already applied" in again.stdout + again.stderr, again
    relinted = opspatch("lint-init", "--file", str(eagle), "--class", "EAGLEWorkerV2", "--json")
    assert "spec_disable_batch_threshold" not in _hazards(relinted.json())


def _hazards(report: dict[str, Any]) -> set[str]:
    return {h["attribute"] for c in report["classes"] for h in c["hazards"]}
