"""What a live fix does in one process: `take` it from the file on disk, `revert` it, `list` what
this process holds. Called by `answers.apply_here` (a scheduler's at its boundary)."""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib.util
import marshal
import os
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
PATH_MISMATCH = "path-mismatch"
UNREADABLE = "unreadable"
HASH_MISMATCH = "hash-mismatch"
BAD_SOURCE = "bad-source"
NO_DEFINITION = "no-definition"
NOT_A_FUNCTION = "not-a-function"
FREE_VARIABLES = "free-variables"
EVALUATION_FAILED = "evaluation-failed"
ALREADY_HELD = "already-held"
TAKE_FAILED = "take-failed"
CHANGED_SINCE = "changed-since"
REVERT_FAILED = "revert-failed"

VALUE_REPR_CHARS = 200
"""How much of a value's repr a readback carries."""

_MISSING = object()
_ACCESSORS = ("setter", "deleter")
"""`@name.setter` and `@name.deleter` defs add to a property; its getter is the definition."""


class Refused(Exception):
    """A take or revert this process refuses, nothing changed; `code` is a refusal code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _refused(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "took": [], "refused": {"code": code, "message": message}}


def code_sha256(code: types.CodeType) -> str:
    """A function's code as a hash (marshal: the same interpreter takes and reads back).

    Marshal format 2, which writes no back-references: from format 3 an object is flagged for
    reference by its refcount, so the same code hashed at the take and at a later `list` could
    differ (seen on the stand-in's unit)."""
    return hashlib.sha256(marshal.dumps(code, 2)).hexdigest()


class _Change:
    """One definition of a fix: how to set it, how to undo it, whether the running object still
    holds what it set, and what to read back."""

    def __init__(
        self,
        name: str,
        kind: str,
        apply: Callable[[], None],
        undo: Callable[[], None],
        in_place: Callable[[], bool],
        readback: Callable[[], dict[str, Any]],
        value: Any = _MISSING,
    ) -> None:
        self.name = name
        self.kind = kind
        self.apply = apply
        self.undo = undo
        self.in_place = in_place
        self.readback = readback
        self.value = value
        """The object it sets (a value, a new function); none for a code swap."""


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
    nothing to undo: ok. Refused, nothing reverted, when a definition no longer holds what the
    fix set (the engine or other code changed it since: putting the old back would undo that)."""
    with _lock:
        fix = _held.get(str(fix_id))
        if fix is None:
            return {"ok": True, "took": [], "reverted": []}
        moved = [change.name for change in fix.changes if not change.in_place()]
        if moved:
            return _refused(
                CHANGED_SINCE,
                f"{fix.module}: {', '.join(moved)} changed since fix {fix.fix_id} set it; nothing "
                "was reverted and the fix is still held (a restart puts back the file's code)",
            )
        del _held[fix.fix_id]
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


def holders(module_name: str) -> dict[str, tuple[str, str]]:
    """Each definition of `module_name` a held fix set here: its fix id and the sha256 of the
    file it was taken from (`check` reads them before a take)."""
    with _lock:
        return {
            c.name: (f.fix_id, f.sha256)
            for f in _held.values()
            if f.module == module_name
            for c in f.changes
        }


# -- a take, checked before anything is set --------------------------------------------------------


class _File:
    """The file a take reads, checked by its hash: its path, syntax tree and compiled code."""

    def __init__(self, path: str, tree: ast.Module, code: types.CodeType) -> None:
        self.path = path
        self.tree = tree
        self.code = code


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
    path = _own_copy(module_name, getattr(module, "__file__", None), path, request.get("paths"))
    file = _compiled(path, sha256)
    holders = {
        c.name: f.fix_id for f in _held.values() if f.module == module_name for c in f.changes
    }
    changes: builtins.list[_Change] = []
    taken: dict[str, Any] = {}
    for definition in definitions:
        name, kind = definition["name"], definition["kind"]
        if name in holders:
            raise Refused(
                ALREADY_HELD,
                f"{module_name}.{name} is held by live fix {holders[name]}; revert it first",
            )
        change = _change(module, file, name, kind, taken)
        if change.value is not _MISSING:
            taken[name] = change.value
        changes.append(change)
    return _Fix(fix_id, module_name, sha256, changes)


def _own_copy(module_name: str, loaded: str | None, path: str, paths: Any) -> str:
    """Which of the request's files is this process's copy of the module: `path`, or one of
    `paths` (a server over several hosts: the file on every node, each swapped to the same
    sha256; a rank takes the one its module was loaded from).

    Raises:
        Refused: `path-mismatch`, the module was loaded from none of them.
    """
    if not loaded:
        return path
    others = (
        [p for p in paths if isinstance(p, str) and p] if isinstance(paths, builtins.list) else []
    )
    for candidate in (path, *others):
        if os.path.realpath(loaded) == os.path.realpath(candidate):
            return candidate
    named = " or ".join((path, *others))
    raise Refused(
        PATH_MISMATCH,
        f"{module_name} is loaded here from {loaded}, not from {named}: the fix is not for "
        "this process's copy of the module; nothing taken",
    )


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
            or not all(part.isidentifier() for part in definition["name"].split("."))
            or definition.get("kind") not in KINDS
        ):
            raise Refused(
                BAD_REQUEST,
                f"a definition is {{name, kind}} with a dotted name and kind one of "
                f"{', '.join(KINDS)}: not {definition!r}",
            )
    return fields["fix_id"], fields["module"], fields["path"], fields["sha256"], definitions


def _compiled(path: str, sha256: str) -> _File:
    """The file at `path`, compiled (never run), when its sha256 is `sha256`."""
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
    try:
        tree = ast.parse(importlib.util.decode_source(data), path)
        code = compile(tree, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, UnicodeDecodeError) as error:
        raise Refused(BAD_SOURCE, f"{path} does not compile here: {error}") from None
    return _File(path, tree, code)


# -- one definition, from the compiled file into the running module ----------------------------


def _bound_name(statement: ast.stmt) -> str | None:
    """The name a top-level or class-body statement defines, if it defines one by name."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        accessor = any(
            isinstance(d, ast.Attribute)
            and d.attr in _ACCESSORS
            and isinstance(d.value, ast.Name)
            and d.value.id == statement.name
            for d in statement.decorator_list
        )
        return None if accessor else statement.name
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    if isinstance(statement, ast.AnnAssign) and statement.value is not None:
        return statement.target.id if isinstance(statement.target, ast.Name) else None
    return None


