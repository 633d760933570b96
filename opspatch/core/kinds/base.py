"""The protocol every edit kind implements, and what the kinds share (pure)."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import Field, ValidationError
from pydantic import model_validator as _model_validator

from opspatch.core.fileschema import FileSchema
from opspatch.core.placement import EditProblem, Splice, edit_field
from opspatch.core.selectors import StatementSelector
from opspatch.core.source import LineIndex
from opspatch.core.vocabulary import EditStatus

if TYPE_CHECKING:
    from opspatch.core.spec import PatchSpec


@dataclass(frozen=True)
class EditState:
    index: int
    state: EditStatus
    reason: str
    candidates: tuple[str, ...] = ()
    field: str = ""
    variant: int = 0
    """Which variant of the edit this state is of (0: as written; n: `alternatives[n - 1]`)."""
    placed: bool = True
    """For `applied`: the edit's selector found the new code where it points. False when it was
    judged applied because the old code is gone (a replace whose selector matches nothing, a
    delete): then another alternative with the same code reads applied as well."""
    marked: bool = False
    """For `applied` but not `placed`: the new code stands under this patch's marker, so the
    patch wrote it there (in one of its variants), not merely found it."""


# ---------------------------------------------------------------------------------------------
# per-release alternatives


MAX_ALTERNATIVES = 16
"""Each is tried on every plan; a patch needing more releases than this is several patches."""


class Alternative(FileSchema):
    """Base of an edit's alternative: the fields it changes; the others are the edit's own."""

    name: str | None = Field(
        None, description="What this alternative is for (e.g. 'sglang < 0.5.10'); shown by plan"
    )


_EditT = TypeVar("_EditT", bound="EditKind")


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


class EditKind(FileSchema):
    """What every edit kind shares: its `alternatives`, checked after the kind's own rules and
    tried in order by `variants()`. Each kind declares the field itself, typed with its own
    alternative model and last, so the JSON schema lists it where it always stood.

    The protocol a kind implements (each method takes the patch and the edit's index `i`, which
    name the marker and the field of a problem; a problem raises `EditProblem`):
    `place`, `state`, `undo`, `description`; and says, as class variables, how it is recognised
    in place (`recognised_by`), whether `undo` can take it out of the text alone
    (`undone_from_text`) and whether, applied, it leaves code of its own in the file
    (`leaves_code`)."""

    if TYPE_CHECKING:
        alternatives: Sequence[Alternative]

    recognised_by: ClassVar[str] = "syntax tree"
    """How `AlreadyApplied` says the kind was seen in place."""
    undone_from_text: ClassVar[bool] = False
    """Whether `undo` removes it from the patched text alone (else: from the recorded pre-image)."""
    leaves_code: ClassVar[bool] = True
    """Whether, applied, its own code stands in the file; False for a kind read as applied when
    code is gone (a delete), which a rewrite upstream does as well: absence alone proves nothing."""

    def _check_rules(self) -> None:
        """The kind's rules across its fields (a ValueError naming the field); none here."""

    @_model_validator(mode="after")
    def _rules_then_alternatives(self) -> EditKind:
        # The edit's own rules first: an edit that breaks one is reported as itself, not as
        # every alternative that inherits the fault.
        self._check_rules()
        _check_alternatives(self, self.alternatives)
        return self

    def variants(self: _EditT) -> list[_EditT]:
        """The edit as written, then each alternative as a whole edit (validated at load time)."""
        return _variants(self, self.alternatives)

    @property
    def scope_name(self) -> str | None:
        """The scope the edit is anchored in; None for a kind placed otherwise (a diff)."""
        value = getattr(self, "scope", None)
        return value if isinstance(value, str) else None

    def description(self) -> str:
        """What the edit does, as plan and the edit records say it."""
        raise NotImplementedError

    def place(
        self, text: str, tree: ast.Module, patch: PatchSpec, newline: str, i: int
    ) -> tuple[list[Splice], list[str]]:
        """The splices that carry the edit into `text` (`tree` is its tree), and the scopes it
        edits."""
        raise NotImplementedError

    def state(self, index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int) -> EditState:
        """Is the edit present in `index.text`? Decided at its own place, never by its new code
        merely appearing somewhere."""
        raise NotImplementedError

    def undo(
        self,
        text: str,
        tree: ast.Module,
        patch: PatchSpec,
        newline: str,
        i: int,
    ) -> str:
        """`text` with the edit (found applied there) taken out; refused (`EditProblem`) by a
        kind that is undone from the recorded pre-image only."""
        raise EditProblem(
            f"a {getattr(self, 'kind', '?')} edit is undone from the recorded pre-image (ledger "
            "or backup), not from the patched text",
            edit_field(i),
        )


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
