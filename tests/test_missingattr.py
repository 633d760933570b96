"""diagnose's analysis of `'<Class>' object has no attribute '<attr>'`, how far `__init__` got
by its log messages, and the patches that declare they fix an exception.

The stand-in engine's speculative package is the source under test; the log excerpt is what the
stand-in really wrote when it reproduced the incident (the slow test reproduces it live).
"""

from __future__ import annotations

import ast
import shutil
import textwrap
from pathlib import Path

import pytest

from opspatch.analysis.classgraph import ClassGraph
from opspatch.analysis.fixes import parse_exception_line, patches_fixing
from opspatch.analysis.initprogress import init_progress, message_pattern
from opspatch.analysis.missingattr import (
    MissingAttribute,
    MissingAttributeReport,
    analyze_missing_attribute,
    parse_missing_attribute,
)
from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch
from opspatch.core.spec import patch_json_schema
from opspatch.errors import SpecError

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parent.parent
ENGINE_SRC = REPO / "opspatch/sandbox/engine_src"
EAGLE = ENGINE_SRC / "sglang/srt/speculative/eagle_worker_v2.py"
ERROR = "AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"

# The stand-in's log from the start of the server to the crash (CUDA graph capture failed).
INCIDENT_LOG = """\
[2026-12-01 00:05:10 TP0] Load weight begin. model=tiny, device=cpu
[2026-12-01 00:05:10 TP0] Load weight end. type=TinyCausalLM, dtype=torch.float64, weights=24505, elapsed=0.00 s
[2026-12-01 00:05:10 TP0] Load weight begin. model=tiny-draft, device=cpu
[2026-12-01 00:05:10 TP0] Load weight end. type=TinyCausalLM, dtype=torch.float64, weights=24505, elapsed=0.01 s
[2026-12-01 00:05:10 TP0] Attention backend: torch_native (eager, cpu)
[2026-12-01 00:05:10 TP0] Capture cuda graph begin (target). This can take up to several minutes. bs=[1, 2, 4, 8]
[2026-12-01 00:05:10 TP0] CUDA graph capture failed: torch.cuda.Stream requires CUDA support; falling back to eager decode
[2026-12-01 00:05:10 TP0] max_total_num_tokens=65536, max_running_requests=64, context_len=1024, device=cpu
[2026-12-01 00:05:10] The server is fired up and ready to roll!
[2026-12-01 00:05:10 TP0] Scheduler hit an exception: Traceback (most recent call last):
AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'
"""


def _line_of(path: Path, text: str) -> int:
    found = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(found) == 1, found
    return found[0]


def _analyze(
    root: Path = ENGINE_SRC, error: str = ERROR, log: str | None = INCIDENT_LOG
) -> MissingAttributeReport:
    path = root / "sglang/srt/speculative/eagle_worker_v2.py"
    related = {str(p): p.read_text() for p in root.rglob("*.py") if p != path}
    missing = parse_missing_attribute(error)
    assert missing is not None
    return analyze_missing_attribute(
        path.read_text(), str(path), missing, related=related, log_text=log
    )


# -- the incident ---------------------------------------------------------------------------------


def test_incident_assignment_risky_statements_and_skipping_subclass() -> None:
    report = _analyze(log=None)
    (assignment,) = report.assignments
    assert (assignment.class_name, assignment.method) == ("EAGLEWorkerV2", "__init__")
    assert assignment.statement.line == _line_of(EAGLE, "self.spec_disable_batch_threshold = ")
    assert assignment.init_runs
    assert [s.text for s in assignment.risky_before] == [
        "self.speculative_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)",
        "self._draft_worker = EagleDraftWorker(server_args, gpu_id, nccl_port, target_worker)",
        "self.init_attention_backend()",
        "self.init_cuda_graphs()",
    ]
    assert len(report.skipping_subclasses) == 1
    assert report.skipping_subclasses[0].startswith("StandaloneWorkerV2 (")
    assert report.class_level is None
    assert "after 4 statement(s) that can raise" in report.likely_cause


