"""File schemas, and the one way a problem in a patch, inventory or playbook file is reported."""

from __future__ import annotations

import datetime
import difflib
import re
import types
from collections.abc import Callable, Collection, Mapping, Sequence
from enum import Enum
from typing import Annotated, Any, Protocol, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Tag, ValidationError
from pydantic_core import PydanticCustomError

from opspatch.errors import Location, SpecError

FieldPath = tuple[str | int, ...]

MAX_NESTING = 32
"""Deepest nesting of arrays and tables a file may have; real files stay in single digits."""
MAX_NODES = 200_000
"""Most values a file may hold (counted as written out, so YAML aliases count each time)."""
_MAX_LISTED = 5  # further problems listed in a hint


class SourceDocument(Protocol):
    """A parsed file that can say where a field is written (TOML or YAML)."""

    @property
    def path(self) -> str: ...

    def line_of(self, field_path: Sequence[str | int]) -> int: ...

    def location(self, field_path: Sequence[str | int]) -> Location: ...

    def error(
        self, field_path: Sequence[str | int], problem: str, *, hint: str | None = None
    ) -> SpecError: ...


def format_field_path(field_path: Sequence[str | int]) -> str:
    """`("edits", 1, "anchor")` -> `edits[1].anchor` (the form operators see in messages)."""
    out = ""
    for part in field_path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def did_you_mean(word: str, choices: Collection[str], *, cutoff: float = 0.6) -> str | None:
    """`did you mean 'x' or 'y'?` for the choices nearest to `word`, or None."""
    near = difflib.get_close_matches(word, list(choices), n=3, cutoff=cutoff)
    return "did you mean " + " or ".join(repr(n) for n in near) + "?" if near else None


# ---------------------------------------------------------------------------------------------
# schema helpers


class FileSchema(BaseModel):
    """Base of every file schema: strict types (TOML and YAML give real ones), no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


def problem(message: str, hint: str | None = None) -> PydanticCustomError:
    """A validator's error whose message is shown as written, with an optional hint."""
    return PydanticCustomError("spec_problem", "{problem}", {"problem": message, "hint": hint})


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    # bool is an int in Python; `canary = true` must not quietly mean one canary.
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds)


def expects(what: str, *kinds: type) -> BeforeValidator:
    """Refuse a value that is none of `kinds` with `must be <what>, got <value>`."""

    def check(value: Any) -> Any:
        if not _is(value, kinds):
            raise PydanticCustomError("wrong_type", "must be {what}", {"what": what})
        return value

    return BeforeValidator(check)


def word_of(words: type[Enum]) -> BeforeValidator:
    """Read a string as one of the `words` (a str enum of the vocabulary); any other value gets
    one message, `must be one of <each word>, got <value>`, as a literal's does."""

    def check(value: Any) -> Any:
        for word in words:
            if value == word.value:
                return word
        expected = " or ".join(repr(word.value) for word in words)
        raise PydanticCustomError("literal_error", "must be one of", {"expected": expected})

    return BeforeValidator(check)


def by_type(what: str, **members: Any) -> Any:
    """A union whose member is chosen by the value's type, named `int`, `float`, `str`, `bool`,
    `list` or `dict`: `by_type("a count or a list", int=Count, list=list[str])`. A value of
    another type gets one message, `must be <what>, got <value>`, instead of one per member."""
    by_name = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict}
    kinds = {name: by_name[name] for name in members}

    def pick(value: Any) -> str | None:
        for name, kind in kinds.items():
            if _is(value, (kind,)):
                return name
        return None

    tagged = tuple(Annotated[member, Tag(name)] for name, member in members.items())
    return Annotated[
        Union[tagged],  # noqa: UP007 - a runtime-built union of tagged members
        Discriminator(
            pick,
            custom_error_type="wrong_type",
            custom_error_message=f"must be {what}",
        ),
    ]


# ---------------------------------------------------------------------------------------------
# nesting


