"""Typed patch files (`patches/<id>.toml`): the model, its validation, and the JSON Schema.

A patch says what to change (edits anchored on code structure, never on line numbers), where
(a module by dotted name, the distribution and version range it is meant for), why (the rationale,
which becomes the message of an exported upstream diff) and what must hold afterwards
(postconditions). Validation is strict: unknown keys and unknown edit kinds are errors, code
snippets must parse, and every problem is reported as `file:line: field: problem` (`SpecError`,
by the shared translation in `fileschema`).

Pure: `parse_patch` validates a parsed TOML document; reading the file is
`opspatch.config.patches.load_patch`.
"""

from __future__ import annotations

import ast
import datetime
import keyword
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)
from pydantic import model_validator as _model_validator

from opspatch.core.fileschema import FileSchema, spec_error_from_validation
from opspatch.core.syntax import dedent_code, parse_python
from opspatch.core.tomlsource import TomlDocument, format_field_path
from opspatch.errors import Location

MODULE_SCOPE = "<module>"
MARKER_PREFIX = "# opspatch:"

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_PATCH_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_QUALNAME_RE = re.compile(rf"^{_IDENT}(\.{_IDENT})*$")
_DOTTED_CALL_RE = re.compile(rf"^({_IDENT}|super\(\))(\.{_IDENT})*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


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


class Target(FileSchema):
    """What a patch is for: a module, the distribution that ships it, the versions it fits."""

    module: str = Field(
        description="Dotted module name, e.g. sglang.srt.speculative.eagle_worker_v2"
    )
    distribution: str = Field("sglang", description="Distribution whose version is gated")
    versions: str = Field(
        "", description="PEP 440 specifier set the patch is meant for, e.g. '>=0.5.4'; empty = any"
    )
    accept_sha256: list[str] = Field(
        default_factory=list,
        description="Optional: sha256 of the only pre-images accepted (lower-case hex)",
    )
    min_python: str | None = Field(
        None,
        description="Oldest Python the patched file must still parse on, e.g. '3.10'",
    )

    @field_validator("module")
    @classmethod
    def _module_is_dotted(cls, value: str) -> str:
        if not _QUALNAME_RE.match(value):
            raise ValueError(f"{value!r} is not a dotted module name")
        return value

    @field_validator("versions")
    @classmethod
    def _versions_parse(cls, value: str) -> str:
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            raise ValueError(
                f"{value!r} is not a version range (PEP 440, e.g. '>=0.5.4')"
            ) from None
        return value

    @field_validator("accept_sha256")
    @classmethod
    def _hashes_are_hex(cls, value: list[str]) -> list[str]:
        for digest in value:
            if not _SHA256_RE.match(digest):
                raise ValueError(f"{digest!r} is not a lower-case hex sha256")
        return value

    @field_validator("min_python")
    @classmethod
    def _python_is_major_minor(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^3\.\d{1,2}$", value):
            raise ValueError(f"{value!r} is not a Python version like '3.10'")
        return value

    @property
    def specifier(self) -> SpecifierSet:
        return SpecifierSet(self.versions)

    @property
    def feature_version(self) -> tuple[int, int] | None:
        if self.min_python is None:
            return None
        major, minor = self.min_python.split(".")
        return int(major), int(minor)

    def mismatch(self, file_path: str, installed_version: str | None) -> str | None:
        """Why a file is not this target (wrong module path, version outside the range), or None.

        `installed_version` is the distribution's version where the file lives (None: unknown,
        which is not a mismatch: a source checkout has no dist-info).
        """
        normalized = file_path.replace("\\", "/")
        if not any(
            normalized == rel or normalized.endswith("/" + rel) for rel in self.module_relpaths()
        ):
            return (
                f"{file_path} is not {self.module} "
                f"(its path should end in {self.module_relpaths()[0]})"
            )
        if installed_version is not None and self.versions:
            try:
                inside = self.specifier.contains(installed_version, prereleases=True)
            except Exception:  # an unparseable installed version is treated as outside
                inside = False
            if not inside:
                return (
                    f"{self.distribution} {installed_version} is outside the versions this patch is "
                    f"for ({self.versions})"
                )
        return None

    def module_relpaths(self) -> tuple[str, str]:
        """The two file paths a module can live at: `a/b/c.py` and `a/b/c/__init__.py`."""
        base = self.module.replace(".", "/")
        return f"{base}.py", f"{base}/__init__.py"


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


# ---------------------------------------------------------------------------------------------
# per-release alternatives


MAX_ALTERNATIVES = 16
"""Each is tried on every plan; a patch needing more releases than this is several patches."""


class Alternative(FileSchema):
    """Base of an edit's alternative: the fields it changes; the others are the edit's own."""

    name: str | None = Field(
        None, description="What this alternative is for (e.g. 'sglang < 0.5.10'); shown by plan"
    )


class InsertAlternative(Alternative):
    scope: str | None = None
    position: Literal["start", "end", "before", "after"] | None = None
    anchor: StatementSelector | None = None
    code: str | None = None
    comment: str | None = None


class ReplaceAlternative(Alternative):
    scope: str | None = None
    select: ReplaceSelector | None = None
    code: str | None = None
    comment: str | None = None


class DeleteAlternative(Alternative):
    scope: str | None = None
    select: ReplaceSelector | None = None
    comment: str | None = None


class MoveAlternative(Alternative):
    scope: str | None = None
    select: ReplaceSelector | None = None
    position: Literal["start", "end", "before", "after"] | None = None
    anchor: StatementSelector | None = None
    comment: str | None = None


class DiffAlternative(Alternative):
    diff: str | None = None
    max_offset: int | None = Field(None, ge=0, le=100_000)
    fuzz: int | None = Field(None, ge=0, le=3)


_EditT = TypeVar("_EditT", bound="_EditKind")


def _alternative_fields(edit: FileSchema, alternative: Alternative) -> dict[str, Any]:
    """The edit's fields with the alternative's given ones in their place."""
    data = {name: getattr(edit, name) for name in type(edit).model_fields if name != "alternatives"}
    data.update(
        {name: getattr(alternative, name) for name in alternative.model_fields_set - {"name"}}
    )
    return data


def _check_alternatives(edit: FileSchema, alternatives: Sequence[Alternative]) -> None:
    """Each alternative, merged with its edit, must be a valid edit of the same kind."""
    for number, alternative in enumerate(alternatives):
        try:
            type(edit).model_validate(_alternative_fields(edit, alternative))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ()))
            problem = str(first.get("msg", "invalid")).removeprefix("Value error, ")
            raise ValueError(
                f"alternatives: alternatives[{number}]"
                + (f".{where}" if where else "")
                + f": {problem}"
            ) from None


