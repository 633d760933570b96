"""The preflight's `check` in this process (`liveplugin/checks.py`), over temporary modules imported
here: what would keep a live fix from being in effect is found before anything is taken. A
function whose frame never returns (a loop on another thread) is named with its thread, one that
is not running is not; the objects a changed `__init__` already built are counted; a changed
value read at import time (another constant, a default, a dataclass field, a decorator, a
`from m import NAME` copy's default) is found, a read at call time is not; a definition another
fix holds is named; a module never imported says so. Nothing is changed by any of it."""

from __future__ import annotations

import ast
import gc
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from opspatch.hosts.liveplugin import boundary, checks, importtime
from opspatch.hosts.liveplugin import fixes as runtime
from tests.livekit import module_from, nothing_held, post_image, take

pytestmark = pytest.mark.pure

__all__ = ["module_from", "nothing_held"]  # fixtures, used by name

LOOP = """
import time


def loop(stop, state):
    while not stop.is_set():
        state.boundaries += 1
        time.sleep(0.005)


def step():
    return 1
"""


def check(module: str, *definitions: tuple[str, str], **extra: Any) -> dict[str, Any]:
    reply = checks.check(
        {
            "op": "check",
            "fixes": [
                {
                    "fix_id": extra.pop("fix_id", "fix-1"),
                    "module": module,
                    "sha256": extra.pop("sha256", "0" * 64),
                    "definitions": [{"name": n, "kind": k} for n, k in definitions],
                    **extra,
                }
            ],
        }
    )
    assert reply["ok"] is True, reply
    (found,) = reply["checks"]
    return found  # type: ignore[no-any-return]


@pytest.fixture
def scheduler(monkeypatch: pytest.MonkeyPatch) -> Iterator[boundary.SchedulerBoundary]:
    """This process as a scheduler rank: its boundaries counted by the loop under test."""
    state = boundary.SchedulerBoundary()
    state.rank = 0
    monkeypatch.setattr(boundary, "STATE", state)
    yield state


def test_a_function_in_a_frame_that_never_returns_is_named_and_a_resting_one_is_not(
    module_from: Callable[[str, str], ModuleType], scheduler: boundary.SchedulerBoundary
) -> None:
    looping = module_from("check_loop", LOOP)
    stop = threading.Event()
    thread = threading.Thread(target=looping.loop, args=(stop, scheduler), name="sched-loop")
    thread.start()
    try:
        while scheduler.boundaries < 1:
            time.sleep(0.005)
        found = check("check_loop", ("loop", "function"), ("step", "function"))
    finally:
        stop.set()
        thread.join()
    assert found["frames"] == [
        {
            "name": "loop",
            "module": "check_loop",
            "thread": "sched-loop",
            "across": "two scheduling boundaries",
        }
    ]
    assert found["loaded"] is True and found["held"] == [] and found["objects"] == []


def test_a_function_no_thread_runs_is_answered_at_once(
    module_from: Callable[[str, str], ModuleType],
) -> None:
    module_from("check_rest", LOOP)
    started = time.monotonic()
    found = check("check_rest", ("loop", "function"), ("step", "function"))
    assert found["frames"] == []
    assert time.monotonic() - started < checks.FRAME_WAIT_S  # no frame seen: nothing waited for


def test_the_objects_a_changed_init_already_built_are_counted_with_subclasses(
    module_from: Callable[[str, str], ModuleType],
) -> None:
    built = module_from(
        "check_built",
        """
        class Worker:
            def __init__(self):
                self.limit = 4


        class Special(Worker):
            pass


        class Unused:
            def __init__(self):
                self.limit = 4
        """,
    )
    kept = [built.Worker(), built.Worker(), built.Special()]
    found = check(
        "check_built",
        ("Worker.__init__", "method"),
        ("Unused.__init__", "method"),
        objects=["Worker.__init__", "Unused.__init__"],
    )
    assert found["objects"] == [
        {"name": "Worker.__init__", "class": "Worker", "count": len(kept), "complete": True},
        {"name": "Unused.__init__", "class": "Unused", "count": 0, "complete": True},
    ]


def test_objects_hidden_by_a_frozen_collector_are_found_from_the_running_frames(
    module_from: Callable[[str, str], ModuleType],
) -> None:
    """SGLang's scheduler calls `gc.freeze()` once started, after which `gc.get_objects()` no
    longer lists the Scheduler it built (seen on real 0.5.23: counted 0); the thread that runs
    it holds it in its frames (the loop's `self`), two references deep here."""
    built = module_from(
        "check_frozen",
        """
        import threading


        class Scheduler:
            def __init__(self):
                self.worker = Worker()


        class Worker:
            def __init__(self):
                self.limit = 4


        def serve(built, stop):
            scheduler = Scheduler()
            built.set()
            stop.wait()
        """,
    )
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=built.serve, args=(ready, stop))
    thread.start()
    ready.wait()
    gc.freeze()
    try:
        found = check(
            "check_frozen",
            ("Worker.__init__", "method"),
            objects=["Worker.__init__", "Scheduler.__init__"],
        )
    finally:
        gc.unfreeze()
        stop.set()
        thread.join()
    assert [(o["class"], o["count"], o["complete"]) for o in found["objects"]] == [
        ("Worker", 1, True),
        ("Scheduler", 1, True),
    ]


