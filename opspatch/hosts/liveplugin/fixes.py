"""What a live fix does in one process: `take` it from the file on disk, `revert` it, `list` what
this process holds. Called by `answers.apply_here` (a scheduler's at its boundary).

A take names a module, the file and the sha256 it must have, and the definitions to take (no
code travels). The file is read, its hash checked, compiled and run in a fresh namespace beside
the running module (named as it, never put in `sys.modules`); then each definition is taken into
the running module's own objects:
- `constant` (`NAME`): the module's attribute set; other modules that bound the old object with
  `from m import NAME` (the same name, the very same object) are rebound too;
- `class-attribute` (`Class.name`): set on the running class;
- `function` (`name`), `method` (`Class.name`): the running function's `__code__` swapped for the
  new one (staticmethod, classmethod, property and `functools.wraps` wrappers are looked through),
  so every reference bound earlier runs the new code; refused when the free variables differ (a
  new closure, `super()` where there was none). A new one is built on the running module's
  globals.
All or nothing: everything is checked before anything is set, and a failure while setting
undoes what was set. What each definition held before is kept for `revert`. Frames already
running keep the code they started with.
"""

from __future__ import annotations

import builtins
import hashlib
import marshal
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

CONSTANT = "constant"
CLASS_ATTRIBUTE = "class-attribute"
FUNCTION = "function"
METHOD = "method"
KINDS = (CONSTANT, CLASS_ATTRIBUTE, FUNCTION, METHOD)

# Refusal codes of the fix runtime (the delivery path's are in `wire`).
BAD_REQUEST = "bad-request"
NOT_LOADED = "module-not-loaded"
UNREADABLE = "unreadable"
HASH_MISMATCH = "hash-mismatch"
BAD_SOURCE = "bad-source"
NO_DEFINITION = "no-definition"
NOT_A_FUNCTION = "not-a-function"
FREE_VARIABLES = "free-variables"
ALREADY_HELD = "already-held"
TAKE_FAILED = "take-failed"
REVERT_FAILED = "revert-failed"

VALUE_REPR_CHARS = 200
"""How much of a value's repr a readback carries."""

_MISSING = object()
_PLAIN_VALUES = (type(None), bool)
"""Values never rebound in other modules: every module's `None` or `False` is the same object,
so identity cannot tell an import of the constant from a module's own value."""


class Refused(Exception):
    """A take this process refuses, before anything was set; `code` is a refusal code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _refused(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "took": [], "refused": {"code": code, "message": message}}


def code_sha256(code: types.CodeType) -> str:
    """A function's code as a hash (marshal: the same interpreter takes and reads back)."""
    return hashlib.sha256(marshal.dumps(code)).hexdigest()


class _Change:
    """One definition of a fix: how to set it, how to undo it, and what to read back."""

    def __init__(
        self,
        name: str,
        kind: str,
        apply: Callable[[], None],
        undo: Callable[[], None],
        readback: Callable[[], dict[str, Any]],
    ) -> None:
        self.name = name
        self.kind = kind
        self.apply = apply
        self.undo = undo
        self.readback = readback


class _Fix:
    def __init__(
        self, fix_id: str, module: str, sha256: str, changes: builtins.list[_Change]
    ) -> None:
        self.fix_id = fix_id
        self.module = module
        self.sha256 = sha256
        self.changes = changes

    def entries(self) -> builtins.list[dict[str, Any]]:
        """One entry per definition, read back from the running objects."""
        found = []
        for change in self.changes:
            entry = {
                "fix_id": self.fix_id,
                "module": self.module,
                "sha256": self.sha256,
                "name": change.name,
                "kind": change.kind,
            }
            entry.update(change.readback())
            found.append(entry)
        return found


_held: dict[str, _Fix] = {}
_lock = threading.Lock()
"""One take or revert at a time (the main process answers on its socket threads)."""


