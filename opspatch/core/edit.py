"""Apply, detect and reverse a patch on Python source: the pure heart of opspatch.

`apply_patch(source, patch)` returns one of three values, never raises for a file that does not
fit, and never returns a broken file:

- `Applied(new_source, diff, ...)`: every edit placed, the result validated (parses, compiles,
  postconditions hold, nothing outside the edited scopes changed);
- `AlreadyApplied(reason)`: every edit is already present at its own place, recognised by its
  syntax tree (so a removed marker comment or a reformatted line does not hide it; a diff edit:
  its reverse applies), and by its marker only where the tree cannot tell the code an edit wrote
  from the same code already there (a `first` / `last` replace); never by the new code merely
  appearing somewhere in the scope;
- `NotApplicable(reason, field, candidates)`: an anchor found nothing or several places, the file
  is partly patched, not decodable, not an accepted pre-image, or the result failed validation.

Edits change only their own spans: every other byte (comments, blank lines, CRLF, tabs, encoding
cookie, BOM) is kept, because edits are splices into the original text. Each `Applied` records its
splices, so `reverse(applied)` gives back the pre-image byte for byte; `unapply(source, patch)`
removes insert and diff edits from a patched file without any record.

Pure: bytes in, values out; no disk, no network.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from opspatch.core.anchors import (
    AnchorProblem,
    Scope,
    StatementRun,
    find_statement_runs,
    first_line,
    last_line,
    matching_statements,
    replaced_expressions,
    select_expressions,
    select_statements,
    selected_expressions,
    span,
    statement_dumps,
    strip_positions,
)
from opspatch.core.placement import (
    EditProblem,
    Splice,
    apply_splices,
    carries_marker,
    marker_lines,
    place_delete,
    place_insert,
    place_move,
    place_replace,
    plan_diff,
    scope_of,
    select_in,
    start_index,
    undo_splices,
)
from opspatch.core.source import (
    LineIndex,
    SourceDecodeError,
    SourceText,
    sha256_hex,
    split_lines,
    strip_newline,
)
from opspatch.core.spec import (
    DeleteEdit,
    DiffEdit,
    Edit,
    InsertEdit,
    MoveEdit,
    PatchSpec,
    ReplaceEdit,
    StatementSelector,
    edit_field,
    variant_label,
)
from opspatch.core.syntax import parse_python
from opspatch.core.unified import (
    HunkFailure,
    parse_unified_diff,
    plan_hunks,
)
from opspatch.core.validate import validate_result
from opspatch.core.vocabulary import Detected, EditStatus

# ---------------------------------------------------------------------------------------------
# outcomes


@dataclass(frozen=True)
class EditRecord:
    """What one edit did: its splices (relative to the text before it) and what they undo."""

    index: int
    kind: str
    scope: str
    description: str
    splices: tuple[Splice, ...]
    undo: tuple[Splice, ...]
    variant: int = 0
    """0: the edit as written; n: its `alternatives[n - 1]`, the one that fit."""


@dataclass(frozen=True)
class Applied:
    """The patch applies: the new bytes, a unified diff, and how to undo it exactly."""

    patch_id: str
    old_source: bytes
    new_source: bytes
    diff: str
    edits: tuple[EditRecord, ...]
    edited_scopes: tuple[str, ...]
    encoding: str
    newline: str
    matched: tuple[str, ...] = ()
    """Which alternative of each edit that has alternatives fit (`edits[0]: alternatives[1]`)."""

    @property
    def sha256_before(self) -> str:
        return sha256_hex(self.old_source)

    @property
    def sha256_after(self) -> str:
        return sha256_hex(self.new_source)

    @property
    def outcome(self) -> str:
        return "applicable"


@dataclass(frozen=True)
class AlreadyApplied:
    """Every edit is already present (and the postconditions hold): nothing to do."""

    patch_id: str
    reason: str
    matched: tuple[str, ...] = ()
    """Which alternative of each edit that has alternatives was found in place."""

    @property
    def outcome(self) -> str:
        return "already-applied"


@dataclass(frozen=True)
class NotApplicable:
    """The patch does not fit this file; `field` names the patch field at fault, if one is."""

    patch_id: str
    reason: str
    field: str = ""
    candidates: tuple[str, ...] = ()

    @property
    def outcome(self) -> str:
        return "not-applicable"

    @property
    def matched(self) -> tuple[str, ...]:
        return ()

    def render(self) -> str:
        lines = [self.reason if not self.field else f"{self.field}: {self.reason}"]
        lines += [f"    {c}" for c in self.candidates]
        return "\n".join(lines)


PlanOutcome = Applied | AlreadyApplied | NotApplicable


def plan_summary(outcome: PlanOutcome) -> str:
    """The outcome's word, then which alternative of each edit fit (`applicable; edits[0]:
    alternatives[1] (sglang >= 0.5.10)`): the plan step's detail, so the ledger keeps it."""
    return "; ".join((outcome.outcome, *outcome.matched))


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


@dataclass(frozen=True)
class Detection:
    """Whether a file carries a patch: `applied`, `not-applied`, `partial` or `unknown`."""

    state: Detected
    edits: tuple[EditState, ...] = field(default_factory=tuple)
    reason: str = ""


@dataclass(frozen=True)
class Reverted:
    """`unapply` removed the patch: the pre-image and the diff that removes it."""

    old_source: bytes
    diff: str


# ---------------------------------------------------------------------------------------------
# detecting


def inserted_run(
    index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int
) -> list[ast.stmt] | None:
    """The statements insert edit `i` put into `tree` (the tree of `index.text`), if they are
    there: at its own place, never merely somewhere in its scope.

    Beside its anchor: the statement the anchor selects (its `which` applied), counted without
    the inserted code itself and the code of the patch's later inserts, as it was chosen when
    the edit was placed. At the start (end): first (last) in the scope's own body, or anywhere
    in that body under this patch's marker (a patch stacked later may have inserted before or
    after it). The code of the patch's other inserts may stand in between, since two inserts at
    one place go side by side.
    """
    return _inserted_runs(index, tree, patch, i).get(i)


def _inserted_runs(
    index: LineIndex, tree: ast.Module, patch: PatchSpec, first: int
) -> dict[int, list[ast.stmt] | None]:
    """`inserted_run` of every insert from edit `first` on, the last first: each excludes the
    statements the later ones put in from its anchor's matches."""
    runs: dict[int, list[ast.stmt] | None] = {}
    later: set[int] = set()
    for j in reversed(range(first, len(patch.edits))):
        if not isinstance(patch.edits[j], InsertEdit):
            continue
        try:
            runs[j] = _find_inserted(index, tree, patch, j, later)
        except EditProblem:
            if j == first:
                raise
            runs[j] = None
        later.update(id(stmt) for stmt in runs[j] or [])
    return runs


def _find_inserted(
    index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int, later: set[int]
) -> list[ast.stmt] | None:
    edit = patch.edits[i]
    assert isinstance(edit, InsertEdit)
    scope = scope_of(tree, edit.scope, i)
    others = _other_inserts(patch, i)
    for run in find_statement_runs(scope, statement_dumps(edit.code)):
        dumps = [strip_positions(s) for s in run.block]
        if edit.position in ("start", "end"):
            if run.block is not scope.node.body:  # a nested block is not the scope's start/end
                continue
            if edit.position == "start":
                placed = _skip_back(dumps, run.start, others) == start_index(scope)
            else:
                placed = _skip_forward(dumps, run.start + run.length, others) == len(run.block)
            if placed or carries_marker(index, run.statements[0], patch):
                return run.statements
            continue
        assert edit.anchor is not None
        anchor = _chosen_anchor(scope, edit.anchor, later | {id(s) for s in run.statements})
        if anchor is None:
            continue
        if edit.position == "after":
            end = _skip_back(dumps, run.start, others)  # what stands before it
            placed = end >= 1 and run.block[end - 1] is anchor
        else:
            begin = _skip_forward(dumps, run.start + run.length, others)  # what stands after it
            placed = begin < len(run.block) and run.block[begin] is anchor
        if placed:
            return run.statements
    return None


def _chosen_anchor(scope: Scope, anchor: StatementSelector, excluded: set[int]) -> ast.stmt | None:
    """The statement `anchor` selects (its `which` applied) among those not `excluded`; None
    when it selects none (or several, for `only`)."""
    found = [loc.stmt for loc in matching_statements(scope, anchor) if id(loc.stmt) not in excluded]
    if not found or (anchor.which == "only" and len(found) > 1):
        return None
    return found[-1] if anchor.which == "last" else found[0]


def _other_inserts(patch: PatchSpec, i: int) -> list[list[str]]:
    """The statement dumps of the patch's inserts other than edit `i` (they may stand beside it)."""
    return [
        statement_dumps(other.code)
        for j, other in enumerate(patch.edits)
        if j != i and isinstance(other, InsertEdit)
    ]


def _skip_back(dumps: list[str], end: int, others: list[list[str]]) -> int:
    """`end`, moved back over any of `others` that stand just before it."""
    while skipped := next(
        (o for o in others if o and end >= len(o) and dumps[end - len(o) : end] == o), None
    ):
        end -= len(skipped)
    return end


def _skip_forward(dumps: list[str], begin: int, others: list[list[str]]) -> int:
    """`begin`, moved on over any of `others` that stand just from it."""
    while skipped := next((o for o in others if o and dumps[begin : begin + len(o)] == o), None):
        begin += len(skipped)
    return begin


def _move_state(tree: ast.Module, patch: PatchSpec, edit: MoveEdit, i: int) -> EditState:
    """A move is applied when its one statement stands where the position says (past the code
    of the patch's inserts), not merely somewhere in the scope."""
    scope = scope_of(tree, edit.scope, i)
    moved = select_in(scope, edit.select, i, "select")
    anchor = select_in(scope, edit.anchor, i, "anchor") if edit.anchor is not None else None
    if anchor is not None and anchor.stmt is moved.stmt:
        raise EditProblem("the anchor is the statement to move", edit_field(i, "anchor"))
    block = moved.block
    at = next(k for k, stmt in enumerate(block) if stmt is moved.stmt)
    dumps = [strip_positions(stmt) for stmt in block]
    others = _other_inserts(patch, i)
    if edit.position == "after":
        before = _skip_back(dumps, at, others)
        placed = anchor is not None and before >= 1 and block[before - 1] is anchor.stmt
    elif edit.position == "before":
        after = _skip_forward(dumps, at + 1, others)
        placed = anchor is not None and after < len(block) and block[after] is anchor.stmt
    elif edit.position == "start":
        placed = block is scope.node.body and _skip_back(dumps, at, others) == start_index(scope)
    else:
        placed = block is scope.node.body and _skip_forward(dumps, at + 1, others) == len(block)
    where = _insert_place(edit)
    if placed:
        return EditState(i, EditStatus.APPLIED, f"the statement stands {where}")
    return EditState(
        i, EditStatus.PENDING, f"the statement stands at line {first_line(moved.stmt)}, not {where}"
    )


def _insert_place(edit: InsertEdit | MoveEdit) -> str:
    if edit.anchor is not None:
        return f"{edit.position} its anchor"
    return f"at the {edit.position} of `{edit.scope}`"


def _edit_state(index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int) -> EditState:
    """Is edit `i` present in `index.text`? Decided at the edit's own place, by syntax trees
    (the node its selector or anchor chooses, or its position) and, where the tree alone cannot
    tell code the edit wrote from the same code already there, by its marker comment; never by
    the new code appearing somewhere in the scope."""
    edit = patch.edits[i]
    text = index.text
    try:
        if isinstance(edit, InsertEdit):
            scope = scope_of(tree, edit.scope, i)
            if inserted_run(index, tree, patch, i) is not None:
                return EditState(
                    i, EditStatus.APPLIED, f"its code is present {_insert_place(edit)}"
                )
            if edit.anchor is not None:
                select_in(scope, edit.anchor, i, "anchor")  # a missing anchor is a problem now
            return EditState(i, EditStatus.PENDING, f"its code is not {_insert_place(edit)}")
        if isinstance(edit, ReplaceEdit):
            return _replace_state(index, tree, patch, edit, i)
        if isinstance(edit, DeleteEdit):
            inserted = _inserted_by(index, tree, patch, range(len(patch.edits)))
            return _delete_state(tree, edit, i, inserted)
        if isinstance(edit, MoveEdit):
            return _move_state(tree, patch, edit, i)
        assert isinstance(edit, DiffEdit)
        parsed = parse_unified_diff(edit.diff)
        plain = [strip_newline(line) for line in split_lines(text)]
        # As GNU patch does, look for an already-applied diff before fuzzing: with fuzz, an
        # addition's context may still match after the addition is in place.
        forward: object = None
        for fuzz in sorted({0, edit.fuzz}):
            forward = plan_hunks(plain, parsed, max_offset=edit.max_offset, fuzz=fuzz)
            if isinstance(forward, list):
                return EditState(i, EditStatus.PENDING, "the diff applies")
            backward = plan_hunks(plain, parsed.reversed(), max_offset=edit.max_offset, fuzz=fuzz)
            if isinstance(backward, list):
                return EditState(
                    i, EditStatus.APPLIED, "the diff is already in the file (its reverse applies)"
                )
        assert isinstance(forward, HunkFailure)
        raise EditProblem(forward.message, edit_field(i, "diff"))
    except EditProblem as problem:
        return EditState(i, EditStatus.BROKEN, problem.message, problem.candidates, problem.field)


Span = tuple[int, int, int, int]


def _run_span(run: StatementRun) -> Span:
    statements = run.statements
    return span(statements[0])[:2] + span(statements[-1])[2:]


def _inside(inner: Span, outer: Span) -> bool:
    return outer[:2] <= inner[:2] and inner[2:] <= outer[2:]


def _replace_state(
    index: LineIndex, tree: ast.Module, patch: PatchSpec, edit: ReplaceEdit, i: int
) -> EditState:
    """A replace is applied when its new code stands at the place the selector chooses:

    - the node the selector selects (its `which` applied: the first, the last, or every match)
      lies inside new code (which may contain the old, e.g. `max(x, 1)`, or match the selector
      itself, e.g. a new call of the same function);
    - else, for `first` (`last`), new code under this patch's marker comes before (after) every
      match left: the tree alone cannot tell the new code the edit wrote from the same code that
      stood there before, so new code merely standing earlier (later) in the scope is not it;
    - nothing the selector matches is left and new code stands in the scope (the old code is
      gone: there is no place left to apply it; not `placed`, `marked` under the marker).
    """
    scope = scope_of(tree, edit.scope, i)
    field_name = edit_field(i, "select")
    if edit.select.selects_expressions:
        new = [(span(m.expr), m.stmt) for m in replaced_expressions(scope, edit.select, edit.code)]
        old_spans = sorted(span(m.expr) for m in selected_expressions(scope, edit.select))
    else:
        runs = find_statement_runs(scope, statement_dumps(edit.code))
        new = [(_run_span(r), r.statements[0]) for r in runs]
        old_spans = sorted(span(loc.stmt) for loc in matching_statements(scope, edit.select))
    new_spans = [where for where, _ in new]
    replaced = [any(_inside(old, where) for where in new_spans) for old in old_spans]
    leftover = [old for old, done in zip(old_spans, replaced, strict=True) if not done]
    marked = [where for where, stmt in new if carries_marker(index, stmt, patch)]
    which = edit.select.which
    if new_spans and not leftover:
        return EditState(
            i,
            EditStatus.APPLIED,
            "the replacement is present" + ("" if old_spans else " (the code to replace is gone)"),
            placed=bool(old_spans),
            marked=bool(marked),
        )
    # here some match is left, or no new code stands anywhere (nothing is replaced or marked)
    first_done = (
        which == "first"
        and bool(leftover)
        and (replaced[0] or any(where[:2] < leftover[0][:2] for where in marked))
    )
    last_done = (
        which == "last"
        and bool(leftover)
        and (replaced[-1] or any(where[2:] > leftover[-1][2:] for where in marked))
    )
    if first_done or last_done:
        return EditState(i, EditStatus.APPLIED, f"the replacement is present at the {which} match")
    try:  # the selection must be unambiguous for the edit to be applicable
        if edit.select.selects_expressions:
            select_expressions(scope, edit.select)
        else:
            select_statements(scope, edit.select)
    except AnchorProblem as problem:
        raise EditProblem(problem.message, field_name, problem.candidates) from None
    return EditState(i, EditStatus.PENDING, "the code to replace is present")


def _inserted_by(
    index: LineIndex, tree: ast.Module, patch: PatchSpec, indices: Sequence[int]
) -> set[int]:
    """Ids of the statements the patch's inserts among `indices` put into `tree` (where present),
    so a delete of the same code (a move: the delete, then the insert) does not count them."""
    found: set[int] = set()
    for j in indices:
        if isinstance(patch.edits[j], InsertEdit):
            try:
                run = inserted_run(index, tree, patch, j)
            except EditProblem:
                continue
            found.update(id(stmt) for stmt in run or [])
    return found


def _delete_state(tree: ast.Module, edit: DeleteEdit, i: int, inserted: set[int]) -> EditState:
    """A delete is applied when the selector matches nothing left in the scope but the code this
    patch inserted."""
    scope = scope_of(tree, edit.scope, i)
    left = [loc for loc in matching_statements(scope, edit.select) if id(loc.stmt) not in inserted]
    if not left:
        return EditState(
            i, EditStatus.APPLIED, "the statement to delete is not in the scope", placed=False
        )
    if edit.select.which == "only" and len(left) > 1:
        raise EditProblem(
            f"{edit.select.describe()} matches {len(left)} statements in `{scope.qualname}`",
            edit_field(i, "select"),
            [f"line {first_line(loc.stmt)}" for loc in left],
        )
    return EditState(i, EditStatus.PENDING, "the statement to delete is present")


def _refuse_deleting_inserted(index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int) -> None:
    """A delete placed after an insert of the same code would take the inserted code too."""
    edit = patch.edits[i]
    assert isinstance(edit, DeleteEdit)
    inserted = _inserted_by(index, tree, patch, range(i))
    scope = scope_of(tree, edit.scope, i)
    if any(id(loc.stmt) in inserted for loc in matching_statements(scope, edit.select)):
        raise EditProblem(
            "it would delete code this patch inserts; put the delete before the insert",
            edit_field(i, "select"),
        )


def _decode(source: bytes) -> tuple[SourceText, ast.Module]:
    decoded = SourceText.decode(source)
    try:
        tree = parse_python(decoded.text)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise SourceDecodeError(f"the file does not parse: {exc.msg}{where}") from None
    return decoded, tree


def detect(source: bytes, patch: PatchSpec) -> Detection:
    """Which of the patch's edits the file already carries (structurally)."""
    try:
        decoded, tree = _decode(source)
    except SourceDecodeError as exc:
        return Detection(Detected.UNKNOWN, (), str(exc))
    return _detect_parsed(decoded, tree, patch)


def _detect_parsed(decoded: SourceText, tree: ast.Module, patch: PatchSpec) -> Detection:
    """`detect` on a file already decoded and parsed (`tree` is `parse_python(decoded.text)`)."""
    return _detect_resolved(decoded, tree, patch)[0]


def _choose_variants(
    index: LineIndex, tree: ast.Module, patch: PatchSpec
) -> tuple[PatchSpec, tuple[EditState, ...]]:
    """Each edit's state, for an edit with alternatives that of the variant that fits: the first
    found applied where its selector points, else the first whose old code is gone and whose
    new code stands under the patch's marker (so a re-application recognises what it wrote),
    else the first pending (a variant with code left to change is not skipped because another one's old
    code is gone and its new code stands somewhere), else the first found applied at all; when
    none fits, one broken state naming what each variant found. Returns the patch with each
    edit replaced by its chosen variant, which is what is placed, detected and undone."""
    edits: list[Edit] = list(patch.edits)
    resolved = patch
    states: list[EditState] = []
    for i, edit in enumerate(patch.edits):
        variants: Sequence[Edit] = edit.variants()
        if len(variants) == 1:
            states.append(_edit_state(index, tree, resolved, i))
            continue
        tried: list[EditState] = []
        for number, variant in enumerate(variants):
            edits[i] = variant
            attempt = patch.model_copy(update={"edits": list(edits)})
            tried.append(replace(_edit_state(index, tree, attempt, i), variant=number))
        applied = [t for t in tried if t.state == EditStatus.APPLIED]
        chosen = (
            next((t for t in applied if t.placed), None)
            or next((t for t in applied if t.marked), None)
            or next((t for t in tried if t.state == EditStatus.PENDING), None)
            or next(iter(applied), None)
        )
        if chosen is None:
            chosen = EditState(
                i,
                EditStatus.BROKEN,
                f"none of its {len(variants)} variants fits",
                tuple(
                    f"{variant_label(edit, t.variant)}: "
                    + (f"{t.field}: " if t.field else "")
                    + t.reason
                    + "".join(f" [{c}]" for c in t.candidates[:3])
                    for t in tried
                ),
                edit_field(i),
            )
        edits[i] = variants[chosen.variant]
        resolved = patch.model_copy(update={"edits": list(edits)})
        states.append(chosen)
    return resolved, tuple(states)


def matched_alternatives(patch: PatchSpec, states: Sequence[EditState]) -> tuple[str, ...]:
    """`edits[i]: <variant>` for every edit that has alternatives: which one fit."""
    return tuple(
        f"{edit_field(state.index)}: {variant_label(patch.edits[state.index], state.variant)}"
        for state in states
        if patch.edits[state.index].alternatives
    )


def _detect_resolved(
    decoded: SourceText, tree: ast.Module, patch: PatchSpec
) -> tuple[Detection, PatchSpec]:
    """`detect`, and the patch with each edit's fitting variant in its place."""
    resolved, states = _choose_variants(LineIndex(decoded.text), tree, patch)
    return _judge(states), resolved


def _judge(states: tuple[EditState, ...]) -> Detection:
    kinds = {s.state for s in states}
    if EditStatus.BROKEN in kinds:
        broken = next(s for s in states if s.state == EditStatus.BROKEN)
        return Detection(Detected.UNKNOWN, states, f"{edit_field(broken.index)}: {broken.reason}")
    if kinds == {"applied"}:
        return Detection(Detected.APPLIED, states, "every edit is present")
    if kinds == {"pending"}:
        return Detection(Detected.NOT_APPLIED, states, "no edit is present")
    present = ", ".join(edit_field(s.index) for s in states if s.state == "applied")
    missing = ", ".join(edit_field(s.index) for s in states if s.state == "pending")
    return Detection(
        Detected.PARTIAL, states, f"partly applied: {present} present, {missing} missing"
    )


def misfits(patch: PatchSpec, detection: Detection) -> str:
    """Which of the patch's edits no longer fit the file, each by its field, kind and scope, and
    why (`edits[0] (insert in EAGLEWorkerV2): scope ... is not defined in this file; nearest:
    EAGLEWorkerV3 (line 70)`): where a port has to start. Empty when every edit fits."""
    said = []
    for state in detection.edits:
        if state.state != EditStatus.BROKEN:
            continue
        edit = patch.edits[state.index]
        where = f" in {edit.scope}" if not isinstance(edit, DiffEdit) else ""
        nearest = f"; nearest: {', '.join(state.candidates[:3])}" if state.candidates else ""
        said.append(f"{edit_field(state.index)} ({edit.kind}{where}): {state.reason}{nearest}")
    return "; ".join(said)


# ---------------------------------------------------------------------------------------------
# applying


def unified_diff(old: str, new: str, relpath: str) -> str:
    """A unified diff between two texts, labelled a/<relpath> and b/<relpath>."""
    return "".join(
        difflib.unified_diff(
            split_lines(old), split_lines(new), fromfile=f"a/{relpath}", tofile=f"b/{relpath}"
        )
    )


def apply_patch(source: bytes, patch: PatchSpec, *, relpath: str | None = None) -> PlanOutcome:
    """Plan `patch` on `source`: `Applied`, `AlreadyApplied` or `NotApplicable`, with reasons.

    `relpath` labels the diff (default: the module's path, e.g.
    `sglang/srt/speculative/eagle_worker_v2.py`).
    """
    relpath = relpath or patch.target.module_relpaths()[0]
    try:
        decoded, tree = _decode(source)
    except SourceDecodeError as exc:
        return NotApplicable(patch.id, str(exc))
    original = patch
    detection, patch = _detect_resolved(decoded, tree, patch)
    matched = matched_alternatives(original, detection.edits)
    if detection.state == "unknown":
        broken = next((s for s in detection.edits if s.state == "broken"), None)
        if broken is not None:
            return NotApplicable(
                patch.id, broken.reason, _broken_field(patch, broken), broken.candidates
            )
        return NotApplicable(patch.id, detection.reason)
    if detection.state == "partial":
        return NotApplicable(
            patch.id,
            detection.reason
            + f"; restore the original file (`opspatch rollback {patch.id}` where opspatch wrote "
            "it) or finish the change by hand",
        )
    if detection.state == "applied":
        problems = validate_result(
            old_text=decoded.text,
            new_text=decoded.text,
            new_source=source,
            patch=patch,
            edited_scopes=(),
            filename=relpath,
            check_compile=False,
            new_tree=tree,
        )
        if problems:
            return NotApplicable(patch.id, "its code is present but: " + "; ".join(problems))
        return AlreadyApplied(
            patch.id,
            f"all {len(patch.edits)} edit(s) already present (recognised by {_recognised_by(patch)})"
            + (", postconditions hold" if patch.postconditions else "")
            + "".join(f"; {m}" for m in matched),
            matched,
        )
    sha = sha256_hex(source)
    if patch.target.accept_sha256 and sha not in patch.target.accept_sha256:
        return NotApplicable(
            patch.id,
            f"the file's sha256 {sha} is not one of the pre-images this patch accepts",
            "target.accept_sha256",
        )

    text = decoded.text
    records: list[EditRecord] = []
    scopes: list[str] = []
    current_tree = tree  # the tree of `text`, parsed once per text
    try:
        for i, edit in enumerate(patch.edits):
            if isinstance(edit, InsertEdit):
                splices, edit_scopes = place_insert(
                    text, current_tree, edit, patch, decoded.newline, i
                )
                description = f"insert at {edit.position} of {edit.scope}"
            elif isinstance(edit, ReplaceEdit):
                splices, edit_scopes = place_replace(
                    text, current_tree, edit, patch, decoded.newline, i
                )
                description = f"replace {edit.select.describe()} in {edit.scope}"
            elif isinstance(edit, DeleteEdit):
                _refuse_deleting_inserted(LineIndex(text), current_tree, patch, i)
                splices, edit_scopes = place_delete(
                    text, current_tree, edit, patch, decoded.newline, i
                )
                description = f"delete {edit.select.describe()} in {edit.scope}"
            elif isinstance(edit, MoveEdit):
                splices, edit_scopes = place_move(
                    text, current_tree, edit, patch, decoded.newline, i
                )
                description = f"move {edit.select.describe()} {_insert_place(edit)} in {edit.scope}"
            else:
                splices, edit_scopes = plan_diff(text, current_tree, edit, decoded.newline, i)
                description = "diff"
            new_text = apply_splices(text, splices)
            records.append(
                EditRecord(
                    index=i,
                    kind=edit.kind,
                    scope=",".join(edit_scopes),
                    description=description,
                    splices=tuple(splices),
                    undo=undo_splices(text, splices),
                    variant=detection.edits[i].variant,
                )
            )
            scopes.extend(s for s in edit_scopes if s not in scopes)
            text = new_text
            try:
                current_tree = parse_python(text)
            except SyntaxError as exc:
                where = f" (line {exc.lineno})" if exc.lineno else ""
                return NotApplicable(
                    patch.id,
                    f"the result does not parse after this edit: {exc.msg}{where}",
                    edit_field(i),
                )
    except EditProblem as problem:
        return NotApplicable(patch.id, problem.message, problem.field, problem.candidates)

    try:
        new_source = decoded.encode(text)
    except SourceDecodeError as exc:
        return NotApplicable(patch.id, str(exc))
    problems = validate_result(
        old_text=decoded.text,
        new_text=text,
        new_source=new_source,
        patch=patch,
        edited_scopes=tuple(scopes),
        filename=relpath,
        old_tree=tree,
        new_tree=current_tree,
    )
    if problems:
        return NotApplicable(patch.id, "the result fails validation: " + "; ".join(problems))
    return Applied(
        patch_id=patch.id,
        old_source=source,
        new_source=new_source,
        diff=unified_diff(decoded.text, text, relpath),
        edits=tuple(records),
        edited_scopes=tuple(scopes),
        encoding=decoded.encoding,
        newline=decoded.newline,
        matched=matched,
    )


def _recognised_by(patch: PatchSpec) -> str:
    """How the engine saw the edits in place: a diff by its reverse applying, others by tree."""
    ways = {"reverse apply" if isinstance(e, DiffEdit) else "syntax tree" for e in patch.edits}
    return " and ".join(sorted(ways, reverse=True))


def _broken_field(patch: PatchSpec, state: EditState) -> str:
    return state.field or edit_field(state.index)


def reverse(applied: Applied) -> bytes:
    """The exact pre-image of an `Applied`, rebuilt from its recorded splices."""
    decoded = SourceText.decode(applied.new_source)
    text = decoded.text
    for record in reversed(applied.edits):
        text = apply_splices(text, record.undo)
    return decoded.encode(text)


def _removal_candidates(index: LineIndex, first: int, last: int, newline: str) -> list[str]:
    """Texts with lines [first, last] removed, also for a block that ended a file without a
    final newline (its newline went before it)."""
    text = index.text
    start, end = index.line_start(first), index.line_end(last)
    out = [text[:start] + text[end:]]
    if end == len(text) and start >= len(newline) and text[start - len(newline) : start] == newline:
        out.append(text[: start - len(newline)])
    return out


def _first_verified(
    candidates: Sequence[str], patch: PatchSpec, i: int, current: str, newline: str
) -> str | None:
    """The candidate pre-image from which edit `i` re-creates exactly `current`.

    Re-applying is the proof: a candidate is accepted only if inserting the edit into it gives
    back the patched text byte for byte.
    """
    edit = patch.edits[i]
    assert isinstance(edit, InsertEdit)
    for candidate in candidates:
        try:
            tree = parse_python(candidate)
            splices, _ = place_insert(candidate, tree, edit, patch, newline, i)
        except (SyntaxError, EditProblem):
            continue
        if apply_splices(candidate, splices) == current:
            return candidate
    return None


def undone_from_text(patch: PatchSpec) -> bool:
    """Whether `unapply` can remove the patch from the patched text alone: only inserts and
    diffs can; a replace, delete or move is undone from its recorded pre-image."""
    return all(isinstance(edit, InsertEdit | DiffEdit) for edit in patch.edits)


def unapply(
    source: bytes, patch: PatchSpec, *, relpath: str | None = None
) -> Reverted | NotApplicable:
    """Remove `patch` from a patched file without any record of how it was applied.

    Works for `insert` edits (the inserted block, marker included, is found by its syntax tree
    and removed line for line) and `diff` edits (the reversed diff is applied), each in the
    variant (alternative) found in the file. A `replace`, `delete` or `move` edit cannot be undone from the patched text alone: it is undone from the recorded pre-image
    (the ledger, or the backup beside a local file), so this returns `NotApplicable` for it.
    """
    relpath = relpath or patch.target.module_relpaths()[0]
    try:
        decoded, source_tree = _decode(source)
    except SourceDecodeError as exc:
        return NotApplicable(patch.id, f"the patch is not applied here ({exc})")
    detection, patch = _detect_resolved(decoded, source_tree, patch)  # the alternatives in place
    if detection.state != "applied":
        return NotApplicable(patch.id, f"the patch is not applied here ({detection.reason})")
    text = decoded.text
    for i in reversed(range(len(patch.edits))):
        edit = patch.edits[i]
        tree = parse_python(text)
        index = LineIndex(text)
        if isinstance(edit, ReplaceEdit | DeleteEdit | MoveEdit):
            return NotApplicable(
                patch.id,
                f"a {edit.kind} edit is undone from the recorded pre-image (ledger or backup), "
                "not from the patched text",
                edit_field(i),
            )
        if isinstance(edit, DiffEdit):
            parsed = parse_unified_diff(edit.diff).reversed()
            try:
                splices, _ = plan_diff(text, tree, edit, decoded.newline, i, diff=parsed)
            except EditProblem as problem:
                return NotApplicable(patch.id, problem.message, problem.field)
            text = apply_splices(text, splices)
            continue
        run = inserted_run(index, tree, patch, i)
        assert run is not None  # detection said applied
        indent = index.indentation(first_line(run[0]))
        end_line = last_line(run[-1])
        for blank_after in (False, True):
            marker = marker_lines(patch, edit.comment, indent, blank_after=blank_after)
            start_line = first_line(run[0]) - len(marker)
            if start_line >= 1 and index.line_text(start_line).strip() == marker[0]:
                break
        else:
            return NotApplicable(
                patch.id,
                "the inserted code's marker comment is missing or changed; restore from the recorded "
                "pre-image",
                edit_field(i),
            )
        if blank_after:  # the block brought the blank line after it: it goes too
            end_line += 1
            if end_line > len(index.lines) or index.line_text(end_line).strip():
                return NotApplicable(
                    patch.id,
                    "the blank line the inserted code brought is gone; restore from the recorded "
                    "pre-image",
                    edit_field(i),
                )
        candidates = _removal_candidates(index, start_line, end_line, decoded.newline)
        verified = _first_verified(candidates, patch, i, text, decoded.newline)
        if verified is None:
            return NotApplicable(
                patch.id,
                "the inserted code was changed since it was applied; restore from the recorded "
                "pre-image",
                edit_field(i),
            )
        text = verified
    old_source = decoded.encode(text)
    return Reverted(old_source=old_source, diff=unified_diff(decoded.text, text, relpath))
