"""What one process says before a live fix is taken (`check`): whether the fix would be in effect
here, read from the running objects and the module's source; nothing is changed."""

from __future__ import annotations

import ast
import gc
import importlib.util
import inspect
import sys
import threading
import time
import types
from typing import Any

from . import boundary, fixes, importtime, wire

FRAME_WAIT_S = 0.5
"""How long a process without scheduling boundaries (main, detokenizer) watches a frame."""
REACH_DEPTH = 8
"""References followed from a frame's locals (`self` -> its `__dict__` -> a worker -> ...)."""
REACH_LIMIT = 2_000_000
"""Objects looked at from the frames at most."""
BOUNDARY_WAIT_S = 30.0
"""How long a scheduler waits for its two boundaries; a frame still there after it is one no
boundary came through either."""


def check(request: dict[str, Any]) -> dict[str, Any]:
    """Every fix of `request["fixes"]` checked here (see the module's docstring)."""
    asked = request.get("fixes")
    if not isinstance(asked, list) or not all(isinstance(fix, dict) for fix in asked):
        return wire.refusal(wire.BAD_REQUEST, "a check needs `fixes`: a list of fixes")
    checked = [_one(fix) for fix in asked]
    watched = {}
    for index, fix in enumerate(asked):  # no zip(strict=): the plugin runs on Python 3.8
        if checked[index]["loaded"]:
            watched.update(_running_codes(sys.modules[fix["module"]], fix))
    frames = _lasting_frames(watched)
    for found in checked:
        found["frames"] = [f for f in frames if f["module"] == found["module"]]
    return {"ok": True, "took": [], "checks": checked}


def _one(fix: dict[str, Any]) -> dict[str, Any]:
    module_name = str(fix.get("module") or "")
    found: dict[str, Any] = {"fix_id": fix.get("fix_id"), "module": module_name}
    module = sys.modules.get(module_name)
    found["loaded"] = module is not None
    if module is None:
        return found
    definitions = [d for d in fix.get("definitions") or [] if isinstance(d, dict)]
    names = {str(d.get("name")) for d in definitions}
    found["held"] = [
        {"name": name, "fix_id": fix_id}
        for name, (fix_id, sha256) in sorted(fixes.holders(module_name).items())
        if name in names and (fix_id != fix.get("fix_id") or sha256 != fix.get("sha256"))
    ]
    values = {
        str(d["name"])
        for d in definitions
        if d.get("kind") in (fixes.CONSTANT, fixes.CLASS_ATTRIBUTE)
    }
    found["captured"] = _captured(module, values)
    found["objects"] = [_objects(module, str(name)) for name in fix.get("objects") or []]
    return found


