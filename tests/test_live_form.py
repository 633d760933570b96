"""The live form of a patched file (`core/live.py`), pure: which definitions a running process
takes, or why the change cannot be taken live, from the pre- and post-image compared by syntax
tree; eagle-init-guard's on the stand-in's file and on a real release."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch
from opspatch.core.live import LiveDefinition, LiveForm, NotLive, live_form
from opspatch.core.vocabulary import LiveKind, LivePolicy, NotLiveReason
from opspatch.errors import SpecError
from tests.patchkit import src
from tests.sglang_wheels import WheelUnavailable, release_file

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parent.parent
MODULE = "sglang.srt.managers.helper"
EAGLE_MODULE = "sglang.srt.speculative.eagle_worker_v2"
EAGLE_FILE = REPO / "opspatch/sandbox/engine_src/sglang/srt/speculative/eagle_worker_v2.py"

PRE = src(
    '''
    """A module."""
    import os

    LIMIT = 4
    names: list[str] = []


    def helper(x, scale=2):
        return x * scale


    def stream():
        yield 1


    class Base:
        pass


    class Worker(Base):
        """A worker."""

        threshold = 5

        def __init__(self):
            super().__init__()
            self.ready = True

        def step(self):
            return "step"

        @staticmethod
        def tool():
            return "tool"
    '''
)


def post(*pairs: tuple[str, str]) -> bytes:
    text = PRE.decode()
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text.encode()


def form(after: bytes, module: str = MODULE, policy: LivePolicy | None = None) -> LiveForm:
    found = live_form(module, PRE, after, policy)
    assert isinstance(found, LiveForm), found
    return found


def refusal(after: bytes, module: str = MODULE, policy: LivePolicy | None = None) -> NotLive:
    found = live_form(module, PRE, after, policy)
    assert isinstance(found, NotLive), found
    return found


def test_changed_and_added_definitions_are_taken_by_kind_in_the_post_images_order() -> None:
    after = post(
        ("LIMIT = 4", "LIMIT = 8"),
        ("return x * scale", "return x * scale + 1"),
        ("threshold = 5", "threshold = 5\n    budget: int = 0"),
        ('return "step"', 'return "new step"'),
        ('return "tool"', 'return "new tool"'),
        ("class Base:", "def added(y):\n    return y\n\n\nclass Base:"),
    )
    found = form(after)
    assert found.module == MODULE and found.sha256 == hashlib.sha256(after).hexdigest()
    assert found.definitions == (
        LiveDefinition("LIMIT", LiveKind.CONSTANT),
        LiveDefinition("helper", LiveKind.FUNCTION),
        LiveDefinition("added", LiveKind.FUNCTION),
        LiveDefinition("Worker.budget", LiveKind.CLASS_ATTRIBUTE),
        LiveDefinition("Worker.step", LiveKind.METHOD),
        LiveDefinition("Worker.tool", LiveKind.METHOD),
    )


def test_comments_and_docstrings_take_nothing() -> None:
    after = post(
        ('"""A module."""', '"""The module."""'),
        ('"""A worker."""', '"""The worker."""'),
        ("LIMIT = 4", "LIMIT = 4  # the limit"),
    )
    assert form(after).definitions == ()


@pytest.mark.parametrize(
    ("pairs", "reason", "said"),
    [
        ((("import os", "import os\nimport sys"),), NotLiveReason.STATEMENT, "an import"),
        ((("LIMIT = 4\n", ""),), NotLiveReason.REMOVED, "LIMIT removed"),
        (
            (("class Base:", "class New:\n    pass\n\n\nclass Base:"),),
            NotLiveReason.NEW_CLASS,
            "New",
        ),
        ((("scale=2", "scale=3"),), NotLiveReason.DEFAULTS, "helper's default values"),
        ((("    @staticmethod\n", "    @classmethod\n"),), NotLiveReason.DECORATORS, "Worker.tool"),
        (
            (('return "step"', "return super().step()"),),
            NotLiveReason.FREE_VARIABLES,
            "('__class__',)",
        ),
        ((("yield 1", "yield 2"),), NotLiveReason.GENERATOR, "stream"),
        ((('return "step"', "yield 1"),), NotLiveReason.GENERATOR, "Worker.step"),
        ((("class Worker(Base):", "class Worker:"),), NotLiveReason.BASES, "Worker"),
        ((("LIMIT = 4", "LIMIT = 4\nLIMIT = 5"),), NotLiveReason.STATEMENT, "more than once"),
    ],
)
def test_a_change_a_running_process_cannot_take_is_refused_with_its_reason(
    pairs: tuple[tuple[str, str], ...], reason: NotLiveReason, said: str
) -> None:
    found = refusal(post(*pairs))
    assert found.reason == reason and said in found.text, found


def test_an_attribute_of_a_decorated_class_is_refused_its_methods_are_not() -> None:
    before = src(
        """
        @dataclass
        class Config:
            size: int = 1

            def double(self):
                return 2 * self.size
        """
    )
    attribute = before.replace(b"size: int = 1", b"size: int = 2")
    method = before.replace(b"2 * self.size", b"3 * self.size")
    refused = live_form(MODULE, before, attribute)
    assert isinstance(refused, NotLive) and refused.reason == NotLiveReason.DECORATORS
    taken = live_form(MODULE, before, method)
    assert isinstance(taken, LiveForm)
    assert taken.definitions == (LiveDefinition("Config.double", LiveKind.METHOD),)


def test_the_model_forward_and_the_graph_runner_are_restart_only_unless_the_patch_allows() -> None:
    after = post(("LIMIT = 4", "LIMIT = 8"))
    for module in (
        "sglang.srt.models.llama",
        "sglang.srt.model_executor.model_runner",
        "sglang.srt.model_executor.cuda_graph_runner",
        "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
    ):
        assert refusal(after, module).reason == NotLiveReason.RESTART_ONLY_MODULE, module
    assert form(after, "sglang.srt.models.llama", LivePolicy.ALLOWED).definitions
    declared = refusal(after, MODULE, LivePolicy.RESTART_ONLY)
    assert declared.reason == NotLiveReason.DECLARED_RESTART_ONLY


def test_a_post_image_that_does_not_compile_is_refused() -> None:
    assert refusal(b"def broken(:\n").reason == NotLiveReason.UNPARSABLE


def eagle_guard_form(pre: bytes) -> LiveForm | NotLive:
    patch = load_patch(REPO / "patches" / "eagle-init-guard.toml").spec
    plan = apply_patch(pre, patch)
    assert isinstance(plan, Applied), plan
    return live_form(EAGLE_MODULE, plan.old_source, plan.new_source, patch.live)


EAGLE_GUARD_FORM = (
    LiveDefinition("EAGLEWorkerV2.spec_disable_batch_threshold", LiveKind.CLASS_ATTRIBUTE),
    LiveDefinition("EAGLEWorkerV2.__init__", LiveKind.METHOD),
)
"""The class-level default (what makes a half-built worker's next lookup succeed) and the
early assignment in `__init__` (for workers built later), as the file carries them."""


def test_eagle_init_guards_live_form_is_the_class_default_and_init_on_the_standin() -> None:
    found = eagle_guard_form(EAGLE_FILE.read_bytes())
    assert isinstance(found, LiveForm), found
    assert found.definitions == EAGLE_GUARD_FORM


def test_eagle_init_guards_live_form_on_a_real_release() -> None:
    try:
        pre = release_file("0.5.23", "sglang/srt/speculative/eagle_worker_v2.py")
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang wheel not available (offline?): {exc}")
    found = eagle_guard_form(pre)
    assert isinstance(found, LiveForm), found
    assert found.definitions == EAGLE_GUARD_FORM


def test_a_patchs_live_field_takes_two_words_and_refuses_others_in_one_message(
    tmp_path: Path,
) -> None:
    text = (REPO / "patches" / "eagle-init-guard.toml").read_text()
    path = tmp_path / "eagle-init-guard.toml"
    path.write_text(text.replace('forwarded = "no"', 'forwarded = "no"\nlive = "restart-only"'))
    assert load_patch(path).spec.live == LivePolicy.RESTART_ONLY
    path.write_text(text.replace('forwarded = "no"', 'forwarded = "no"\nlive = "sometimes"'))
    with pytest.raises(SpecError) as raised:
        load_patch(path)
    assert "eagle-init-guard.toml:" in str(raised.value)
    assert "live: must be one of 'allowed', 'restart-only', got 'sometimes'" in str(raised.value)


BUILT = src(
    """
    class Scheduler:
        budget: int = 0

        def __init__(self, args):
            self.limit = args.limit
            self.pool = self.init_pool(args)

        def init_pool(self, args):
            return [None] * args.size

        def shared(self):
            return self.limit

        def event_loop(self):
            while True:
                self.shared()
    """
)


@pytest.mark.parametrize(
    ("old", "new", "objects"),
    [
        ("self.limit = args.limit", "self.limit = args.limit // 2", ("Scheduler.__init__",)),
        ("[None] * args.size", "[None] * (args.size + 1)", ("Scheduler.init_pool",)),
        ("return self.limit", "return self.limit + 1", ()),
        (  # eagle-init-guard's shape: an early assignment of the class's own literal default
            "self.limit = args.limit\n",
            "self.budget = 0\n        self.limit = args.limit\n",
            (),
        ),
        (  # a default the class does not have: the objects already built lack it
            "self.limit = args.limit\n",
            "self.spare = 0\n        self.limit = args.limit\n",
            ("Scheduler.__init__",),
        ),
        (  # after another assignment of it: an object built by the old code keeps that one
            "self.pool = self.init_pool(args)\n",
            "self.pool = self.init_pool(args)\n        self.limit = 0\n",
            ("Scheduler.__init__",),
        ),
    ],
    ids=["init", "helper-only-init-calls", "method", "guard-default", "no-default", "late"],
)
def test_a_method_that_runs_only_while_an_object_is_built_is_named_for_the_objects_check(
    old: str, new: str, objects: tuple[str, ...]
) -> None:
    after = BUILT.decode().replace(old, new, 1)
    found = live_form(MODULE, BUILT, after.encode())
    assert isinstance(found, LiveForm), found
    assert found.objects == objects, found


def test_a_new_nested_closure_is_taken_and_only_the_functions_own_free_variables_refuse() -> None:
    """docs/live.md: what `free-variables` refuses is the swapped function's own free
    variables changing (`super()` gained); a closure nested in it is part of its new code."""
    nested = post(
        (
            'return "step"',
            "ready = self.ready\n\n        def said():\n            return ready\n\n"
            "        return said()",
        ),
    )
    assert form(nested).definitions == (LiveDefinition("Worker.step", LiveKind.METHOD),)
    gained = refusal(post(('return "step"', "return super().step()")))
    assert gained.reason == NotLiveReason.FREE_VARIABLES
    assert "super()" in gained.text and "closure" not in gained.text, gained.text
