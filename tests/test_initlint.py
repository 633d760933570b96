"""lint-init's analysis: partial-initialisation hazards and the guard patch that removes them.

On the stand-in engine (which carries the incident's `spec_disable_batch_threshold`) and on the
real `eagle_worker_v2.py` of SGLang 0.5.4, 0.5.10 and 0.5.23 (downloaded as the patch engine tests
do; skipped with the reason when offline), plus small classes for each rule.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from opspatch.analysis.fixes import parse_exception_line, patches_fixing
from opspatch.analysis.initlint import InitLintReport, lint_init, write_guard_patch
from opspatch.config.patches import load_patch
from opspatch.core.edit import AlreadyApplied, Applied, apply_patch, reverse
from opspatch.core.spec import PatchSpec
from opspatch.core.validate import check_compiles
from opspatch.errors import InputError
from tests.sglang_wheels import EAGLE_RELPATH, WheelUnavailable, sglang_site

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parent.parent
STANDIN_SPECULATIVE = REPO / "opspatch/sandbox/engine_src/sglang/srt/speculative"
MODULE = "sglang.srt.speculative.eagle_worker_v2"


def _lint(path: Path, class_name: str | None = "EAGLEWorkerV2") -> InitLintReport:
    related = {str(p): p.read_text() for p in path.parent.glob("*.py") if p != path}
    return lint_init(path.read_text(), str(path), class_name=class_name, related=related)


def _line_of(path: Path, text: str) -> int:
    """The line number of the only line containing `text` (an oracle independent of the AST)."""
    found = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(found) == 1, found
    return found[0]


def _hazard(report: InitLintReport, attribute: str):  # type: ignore[no-untyped-def]
    found = [h for h in report.hazards if h.attribute == attribute]
    assert len(found) == 1, [h.attribute for h in report.hazards]
    return found[0]


def _guard_round_trip(tmp_path: Path, path: Path, report: InitLintReport) -> PatchSpec:
    """The written guard loads, applies, validates, is idempotent, reverses exactly, and leaves
    no hazard behind."""
    patch_id = "eagle-guard-written"
    guard = write_guard_patch(report, module=MODULE, patch_id=patch_id, incident="INC-TEST")
    patch_file = tmp_path / f"{patch_id}.toml"
    patch_file.write_text(guard.text)
    loaded = load_patch(patch_file)
    assert {c.name for c in loaded.spec.postconditions} == {h.attribute for h in report.hazards}  # type: ignore[union-attr]
    before = path.read_bytes()
    outcome = apply_patch(before, loaded.spec)
    assert isinstance(outcome, Applied), getattr(outcome, "reason", outcome)
    assert check_compiles(outcome.new_source, str(path), (3, 10)) == []
    assert isinstance(apply_patch(outcome.new_source, loaded.spec), AlreadyApplied)
    assert reverse(outcome) == before
    related = {str(p): p.read_text() for p in path.parent.glob("*.py") if p != path}
    after = lint_init(
        outcome.new_source.decode(), str(path), class_name="EAGLEWorkerV2", related=related
    )
    assert after.hazards == ()
    # the rationale says what was found
    for hazard in report.hazards:
        assert (
            f"{hazard.class_name}.{hazard.attribute} is assigned at line" in loaded.spec.rationale
        )
    return loaded.spec


# -- the stand-in: the incident's case ------------------------------------------------------------


def test_standin_incident_hazard_found_with_its_line() -> None:
    path = STANDIN_SPECULATIVE / "eagle_worker_v2.py"
    report = _lint(path)
    hazard = _hazard(report, "spec_disable_batch_threshold")
    assert hazard.assignment.line == _line_of(
        path, "self.spec_disable_batch_threshold = server_args"
    )
    assert hazard.kinds == ("late", "skipped")
    # the first statement that can raise, and the last one before the assignment
    assert hazard.first_risky is not None
    assert hazard.first_risky.line == _line_of(
        path, "self.speculative_algorithm = SpeculativeAlgorithm"
    )
    assert hazard.risky_before[-1].text == "self.init_cuda_graphs()"
    assert hazard.risky_before[-1].line == _line_of(path, "        self.init_cuda_graphs()")
    assert [r.method for r in hazard.reads] == ["EAGLEWorkerV2.should_disable_speculation"]
    assert [s.name for s in hazard.skipping_subclasses] == ["StandaloneWorkerV2"]
    assert hazard.skipping_subclasses[0].runs_instead == ("StandaloneWorkerV2", "BaseSpecWorker")
    # 0 = never disable, inferred from `threshold > 0` in the method that reads it
    assert (
        hazard.default.code("spec_disable_batch_threshold")
        == "spec_disable_batch_threshold: int = 0"
    )
    text = report.render()
    assert f"assigned: line {hazard.assignment.line}: self.spec_disable_batch_threshold" in text
    assert "skipped by: StandaloneWorkerV2" in text


def test_standin_guard_patch_applies_validates_and_clears_the_hazards(tmp_path: Path) -> None:
    path = STANDIN_SPECULATIVE / "eagle_worker_v2.py"
    spec = _guard_round_trip(tmp_path, path, _lint(path))
    # the written patch declares the AttributeErrors it prevents, subclass included
    for owner in ("EAGLEWorkerV2", "StandaloneWorkerV2"):
        raised = parse_exception_line(
            f"AttributeError: '{owner}' object has no attribute 'spec_disable_batch_threshold'"
        )
        assert raised is not None
        assert [m.patch_id for m in patches_fixing(raised, [spec])] == [spec.id]


def test_the_shipped_guard_clears_the_incident_hazard() -> None:
    path = STANDIN_SPECULATIVE / "eagle_worker_v2.py"
    guard = load_patch(REPO / "patches" / "eagle-init-guard.toml").spec
    outcome = apply_patch(path.read_bytes(), guard)
    assert isinstance(outcome, Applied)
    related = {str(p): p.read_text() for p in path.parent.glob("*.py") if p != path}
    after = lint_init(
        outcome.new_source.decode(), str(path), class_name="EAGLEWorkerV2", related=related
    )
    assert "spec_disable_batch_threshold" not in {h.attribute for h in after.hazards}


def test_without_the_sibling_files_the_subclass_is_not_seen() -> None:
    path = STANDIN_SPECULATIVE / "eagle_worker_v2.py"
    report = lint_init(path.read_text(), str(path), class_name="EAGLEWorkerV2")
    hazard = _hazard(report, "spec_disable_batch_threshold")
    assert hazard.kinds == ("late",)


# -- real releases --------------------------------------------------------------------------------

# What upstream really has (spec_disable_batch_threshold is the incident build's local feature):
# attributes assigned after calls that can raise, and attributes a subclass never gets.
UPSTREAM = {
    "0.5.4": {"late": {"_draft_worker", "plan_stream", "req_to_token_pool"}, "skipped": {}},
    "0.5.10": {
        "late": {"_draft_worker", "plan_stream", "req_to_token_pool"},
        # StandaloneWorkerV2.__init__ copies the argument block without tp_rank, which
        # update_weights_from_tensor reads
        "skipped": {"tp_rank": ["StandaloneWorkerV2"]},
    },
    "0.5.23": {
        "late": {"_draft_worker", "plan_stream", "adaptive_controller", "topk"},
        "skipped": {
            "enable_dp_spec_prefill_coordination": ["FrozenKVMTPWorkerV2", "StandaloneWorkerV2"]
        },
    },
}


@pytest.fixture(scope="module", params=sorted(UPSTREAM))
def release(request: pytest.FixtureRequest) -> tuple[str, Path]:
    try:
        site = sglang_site(request.param)
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang {request.param} wheel not available (offline?): {exc}")
    return request.param, site / EAGLE_RELPATH


def test_real_release_hazards(release: tuple[str, Path]) -> None:
    version, path = release
    assert "spec_disable_batch_threshold" not in path.read_text()  # the local feature
    report = _lint(path)
    expected = UPSTREAM[version]
    late = {h.attribute for h in report.hazards if "late" in h.kinds}
    assert expected["late"] <= late
    skipped = {
        h.attribute: [s.name for s in h.skipping_subclasses]
        for h in report.hazards
        if "skipped" in h.kinds
    }
    assert skipped == expected["skipped"]
    draft = _hazard(report, "_draft_worker")
    assert draft.assignment.line == _line_of(path, "self._draft_worker = ")
    assert draft.assignment.text.startswith("self._draft_worker = EagleDraftWorker(")
    assert draft.first_risky is not None and draft.first_risky.line < draft.assignment.line
    assert "EAGLEWorkerV2.draft_worker" in {r.method for r in draft.reads} or version == "0.5.23"


def test_real_release_guard_patch_applies_and_validates(
    release: tuple[str, Path], tmp_path: Path
) -> None:
    _, path = release
    _guard_round_trip(tmp_path, path, _lint(path))


def test_0_5_23_annotation_is_quoted_because_the_module_evaluates_annotations() -> None:
    try:
        path = sglang_site("0.5.23") / EAGLE_RELPATH
    except WheelUnavailable as exc:
        pytest.skip(str(exc))
    hazard = _hazard(_lint(path), "adaptive_controller")
    assert hazard.default.code("adaptive_controller") == (
        'adaptive_controller: "Optional[AdaptiveController]" = None'
    )


# -- the rules, one by one ------------------------------------------------------------------------


def _lint_text(source: str, class_name: str | None = None) -> InitLintReport:
    return lint_init(textwrap.dedent(source), "mod.py", class_name=class_name)


def test_class_level_default_and_assignment_before_any_call_are_safe() -> None:
    report = _lint_text(
        """
        class W(Base):
            ready = False
            def __init__(self, n):
                super().__init__()
                self.n = n
                self.ready = True
                self.pool = make_pool(n)
                self.late = n
            def step(self):
                return self.n, self.ready, self.pool, self.late, self.unread_elsewhere
        """
    )
    assert [h.attribute for h in report.hazards] == ["pool", "late"]
    pool, late = report.hazards
    assert pool.first_risky is not None and pool.first_risky.line == pool.assignment.line
    assert late.first_risky is not None and late.first_risky.text == "self.pool = make_pool(n)"


def test_attribute_read_nowhere_is_not_reported() -> None:
    report = _lint_text(
        """
        class W:
            def __init__(self):
                setup()
                self.only_written = 1
        """
    )
    assert report.hazards == ()
    assert "no partial-initialisation hazard" in report.render()


def test_a_subclass_that_chains_does_not_skip_and_one_that_calls_a_sibling_base_does() -> None:
    report = _lint_text(
        """
        class Base:
            def __init__(self):
                self.x = 1
            def use(self):
                return self.x
        class Chains(Base):
            def __init__(self):
                super().__init__()
        class Explicit(Base):
            def __init__(self):
                Base.__init__(self)
        class Inherits(Base):
            pass
        class Skips(Base):
            def __init__(self):
                object.__init__(self)
        class SkipsButSets(Base):
            def __init__(self):
                self.x = 2
        class GrandChild(Chains):
            def __init__(self):
                super().__init__()
        """,
        "Base",
    )
    (hazard,) = report.hazards
    assert hazard.kinds == ("skipped",)
    assert [s.name for s in hazard.skipping_subclasses] == ["Skips"]


def test_calls_inside_a_nested_function_do_not_count_as_calls() -> None:
    report = _lint_text(
        """
        class W:
            def __init__(self):
                def later():
                    return boom()
                self.cb = lambda: boom()
                self.x = 1
            def use(self):
                return self.x, self.cb
        """
    )
    assert report.hazards == ()


@pytest.mark.parametrize(
    ("assignment", "method_body", "expected"),
    [
        ("self.n: int = compute()", "return self.n", "n: int = 0"),
        ("self.n: Optional[Pool] = compute()", "return self.n", 'n: "Optional[Pool]" = None'),
        ("self.n: Pool = compute()", "return self.n", 'n: "Pool | None" = None'),
        ("self.n = 8", "return self.n", "n: int = 0"),
        ("self.n = 0.5", "return self.n", "n: float = 0.0"),
        ("self.n = True", "return self.n", "n: bool = False"),
        ("self.n = compute()", "t = self.n\n        return t >= 2", "n: int = 0"),
        ("self.n = compute()", "return range(self.n)", "n: int = 0"),
        ("self.n = compute()", "return self.n * 1.5", "n: float = 0.0"),
        ("self.n = compute()", "return self.n.run()", "n = None"),
    ],
)
def test_default_inference(assignment: str, method_body: str, expected: str) -> None:
    source = f"""