def _nodes(file: _File, name: str) -> builtins.list[ast.stmt]:
    """The statements that define `name` in the file: its classes', then its own; one each."""
    parts = name.split(".")
    body: builtins.list[ast.stmt] = file.tree.body
    chain: builtins.list[ast.stmt] = []
    for depth, part in enumerate(parts):
        where = ".".join(parts[: depth + 1])
        matches = [s for s in body if _bound_name(s) == part]
        if not matches:
            raise Refused(NO_DEFINITION, f"{file.path} defines no {where} (for {name})")
        if len(matches) > 1:
            raise Refused(
                NO_DEFINITION,
                f"{file.path} defines {where} {len(matches)} times: which one {name} means is "
                "not clear; restart instead",
            )
        chain.append(matches[0])
        if depth < len(parts) - 1:
            if not isinstance(matches[0], ast.ClassDef):
                raise Refused(NO_DEFINITION, f"{where} is not a class in {file.path}")
            body = matches[0].body
    return chain


def _code_at(file: _File, chain: builtins.list[ast.stmt], name: str) -> types.CodeType:
    """The code object the file's compiled code holds for the def at the end of `chain`."""
    code = file.code
    for node in chain:
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        matches = [
            c
            for c in code.co_consts
            if isinstance(c, types.CodeType)
            and c.co_name == node.name
            and c.co_firstlineno == first
        ]
        if len(matches) != 1:
            raise Refused(NO_DEFINITION, f"{file.path}: no compiled code found for {name}")
        code = matches[0]
    return code