def take(request: dict[str, Any]) -> dict[str, Any]:
    """Take the fix `request` names into this process (see the module's docstring): ok with
    each definition read back, or a refusal with nothing changed."""
    with _lock:
        try:
            fix = _prepare(request)
        except Refused as refused:
            return _refused(refused.code, refused.message)
        if fix is None:  # the same fix again (a retried request): already in place
            return {"ok": True, "took": _held[request["fix_id"]].entries()}
        done: builtins.list[_Change] = []
        try:
            for change in fix.changes:
                change.apply()
                done.append(change)
        except Exception as error:
            for change in reversed(done):
                change.undo()
            return _refused(
                TAKE_FAILED,
                f"{fix.module}: setting {fix.changes[len(done)].name} failed "
                f"({type(error).__name__}: {error}); nothing is left changed",
            )
        _held[fix.fix_id] = fix
        return {"ok": True, "took": fix.entries()}


def revert(fix_id: Any) -> dict[str, Any]:
    """Put back what fix `fix_id` changed in this process. A fix this process does not hold has
    nothing to undo: ok."""
    with _lock:
        fix = _held.pop(str(fix_id), None)
        if fix is None:
            return {"ok": True, "took": [], "reverted": []}
        problems = []
        for change in reversed(fix.changes):
            try:
                change.undo()
            except Exception as error:
                problems.append(f"{change.name}: {type(error).__name__}: {error}")
        if problems:
            return _refused(REVERT_FAILED, f"{fix.module}: " + "; ".join(problems))
        return {"ok": True, "took": [], "reverted": [change.name for change in fix.changes]}


def list() -> dict[str, Any]:  # the operation's name on the wire
    """Every fix this process holds, one entry per definition, read back from the running
    objects (a value's repr, a function's code hash)."""
    with _lock:
        took: builtins.list[dict[str, Any]] = []
        for fix in _held.values():
            took.extend(fix.entries())
        return {"ok": True, "took": took}


# -- a take, checked before anything is set --------------------------------------------------------


def _prepare(request: dict[str, Any]) -> _Fix | None:
    """The fix `request` names, every definition resolved and checked; None when this very fix
    is held already.

    Raises:
        Refused: why it cannot be taken here.
    """
    fix_id, module_name, path, sha256, definitions = _read_request(request)
    held = _held.get(fix_id)
    if held is not None:
        if held.sha256 == sha256 and [c.name for c in held.changes] == [
            d["name"] for d in definitions
        ]:
            return None
        raise Refused(ALREADY_HELD, f"fix {fix_id} is held here from another file; revert it first")
    module = sys.modules.get(module_name)
    if module is None:
        raise Refused(NOT_LOADED, f"{module_name} is not loaded in this process: nothing to fix")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise Refused(UNREADABLE, f"cannot read {path}: {error}") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise Refused(
            HASH_MISMATCH,
            f"{path} has sha256 {actual[:12]}, not {sha256[:12]} as the request says: it is not "
            "the file this fix was made from; nothing taken",
        )
    namespace = _run_beside(module, module_name, path, data)
    holders = {
        c.name: f.fix_id for f in _held.values() if f.module == module_name for c in f.changes
    }
    changes = []
    for definition in definitions:
        name, kind = definition["name"], definition["kind"]
        if name in holders:
            raise Refused(
                ALREADY_HELD,
                f"{module_name}.{name} is held by live fix {holders[name]}; revert it first",
            )
        changes.append(_change(module, namespace, name, kind))
    return _Fix(fix_id, module_name, sha256, changes)


def _read_request(request: dict[str, Any]) -> tuple[str, str, str, str, Any]:
    fields = {}
    for key in ("fix_id", "module", "path", "sha256"):
        value = request.get(key)
        if not isinstance(value, str) or not value:
            raise Refused(BAD_REQUEST, f"a take needs `{key}` (a non-empty string)")
        fields[key] = value
    definitions = request.get("definitions")
    if not isinstance(definitions, builtins.list):
        raise Refused(BAD_REQUEST, "a take needs `definitions`: a list of {name, kind}")
    for definition in definitions:
        if (
            not isinstance(definition, dict)
            or not isinstance(definition.get("name"), str)
            or definition.get("kind") not in KINDS
        ):
            raise Refused(
                BAD_REQUEST,
                f"a definition is {{name, kind}} with kind one of {', '.join(KINDS)}: "
                f"not {definition!r}",
            )
    return fields["fix_id"], fields["module"], fields["path"], fields["sha256"], definitions