def test_incident_alternatives_are_checked_and_absent() -> None:
    report = _analyze()
    checks = {c.name: c for c in report.checks}
    for name in (
        "__getattr__", "__getattribute__", "__setattr__", "__new__", "metaclass",
        "__init_subclass__", "__slots__", "del self.spec_disable_batch_threshold",
        "proxy or other class",
    ):  # fmt: skip
        assert checks[name].present is False, checks[name]
    assert "not a proxy" in checks["proxy or other class"].detail
    assert report.not_examined == ()  # every base but the standard library's ABC was given


def test_incident_init_stopped_between_capture_and_the_missing_message() -> None:
    report = _analyze()
    progress = report.progress
    assert progress is not None
    capture = _line_of(EAGLE, "        self.init_cuda_graphs()")
    message = _line_of(EAGLE, 'logger.info(f"Dynamic speculation disable: threshold=')
    assert (progress.stopped_after_line, progress.stopped_before_line) == (capture, message)
    assert progress.summary() == (
        f"EAGLEWorkerV2.__init__ stopped between line {capture} and line {message}"
    )
    assert progress.last_seen is not None
    assert (
        progress.last_seen.checkpoint.via
        == "BaseSpecWorker.init_cuda_graphs -> CudaGraphRunner.__init__"
    )
    assert progress.last_seen.evidence is not None
    assert "Capture cuda graph begin (target)" in progress.last_seen.evidence
    assert progress.next_unseen is not None
    assert progress.next_unseen.checkpoint.template == "Dynamic speculation disable: threshold="
    assert [s.text for s in progress.suspects] == ["self.init_cuda_graphs()"]
    assert report.likely_cause.startswith(progress.summary() + ", before assigning")
    assert "`self.init_cuda_graphs()` was swallowed by a caller" in report.likely_cause
    text = report.render()
    assert "stopped between line" in text and "[no] __getattr__" in text


def test_a_full_start_log_says_init_got_past_its_last_message() -> None:
    log = INCIDENT_LOG + "[2026] Dynamic speculation disable: threshold=0\n"
    report = _analyze(log=log)
    assert report.progress is not None
    assert report.progress.next_unseen is None
    assert "got past its last logged point" in report.progress.summary()
    assert "after 4 statement(s) that can raise" in report.likely_cause


def test_no_message_of_init_in_the_log() -> None:
    report = _analyze(log="[2026] server_args=ServerArgs()\n")
    assert report.progress is not None
    assert report.progress.last_seen is None
    assert "none of its messages is in the log" in report.progress.summary()


def test_subclass_message_names_the_init_it_never_runs() -> None:
    report = _analyze(
        error="AttributeError: 'StandaloneWorkerV2' object has no attribute "
        "'spec_disable_batch_threshold'. Did you mean: 'speculation_disabled'?"
    )
    assert report.class_name == "StandaloneWorkerV2"
    (assignment,) = report.assignments
    assert assignment.class_name == "EAGLEWorkerV2" and not assignment.init_runs
    assert report.likely_cause.startswith("StandaloneWorkerV2 never runs EAGLEWorkerV2.__init__")


def test_getattr_in_a_base_class_is_reported_as_the_likelier_cause(tmp_path: Path) -> None:
    root = tmp_path / "src"
    shutil.copytree(ENGINE_SRC, root)
    base = root / "sglang/srt/speculative/base_spec_worker.py"
    text = base.read_text()
    hook = (
        "    def __getattr__(self, name):\n"
        "        raise AttributeError(f\"'{type(self).__name__}' object has no attribute '{name}'\")\n\n"
        "    @property\n    def target_worker"
    )
    base.write_text(text.replace("    @property\n    def target_worker", hook, 1))
    report = _analyze(root)
    check = next(c for c in report.checks if c.name == "__getattr__")
    assert check.present and "BaseSpecWorker" in check.detail
    assert report.likely_cause.startswith(
        "likelier cause: __getattr__ is defined in BaseSpecWorker"
    )