def _variants(edit: _EditT, alternatives: Sequence[Alternative]) -> list[_EditT]:
    """The edit as written, then each alternative as a whole edit (validated at load time)."""
    return [
        edit,
        *(type(edit).model_construct(**_alternative_fields(edit, a)) for a in alternatives),
    ]


def variant_label(edit: Any, variant: int) -> str:
    """How plan names the variant of an edit that matched: `as written` or its alternative."""
    if variant == 0:
        return "as written"
    alternative = edit.alternatives[variant - 1]
    named = f" ({alternative.name})" if alternative.name else ""
    return f"alternatives[{variant - 1}]{named}"


class _EditKind(FileSchema):
    """What every edit kind shares: its `alternatives`, checked after the kind's own rules and
    tried in order by `variants()`. Each kind declares the field itself, typed with its own
    alternative model and last, so the JSON schema lists it where it always stood."""

    if TYPE_CHECKING:
        alternatives: Sequence[Alternative]

    def _check_rules(self) -> None:
        """The kind's rules across its fields (a ValueError naming the field); none here."""

    @_model_validator(mode="after")
    def _rules_then_alternatives(self) -> _EditKind:
        # The edit's own rules first: an edit that breaks one is reported as itself, not as
        # every alternative that inherits the fault.
        self._check_rules()
        _check_alternatives(self, self.alternatives)
        return self

    def variants(self: _EditT) -> list[_EditT]:
        """The edit as written, then each alternative as a whole edit (validated at load time)."""
        return _variants(self, self.alternatives)