class W:
    def __init__(self):
        setup()
        {assignment}
    def use(self):
        {method_body}
"""
    (hazard,) = lint_init(source, "mod.py").hazards
    assert hazard.default.code("n") == expected


def test_future_annotations_keep_the_annotation_unquoted() -> None:
    source = """from __future__ import annotations
class W:
    def __init__(self):
        setup()
        self.n: Pool = compute()
    def use(self):
        return self.n
"""
    (hazard,) = lint_init(source, "mod.py").hazards
    assert hazard.default.code("n") == "n: Pool | None = None"


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ("@dataclass\nclass W:", "@dataclass"),
        ("class W(Enum):", "Enum"),
        ("class W:\n    __slots__ = ('x',)", "__slots__"),
    ],
)
def test_guard_refused_where_a_class_level_value_is_not_inert(header: str, why: str) -> None:
    source = (
        header
        + "\n    def __init__(self):\n        setup()\n        self.x = 1\n"
        + "    def use(self):\n        return self.x\n"
    )
    report = lint_init(source, "mod.py")
    assert len(report.hazards) == 1
    with pytest.raises(InputError, match=why):
        write_guard_patch(report, module="m", patch_id="g")


def test_nothing_to_guard_is_an_input_error() -> None:
    report = _lint_text("class W:\n    def __init__(self):\n        self.x = 1\n")
    with pytest.raises(InputError, match="no partial-initialisation hazard"):
        write_guard_patch(report, module="m", patch_id="g")


def test_unknown_class_and_non_python_are_one_clear_message() -> None:
    with pytest.raises(InputError, match=r"no class Nope \(classes in this file: W\)"):
        _lint_text("class W:\n    pass\n", "Nope")
    with pytest.raises(InputError, match=r"mod.py:1: not Python"):
        lint_init("def (:\n", "mod.py")


def test_report_json_names_every_field() -> None:
    path = STANDIN_SPECULATIVE / "eagle_worker_v2.py"
    data = _lint(path).to_json()
    hazard = next(
        h
        for c in data["classes"]
        for h in c["hazards"]
        if h["attribute"] == "spec_disable_batch_threshold"
    )
    assert set(hazard) >= {
        "class", "attribute", "kinds", "assigned_line", "first_risky", "reads",
        "skipping_subclasses", "default",
    }  # fmt: skip
    assert hazard["first_risky"]["calls"] == ["SpeculativeAlgorithm.from_string"]
    assert ast.parse(hazard["default"]["value"])


def test_a_refused_class_is_left_out_when_the_file_has_others_to_guard(tmp_path: Path) -> None:
    source = textwrap.dedent(
        """
        from dataclasses import dataclass

        @dataclass
        class Config:
            def __init__(self):
                setup()
                self.x = 1
            def use(self):
                return self.x

        class Worker:
            def __init__(self):
                setup()
                self.y = 1
            def use(self):
                return self.y
        """
    )
    report = lint_init(source, "pkg/mod.py")
    guard = write_guard_patch(report, module="pkg.mod", patch_id="mod-guard")
    assert [d[:2] for d in guard.defaults] == [("Worker", "y: int = 0")]
    assert guard.skipped == (
        "Config: it is decorated with @dataclass: a class-level value would become a field",
    )
    (tmp_path / "mod-guard.toml").write_text(guard.text)
    outcome = apply_patch(source.encode(), load_patch(tmp_path / "mod-guard.toml").spec)
    assert isinstance(outcome, Applied), outcome
    with pytest.raises(InputError, match="class Config: no guard patch"):
        write_guard_patch(report, module="pkg.mod", patch_id="g", class_name="Config")


def test_an_assignment_inside_a_closure_is_not_an_assignment_of_init() -> None:
    report = _lint_text(
        """
        class W:
            def __init__(self):
                def later():
                    self.x = 0
                self.cb = later
                setup()
                self.x = 1
            def use(self):
                return self.x
        """
    )
    (hazard,) = report.hazards
    assert hazard.assignment.text == "self.x = 1"
    assert hazard.first_risky is not None and hazard.first_risky.text == "setup()"