def _source_tree(module: Any) -> ast.Module | None:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return None
    try:
        with open(path, "rb") as handle:
            return ast.parse(importlib.util.decode_source(handle.read()), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def _captured(module: Any, values: set[str]) -> list[dict[str, Any]]:
    """Import-time reads of the changed values, here, where `from m import NAME` copied one, and
    where `m.NAME` was read through the module object (`_through_module`)."""
    if not values:
        return []
    found = []
    tree = _source_tree(module)
    if tree is not None:
        for use in importtime.import_time_uses(tree, values, values):
            found.append({**use, "module": module.__name__})
    for name in sorted(v for v in values if "." not in v and v in vars(module)):
        for other in fixes.imported_elsewhere(module, name, vars(module)[name]):
            other_tree = _source_tree(other)
            if other_tree is not None:
                for use in importtime.import_time_uses(other_tree, {name}, set()):
                    found.append({**use, "module": other.__name__})
    return found + _through_module(module, values)


def _through_module(module: Any, values: set[str]) -> list[dict[str, Any]]:
    """Import-time reads of `values` as attributes of the module object in the other loaded
    modules that hold it (or a package above it) in their globals: `m.NAME`, `alias.NAME`,
    `pkg.m.NAME` evaluated at their import copied the old object, as `from m import NAME` does."""
    found = []
    for other, paths in _holding(module):
        tree = _source_tree(other)
        if tree is None:
            continue
        dotted = {f"{path}.{value}": value for path in paths for value in values}
        for use in importtime.import_time_uses(tree, set(dotted), set()):
            found.append({**use, "name": dotted[use["name"]], "module": other.__name__})
    return found


def _holding(module: Any) -> list[tuple[Any, list[str]]]:
    """The other loaded modules whose globals hold `module` or a package above it, each with
    the dotted paths that reach `module` from there (`alias`, `pkg.m`)."""
    name = module.__name__
    found = []
    for other in tuple(sys.modules.values()):
        space = getattr(other, "__dict__", None)
        if other is module or not isinstance(space, dict):
            continue
        paths = []
        for alias, value in tuple(space.items()):
            # type(), not isinstance(): that reads `__class__`, which some objects warn on
            held = (
                vars(value).get("__name__") if issubclass(type(value), types.ModuleType) else None
            )
            if held == name:
                paths.append(alias)
            elif isinstance(held, str) and name.startswith(held + "."):
                paths.append(alias + name[len(held) :])
        if paths:
            found.append((other, paths))
    return found


def _objects(module: Any, name: str) -> dict[str, Any]:
    """How many objects of the class of construction method `name` (`Class.__init__`) live here."""
    owner: Any = module
    class_path = name.rpartition(".")[0]
    for part in class_path.split("."):
        owner = getattr(owner, part, None)
    if not isinstance(owner, type):
        return {"name": name, "class": class_path, "count": 0, "complete": True}
    found = {id(obj) for obj in gc.get_objects() if owner in type(obj).__mro__}
    reached, complete = _reachable(owner) if gc.get_freeze_count() else (set(), True)
    return {
        "name": name,
        "class": class_path,
        "count": len(found | reached),
        "complete": complete,
    }


_LEAVES = (type, types.ModuleType, types.FunctionType, types.CodeType, types.FrameType)
_ATOMS = (str, bytes, int, float, complex, bool, type(None))


def _reachable(owner: type) -> tuple[set[int], bool]:
    """The ids of `owner`'s objects reachable from other threads' frames (their locals, then
    what those refer to, `REACH_DEPTH` deep; modules' globals, classes and functions are not
    followed), and whether the search finished under `REACH_LIMIT`."""
    me = threading.get_ident()
    frames = [f for i, top in sys._current_frames().items() if i != me for f in _stack(top)]
    skip = {id(vars(m)) for m in tuple(sys.modules.values()) if hasattr(m, "__dict__")}
    layer = [value for frame in frames for value in _locals(frame)]
    found: set[int] = set()
    seen = set(skip)
    for _ in range(REACH_DEPTH):
        following = []
        for obj in layer:
            if id(obj) in seen or isinstance(obj, _ATOMS):
                continue
            seen.add(id(obj))
            if len(seen) > REACH_LIMIT:
                return found, False
            if owner in type(obj).__mro__:
                found.add(id(obj))
            if not isinstance(obj, _LEAVES):
                following.extend(gc.get_referents(obj))
        layer = following
    return found, True


def _locals(frame: Any) -> list[Any]:
    """A function frame's local values (a module's or class body's namespace is not read).

    A running frame's `gc.get_referents` does not list its locals (3.11+), so they are read
    through `f_locals`, which before 3.13 leaves a snapshot of them on the frame, keeping them
    alive as long as it runs (the loop's: for ever): emptied at once, as nothing reads it but
    a trace function, which fills it again first, and `locals()`/`vars()`, whose callers are
    left unread (the dict they hold is that snapshot)."""
    code = frame.f_code
    if not code.co_flags & inspect.CO_OPTIMIZED or {"locals", "vars"} & set(code.co_names):
        return []
    space = frame.f_locals
    values = list(space.values())
    if type(space) is dict and sys.version_info < (3, 13):
        space.clear()
    return values


def _running_codes(module: Any, fix: dict[str, Any]) -> dict[types.CodeType, dict[str, str]]:
    """The running code of each changed function or method the module already has."""
    codes = {}
    for definition in fix.get("definitions") or []:
        if not isinstance(definition, dict):
            continue
        if definition.get("kind") not in (fixes.FUNCTION, fixes.METHOD):
            continue
        name = str(definition.get("name"))
        owner: Any = module
        *path, attribute = name.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        running = fixes.innermost(vars(owner).get(attribute)) if owner is not None else None
        if running is not None:
            codes[running.__code__] = {"name": name, "module": module.__name__}
    return codes


def _stack(frame: Any) -> list[Any]:
    found = []
    while frame is not None:
        found.append(frame)
        frame = frame.f_back
    return found


def _lasting_frames(codes: dict[types.CodeType, dict[str, str]]) -> list[dict[str, Any]]:
    """The frames of `codes` on another thread's stack now that are still there, the same
    frames, once the process has moved on (`_wait`)."""
    if not codes:
        return []
    me = threading.get_ident()
    seen = [
        (ident, frame)
        for ident, top in sys._current_frames().items()
        if ident != me
        for frame in _stack(top)
        if frame.f_code in codes
    ]
    if not seen:
        return []
    across = _wait()
    now = {ident: _stack(top) for ident, top in sys._current_frames().items()}
    threads = {thread.ident: thread.name for thread in threading.enumerate()}
    lasting = []
    for ident, frame in seen:
        if any(frame is other for other in now.get(ident, [])):
            what = codes[frame.f_code]
            lasting.append({**what, "thread": threads.get(ident, str(ident)), "across": across})
    return lasting


def _wait() -> str:
    """Let the process move on: two scheduling boundaries on a scheduler, `FRAME_WAIT_S`
    elsewhere; what passed, for the answer."""
    if boundary.STATE.rank is None:
        time.sleep(FRAME_WAIT_S)
        return f"{FRAME_WAIT_S:g} s"
    start = boundary.STATE.boundaries
    deadline = time.monotonic() + BOUNDARY_WAIT_S
    while boundary.STATE.boundaries < start + 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    passed = boundary.STATE.boundaries - start
    if passed >= 2:
        return "two scheduling boundaries"
    return f"{BOUNDARY_WAIT_S:g} s in which {passed} scheduling boundary came"
