"""The live form of a patched file (pure): which definitions of the module a running process must
take so that it runs what the post-image says, or why it cannot (`NotLive`: `apply --live`
is refused before any change)."""

from __future__ import annotations

import ast
import hashlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from types import CodeType

from opspatch.core.codec import Record
from opspatch.core.liveinit import construction_only
from opspatch.core.syntax import parse_python
from opspatch.core.vocabulary import LiveKind, LivePolicy, NotLiveReason

RESTART_ONLY_PATHS = ("model_executor/", "models/", "cuda_graph_runner")
"""Parts of a module's path that make it restart-only by default: the model forward and the
CUDA graph runner, whose captured graphs replay the old kernels whatever the Python says."""

_GENERATOR_FLAGS = (
    inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_ITERABLE_COROUTINE
)


@dataclass(frozen=True)
class LiveDefinition(Record):
    """One definition a live fix takes: its dotted name in the module (`LIMIT`, `Class.name`,
    `Outer.Inner.method`) and what it is."""

    name: str
    kind: LiveKind


@dataclass(frozen=True)
class LiveForm:
    """What a running process takes for one patched file: the module, the post-image's sha256
    (the file the plugin compiles them from) and the definitions, in the post-image's order.
    `objects`: the changed methods that run only while an object is built (`construction_only`),
    whose change reaches only objects built after the take: the preflight asks each process
    how many objects of their class it already holds."""

    module: str
    sha256: str
    definitions: tuple[LiveDefinition, ...]
    objects: tuple[str, ...] = ()


@dataclass(frozen=True)
class NotLive:
    """Why a file's change cannot be taken live."""

    reason: NotLiveReason
    text: str


class _Refusal(Exception):
    def __init__(self, reason: NotLiveReason, text: str) -> None:
        super().__init__(text)
        self.not_live = NotLive(reason, text)


def restart_only_module(module: str) -> bool:
    """Whether `module` is restart-only unless a patch says `live = "allowed"`."""
    path = module.replace(".", "/") + ".py"
    return any(part in path for part in RESTART_ONLY_PATHS)


def live_form(
    module: str, pre: bytes, post: bytes, policy: LivePolicy | None = None
) -> LiveForm | NotLive:
    """The live form of `module`'s change from `pre` to `post` (see the module's docstring);
    `policy` is the patch's `live`."""
    if policy == LivePolicy.RESTART_ONLY:
        return NotLive(NotLiveReason.DECLARED_RESTART_ONLY, 'the patch says live = "restart-only"')
    if restart_only_module(module) and policy != LivePolicy.ALLOWED:
        return NotLive(
            NotLiveReason.RESTART_ONLY_MODULE,
            f"{module} is restart-only (the model forward or the CUDA graph runner: a captured "
            'graph replays the old kernels); a patch that is safe live there says live = "allowed"',
        )
    try:
        before, after = _Image(module, pre, "pre-image"), _Image(module, post, "post-image")
        definitions = tuple(_compare(before, after, before.tree.body, after.tree.body, ""))
    except _Refusal as refusal:
        return refusal.not_live
    objects = tuple(
        d.name
        for d in definitions
        if d.kind == LiveKind.METHOD and construction_only(before.tree, after.tree, d.name)
    )
    return LiveForm(module, hashlib.sha256(post).hexdigest(), definitions, objects)


class _Image:
    """One side of the change: its syntax tree and its compiled code, by dotted name."""

    def __init__(self, module: str, data: bytes, which: str) -> None:
        try:
            # parse_python serialises the parse, and the code is compiled from the bytes rather
            # than the tree: CPython 3.11 races converting trees in parallel preflight threads
            self.tree = parse_python(data)
            code = compile(data, f"<{module} {which}>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as error:
            raise _Refusal(
                NotLiveReason.UNPARSABLE, f"the {which} does not compile here: {error}"
            ) from None
        self.code: dict[str, CodeType] = dict(_codes(code, ""))


def _codes(code: CodeType, prefix: str) -> Iterator[tuple[str, CodeType]]:
    """Every function's and class body's code under `code`, by dotted name (a later definition
    of one name wins, as at run time)."""
    for const in code.co_consts:
        if isinstance(const, CodeType) and not const.co_name.startswith("<"):
            name = prefix + const.co_name
            yield name, const
            yield from _codes(const, name + ".")


_Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Assign | ast.AnnAssign


def _members(body: list[ast.stmt]) -> tuple[dict[str, list[_Definition]], list[str]]:
    """A body's definitions by name (in order), and every other statement as its dump."""
    named: dict[str, list[_Definition]] = {}
    others: list[str] = []
    for index, statement in enumerate(body):
        if (
            index == 0
            and isinstance(statement, ast.Expr)
            and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str)
        ):
            continue  # the docstring
        for name in _names(statement):
            named.setdefault(name, []).append(statement)  # type: ignore[arg-type]
        if not _names(statement):
            others.append(ast.dump(statement))
    return named, others


def _names(statement: ast.stmt) -> list[str]:
    """The names a definition binds: a def's or class's, an assignment's to plain names."""
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [statement.name]
    if isinstance(statement, ast.Assign) and all(
        isinstance(target, ast.Name) for target in statement.targets
    ):
        return [target.id for target in statement.targets if isinstance(target, ast.Name)]
    if (
        isinstance(statement, ast.AnnAssign)
        and isinstance(statement.target, ast.Name)
        and statement.value is not None
    ):
        return [statement.target.id]
    return []