def test_a_class_level_default_means_other_code_runs() -> None:
    guard = load_patch(REPO / "patches" / "eagle-init-guard.toml").spec
    outcome = apply_patch(EAGLE.read_bytes(), guard)
    assert isinstance(outcome, Applied)
    report = analyze_missing_attribute(
        outcome.new_source.decode(),
        str(EAGLE),
        MissingAttribute("EAGLEWorkerV2", "spec_disable_batch_threshold"),
    )
    assert report.class_level is not None
    assert "the process runs other code" in report.likely_cause


def test_class_not_in_the_source() -> None:
    report = analyze_missing_attribute(
        "class Other:\n    pass\n", "mod.py", MissingAttribute("EAGLEWorkerV2", "x")
    )
    assert report.class_where is None
    assert "not defined in mod.py" in report.likely_cause


def test_metaclass_init_subclass_slots_property_and_del_are_found() -> None:
    source = textwrap.dedent(
        """
        class Meta(type):
            pass
        class Base(metaclass=Meta):
            __slots__ = ("x",)
            def __init_subclass__(cls):
                pass
        class C(Base):
            @property
            def x(self):
                return self._x
            def drop(self):
                del self.x
        """
    )
    report = analyze_missing_attribute(source, "m.py", MissingAttribute("C", "x"))
    present = {c.name for c in report.checks if c.present}
    assert present == {"metaclass", "__init_subclass__", "__slots__", "property x", "del self.x"}


def test_unresolved_bases_are_listed_as_not_examined() -> None:
    report = analyze_missing_attribute(
        "class C(Remote):\n    def __init__(self):\n        self.x = 1\n",
        "m.py",
        MissingAttribute("C", "x"),
    )
    assert report.not_examined == ("base Remote of C (its source was not given)",)


# -- parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ERROR, ("EAGLEWorkerV2", "spec_disable_batch_threshold")),
        ("'mod.Worker' object has no attribute 'x'. Did you mean: 'y'?", ("Worker", "x")),
        ("[ts TP0] AttributeError: 'W' object has no attribute '_pool'", ("W", "_pool")),
        ("AttributeError: module 'm' has no attribute 'x'", None),
        ("KeyError: 'x'", None),
    ],
)
def test_parse_missing_attribute(text: str, expected: tuple[str, str] | None) -> None:
    found = parse_missing_attribute(text)
    assert (None if found is None else (found.class_name, found.attribute)) == expected


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (
            'f"Dynamic speculation disable: threshold={t}"',
            "Dynamic speculation disable: threshold=",
        ),
        (
            '"Load weight begin. model=%s, device=%s" % (a, b)',
            r"Load weight begin. model={…}, device=",
        ),
        ('"Captured {} graphs in {:.2f} s".format(n, t)', "Captured {…} graphs in {…} s"),
        ('"Capture begin " + name + " done now"', "Capture begin {…} done now"),
        ('f"{x}: ok"', None),  # too little literal text to recognise
        ('"first line of it\\nsecond"', "first line of it"),
    ],
)
def test_message_templates(call: str, expected: str | None) -> None:
    found = message_pattern(ast.parse(call, mode="eval").body)
    assert (None if found is None else found[0]) == expected


def test_lazy_percent_arguments_and_rank0_helper_are_logging_calls() -> None:
    source = textwrap.dedent(
        """
        class W:
            def __init__(self):
                logger.info("Init step one of %d", 3)
                self.a = setup()
                log_info_on_rank0(logger, f"Init step two, rank {r}")
                self.b = 1
        """
    )
    graph = ClassGraph("m.py", source)
    (cls,) = graph.named("W")
    progress = init_progress(graph, cls, cls, "x Init step one of 3\n")
    assert [c.checkpoint.pattern for c in progress.checkpoints] == [
        r"Init\ step\ one\ of\ ",
        r"Init\ step\ two,\ rank\ ",
    ]
    assert progress.summary() == "W.__init__ stopped between line 4 and line 6"
    assert [s.text for s in progress.suspects] == ["self.a = setup()"]