def _run_beside(module: Any, module_name: str, path: str, data: bytes) -> dict[str, Any]:
    """The file's code run in a fresh namespace named as the module (not in `sys.modules`)."""
    try:
        code = compile(data, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        raise Refused(BAD_SOURCE, f"{path} does not compile here: {error}") from None
    namespace: dict[str, Any] = {
        "__name__": module_name,
        "__file__": path,
        "__package__": getattr(module, "__package__", None),
        "__builtins__": builtins,
    }
    try:
        exec(code, namespace)
    except Exception as error:
        raise Refused(
            BAD_SOURCE, f"running {path} beside the module failed: {type(error).__name__}: {error}"
        ) from None
    return namespace


def _walk(root: Any, dotted: str, where: str) -> Any:
    """The object at `dotted` (`Class`, `Outer.Inner`) from a module or namespace."""
    found = root
    for part in dotted.split("."):
        found = (
            found.get(part, _MISSING) if isinstance(found, dict) else getattr(found, part, _MISSING)
        )
        if found is _MISSING:
            raise Refused(NO_DEFINITION, f"{where} has no {dotted}")
    return found


def _change(module: Any, namespace: dict[str, Any], name: str, kind: str) -> _Change:
    owner_path, _, attribute = name.rpartition(".")
    where = f"{module.__name__} (running)"
    fresh_where = f"{module.__name__} (from the file)"
    if kind in (CONSTANT, FUNCTION):
        if owner_path:
            raise Refused(BAD_REQUEST, f"a {kind} is a module-level name: not {name}")
        live_owner: Any = module
        fresh: Any = namespace.get(attribute, _MISSING)
    else:
        if not owner_path:
            raise Refused(BAD_REQUEST, f"a {kind} is named Class.name: not {name}")
        live_owner = _walk(module, owner_path, where)
        fresh_owner = _walk(namespace, owner_path, fresh_where)
        if not isinstance(live_owner, type) or not isinstance(fresh_owner, type):
            raise Refused(NO_DEFINITION, f"{owner_path} is not a class in {module.__name__}")
        fresh = fresh_owner.__dict__.get(attribute, _MISSING)
    if fresh is _MISSING:
        raise Refused(NO_DEFINITION, f"{fresh_where} has no {name}")
    old = vars(live_owner).get(attribute, _MISSING)
    if kind == CONSTANT:
        return _constant(module, name, old, fresh)
    if kind == CLASS_ATTRIBUTE:
        return _attribute(live_owner, name, attribute, old, fresh)
    if old is _MISSING:
        return _new_function(module, live_owner, name, kind, fresh)
    return _swap_code(name, kind, old, fresh)


def _setter(owner: Any, attribute: str, value: Any) -> Callable[[], None]:
    if value is _MISSING:
        return lambda: delattr(owner, attribute)
    return lambda: setattr(owner, attribute, value)


def _value_readback(owner: Any, attribute: str) -> Callable[[], dict[str, Any]]:
    def readback() -> dict[str, Any]:
        value = vars(owner).get(attribute, _MISSING)
        return {"value": "<missing>" if value is _MISSING else repr(value)[:VALUE_REPR_CHARS]}

    return readback


def _attribute(owner: type, name: str, attribute: str, old: Any, fresh: Any) -> _Change:
    return _Change(
        name,
        CLASS_ATTRIBUTE,
        _setter(owner, attribute, fresh),
        _setter(owner, attribute, old),
        _value_readback(owner, attribute),
    )


def _constant(module: Any, name: str, old: Any, fresh: Any) -> _Change:
    """A module constant; the modules that imported the old object by name are rebound with it
    (and back on revert, where they still hold the new one)."""
    rebound: builtins.list[Any] = []

    def apply() -> None:
        if old is not _MISSING and not isinstance(old, _PLAIN_VALUES):
            for other in tuple(sys.modules.values()):
                space = getattr(other, "__dict__", None)
                if other is not module and space is not None and space.get(name, _MISSING) is old:
                    rebound.append(other)
        setattr(module, name, fresh)
        for other in rebound:
            setattr(other, name, fresh)

    def undo() -> None:
        _setter(module, name, old)()
        for other in rebound:
            if vars(other).get(name, _MISSING) is fresh:
                setattr(other, name, old)

    value = _value_readback(module, name)

    def readback() -> dict[str, Any]:
        found = value()
        found["rebound"] = sorted(other.__name__ for other in rebound)
        return found

    return _Change(name, CONSTANT, apply, undo, readback)


def _innermost(found: Any) -> Any:
    """The plain function behind a method's wrappers: staticmethod, classmethod, property's
    getter and `functools.wraps` wrappers (`__wrapped__`), or None where there is none."""
    if isinstance(found, (staticmethod, classmethod)):
        found = found.__func__
    elif isinstance(found, property):
        found = found.fget
    seen = 0
    while not isinstance(found, types.FunctionType) and seen < 16:
        found = getattr(found, "__wrapped__", None)
        seen += 1
    if isinstance(found, types.FunctionType):
        while isinstance(getattr(found, "__wrapped__", None), types.FunctionType):
            found = getattr(found, "__wrapped__")  # noqa: B009 (a FunctionType declares none)
        return found
    return None


def _swap_code(name: str, kind: str, old: Any, fresh: Any) -> _Change:
    live = _innermost(old)
    new = _innermost(fresh)
    if live is None or new is None:
        raise Refused(
            NOT_A_FUNCTION,
            f"{name} is not a function here (or wraps none that can be found): its code cannot "
            "be swapped",
        )
    before, after = live.__code__, new.__code__
    if before.co_freevars != after.co_freevars:
        raise Refused(
            FREE_VARIABLES,
            f"{name}: free variables {before.co_freevars} running, {after.co_freevars} in the "
            "file (a new closure or super()): its code cannot be swapped; restart instead",
        )

    def apply() -> None:
        live.__code__ = after

    def undo() -> None:
        live.__code__ = before

    return _Change(name, kind, apply, undo, lambda: {"code_sha256": code_sha256(live.__code__)})


def _new_function(module: Any, owner: Any, name: str, kind: str, fresh: Any) -> _Change:
    """A function or method the running module lacks: built from the file's code on the running
    module's globals (`super()`'s cell: the running class)."""
    if not isinstance(fresh, types.FunctionType):
        raise Refused(
            NOT_A_FUNCTION,
            f"{name} is new and decorated: a decorator's result is not taken live; restart instead",
        )
    code = fresh.__code__
    cells = []
    for free in code.co_freevars:
        if free != "__class__" or kind != METHOD:
            raise Refused(
                FREE_VARIABLES, f"{name} is new and closes over {free!r}: restart instead"
            )
        cells.append(types.CellType(owner))
    built = types.FunctionType(
        code, vars(module), fresh.__name__, fresh.__defaults__, tuple(cells) or None
    )
    built.__kwdefaults__ = fresh.__kwdefaults__
    built.__qualname__ = fresh.__qualname__
    built.__doc__ = fresh.__doc__
    built.__annotations__ = fresh.__annotations__
    built.__dict__.update(fresh.__dict__)
    attribute = name.rpartition(".")[2]
    return _Change(
        name,
        kind,
        _setter(owner, attribute, built),
        _setter(owner, attribute, _MISSING),
        lambda: {"code_sha256": code_sha256(built.__code__)},
    )
