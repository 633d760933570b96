"""Where an edit points: scopes (`Class.method`, `<module>`) and the structural selectors that
choose a statement (`StatementSelector`) or what a `replace` changes (`ReplaceSelector`)."""

from __future__ import annotations

import ast
import keyword
import re
from typing import Any, Literal

from pydantic import model_validator as _model_validator

from opspatch.core.fileschema import FileSchema
from opspatch.core.syntax import dedent_code, parse_python

MODULE_SCOPE = "<module>"

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_QUALNAME_RE = re.compile(rf"^{_IDENT}(\.{_IDENT})*$")
_DOTTED_CALL_RE = re.compile(rf"^({_IDENT}|super\(\))(\.{_IDENT})*$")


def _check_qualname(value: str) -> str:
    if value == MODULE_SCOPE:
        return value
    if not _QUALNAME_RE.match(value) or any(keyword.iskeyword(p) for p in value.split(".")):
        raise ValueError(
            f"{value!r} is not a scope: use `Class`, `Class.method`, `function` or `{MODULE_SCOPE}`"
        )
    return value


def _parse_statements(code: str, what: str) -> list[ast.stmt]:
    try:
        return parse_python(dedent_code(code).text).body
    except SyntaxError as exc:
        where = f" (snippet line {exc.lineno})" if exc.lineno else ""
        raise ValueError(f"{what} does not parse: {exc.msg}{where}") from None


class StatementSelector(FileSchema):
    """Selects statements structurally inside a scope (exactly one criterion).

    - `calls`: a statement that calls this name (`init_cuda_graphs` matches
      `self.init_cuda_graphs()`; `super().__init__` matches the base-class initializer call);
    - `assigns`: a statement that assigns this target (`self.y`, `x`);
    - `defines`: a `def`/`class` statement with this name;
    - `matches`: a statement whose syntax tree equals this code (whitespace and comments ignored).

    `which` picks among several matches: `only` (the default) refuses ambiguity and lists them.
    """

    calls: str | None = None
    assigns: str | None = None
    defines: str | None = None
    matches: str | None = None
    which: Literal["only", "first", "last"] = "only"

    @_model_validator(mode="after")
    def _exactly_one(self) -> StatementSelector:
        _check_statement_criteria(self, extra=())
        return self

    def describe(self) -> str:
        for key in ("calls", "assigns", "defines", "matches"):
            value = getattr(self, key)
            if value is not None:
                return f"the {'' if self.which == 'only' else self.which + ' '}statement that {key} `{value.strip()}`"
        raise AssertionError("unreachable")  # pragma: no cover


def _check_statement_criteria(selector: Any, extra: tuple[str, ...]) -> None:
    """Exactly one selection criterion, each well-formed (shared by both selector models)."""
    keys = ("calls", "assigns", "defines", "matches", *extra)
    given = [k for k in keys if getattr(selector, k, None)]
    if getattr(selector, "keyword", None) is not None and given == ["calls"]:
        pass  # calls + keyword: one criterion, the keyword's value in that call
    elif len(given) != 1:
        raise ValueError(
            f"give exactly one of {', '.join(keys)}"
            + (f" (got {', '.join(given)})" if given else "")
        )
    if selector.calls is not None and not _DOTTED_CALL_RE.match(selector.calls):
        raise ValueError(
            f"calls: {selector.calls!r} is not a dotted name such as `self.init_cuda_graphs`"
        )
    if selector.assigns is not None and not _QUALNAME_RE.match(selector.assigns):
        raise ValueError(
            f"assigns: {selector.assigns!r} is not an assignable name such as `self.y`"
        )
    if selector.defines is not None and not re.match(rf"^{_IDENT}$", selector.defines):
        raise ValueError(f"defines: {selector.defines!r} is not a name")
    if selector.matches is not None and len(_parse_statements(selector.matches, "matches")) != 1:
        raise ValueError("matches must be exactly one statement")
    expression = getattr(selector, "expression", None)
    if expression is not None:
        try:
            parse_python(expression.strip(), mode="eval")
        except SyntaxError as exc:
            raise ValueError(f"expression does not parse: {exc.msg}") from None


class ReplaceSelector(FileSchema):
    """What a `replace` edit replaces: a statement (as `StatementSelector`), or an expression:

    - `expression`: an expression whose syntax tree equals this code;
    - `calls` with `keyword`: the value of `keyword=` in a call of `calls`
      (`{ calls = "torch.cuda.graph", keyword = "pool" }` picks `...` in `torch.cuda.graph(g, pool=...)`);
    - `with_item`: the context expression of a `with` item that calls this name, or equals this
      expression (`{ with_item = "torch.cuda.graph" }`); its `as` target stays;
    - `test_of` (`"if"` or `"while"`), optionally with `containing`: the whole test of such a
      statement whose test contains that expression.

    `which = "all"` replaces every match.
    """

    calls: str | None = None
    assigns: str | None = None
    defines: str | None = None
    matches: str | None = None
    expression: str | None = None
    keyword: str | None = None
    with_item: str | None = None
    test_of: Literal["if", "while"] | None = None
    containing: str | None = None
    which: Literal["only", "first", "last", "all"] = "only"

    @_model_validator(mode="after")
    def _exactly_one(self) -> ReplaceSelector:
        if self.keyword is not None:
            if self.calls is None:
                raise ValueError("keyword: names an argument of a call; give calls too")
            if not re.match(rf"^{_IDENT}$", self.keyword) or keyword.iskeyword(self.keyword):
                raise ValueError(f"keyword: {self.keyword!r} is not an argument name")
        if self.containing is not None:
            if self.test_of is None:
                raise ValueError("containing: narrows test_of; give test_of too")
            _check_expression(self.containing, "containing")
        if self.with_item is not None and not _DOTTED_CALL_RE.match(self.with_item):
            _check_expression(self.with_item, "with_item")
        _check_statement_criteria(self, extra=("expression", "with_item", "test_of"))
        return self

    def sub_criterion(self) -> Literal["keyword", "with_item", "test_of"] | None:
        """Which selector below the statement this is, if one is (they select expressions)."""
        if self.keyword is not None:
            return "keyword"
        if self.with_item is not None:
            return "with_item"
        if self.test_of is not None:
            return "test_of"
        return None

    @property
    def selects_expressions(self) -> bool:
        return self.expression is not None or self.sub_criterion() is not None

    def describe(self) -> str:
        which = {"only": "the ", "first": "the first ", "last": "the last ", "all": "every "}[
            self.which
        ]
        if self.expression is not None:
            return f"{which}expression `{self.expression.strip()}`"
        if self.keyword is not None:
            return f"{which}value of `{self.keyword}=` in a call of `{self.calls}`"
        if self.with_item is not None:
            return f"{which}`with` item `{self.with_item.strip()}`"
        if self.test_of is not None:
            containing = (
                f" containing `{self.containing.strip()}`" if self.containing is not None else ""
            )
            return f"{which}test of an `{self.test_of}`{containing}"
        one = StatementSelector.model_construct(
            calls=self.calls,
            assigns=self.assigns,
            defines=self.defines,
            matches=self.matches,
            which="only" if self.which == "all" else self.which,
        ).describe()
        return "every" + one.removeprefix("the") if self.which == "all" else one


def _check_expression(code: str, what: str) -> None:
    try:
        parse_python(code.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"{what} does not parse as an expression: {exc.msg}") from None
