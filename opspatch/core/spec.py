"""Typed patch files (`patches/<id>.toml`): the model, its validation, and the JSON Schema."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from opspatch.core.fileschema import FileSchema, spec_error_from_validation, word_of
from opspatch.core.incident import (
    NOT_FORWARDED,
    NOT_NEEDED_PREFIX,
    Fix,
    LastUpdate,
    Upstream,
    _check_bug,
    _check_forwarded,
    _check_text,
)
from opspatch.core.kinds import KINDS, Edit
from opspatch.core.kinds.base import MAX_ALTERNATIVES, Alternative, EditKind, variant_label
from opspatch.core.kinds.delete import DeleteAlternative, DeleteEdit
from opspatch.core.kinds.diff import DiffAlternative, DiffEdit
from opspatch.core.kinds.insert import InsertAlternative, InsertEdit
from opspatch.core.kinds.move import MoveAlternative, MoveEdit
from opspatch.core.kinds.replace import ReplaceAlternative, ReplaceEdit
from opspatch.core.placement import edit_field
from opspatch.core.selectors import (
    MODULE_SCOPE,
    ReplaceSelector,
    StatementSelector,
    _check_qualname,
)
from opspatch.core.target import Target
from opspatch.core.tomlsource import TomlDocument
from opspatch.core.vocabulary import LivePolicy
from opspatch.errors import Location

__all__ = [
    "KINDS",
    "MAX_ALTERNATIVES",
    "MARKER_PREFIX",
    "MODULE_SCOPE",
    "NOT_FORWARDED",
    "NOT_NEEDED_PREFIX",
    "Alternative",
    "AssignedBeforeCalls",
    "ClassAttribute",
    "DeleteAlternative",
    "DeleteEdit",
    "DiffAlternative",
    "DiffEdit",
    "Edit",
    "EditKind",
    "Fix",
    "InsertAlternative",
    "InsertEdit",
    "LastUpdate",
    "LoadedPatch",
    "MoveAlternative",
    "MoveEdit",
    "PatchSetSpec",
    "PatchSpec",
    "Postcondition",
    "ReplaceAlternative",
    "ReplaceEdit",
    "ReplaceSelector",
    "SetTarget",
    "StatementSelector",
    "Target",
    "Upstream",
    "edit_field",
    "parse_patch",
    "parse_patch_file",
    "patch_json_schema",
    "variant_label",
]

MARKER_PREFIX = "# opspatch:"

_PATCH_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


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
    live: Annotated[LivePolicy | None, word_of(LivePolicy)] = Field(
        None,
        description="apply --live: 'restart-only' (never taken live) or 'allowed' (live even in "
        "the model forward or the CUDA graph runner); unset: live where its live form allows",
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

    model_config = ConfigDict(defer_build=True)  # as `PatchSetSpec`, whose part it is

    edits: list[Edit] = Field(min_length=1)
    postconditions: list[Postcondition] = Field(default_factory=list)


class PatchSetSpec(FileSchema):
    """A patch set: one fix across several modules (`[[targets]]`, each with its own
    `[[targets.edits]]`), planned, swapped, proven and rolled back together on a host.

    The header is a patch's; `parts()` gives one single-target `PatchSpec` per target, the unit
    the edit engine plans on one file."""

    model_config = ConfigDict(defer_build=True)
    """Its validator is built when the first set is read, not on import: a plain patch's
    load (`apply --file`, issue 44) never uses it."""

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
    live: Annotated[LivePolicy | None, word_of(LivePolicy)] = None

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
    given_path: str | None = None
    """The path the operator named the patch by (None: found by its id in the workspace)."""

    @property
    def reference(self) -> str:
        """How a hint names this patch in a command: its id, or the path it was given by (the
        workspace may not find it by its id, and a hint naming the id would then fail)."""
        return self.given_path or self.spec.id

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


def patch_json_schema() -> dict[str, Any]:
    """JSON Schema of patch files (editors validate TOML against it, e.g. with taplo)."""
    schema = TypeAdapter(PatchSpec).json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "opspatch patch file"
    return schema
