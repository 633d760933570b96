"""One generic way to turn opspatch's frozen dataclasses into JSON values and back."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from enum import Enum
from typing import (
    Any,
    ClassVar,
    Literal,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

_KEY = "opspatch.json.key"
_INLINE = "opspatch.json.inline"
_OMIT_NONE = "opspatch.json.omit_none"
_SKIP = "opspatch.json.skip"
_ENCODE = "opspatch.json.encode"
_DECODE = "opspatch.json.decode"
_UNWRITTEN = "opspatch.json.unwritten"

NOT_WRITTEN: Mapping[str, Any] = {_SKIP: True}
"""`field(metadata=NOT_WRITTEN)`: a field the JSON leaves out (see the module rules)."""

R = TypeVar("R", bound="JsonRecord")


def json_options(
    *,
    key: str | None = None,
    inline: bool = False,
    omit_none: bool = False,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
    written: bool = True,
) -> Mapping[str, Any]:
    """The `metadata` of a field serialised under `key` or merged into its parent (`inline`),
    left out while None (`omit_none`), written as `encode(value)`, read as `decode(value)`, or
    read and never written (`written=False`) (see the module rules): for `field(metadata=...)`,
    where a field stays required."""
    metadata: dict[str, Any] = {}
    if key is not None:
        metadata[_KEY] = key
    if inline:
        metadata[_INLINE] = True
    if omit_none:
        metadata[_OMIT_NONE] = True
    if encode is not None:
        metadata[_ENCODE] = encode
    if decode is not None:
        metadata[_DECODE] = decode
    if not written:
        metadata[_UNWRITTEN] = True
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
    """A dataclass `field(**options)` with `json_options` (see the module rules)."""
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


class JsonRecord:
    """Mixin for frozen dataclasses: `to_json()` and `from_json()` derived from the fields."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (keys in field order)."""
        return record_to_json(self)

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        """Read a record back from what `to_json()` wrote.

        Raises:
            ValueError: a key is missing or a value does not have the field's type.
        """
        return record_from_json(cls, data)


def to_json_value(value: Any) -> Any:
    """`value` as plain JSON values: records as objects, sequences as lists, enums as words."""
    if isinstance(value, JsonRecord):
        return value.to_json()  # a class whose JSON is written by hand says so by overriding
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [to_json_value(item) for item in value]
    if isinstance(value, Mapping):
        return {key: to_json_value(item) for key, item in value.items()}
    return value


def record_to_json(record: JsonRecord) -> dict[str, Any]:
    """A record's fields as a JSON object, in declaration order (see the module rules)."""
    document: dict[str, Any] = {}
    for spec in dataclasses.fields(record):
        value = getattr(record, spec.name)
        if spec.metadata.get(_SKIP) or spec.metadata.get(_UNWRITTEN):
            continue
        if value is None and spec.metadata.get(_OMIT_NONE):
            continue
        if spec.metadata.get(_INLINE):
            document.update(record_to_json(value))
            continue
        encode = spec.metadata.get(_ENCODE)
        if encode is not None:
            value = encode(value)
        document[spec.metadata.get(_KEY, spec.name)] = to_json_value(value)
    return document


def record_from_json(cls: type[R], data: Mapping[str, Any]) -> R:
    """A `cls` read from the JSON object `data` (see the module rules).

    Raises:
        ValueError: `data` is not an object, a key is missing, or a value has the wrong type.
    """
    return _decode_record(cls, data, cls.__name__)


# ---------------------------------------------------------------------------------------------
# decoding


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved type hints of `cls` (its annotations are strings), computed once."""
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def _decode_record(cls: type[R], data: Any, where: str) -> R:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(cls):
        if not spec.init or spec.metadata.get(_SKIP):
            continue  # derived from the other fields, or never written
        if spec.metadata.get(_INLINE):
            values[spec.name] = _decode_record(hints[spec.name], data, where)
            continue
        key = spec.metadata.get(_KEY, spec.name)
        if key not in data:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}.{key}: missing")
            continue
        decode = spec.metadata.get(_DECODE)
        if decode is not None:
            try:
                values[spec.name] = decode(data[key])
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{where}.{key}: {exc}") from None
            continue
        values[spec.name] = _decode(hints[spec.name], data[key], f"{where}.{key}")
    return cls(**values)


def check_present(cls: type[JsonRecord], data: Mapping[str, Any], where: str) -> None:
    """Check the keys of `data` that `cls` reads against their fields' types, as `from_json`
    would, leaving the others (and any key `cls` requires but `data` lacks) alone: for an object
    that may be written in an older or partial shape (a host's recorded facts).

    Raises:
        ValueError: a key `cls` reads holds a value of another type (named as `where.key`).
    """
    hints = _hints(cls)
    for spec in dataclasses.fields(cls):
        if not spec.init or spec.metadata.get(_SKIP) or spec.metadata.get(_INLINE):
            continue
        key = spec.metadata.get(_KEY, spec.name)
        if key in data and spec.metadata.get(_DECODE) is None:
            _decode(hints[spec.name], data[key], f"{where}.{key}")


def read_keys(cls: type[JsonRecord]) -> frozenset[str]:
    """The keys a `cls` is read from (its fields' keys, inline records' keys merged; not the
    derived fields or those never read): what an agent reply read as `cls` must carry."""
    hints = _hints(cls)
    keys: set[str] = set()
    for spec in dataclasses.fields(cls):
        if not spec.init or spec.metadata.get(_SKIP):
            continue
        if spec.metadata.get(_INLINE):
            keys |= read_keys(hints[spec.name])
        else:
            keys.add(spec.metadata.get(_KEY, spec.name))
    return frozenset(keys)


def _decode(hint: Any, value: Any, where: str) -> Any:
    origin = get_origin(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        if value is None and len(options) < len(get_args(hint)):
            return None
        if len(options) != 1:
            raise TypeError(f"{where}: unions other than `X | None` are not supported")
        return _decode(options[0], value, where)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected an array, got {type(value).__name__}")
        item_hint = get_args(hint)[0]
        items = [_decode(item_hint, item, f"{where}[{i}]") for i, item in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        item_hint = get_args(hint)[1] if get_args(hint) else Any
        return {str(k): _decode(item_hint, v, f"{where}.{k}") for k, v in value.items()}
    if origin is Literal:
        if value not in get_args(hint):
            known = ", ".join(repr(word) for word in get_args(hint))
            raise ValueError(f"{where}: {value!r} is not one of {known}")
        return value
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            known = ", ".join(str(member.value) for member in hint)
            raise ValueError(f"{where}: {value!r} is not one of {known}") from None
    if isinstance(hint, type) and issubclass(hint, JsonRecord):
        # a record in a field is named by its class (`HostFacts.python_version`, as when read
        # alone); one in an array by its place (`SmokeResult.prompts[0].ok`)
        return _decode_record(hint, value, where if where.endswith("]") else hint.__name__)
    return _decode_scalar(hint, value, where)


def _decode_scalar(hint: Any, value: Any, where: str) -> Any:
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is str:
        ok = isinstance(value, str)
    else:
        raise TypeError(f"{where}: cannot read a value of type {hint!r}")
    if not ok:
        raise ValueError(f"{where}: expected {hint.__name__}, got {type(value).__name__}")
    return value