def _change(module: Any, file: _File, name: str, kind: str, taken: dict[str, Any]) -> _Change:
    owner_path, _, attribute = name.rpartition(".")
    if kind in (CONSTANT, FUNCTION):
        if owner_path:
            raise Refused(BAD_REQUEST, f"a {kind} is a module-level name: not {name}")
        owner: Any = module
    else:
        if not owner_path:
            raise Refused(BAD_REQUEST, f"a {kind} is named Class.name: not {name}")
        owner = module
        for part in owner_path.split("."):
            owner = getattr(owner, part, _MISSING)
        if not isinstance(owner, type):
            raise Refused(NO_DEFINITION, f"{owner_path} is not a class in the running {module}")
    chain = _nodes(file, name)
    node = chain[-1]
    old = vars(owner).get(attribute, _MISSING)
    if kind in (CONSTANT, CLASS_ATTRIBUTE):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            raise Refused(NO_DEFINITION, f"{name} is not an assignment in {file.path}")
        scope = _scope(taken, owner_path, owner)
        fresh = _evaluated(module, scope, node.value, file.path, name)
        if kind == CONSTANT:
            return _constant(module, name, old, fresh)
        return _attribute(owner, name, attribute, old, fresh)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise Refused(NOT_A_FUNCTION, f"{name} is not a def in {file.path}: no code to take")
    code = _code_at(file, chain, name)
    if old is _MISSING:
        return _new_function(module, owner, name, kind, node, code, file, taken)
    return _swap_code(name, kind, old, code)


def _scope(taken: dict[str, Any], owner_path: str, owner: Any) -> dict[str, Any]:
    """The names an expression of the fix sees before the running module's globals: what the
    fix's earlier definitions set (they come in the file's order), and for a class body a copy
    of the running class's namespace (and the fix's earlier attributes of that class)."""
    scope = {name: value for name, value in taken.items() if "." not in name}
    if owner_path:
        scope.update(vars(owner))
        for name, value in taken.items():
            holder, _, attribute = name.rpartition(".")
            if holder == owner_path:
                scope[attribute] = value
    return scope


def _evaluated(
    module: Any, scope: dict[str, Any], expression: ast.expr, path: str, name: str
) -> Any:
    """An assignment's expression alone, evaluated on the running module's globals (`scope`
    first: see `_scope`)."""
    try:
        code = compile(ast.Expression(body=expression), path, "eval", dont_inherit=True)
        return eval(code, vars(module), scope)
    except Exception as error:
        raise Refused(
            EVALUATION_FAILED,
            f"{name}: its expression failed on the running module ({type(error).__name__}: "
            f"{error}); nothing taken",
        ) from None


def _setter(owner: Any, attribute: str, value: Any) -> Callable[[], None]:
    if value is _MISSING:
        return lambda: delattr(owner, attribute)
    return lambda: setattr(owner, attribute, value)


def _holds(owner: Any, attribute: str, value: Any) -> Callable[[], bool]:
    return lambda: vars(owner).get(attribute, _MISSING) is value


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
        _holds(owner, attribute, fresh),
        _value_readback(owner, attribute),
        fresh,
    )


def _constant(module: Any, name: str, old: Any, fresh: Any) -> _Change:
    """A module constant; the modules that imported the old object with `from m import NAME`
    are rebound with it (and back on revert, where they still hold the new one)."""
    rebound = imported_elsewhere(module, name, old)

    def apply() -> None:
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

    return _Change(name, CONSTANT, apply, undo, _holds(module, name, fresh), readback, fresh)


def imported_elsewhere(module: Any, name: str, old: Any) -> builtins.list[Any]:
    """The other loaded modules holding `old` as `name` because their source says
    `from <module> import <name>`: the same object alone could be a small int or a string
    interned by chance."""
    if old is _MISSING:
        return []
    found = []
    for other in tuple(sys.modules.values()):
        space = getattr(other, "__dict__", None)
        if other is module or not isinstance(space, dict) or space.get(name, _MISSING) is not old:
            continue
        if _imports_from(other, module.__name__, name):
            found.append(other)
    return found


