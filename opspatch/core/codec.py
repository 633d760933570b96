"""JSON values read and written through pydantic `TypeAdapter`s: agent replies (TypedDicts both
ends import) and opspatch's frozen dataclasses (`Record`). Scalars are read strictly (`"2"` is no
int), a number stays as written. pydantic is imported on first use, not with this module.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, Union, cast, get_args, get_origin

if TYPE_CHECKING:
    from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")
R = TypeVar("R", bound="Record")

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


class _Wire:
    """`Annotated[T, WIRE]`: a record's field of the agent's wire type `T` (a TypedDict, or a
    list or union of them), read as `read` reads a reply."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        return handler.generate_schema(_wire_type(source))


WIRE = _Wire()


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
    return _said(exc.errors(include_url=False), root)


def _said(errors: list[Any], root: str) -> str:
    first = errors[0]
    place = root + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
    what = "missing" if first["type"] == "missing" else first["msg"]
    if first["type"] in ("enum", "literal_error"):  # a word this opspatch does not know
        what += f", got {first['input']!r}"
    elif first["type"] != "missing":
        what += f", got {type(first['input']).__name__}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{place}: {what}{more}"


def check_present(cls: type[Record], data: Mapping[str, Any], where: str) -> None:
    """Check the keys of `data` that `cls` reads against their fields' types, as `from_json`
    would, leaving alone the keys `cls` requires but `data` lacks: for an object that may be
    written in an older or partial shape (a host's recorded facts).

    Raises:
        ValueError: a key `cls` reads holds a value of another type (named as `where.key`).
    """
    from pydantic import ValidationError

    try:
        adapter(cast(Any, cls)).validate_python(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        wrong = [e for e in errors if e["type"] != "missing" or len(e["loc"]) > 1]
        if wrong:
            raise ValueError(_said(wrong, where)) from None


# ---------------------------------------------------------------------------------------------
# records: frozen dataclasses as JSON objects

_WRITING = "opspatch.writing"
_INLINE = "opspatch.inline"
_ENCODE = "opspatch.encode"
_DECODE = "opspatch.decode"

UNREAD = "opspatch.unread"

NOT_WRITTEN: Mapping[str, Any] = {"exclude": True, UNREAD: True}
"""`field(metadata=NOT_WRITTEN)`: a field the JSON leaves out, which the controller sets (no
reply is expected to carry it)."""


def _is_none(value: object) -> bool:
    return value is None


def json_options(
    *,
    key: str | None = None,
    inline: bool = False,
    omit_none: bool = False,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
    written: bool = True,
) -> dict[str, Any]:
    """A field's `metadata`: pydantic's own `Field` arguments (`alias`, `exclude`, `exclude_if`,
    which pydantic reads from a dataclass field's metadata) and the ones `Record` adds: written
    merged into its parent (`inline`), written as `encode(value)`, read as `decode(value)`."""
    metadata: dict[str, Any] = {}
    if key is not None:
        metadata["alias"] = key
    if omit_none:
        metadata["exclude_if"] = _is_none
    if not written:
        metadata["exclude"] = True
    if inline:
        metadata[_INLINE] = True
    if encode is not None:
        metadata[_ENCODE] = encode
    if decode is not None:
        metadata[_DECODE] = decode
    return metadata


def json_field(
    *,
    key: str | None = None,
    inline: bool = False,
    omit_none: bool = False,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
    written: bool = True,
    **options: Any,
) -> Any:
    """A dataclass `field(**options)` with `json_options`."""
    metadata = dict(options.pop("metadata", {}) or {})
    metadata.update(
        json_options(
            key=key,
            inline=inline,
            omit_none=omit_none,
            encode=encode,
            decode=decode,
            written=written,
        )
    )
    return dataclasses.field(metadata=metadata, **options)


class Record:
    """Mixin for frozen dataclasses: `to_json()` and `from_json()` through the class's pydantic
    `TypeAdapter`. Keys come in field order; a derived field (`init=False`) is written in its
    place and never read."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (keys in field order)."""
        return dump(self)

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        """Read a record back from what `to_json()` wrote.

        Raises:
            ValueError: a key is missing or a value does not have the field's type, named by
                its place (`HostFacts.cuda_device_count: ...`).
        """
        return read(cls, data)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return _record_schema(cls, handler(source), handler)


class AnyRecord:
    """Stands at run time for a record type a module imports only for mypy (one kept off a
    light import path): a value written by its own `to_json()` and read as it stands."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema(
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda record: record.to_json()
            )
        )


def dump(record: Record) -> dict[str, Any]:
    """`record`'s fields as a JSON object (what `to_json()` writes, before any override). A value
    is written as it stands, unchecked against its field's type (a step named by a plain `str`),
    as the ledger has always written it."""
    written = adapter(cast(Any, type(record))).dump_python(
        record, mode="json", by_alias=True, warnings=False, context={_WRITING: record}
    )
    return cast("dict[str, Any]", written)


def _record_schema(cls: type, schema: Any, handler: Any) -> Any:
    """pydantic's dataclass `schema` of `cls` with the derived fields written, `encode` and
    `decode` applied, `inline` records merged, and scalars read as `_as_written` reads them."""
    from pydantic_core import core_schema

    schema = _as_written(schema)
    args = schema["schema"]
    hints = typing.get_type_hints(cls)
    generated = {spec["name"]: spec for spec in args["fields"]}
    fields, inline = [], []
    for spec in dataclasses.fields(cls):
        if spec.name not in generated:  # derived: written in its place, never read
            derived = handler.generate_schema(hints[spec.name])
            fields.append(core_schema.dataclass_field(spec.name, derived, init=False))
            continue
        fields.append(made := generated[spec.name])
        if spec.metadata.get(_INLINE):
            inline.append(spec.name)
        decode, encode = spec.metadata.get(_DECODE), spec.metadata.get(_ENCODE)
        if decode is not None:  # read as decode reads it, under the default if there is one
            holder = made["schema"] if made["schema"]["type"] == "default" else made
            holder["schema"] = core_schema.no_info_plain_validator_function(decode)
        if encode is not None:
            made["schema"]["serialization"] = core_schema.plain_serializer_function_ser_schema(
                encode
            )
    args["fields"] = fields
    if inline:
        schema["schema"] = core_schema.no_info_before_validator_function(
            functools.partial(_nest, inline), args
        )
    if inline or cls.to_json is not Record.to_json:  # type: ignore[attr-defined]
        schema["serialization"] = core_schema.wrap_serializer_function_ser_schema(
            functools.partial(_write, inline), info_arg=True
        )
    return schema


def _write(inline: list[str], record: Any, write: Any, info: Any) -> Any:
    """A record written with its inline records' keys merged in their place, or, where its
    `to_json` is written by hand and it is nested in another, by that `to_json` (which calls
    `dump` for its fields: those are written here)."""
    if (
        type(record).to_json is not Record.to_json
        and (info.context or {}).get(_WRITING) is not record
    ):
        return record.to_json()
    written: dict[str, Any] = {}
    for key, value in write(record).items():
        written.update(value if key in inline else {key: value})
    return written


def _nest(names: list[str], data: Any) -> Any:
    """An object read with its inline records read from the object itself."""
    return {**data, **{name: data for name in names}} if isinstance(data, Mapping) else data