def check_nesting(data: Any, document: SourceDocument) -> None:
    """Refuse data nested more than `MAX_NESTING` levels, or holding more than `MAX_NODES`
    values (YAML aliases can make a small file huge, or refer to themselves).

    Raises:
        SpecError: at the first field that is too deep.
    """
    count = 0
    stack: list[tuple[Any, FieldPath]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise document.error(
                path, f"the file holds more than {MAX_NODES} values", hint="is it an alias loop?"
            )
        if isinstance(value, dict | list) and len(path) >= MAX_NESTING:
            raise document.error(
                path,
                f"nested more than {MAX_NESTING} levels deep",
                hint="no opspatch file needs that; is the file generated or damaged?",
            )
        if isinstance(value, dict):
            stack.extend((v, (*path, str(k))) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(value))


# ---------------------------------------------------------------------------------------------
# ValidationError -> SpecError


def shown(value: Any) -> str:
    """A value as a problem statement shows it: `a string ('fast')`, `a table`."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value!r})" if len(value) <= 60 else "a long string"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, datetime.date | datetime.time):
        return f"a date or time ({value.isoformat()})"
    return "nothing" if value is None else f"a {type(value).__name__}"


def _members(annotation: Any) -> list[Any]:
    """The types an annotation can hold (Annotated, Optional and unions unwrapped)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def keys_at(schema: type[BaseModel], path: Sequence[str | int]) -> set[str]:
    """The keys the schema allows in the table at `path` (a field path as written)."""
    current: list[Any] = [schema]
    for part in path:
        following: list[Any] = []
        for member in (m for a in current for m in _members(a)):
            origin = get_origin(member)
            if isinstance(part, int):
                if origin in (list, tuple):
                    following.append(get_args(member)[0])
            elif _is_model(member):
                for name, info in member.model_fields.items():
                    if part in (name, info.alias):
                        following.append(info.annotation)
            elif origin is dict:
                following.append(get_args(member)[1])
        current = following
    keys: set[str] = set()
    for member in (m for a in current for m in _members(a)):
        if _is_model(member):
            keys.update(info.alias or name for name, info in member.model_fields.items())
    return keys


def _child(node: Any, part: str | int) -> tuple[bool, Any]:
    """Whether `node` (a table or a list) has `part`, and the value there."""
    if isinstance(node, dict) and part in node:
        return True, node[part]
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return True, node[part]
    return False, None


def _written_path(loc: Sequence[str | int], data: Any, *, keep_last: bool) -> FieldPath:
    """Pydantic's error location as written in the file: the union member names it inserts
    (`insert`, `systemd`, `int`) are not in the data, so parts the data does not have are
    dropped; the last part is kept for a missing or unknown key."""
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        present, child = _child(node, part)
        if present:
            node = child
        elif not (last and keep_last):
            continue
        out.append(part)
    return tuple(out)


def _quoted_choices(expected: str) -> list[str]:
    return re.findall(r"'((?:[^'\\]|\\.)*)'", expected)


_TYPE_WORDS = {
    "int_type": "a whole number",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}
"""What a value of the wrong type should have been, by pydantic's error type."""


def _quote_it(value: Any) -> str | None:
    """The hint for a number where text belongs: TOML and YAML read an unquoted 3.10 as the
    number 3.1, so the text as written is gone."""
    if type(value) is int:
        return f'put it in quotes: "{value}"'
    if type(value) is float:
        return "put it in quotes, written as you mean it (unquoted, 3.10 is the number 3.1)"
    return None


def _describe(
    error: Mapping[str, Any],
    schema: type[BaseModel],
    data: Any,
    named_in_message: Collection[str],
) -> tuple[FieldPath, str, str | None]:
    """One pydantic error as (field path as written, problem, hint)."""
    kind = str(error.get("type", ""))
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    value = error.get("input")
    keep_last = kind in ("missing", "extra_forbidden")
    path = _written_path(tuple(error.get("loc", ())), data, keep_last=keep_last)
    hint: str | None = ctx.get("hint") if isinstance(ctx.get("hint"), str) else None
    if kind == "extra_forbidden" and path:
        key = str(path[-1])
        known = keys_at(schema, path[:-1])
        hint = did_you_mean(key, known) or (
            f"known keys here: {', '.join(sorted(known))}" if known else None
        )
        return path, f"unknown key {key!r}", hint
    if kind == "missing" and path:
        return path, f"missing required key {str(path[-1])!r}", None
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        key = str(ctx.get("discriminator", "'kind'")).strip("'\"")
        if kind == "union_tag_not_found":
            return (*path, key), f"missing required key {key!r}", None
        tag = ctx.get("tag")
        choices = _quoted_choices(str(ctx.get("expected_tags", "")))
        return (
            (*path, key),
            f"unknown {key} {tag!r}; expected one of {', '.join(repr(c) for c in choices)}",
            did_you_mean(str(tag), choices),
        )
    if kind == "literal_error":
        choices = _quoted_choices(str(ctx.get("expected", "")))
        listed = ", ".join(repr(c) for c in choices)
        return (
            path,
            f"must be one of {listed}, got {value!r}",
            did_you_mean(str(value), choices) if isinstance(value, str) else None,
        )
    if kind == "wrong_type":  # from `expects` and `by_type`: the message is "must be <what>"
        return path, f"{error.get('msg')}, got {shown(value)}", hint
    if kind in _TYPE_WORDS:
        if kind == "string_type":
            hint = hint or _quote_it(value)
        return path, f"must be {_TYPE_WORDS[kind]}, got {shown(value)}", hint
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("more than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        return path, f"must be {words} {ctx.get(key)}, got {value!r}", hint
    if kind == "too_short":
        if isinstance(value, str):
            return path, "must not be empty", hint
        if ctx.get("min_length") == 1:
            return path, "must be a non-empty list", hint
        return path, f"must have at least {ctx.get('min_length')} items", hint
    if kind == "finite_number":
        return path, f"must be a finite number, got {value!r}", hint
    if kind == "string_pattern_mismatch":
        return path, f"{value!r} does not match {ctx.get('pattern')}", hint
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    moved = re.match(r"^([a-z_]+): (.*)$", message, re.DOTALL)
    if moved and moved.group(1) in named_in_message:
        # a check across fields names the field it is about: `position: needs an anchor`
        return (*path, moved.group(1)), moved.group(2), hint
    return path, message, hint


def spec_error_from_validation(
    exc: ValidationError,
    document: SourceDocument,
    *,
    schema: type[BaseModel],
    data: Any,
    to_document: Callable[[FieldPath], FieldPath] | None = None,
    named_in_message: Collection[str] = (),
) -> SpecError:
    """The `SpecError` for a schema's `ValidationError`: the first problem at its file, line and
    field (unknown keys first: a misspelt key also shows up as a missing one), its hint, and
    the other problems listed after the hint.

    `data` is what was validated; `to_document` maps a path in it to the path in `document`
    (an Ansible variable for an inventory setting); `named_in_message` are the field names a
    check across fields writes first in its message (`position: ...`), so the error is placed
    at that field.
    """
    errors = sorted(exc.errors(), key=lambda e: e.get("type") != "extra_forbidden")
    located: list[tuple[FieldPath, str, str | None]] = []
    for error in errors:
        path, text, hint = _describe(error, schema, data, named_in_message)
        located.append((to_document(path) if to_document else path, text, hint))
    (first_path, first_problem, first_hint), others = located[0], located[1:]
    listed = [f"{document.location(p)}: {text}" for p, text, _ in others[:_MAX_LISTED]]
    if len(others) > _MAX_LISTED:
        listed.append(f"and {len(others) - _MAX_LISTED} more")
    hint = "; ".join(
        part for part in (first_hint, ("also: " + "; ".join(listed)) if listed else None) if part
    )
    return document.error(first_path, first_problem, hint=hint or None)