def _check_anchor(position: str, anchor: StatementSelector | None) -> None:
    """`before` / `after` take an anchor; `start` / `end` take none."""
    if position in ("before", "after") and anchor is None:
        raise ValueError(f"position: {position!r} needs an anchor (a statement selector)")
    if position in ("start", "end") and anchor is not None:
        raise ValueError(f"anchor: position {position!r} takes no anchor (use before/after)")


def _alternatives_field() -> Any:
    return Field(
        default_factory=list,
        max_length=MAX_ALTERNATIVES,
        description="Tried in order when the edit as written does not fit (other releases)",
    )


class InsertEdit(_EditKind):
    """Insert code into a scope.

    Positions: `start` (after the docstring, after `from __future__` imports in a module, and after
    a leading `super().__init__(...)` call), `end`, or `before` / `after` the statement chosen by
    `anchor`. A class scope inserts at class level. Inserted code takes the indentation of its
    block and is preceded by a marker comment naming the patch (`# opspatch:<id>: <comment>`).
    """

    kind: Literal["insert"]
    scope: str = Field(description="`Class`, `Class.method`, `function` or `<module>`")
    position: Literal["start", "end", "before", "after"] = "start"
    anchor: StatementSelector | None = None
    code: str = Field(description="Python statements to insert (dedented automatically)")
    comment: str | None = Field(None, description="Why: rendered after the marker comment")
    alternatives: list[InsertAlternative] = _alternatives_field()

    _scope = field_validator("scope")(_check_qualname)

    @field_validator("code")
    @classmethod
    def _code_parses(cls, value: str) -> str:
        if not _parse_statements(value, "code"):
            raise ValueError("code is empty")
        return value

    def _check_rules(self) -> None:
        """The anchor matches the position."""
        _check_anchor(self.position, self.anchor)


class ReplaceEdit(_EditKind):
    """Replace one statement or expression, selected structurally, with new code."""

    kind: Literal["replace"]
    scope: str
    select: ReplaceSelector
    code: str
    comment: str | None = None
    alternatives: list[ReplaceAlternative] = _alternatives_field()

    _scope = field_validator("scope")(_check_qualname)

    def _check_rules(self) -> None:
        """The code fits what is selected: an expression for an expression, else statements."""
        if self.select.selects_expressions:
            try:
                parse_python(self.code.strip(), mode="eval")
            except SyntaxError as exc:
                raise ValueError(
                    f"code: must be an expression to replace an expression: {exc.msg}"
                ) from None
        elif not _parse_statements(self.code, "code"):
            raise ValueError("code: is empty")


class DeleteEdit(_EditKind):
    """Delete one statement (`which = "all"`: every match), selected as `replace` selects
    statements; the marker comment stands where it was.

    Recognised as applied when the selector matches nothing in the scope, so `first`/`last`
    (which would delete one more match each time) are refused.
    """

    kind: Literal["delete"]
    scope: str
    select: ReplaceSelector
    comment: str | None = None
    alternatives: list[DeleteAlternative] = _alternatives_field()

    _scope = field_validator("scope")(_check_qualname)

    def _check_rules(self) -> None:
        """It selects statements, in a way that can be recognised as applied."""
        if self.select.selects_expressions:
            raise ValueError(
                "select: a delete removes statements; use calls, assigns, "
                "defines or matches (an expression is changed with replace)"
            )
        if self.select.which in ("first", "last"):
            raise ValueError(
                f"select.which: {self.select.which!r} cannot be recognised as applied once the "
                "statement is gone; use 'only' (select it uniquely, e.g. with matches) or 'all'"
            )