CAPTURING = """
import dataclasses

LIMIT = 5
TWICE = LIMIT * 2


def clamp(value, limit=LIMIT):
    return min(value, limit)


def read_each_call():
    return LIMIT


@dataclasses.dataclass
class Config:
    limit: int = dataclasses.field(default_factory=lambda: LIMIT)
    cap: int = LIMIT


class Worker:
    threshold = 5
    doubled = threshold * 2

    def step(self, threshold=threshold):
        return threshold
"""


def test_a_value_read_at_import_is_found_here_and_where_it_was_imported_by_name(
    module_from: Callable[[str, str], ModuleType],
) -> None:
    module_from("check_cap", CAPTURING)
    module_from(
        "check_cap_user",
        """
        from check_cap import LIMIT


        def use(limit=LIMIT):
            return limit
        """,
    )
    found = check("check_cap", ("LIMIT", "constant"), ("Worker.threshold", "class-attribute"))
    said = [(c["module"], c["name"], c["line"], c["where"]) for c in found["captured"]]
    assert said == [
        ("check_cap", "LIMIT", 5, "the module's top level"),
        ("check_cap", "LIMIT", 8, "the defaults of clamp"),
        ("check_cap", "LIMIT", 19, "class Config's body"),
        ("check_cap", "Worker.threshold", 24, "class Worker's body"),
        ("check_cap", "Worker.threshold", 26, "the defaults of Worker.step"),
        ("check_cap_user", "LIMIT", 5, "the defaults of use"),
    ]  # not read_each_call's body, nor the default_factory's lambda: they read it each call
    again = check("check_cap", ("LIMIT", "constant"), ("TWICE", "constant"))
    assert [c["line"] for c in again["captured"] if c["module"] == "check_cap"] == [
        8,
        19,
    ]  # TWICE is evaluated again


def test_a_value_read_at_import_through_the_module_object_elsewhere_is_found(
    module_from: Callable[[str, str], ModuleType],
) -> None:
    """`import m` (or `import m as alias`) then `m.NAME` at another module's import copies the
    value as `from m import NAME` does: found the same way, under that module, a read in a
    function body not. Before, only the module's own import-time reads and `from m import NAME`
    copies were seen: the fix was taken and said applied while `use`'s default kept the old."""
    module_from("check_cap", CAPTURING)
    module_from(
        "check_cap_attr_user",
        """
        import check_cap
        import check_cap as cap

        DEFAULT = check_cap.LIMIT * 2


        def use(limit=cap.LIMIT, doubled=cap.Worker.threshold):
            return limit


        def each_call():
            return check_cap.LIMIT, cap.Worker.threshold
        """,
    )
    found = check("check_cap", ("LIMIT", "constant"), ("Worker.threshold", "class-attribute"))
    elsewhere = [
        (c["name"], c["line"], c["where"])
        for c in found["captured"]
        if c["module"] == "check_cap_attr_user"
    ]
    assert elsewhere == [
        ("LIMIT", 5, "the module's top level"),
        ("LIMIT", 8, "the defaults of use"),
        ("Worker.threshold", 8, "the defaults of use"),
    ], found["captured"]


def test_a_module_held_through_its_package_is_reached_by_its_dotted_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`import pkg.m` binds `pkg`: the module is read there as `pkg.m.NAME`; `from pkg import
    m` binds the module itself, read as `m.NAME`."""
    package, module = ModuleType("check_pkgx"), ModuleType("check_pkgx.sub")
    plain, aliased = ModuleType("check_plain_user"), ModuleType("check_from_user")
    plain.check_pkgx = package  # type: ignore[attr-defined]
    aliased.sub = module  # type: ignore[attr-defined]
    for each in (package, module, plain, aliased):
        monkeypatch.setitem(sys.modules, each.__name__, each)
    found = {other.__name__: paths for other, paths in checks._holding(module)}
    assert found == {"check_plain_user": ["check_pkgx.sub"], "check_from_user": ["sub"]}


def test_import_time_reads_inside_if_blocks_decorators_and_class_lines_count() -> None:
    tree = ast.parse(
        textwrap.dedent(
            """
            if True:
                ALIAS = LIMIT
            try:
                register(LIMIT)
            except ImportError:
                pass

            @cache(size=LIMIT)
            def cached():
                return LIMIT

            class Sub(Base, size=LIMIT):
                pass

            handler = lambda x=LIMIT: x + LIMIT
            """
        )
    )
    uses = importtime.import_time_uses(tree, {"LIMIT"}, set())
    assert [(u["line"], u["where"]) for u in uses] == [
        (3, "the module's top level"),
        (5, "the module's top level"),
        (9, "the decorators of cached"),
        (13, "the definition of class Sub"),
        (16, "the module's top level"),
    ]


def test_a_definition_another_fix_holds_is_named_and_a_module_never_imported_says_so(
    module_from: Callable[[str, str], ModuleType],
) -> None:
    target = module_from("check_held", "LIMIT = 1\n")
    path, sha = post_image(target, "LIMIT = 2\n")
    assert take("check_held", path, sha, ("LIMIT", "constant"), fix_id="first")["ok"]
    other = check("check_held", ("LIMIT", "constant"), fix_id="second")
    assert other["held"] == [{"name": "LIMIT", "fix_id": "first"}]
    same = check("check_held", ("LIMIT", "constant"), fix_id="first", sha256=sha)
    assert same["held"] == []  # the same fix again: a retried take, not another fix
    assert check("check_never_imported", ("LIMIT", "constant")) == {
        "fix_id": "fix-1",
        "module": "check_never_imported",
        "loaded": False,
        "frames": [],
    }
    assert runtime.list()["took"][0]["value"] == "2"  # the check changed nothing
