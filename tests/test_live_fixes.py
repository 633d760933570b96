"""The fix runtime (`liveplugin/fixes.py`) in this process, over temporary modules imported here:
a take sets module constants and class attributes and swaps functions' and methods' code in the
running objects (and rebinds `from m import X` elsewhere, only there), never running the file's
top level again; a revert puts each back, or refuses when a definition changed since. A file
whose hash is not the request's, one the module was not loaded from, a changed free variable or
a definition that cannot be set is refused with nothing changed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from opspatch.hosts.liveplugin import fixes
from tests.livekit import module_from, nothing_held, post_image, take

__all__ = ["module_from", "nothing_held"]  # the fixtures, used by name

pytestmark = pytest.mark.pure

ORIGINAL = """
LIMIT = [1, 2]
GREETING = "hello"


def helper(x):
    return x + 1


class Worker:
    threshold = 5

    def __init__(self):
        self.ready = True

    def step(self):
        return "old step"

    @staticmethod
    def tool():
        return "old tool"

    @property
    def name(self):
        return "old name"
"""


def changed(*pairs: tuple[str, str]) -> str:
    text = ORIGINAL
    for old, new in pairs:
        assert old in text
        text = text.replace(old, new)
    return text


def test_a_constant_is_set_and_rebound_where_it_was_imported_by_name_then_reverted(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m1", ORIGINAL)
    user = module_from("live_u1", "from live_m1 import LIMIT, helper\n")
    old_limit = target.LIMIT
    path, sha = post_image(target, changed(("LIMIT = [1, 2]", "LIMIT = [1, 2, 3]")))

    reply = take("live_m1", path, sha, ("LIMIT", "constant"))

    assert reply["ok"] is True, reply
    assert target.LIMIT == [1, 2, 3] and user.LIMIT is target.LIMIT
    (entry,) = reply["took"]
    assert entry == {
        "fix_id": "fix-1",
        "module": "live_m1",
        "sha256": sha,
        "name": "LIMIT",
        "kind": "constant",
        "value": "[1, 2, 3]",
        "rebound": ["live_u1"],
    }
    assert fixes.list()["took"] == [entry]
    assert fixes.revert("fix-1") == {"ok": True, "took": [], "reverted": ["LIMIT"]}
    assert target.LIMIT is old_limit and user.LIMIT is old_limit
    assert fixes.list()["took"] == []


def test_a_class_attribute_is_set_on_the_running_class_and_its_instances_see_it(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m2", ORIGINAL)
    half_built = object.__new__(target.Worker)  # __init__ never ran
    path, sha = post_image(
        target, changed(("    threshold = 5\n", "    threshold = 5\n    budget: int = 0\n"))
    )

    reply = take("live_m2", path, sha, ("Worker.budget", "class-attribute"))

    assert reply["ok"] is True, reply
    assert half_built.budget == 0
    assert reply["took"][0]["value"] == "0"
    fixes.revert("fix-1")
    assert not hasattr(half_built, "budget")  # it had none: removed, not left behind


def test_methods_are_swapped_by_code_so_bound_and_wrapped_references_run_the_new_code(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m3", ORIGINAL)
    worker = target.Worker()
    bound = worker.step  # bound before the fix
    old_step_code = target.Worker.step.__code__
    path, sha = post_image(
        target,
        changed(
            ('return "old step"', 'return "new step"'),
            ('return "old tool"', 'return "new tool"'),
            ('return "old name"', 'return "new name"'),
        ),
    )

    reply = take(
        "live_m3",
        path,
        sha,
        ("Worker.step", "method"),
        ("Worker.tool", "method"),
        ("Worker.name", "method"),
    )

    assert reply["ok"] is True, reply
    assert (bound(), target.Worker.tool(), worker.name) == ("new step", "new tool", "new name")
    hashes = {entry["name"]: entry["code_sha256"] for entry in reply["took"]}
    assert hashes["Worker.step"] == fixes.code_sha256(target.Worker.step.__code__)
    assert hashes["Worker.step"] != fixes.code_sha256(old_step_code)
    fixes.revert("fix-1")
    assert (bound(), target.Worker.tool(), worker.name) == ("old step", "old tool", "old name")


def test_a_function_imported_elsewhere_by_name_runs_the_new_code_there_too(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m4", ORIGINAL)
    user = module_from("live_u4", "from live_m4 import helper\n")
    path, sha = post_image(target, changed(("return x + 1", "return x + 100")))

    assert take("live_m4", path, sha, ("helper", "function"))["ok"] is True
    assert user.helper(1) == 101 and user.helper is target.helper  # the same object, new code
    fixes.revert("fix-1")
    assert user.helper(1) == 2


def test_a_new_function_and_a_new_method_using_super_are_built_on_the_running_module(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m5", ORIGINAL)
    source = (
        changed(('return "old step"', "return triple(2)"))
        + "\n\ndef triple(x):\n    return 3 * x\n"
        + "\n\nclass Sub(Worker):\n    pass\n"
    )
    path, sha = post_image(target, source)

    reply = take("live_m5", path, sha, ("triple", "function"), ("Worker.step", "method"))

    assert reply["ok"] is True, reply
    assert target.Worker().step() == 6
    assert target.triple.__globals__ is vars(target)  # the running module's, not the file's copy
    fixes.revert("fix-1")
    assert not hasattr(target, "triple") and target.Worker().step() == "old step"


def test_a_file_whose_hash_is_not_the_requests_is_refused_and_nothing_changes(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m6", ORIGINAL)
    path, _ = post_image(target, changed(("threshold = 5", "threshold = 6")))

    reply = take("live_m6", path, "0" * 64, ("Worker.threshold", "class-attribute"))

    assert reply["ok"] is False and reply["refused"]["code"] == "hash-mismatch", reply
    assert target.Worker.threshold == 5
    assert fixes.list()["took"] == []


def test_a_method_whose_free_variables_changed_is_refused(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m7", ORIGINAL)
    # super() gives the method a free variable (__class__) it did not have
    path, sha = post_image(
        target, changed(('return "old step"', 'return super().__repr__() and "new step"'))
    )

    reply = take("live_m7", path, sha, ("Worker.step", "method"))

    assert reply["refused"]["code"] == "free-variables", reply
    assert "__class__" in reply["refused"]["message"]
    assert target.Worker().step() == "old step"


def test_a_fix_is_all_or_nothing_when_one_definition_cannot_be_set(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m8", ORIGINAL)
    path, sha = post_image(
        target,
        changed(("threshold = 5", "threshold = 6"), ('return "old step"', 'return "new step"')),
    )

    class Frozen(type):
        def __setattr__(cls, name: str, value: Any) -> None:
            if name == "step":
                raise TypeError("frozen")
            super().__setattr__(name, value)

    # a running class without `step` that refuses to be given one
    body = {k: v for k, v in vars(target.Worker).items() if k not in ("step", "__dict__")}
    target.Worker = Frozen("Worker", (), body)
    refused = take(
        "live_m8",
        path,
        sha,
        ("Worker.threshold", "class-attribute"),
        ("Worker.extra", "method"),
    )
    assert refused["refused"]["code"] == "no-definition"  # checked before anything is set
    assert target.Worker.threshold == 5

    source = changed(("threshold = 5", "threshold = 6")) + (
        "\n\ndef _step(self):\n    return 1\n\n\nWorker.step = _step\n"
    )
    path, sha = post_image(target, source)
    reply = take(
        "live_m8",
        path,
        sha,
        ("Worker.threshold", "class-attribute"),
        ("Worker.step", "method"),
    )
    assert reply["refused"]["code"] == "take-failed", reply
    assert "nothing is left changed" in reply["refused"]["message"]
    assert target.Worker.threshold == 5 and "step" not in vars(target.Worker)
    assert fixes.list()["took"] == []


def test_a_process_without_the_module_refuses_and_a_revert_of_nothing_is_ok(
    tmp_path: Path,
) -> None:
    path, sha = post_image(tmp_path / "live_never_imported.py", ORIGINAL)
    reply = take("live_never_imported", path, sha, ("helper", "function"))
    assert reply["refused"]["code"] == "module-not-loaded"
    assert fixes.revert("never-taken") == {"ok": True, "took": [], "reverted": []}


def test_a_retried_take_is_ok_and_a_definition_held_by_another_fix_is_refused(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m9", ORIGINAL)
    path, sha = post_image(target, changed(("threshold = 5", "threshold = 6")))
    first = take("live_m9", path, sha, ("Worker.threshold", "class-attribute"))
    again = take("live_m9", path, sha, ("Worker.threshold", "class-attribute"))
    assert first == again and first["ok"] is True
    other = take("live_m9", path, sha, ("Worker.threshold", "class-attribute"), fix_id="fix-2")
    assert other["refused"]["code"] == "already-held" and "fix-1" in other["refused"]["message"]
    fixes.revert("fix-1")
    assert target.Worker.threshold == 5


def test_a_take_never_runs_the_modules_top_level_again(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    registry = module_from("live_reg10", "CALLS = []\n")
    top_level = 'import live_reg10\nlive_reg10.CALLS.append("loaded")\n'
    target = module_from("live_m10", top_level + ORIGINAL)
    assert registry.CALLS == ["loaded"]
    path, sha = post_image(
        target,
        top_level
        + changed(("LIMIT = [1, 2]", "LIMIT = [1, 2, 3]"), ('return "old step"', "return LIMIT"))
        + "\n\ndef triple(x, by=len(LIMIT)):\n    return by * x\n",
    )

    reply = take(
        "live_m10",
        path,
        sha,
        ("LIMIT", "constant"),
        ("Worker.step", "method"),
        ("triple", "function"),
    )

    assert reply["ok"] is True, reply
    assert registry.CALLS == ["loaded"]  # the append at the top level did not run again
    # the new function's default saw the fix's own LIMIT, set before it in the file
    assert target.Worker().step() == [1, 2, 3] and target.triple(1) == 3
    assert target.triple.__globals__ is vars(target)


def test_a_constant_equal_by_identity_elsewhere_is_rebound_only_where_imported_by_name(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m11", "COUNT = 7\n" + ORIGINAL)
    own = module_from("live_u11", 'COUNT = 7\nGREETING = "hello"\n')
    importer = module_from("live_v11", "from live_m11 import COUNT\n")
    assert own.COUNT is target.COUNT and own.GREETING is target.GREETING  # cached, interned
    path, sha = post_image(
        target, "COUNT = 8\n" + changed(('GREETING = "hello"', 'GREETING = "hi"'))
    )

    reply = take("live_m11", path, sha, ("COUNT", "constant"), ("GREETING", "constant"))

    assert reply["ok"] is True, reply
    assert (target.COUNT, importer.COUNT, own.COUNT) == (8, 8, 7)
    assert (target.GREETING, own.GREETING) == ("hi", "hello")
    assert [entry["rebound"] for entry in reply["took"]] == [["live_v11"], []]
    fixes.revert("fix-1")
    assert (target.COUNT, importer.COUNT, own.COUNT) == (7, 7, 7)


def test_a_file_other_than_the_one_the_module_was_loaded_from_is_refused(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m12", ORIGINAL)
    path, sha = post_image(tmp_path / "elsewhere.py", changed(("threshold = 5", "threshold = 6")))

    reply = take("live_m12", path, sha, ("Worker.threshold", "class-attribute"))

    assert reply["refused"]["code"] == "path-mismatch", reply
    assert str(target.__file__) in reply["refused"]["message"]
    assert target.Worker.threshold == 5 and fixes.list()["took"] == []


def test_a_revert_is_refused_when_a_definition_changed_since_the_fix_set_it(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    target = module_from("live_m13", ORIGINAL)
    old_limit = target.LIMIT
    path, sha = post_image(
        target,
        changed(("LIMIT = [1, 2]", "LIMIT = [1, 2, 3]"), ('return "old step"', 'return "new"')),
    )
    assert take("live_m13", path, sha, ("LIMIT", "constant"), ("Worker.step", "method"))["ok"]
    taken = target.LIMIT
    target.LIMIT = ["set by the engine since"]

    refused = fixes.revert("fix-1")

    assert refused["refused"]["code"] == "changed-since", refused
    assert "LIMIT" in refused["refused"]["message"]
    assert target.LIMIT == ["set by the engine since"]
    assert target.Worker().step() == "new"  # nothing reverted: the fix is still held whole
    assert [entry["name"] for entry in fixes.list()["took"]] == ["LIMIT", "Worker.step"]
    target.LIMIT = taken
    assert fixes.revert("fix-1")["ok"] is True
    assert target.LIMIT is old_limit and target.Worker().step() == "old step"


def test_a_property_with_a_setter_and_a_wrapped_function_are_found_in_the_compiled_file(
    module_from: Callable[[str, str], ModuleType], tmp_path: Path
) -> None:
    source = """
        import functools

        def logged(f):
            @functools.wraps(f)
            def wrapper(*args):
                return f(*args)
            return wrapper

        class Gauge:
            @property
            def level(self):
                return "old level"

            @level.setter
            def level(self, value):
                pass

        @logged
        def add(a, b=2):
            return a + b
        """
    target = module_from("live_m14", source)
    path, sha = post_image(
        target, source.replace('"old level"', '"new level"').replace("a + b", "a * b")
    )

    reply = take("live_m14", path, sha, ("Gauge.level", "method"), ("add", "function"))

    assert reply["ok"] is True, reply
    assert (target.Gauge().level, target.add(3)) == ("new level", 6)
    fixes.revert("fix-1")
    assert (target.Gauge().level, target.add(3)) == ("old level", 5)