class MoveEdit(_EditKind):
    """Move one statement (chosen as `replace` chooses statements) to a new place in its
    scope: `before` / `after` the statement chosen by `anchor`, or the `start` / `end` of the
    scope's body. The statement's own text moves (re-indented to its new block), preceded
    by the marker comment; nothing is left where it stood.

    Recognised as applied only where the anchor says: the statement stands there and nowhere else
    in the scope. A file where it stands elsewhere is pending, however near.
    """

    kind: Literal["move"]
    scope: str
    select: ReplaceSelector
    position: Literal["start", "end", "before", "after"]
    anchor: StatementSelector | None = None
    comment: str | None = None
    alternatives: list[MoveAlternative] = _alternatives_field()

    _scope = field_validator("scope")(_check_qualname)

    def _check_rules(self) -> None:
        """One statement, to one place."""
        if self.select.selects_expressions:
            raise ValueError(
                "select: a move takes one statement; use calls, assigns, defines or matches"
            )
        if self.select.which != "only":
            raise ValueError(
                f"select.which: a move takes one statement, so {self.select.which!r} cannot be "
                "recognised as applied; select it uniquely (e.g. with matches)"
            )
        _check_anchor(self.position, self.anchor)


class DiffEdit(_EditKind):
    """A unified diff, applied by context like GNU patch: the hunk may move by at most
    `max_offset` lines and drop up to `fuzz` context lines at its ends; a context that matches
    more than one place is refused rather than guessed."""

    kind: Literal["diff"]
    diff: str
    max_offset: int = Field(200, ge=0, le=100_000)
    fuzz: int = Field(2, ge=0, le=3)
    alternatives: list[DiffAlternative] = _alternatives_field()

    @field_validator("diff")
    @classmethod
    def _diff_parses(cls, value: str) -> str:
        from opspatch.core.unified import parse_unified_diff

        parse_unified_diff(value)  # raises ValueError with the reason
        return value


Edit = Annotated[
    InsertEdit | ReplaceEdit | DeleteEdit | MoveEdit | DiffEdit, Field(discriminator="kind")
]


class AssignedBeforeCalls(FileSchema):
    """`attribute` is assigned in `scope`'s own body before any statement that calls out.

    Calls named in `ignore_calls` (by default the base-class initializer) do not count.
    """

    kind: Literal["assigned-before-calls"]
    scope: str
    attribute: str
    ignore_calls: list[str] = Field(default_factory=lambda: ["super().__init__"])

    _scope = field_validator("scope")(_check_qualname)


class ClassAttribute(FileSchema):
    """Class `class_` has a class-level value for `name` (so every instance has it, even one
    whose `__init__` never ran or stopped part-way)."""

    kind: Literal["class-attribute"]
    class_: str = Field(alias="class")
    name: str

    _class = field_validator("class_")(_check_qualname)


Postcondition = Annotated[AssignedBeforeCalls | ClassAttribute, Field(discriminator="kind")]


class Fix(FileSchema):
    """An exception a patch fixes, so a diagnosis that finds it in a log can name the patch.

    `exception` is the exception's type name (a dotted name matches by its last part:
    `torch.OutOfMemoryError` matches `OutOfMemoryError`); `message` is a Python regular expression
    searched in the exception's message (the text after `Type: ` on the traceback's last line).
    """

    exception: str = Field(description="Exception type name, e.g. AttributeError")
    message: str = Field(
        description="Regular expression searched in the exception's message, e.g. "
        "\"object has no attribute 'spec_disable_batch_threshold'\""
    )

    @field_validator("exception")
    @classmethod
    def _exception_is_dotted(cls, value: str) -> str:
        if not _QUALNAME_RE.match(value):
            raise ValueError(f"{value!r} is not an exception type name such as AttributeError")
        return value

    @field_validator("message")
    @classmethod
    def _message_compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        return value