def _compare(
    before: _Image, after: _Image, old: list[ast.stmt], new: list[ast.stmt], prefix: str
) -> Iterator[LiveDefinition]:
    """The definitions of one body (the module's, a class's) that changed, in the new order."""
    where = prefix.rstrip(".") or "the module"
    old_named, old_others = _members(old)
    new_named, new_others = _members(new)
    if old_others != new_others:
        raise _Refusal(
            NotLiveReason.STATEMENT,
            f"a statement of {where} that defines nothing by name changed (an import, an if, a "
            "call): running it again in a live process is not the fix",
        )
    removed = sorted(set(old_named) - set(new_named))
    if removed:
        raise _Refusal(
            NotLiveReason.REMOVED,
            f"{', '.join(prefix + name for name in removed)} removed: a live process would keep it",
        )
    for name, statements in new_named.items():
        was = old_named.get(name)
        if was is not None and [ast.dump(s) for s in was] == [ast.dump(s) for s in statements]:
            continue
        dotted = prefix + name
        if len(statements) > 1 or (was is not None and len(was) > 1):
            raise _Refusal(
                NotLiveReason.STATEMENT,
                f"{dotted} is defined more than once in {where}: which one runs depends on order",
            )
        yield from _changed(before, after, dotted, was[0] if was else None, statements[0])


def _changed(
    before: _Image,
    after: _Image,
    dotted: str,
    was: _Definition | None,
    now: _Definition,
) -> Iterator[LiveDefinition]:
    """One changed (or added: `was` None) definition's part of the live form."""
    in_class = "." in dotted
    if isinstance(now, ast.ClassDef):
        if was is None:
            raise _Refusal(
                NotLiveReason.NEW_CLASS,
                f"class {dotted} is new: its methods would belong to the file's copy of the module",
            )
        if not isinstance(was, ast.ClassDef):
            raise _changed_kind(dotted)
        yield from _changed_class(before, after, dotted, was, now)
        return
    if isinstance(now, ast.FunctionDef | ast.AsyncFunctionDef):
        if was is not None and not isinstance(was, ast.FunctionDef | ast.AsyncFunctionDef):
            raise _changed_kind(dotted)
        _check_function(before, after, dotted, was, now)
        yield LiveDefinition(dotted, LiveKind.METHOD if in_class else LiveKind.FUNCTION)
        return
    if was is not None and not isinstance(was, ast.Assign | ast.AnnAssign):
        raise _changed_kind(dotted)
    yield LiveDefinition(dotted, LiveKind.CLASS_ATTRIBUTE if in_class else LiveKind.CONSTANT)


def _changed_kind(dotted: str) -> _Refusal:
    return _Refusal(
        NotLiveReason.STATEMENT, f"{dotted} changes what it is (a def, a class, an assignment)"
    )


def _changed_class(
    before: _Image, after: _Image, dotted: str, was: ast.ClassDef, now: ast.ClassDef
) -> Iterator[LiveDefinition]:
    if _dumps(was.decorator_list) != _dumps(now.decorator_list):
        raise _Refusal(
            NotLiveReason.DECORATORS, f"class {dotted}'s decorators changed: restart instead"
        )
    if _dumps(was.bases) + _dumps(was.keywords) != _dumps(now.bases) + _dumps(now.keywords):
        raise _Refusal(
            NotLiveReason.BASES,
            f"class {dotted}'s bases or metaclass changed: the running class keeps its own",
        )
    for definition in _compare(before, after, was.body, now.body, dotted + "."):
        if now.decorator_list and definition.kind == LiveKind.CLASS_ATTRIBUTE:
            raise _Refusal(
                NotLiveReason.DECORATORS,
                f"{definition.name}: class {dotted} is decorated (a dataclass, say), which read "
                "its attributes when it was built: restart instead",
            )
        yield definition


def _check_function(
    before: _Image,
    after: _Image,
    dotted: str,
    was: ast.FunctionDef | ast.AsyncFunctionDef | None,
    now: ast.FunctionDef | ast.AsyncFunctionDef,
) -> None:
    """Refuse a function whose change a code swap cannot carry."""
    new_code = after.code.get(dotted)
    old_code = before.code.get(dotted)
    codes = [code for code in (old_code, new_code) if code is not None]
    if any(isinstance(d, ast.AsyncFunctionDef) for d in (was, now)) or any(
        code.co_flags & _GENERATOR_FLAGS for code in codes
    ):
        raise _Refusal(
            NotLiveReason.GENERATOR,
            f"{dotted} is a generator or coroutine function: its live frames keep the old code",
        )
    if was is None:
        if now.decorator_list:
            raise _Refusal(
                NotLiveReason.DECORATORS,
                f"{dotted} is new and decorated: a decorator's result is not taken live",
            )
        return
    if _dumps(was.decorator_list) != _dumps(now.decorator_list):
        raise _Refusal(NotLiveReason.DECORATORS, f"{dotted}'s decorators changed: restart instead")
    if _dumps(was.args.defaults) + _dumps(was.args.kw_defaults) != _dumps(
        now.args.defaults
    ) + _dumps(now.args.kw_defaults):
        raise _Refusal(
            NotLiveReason.DEFAULTS,
            f"{dotted}'s default values changed: they are objects built when it was defined",
        )
    if (
        old_code is not None
        and new_code is not None
        and old_code.co_freevars != new_code.co_freevars
    ):
        raise _Refusal(
            NotLiveReason.FREE_VARIABLES,
            f"{dotted}'s free variables change from {old_code.co_freevars} to "
            f"{new_code.co_freevars} (super() gained or lost, or a name of an enclosing function "
            "newly read): its code cannot be swapped into the running function",
        )


def _dumps(nodes: list[ast.expr] | list[ast.keyword] | list[ast.expr | None]) -> list[str]:
    return [ast.dump(node) if node is not None else "" for node in nodes]