def _imports_from(other: Any, module: str, name: str) -> bool:
    path = getattr(other, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return False
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(importlib.util.decode_source(handle.read()), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return False
    package = getattr(other, "__package__", None) or ""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        try:
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        except (ImportError, ValueError):
            continue
        if source == module and any(
            alias.name == name and alias.asname in (None, name) for alias in node.names
        ):
            return True
    return False


def innermost(found: Any) -> Any:
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


def _swap_code(name: str, kind: str, old: Any, after: types.CodeType) -> _Change:
    live = innermost(old)
    if live is None:
        raise Refused(
            NOT_A_FUNCTION,
            f"{name} is not a function here (or wraps none that can be found): its code cannot "
            "be swapped",
        )
    before = live.__code__
    if before.co_freevars != after.co_freevars:
        raise Refused(
            FREE_VARIABLES,
            f"{name}: free variables {before.co_freevars} running, {after.co_freevars} in the "
            "file (super() gained or lost): its code cannot be swapped; restart instead",
        )

    def apply() -> None:
        live.__code__ = after

    def undo() -> None:
        live.__code__ = before

    return _Change(
        name,
        kind,
        apply,
        undo,
        lambda: live.__code__ is after,
        lambda: {"code_sha256": code_sha256(live.__code__)},
    )


def _new_function(
    module: Any,
    owner: Any,
    name: str,
    kind: str,
    node: ast.FunctionDef | ast.AsyncFunctionDef,
    code: types.CodeType,
    file: _File,
    taken: dict[str, Any],
) -> _Change:
    """A function or method the running module lacks: built from the file's code on the running
    module's globals (`super()`'s cell: the running class)."""
    if node.decorator_list:
        raise Refused(
            NOT_A_FUNCTION,
            f"{name} is new and decorated: a decorator's result is not taken live; restart instead",
        )
    cells = []
    for free in code.co_freevars:
        if free != "__class__" or kind != METHOD:
            raise Refused(
                FREE_VARIABLES, f"{name} is new and closes over {free!r}: restart instead"
            )
        cells.append(types.CellType(owner))
    owner_path = name.rpartition(".")[0]
    template = _evaluated_def(module, _scope(taken, owner_path, owner), node, file, name)
    built = types.FunctionType(
        code, vars(module), code.co_name, template.__defaults__, tuple(cells) or None
    )
    built.__kwdefaults__ = template.__kwdefaults__
    built.__qualname__ = name
    built.__doc__ = template.__doc__
    built.__annotations__ = template.__annotations__
    attribute = name.rpartition(".")[2]
    return _Change(
        name,
        kind,
        _setter(owner, attribute, built),
        _setter(owner, attribute, _MISSING),
        _holds(owner, attribute, built),
        lambda: {"code_sha256": code_sha256(built.__code__)},
        built,
    )


def _evaluated_def(
    module: Any,
    scope: dict[str, Any],
    node: ast.FunctionDef | ast.AsyncFunctionDef,
    file: _File,
    name: str,
) -> Any:
    """The def alone (its defaults and annotations: the file's `from __future__` imports kept)
    run on the running module's globals, `scope` first (`_scope`); nothing is bound in the
    module or the class."""
    futures = [
        s for s in file.tree.body if isinstance(s, ast.ImportFrom) and s.module == "__future__"
    ]
    alone = ast.Module(body=[*futures, node], type_ignores=[])
    scope = dict(scope)
    try:
        exec(compile(alone, file.path, "exec", dont_inherit=True), vars(module), scope)
    except Exception as error:
        raise Refused(
            EVALUATION_FAILED,
            f"{name}: its defaults failed on the running module ({type(error).__name__}: "
            f"{error}); nothing taken",
        ) from None
    return scope[node.name]