# -- patches that declare what they fix -----------------------------------------------------------


def test_eagle_init_guard_is_named_for_the_incident_and_its_subclass() -> None:
    guard = load_patch(REPO / "patches" / "eagle-init-guard.toml").spec
    other = load_patch(REPO / "patches" / "scheduler-report-partial-init.toml").spec
    for line in (
        ERROR,
        ERROR.replace("EAGLEWorkerV2", "StandaloneWorkerV2") + ". Did you mean: 'x'?",
    ):
        raised = parse_exception_line(line)
        assert raised is not None
        assert [m.patch_id for m in patches_fixing(raised, [other, guard])] == ["eagle-init-guard"]
    for line in (
        "AttributeError: 'EAGLEWorkerV2' object has no attribute 'topk'",
        "KeyError: \"object has no attribute 'spec_disable_batch_threshold'\"",
    ):
        raised = parse_exception_line(line)
        assert raised is not None and patches_fixing(raised, [guard]) == ()


def test_exception_types_match_by_their_last_dotted_part(tmp_path: Path) -> None:
    patch = tmp_path / "oom.toml"
    patch.write_text(
        (REPO / "patches" / "eagle-init-guard.toml")
        .read_text()
        .replace('id = "eagle-init-guard"', 'id = "oom"')
        .replace('exception = "AttributeError"', 'exception = "torch.OutOfMemoryError"')
        .replace("object has no attribute 'spec_disable_batch_threshold'", "CUDA out of memory")
    )
    spec = load_patch(patch).spec
    raised = parse_exception_line("OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    assert raised is not None
    (match,) = patches_fixing(raised, [spec])
    assert match.to_json()["fix_index"] == 0


def test_a_bad_fixes_entry_is_a_spec_error_at_its_line(tmp_path: Path) -> None:
    patch = tmp_path / "eagle-init-guard.toml"
    text = (REPO / "patches" / "eagle-init-guard.toml").read_text()
    patch.write_text(
        text.replace(
            "message = \"object has no attribute 'spec_disable_batch_threshold'\"",
            'message = "(unclosed"',
        )
    )
    with pytest.raises(SpecError) as caught:
        load_patch(patch)
    line = next(i for i, t in enumerate(patch.read_text().splitlines(), 1) if "(unclosed" in t)
    assert f":{line}: fixes[0].message" in caught.value.message
    assert "is not a regular expression" in caught.value.message


def test_schema_documents_fixes() -> None:
    schema = patch_json_schema()
    assert "fixes" in schema["properties"]
    assert set(schema["$defs"]["Fix"]["required"]) == {"exception", "message"}


@pytest.mark.engine
def test_live_incident_on_the_standin_is_explained(tmp_path: Path) -> None:
    """Reproduce the incident with a real stand-in engine, then analyse the installed file and the
    log it really wrote."""
    from tests.standin import make_host, running_engine

    host = make_host(tmp_path / "host")
    with running_engine(host) as engine:
        with pytest.raises(ConnectionError):
            engine.post("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 8}})
        engine.wait_exit(timeout=20)
        log = engine.log_text()
    error_line = next(line for line in log.splitlines() if line.startswith("AttributeError:"))
    installed = host.eagle_worker_file
    related = {
        str(p): p.read_text()
        for p in (host.site_packages / "sglang").rglob("*.py")
        if p != installed
    }
    missing = parse_missing_attribute(error_line)
    assert missing is not None
    report = analyze_missing_attribute(
        installed.read_text(), str(installed), missing, related=related, log_text=log
    )
    assert report.progress is not None
    assert report.progress.stopped_after_line == _line_of(
        installed, "        self.init_cuda_graphs()"
    )
    assert "was swallowed by a caller" in report.likely_cause
