"""An agent reply read as its wire type (a TypedDict of `hosts/agent/protocol.py`, imported by
both ends) through a pydantic `TypeAdapter`. Scalars are read strictly (`"2"` is no int) and a
number stays as written (an int in a float field stays an int). pydantic is imported on the
first read, not with this module.
"""

from __future__ import annotations

import functools
import operator
import sys
import types
import typing
from typing import TYPE_CHECKING, Any, TypeVar, Union, cast, get_args, get_origin

if TYPE_CHECKING:
    from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")

_OWN_HOOK = ("dataclass", "typed-dict", "model", "definition-ref", "definitions")


def _as_written(schema: Any, *, top: bool = True) -> Any:
    """pydantic's core `schema` with strict scalars and numbers kept as written, down to the
    next nested reply (each is adjusted by its own hook)."""
    from pydantic_core import core_schema

    if isinstance(schema, list):
        return [_as_written(item, top=False) for item in schema]
    if not isinstance(schema, dict) or (not top and schema.get("type") in _OWN_HOOK):
        return schema
    adjusted = {key: _as_written(value, top=False) for key, value in schema.items()}
    if schema.get("type") == "float":
        number = core_schema.union_schema(
            [core_schema.int_schema(strict=True), core_schema.float_schema(strict=True)],
            custom_error_type="number",
            custom_error_message="Input should be a number",
        )
        kept = {k: v for k, v in adjusted.items() if k in ("serialization", "metadata", "ref")}
        return {**number, **kept}
    if schema.get("type") in ("bool", "int", "str"):
        adjusted["strict"] = True
    return adjusted


def _hook(source: Any, handler: Any) -> Any:
    return _as_written(handler(source))


@functools.cache
def _wire_type(kind: Any) -> Any:
    """`kind` with every TypedDict in it cloned as a `typing_extensions.TypedDict` carrying the
    rules' hook: pydantic reads `typing.TypedDict` only from Python 3.12, and the agent, which
    runs on hosts, imports nothing but the standard library."""
    import typing_extensions

    if typing.is_typeddict(kind):
        hints = typing.get_type_hints(kind, vars(sys.modules[kind.__module__]), include_extras=True)
        fields = {
            name: (
                typing_extensions.Required
                if name in kind.__required_keys__
                else typing_extensions.NotRequired
            )[_wire_type(hint)]
            for name, hint in hints.items()
        }
        clone = typing_extensions.TypedDict(kind.__name__, fields)  # type: ignore[misc]
        cast(Any, clone).__get_pydantic_core_schema__ = staticmethod(_hook)
        return clone
    args = get_args(kind)
    if not args:
        return kind
    wired = tuple(_wire_type(arg) for arg in args)
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):
        return functools.reduce(operator.or_, wired)
    return origin[wired]


@functools.cache
def adapter(kind: Any) -> TypeAdapter[Any]:
    """The one `TypeAdapter` of the wire type `kind`, built on first use and kept."""
    from pydantic import TypeAdapter

    return TypeAdapter(_wire_type(kind))


def read(kind: type[T], data: object) -> T:
    """`data` (JSON values) read as the wire type `kind`, every value checked against its type
    (keys `kind` does not name are dropped).

    Raises:
        ValueError: it is not one; the message names the first problem by its place
            (`UnlockReply.released: ...`, `LiveSiteReply.installed[0].record: ...`).
    """
    from pydantic import ValidationError

    try:
        return cast(T, adapter(cast(Any, kind)).validate_python(data))
    except ValidationError as exc:
        raise ValueError(problem(exc, getattr(kind, "__name__", str(kind)))) from None


def problem(exc: ValidationError, root: str) -> str:
    """pydantic's first error as `Root.key[0].key: what is wrong` (and how many more)."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    place = root + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
    what = "missing" if first["type"] == "missing" else first["msg"]
    if first["type"] != "missing":
        what += f", got {type(first['input']).__name__}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{place}: {what}{more}"