_URL_RE = re.compile(r"^https?://[^\s/]+\S*$")
_GITHUB_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*#[0-9]+$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
NOT_FORWARDED = "no"
NOT_NEEDED_PREFIX = "not-needed:"


class Upstream(FileSchema):
    """The upstream fix a patch stands for: a pull request, a commit, the first release with it.

    `fixed_in` is a claim that opspatch checks against the release's own file (a release at or
    after it whose file does not pass the patch's proof of the fix is reported, not trusted)."""

    pr: str | None = Field(None, description="The upstream pull request: a URL, or owner/repo#N")
    commit: str | None = Field(None, description="The upstream commit (7-40 hex digits)")
    fixed_in: str | None = Field(
        None, description="The first release of the distribution that ships the fix, e.g. 0.5.24"
    )

    @field_validator("pr")
    @classmethod
    def _pr_is_a_reference(cls, value: str | None) -> str | None:
        if value is not None and not (_URL_RE.match(value) or _GITHUB_REF_RE.match(value)):
            raise ValueError(
                f"{value!r} is not a pull request: give its URL "
                "(https://github.com/sgl-project/sglang/pull/1234) or owner/repo#1234"
            )
        return value

    @field_validator("commit")
    @classmethod
    def _commit_is_hex(cls, value: str | None) -> str | None:
        if value is not None and not _COMMIT_RE.match(value):
            raise ValueError(
                f"{value!r} is not a commit: give 7 to 40 lower-case hex digits of its hash"
            )
        return value

    @field_validator("fixed_in")
    @classmethod
    def _fixed_in_is_a_version(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Version(value)
            except InvalidVersion:
                raise ValueError(
                    f"{value!r} is not a version: give the release, e.g. '0.5.24'"
                ) from None
        return value

    @property
    def fixed_in_version(self) -> Version | None:
        return Version(self.fixed_in) if self.fixed_in is not None else None


def _check_forwarded(value: str | None) -> str | None:
    """DEP-3's Forwarded: the upstream URL it was sent to, `no`, or `not-needed: <why>`."""
    if value is None or value == NOT_FORWARDED or _URL_RE.match(value):
        return value
    if value.startswith(NOT_NEEDED_PREFIX) and value.removeprefix(NOT_NEEDED_PREFIX).strip():
        return value
    raise ValueError(
        f"{value!r} is not a forwarding: give the upstream pull request's URL, "
        f"'{NOT_FORWARDED}' (not sent upstream yet) or '{NOT_NEEDED_PREFIX} <why>'"
    )


def _check_bug(value: str | None) -> str | None:
    if value is not None and not (_URL_RE.match(value) or _GITHUB_REF_RE.match(value)):
        raise ValueError(f"{value!r} is not a bug reference: give the bug's URL or owner/repo#N")
    return value


def _check_text(value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise ValueError(
            "is empty: say who wrote the patch and from what incident, or leave it out"
        )
    return value


def _read_date(value: Any) -> Any:
    """A TOML date (`2026-12-01`) or the same written as a string; nothing else."""
    if isinstance(value, datetime.datetime):
        raise ValueError(f"{value.isoformat()} is a date and time: write the date only, YYYY-MM-DD")
    if isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a date: write YYYY-MM-DD, e.g. 2026-12-01"
            ) from None
    return value


LastUpdate = Annotated[datetime.date | None, BeforeValidator(_read_date)]


def _check_patch_id(value: str) -> str:
    if not _PATCH_ID_RE.match(value):
        raise ValueError(f"{value!r} is not a patch id (lower-case letters, digits, '-', '.', '_')")
    return value


class PatchSpec(FileSchema):
    """A patch file, validated."""

    id: str = Field(description="Lower-case slug; the file is patches/<id>.toml")
    summary: str = Field(min_length=1)
    rationale: str = Field(min_length=1, description="Why; becomes the exported diff's message")
    incident: str | None = Field(None, description="Incident or ticket reference")
    preserves_output: bool = Field(
        False,
        description="Declares that decoded output is unchanged (smoke may compare a baseline)",
    )
    target: Target
    edits: list[Edit] = Field(min_length=1)
    postconditions: list[Postcondition] = Field(default_factory=list)
    fixes: list[Fix] = Field(
        default_factory=list,
        description="Exceptions this patch fixes (type and message pattern): diagnose names the "
        "patch when a host's log shows one",
    )
    upstream: Upstream | None = Field(
        None, description="The upstream fix this patch stands for (pr, commit, fixed_in)"
    )
    origin: str | None = Field(
        None, description="DEP-3 Origin: who wrote the patch, from what incident"
    )
    bug: str | None = Field(None, description="DEP-3 Bug: the upstream bug's URL (or owner/repo#N)")
    forwarded: str | None = Field(
        None,
        description="DEP-3 Forwarded: the upstream pull request's URL, 'no', or "
        "'not-needed: <why>'",
    )
    last_update: LastUpdate = Field(
        None, description="DEP-3 Last-Update: the date the patch was last changed (YYYY-MM-DD)"
    )

    _id = field_validator("id")(_check_patch_id)
    _origin = field_validator("origin")(_check_text)
    _bug = field_validator("bug")(_check_bug)
    _forwarded = field_validator("forwarded")(_check_forwarded)

    @property
    def marker(self) -> str:
        return f"{MARKER_PREFIX}{self.id}"


class SetTarget(Target):
    """One file of a patch set (`[[targets]]`): a target with its own edits and postconditions."""

    edits: list[Edit] = Field(min_length=1)
    postconditions: list[Postcondition] = Field(default_factory=list)


class PatchSetSpec(FileSchema):
    """A patch set: one fix across several modules (`[[targets]]`, each with its own
    `[[targets.edits]]`), planned, swapped, proven and rolled back together on a host.

    The header is a patch's; `parts()` gives one single-target `PatchSpec` per target, the unit
    the edit engine plans on one file."""

    id: str = Field(description="Lower-case slug; the file is patches/<id>.toml")
    summary: str = Field(min_length=1)
    rationale: str = Field(min_length=1)
    incident: str | None = None
    preserves_output: bool = False
    targets: list[SetTarget] = Field(
        min_length=2,
        description="Two or more files changed together (one target is written [target])",
    )
    fixes: list[Fix] = Field(default_factory=list)
    upstream: Upstream | None = None
    origin: str | None = None
    bug: str | None = None
    forwarded: str | None = None
    last_update: LastUpdate = None

    _id = field_validator("id")(_check_patch_id)
    _origin = field_validator("origin")(_check_text)
    _bug = field_validator("bug")(_check_bug)
    _forwarded = field_validator("forwarded")(_check_forwarded)

    def parts(self) -> tuple[PatchSpec, ...]:
        """One single-target patch per target, in the file's order (same id and header)."""
        header = self.model_dump(exclude={"targets"}, by_alias=True)
        header["upstream"] = self.upstream  # kept a model: model_construct does not validate
        parts = []
        for target in self.targets:
            edits = list(target.edits)
            conditions = list(target.postconditions)
            plain = Target.model_validate(
                target.model_dump(exclude={"edits", "postconditions"}, by_alias=True)
            )
            parts.append(
                PatchSpec.model_construct(
                    **header, target=plain, edits=edits, postconditions=conditions
                )
            )
        return tuple(parts)


class LoadedPatch(BaseModel):
    """A patch together with where it came from (for messages and the ledger).

    `spec` is the patch; for a patch set (`[[targets]]`) it is the set's first target's part
    and `parts` holds every target's, in order. Code that changes files goes over `parts`;
    code that is about one file only refuses a set (`only_target`)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    spec: PatchSpec
    path: str
    sha256: str
    document: TomlDocument
    members: tuple[PatchSpec, ...] = ()
    """Every target's part of a patch set; empty for a single-target patch."""

    @property
    def parts(self) -> tuple[PatchSpec, ...]:
        """The patch's single-target parts, one per file it changes (one for `[target]`)."""
        return self.members or (self.spec,)

    @property
    def is_set(self) -> bool:
        return bool(self.members)

    def target_field(self, index: int, *rest: str | int) -> tuple[str | int, ...]:
        """The field path of part `index`'s target in the file (`target`, `targets[1]`)."""
        return ("targets", index, *rest) if self.is_set else ("target", *rest)

    def edit_field(self, index: int, edit: int, *rest: str | int) -> tuple[str | int, ...]:
        """The field path of an edit of part `index` (`edits[0]`, `targets[1].edits[0]`)."""
        return ("targets", index, "edits", edit, *rest) if self.is_set else ("edits", edit, *rest)

    def only_target(self, command: str) -> PatchSpec:
        """The patch's one target part, for a command that works on one file.

        Raises:
            InputError: the patch is a set of several targets.
        """
        if self.is_set:
            from opspatch.errors import InputError

            modules = ", ".join(p.target.module for p in self.parts)
            raise InputError(
                f"{self.path}: {self.spec.id} is a patch set ({modules}); {command} takes a patch "
                "with one [target]",
                hint="with --hosts, apply, rollback, recover and status take a patch set",
            )
        return self.spec

    def location(self, field_path: Sequence[str | int]) -> Location:
        return self.document.location(field_path)


def parse_patch_file(document: TomlDocument) -> PatchSpec | PatchSetSpec:
    """Validate a parsed TOML document as a patch (`[target]`) or a patch set (`[[targets]]`).

    Raises:
        SpecError: as `parse_patch`; a document with both forms (or neither) is refused at
            its `targets` (or `target`) field.
    """
    data = document.data
    if "targets" not in data:
        return parse_patch(document)
    for single in ("target", "edits", "postconditions"):
        if single in data:
            raise document.error(
                [single],
                f"a patch set ([[targets]]) keeps each file's {single} inside its "
                "[[targets]] table",
                hint=f"move [{single}] into the [[targets]] table it belongs to "
                "([[targets.edits]], [[targets.postconditions]]), or write one [target] "
                "without [[targets]]",
            )
    try:
        patch_set = PatchSetSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(
            exc, document, schema=PatchSetSpec, data=data, named_in_message=_NAMED_IN_MESSAGE
        ) from None
    first_at: dict[str, int] = {}
    for index, target in enumerate(patch_set.targets):
        if target.module in first_at:
            raise document.error(
                ["targets", index, "module"],
                f"{target.module!r} is already targets[{first_at[target.module]}]: one file is "
                "one [[targets]] table",
                hint="put all of that module's edits under one [[targets]] table",
            )
        first_at[target.module] = index
    return patch_set


def parse_patch(document: TomlDocument) -> PatchSpec:
    """Validate a parsed TOML document as a patch.

    Raises:
        SpecError: the first problem, at its file:line and field; further problems are listed
            in the hint so one run shows them all.
    """
    try:
        return PatchSpec.model_validate(document.data)
    except ValidationError as exc:
        raise spec_error_from_validation(
            exc,
            document,
            schema=PatchSpec,
            data=document.data,
            named_in_message=_NAMED_IN_MESSAGE,
        ) from None


# Checks across fields name the field they are about as "field: problem", so it can be located.
_NAMED_IN_MESSAGE = (
    "position",
    "anchor",
    "code",
    "select",
    "keyword",
    "containing",
    "with_item",
    "alternatives",
)


def edit_field(index: int, *rest: str | int) -> str:
    """The field path of an edit, as shown to operators: `edits[1].anchor`."""
    return format_field_path(("edits", index, *rest))


def patch_json_schema() -> dict[str, Any]:
    """JSON Schema of patch files (editors validate TOML against it, e.g. with taplo)."""
    schema = TypeAdapter(PatchSpec).json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "opspatch patch file"
    return schema
