"""Apply, detect and reverse a patch on Python source: the pure heart of opspatch."""

from __future__ import annotations

import ast
import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from opspatch.core.kinds.base import EditState
from opspatch.core.placement import EditProblem, Splice, apply_splices, undo_splices
from opspatch.core.regions import ScopedReparse, Unsure, WholeReparse
from opspatch.core.remedy import remedy_text
from opspatch.core.source import (
    LineIndex,
    SourceDecodeError,
    SourceText,
    sha256_hex,
    split_lines,
)
from opspatch.core.spec import Edit, PatchSpec, edit_field, variant_label
from opspatch.core.syntax import collection_paused, parse_python
from opspatch.core.validate import validate_result
from opspatch.core.vocabulary import Command, Detected, EditStatus

__all__ = [
    "AlreadyApplied",
    "Applied",
    "Detection",
    "EditRecord",
    "EditState",
    "NotApplicable",
    "PlanOutcome",
    "Reverted",
    "apply_patch",
    "detect",
    "matched_alternatives",
    "misfits",
    "plan_summary",
    "reverse",
    "unapply",
    "undone_from_text",
    "unified_diff",
]

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


def _edit_state(index: LineIndex, tree: ast.Module, patch: PatchSpec, i: int) -> EditState:
    """Is edit `i` present in `index.text`? Its kind decides (`EditKind.state`), at the edit's
    own place; a problem (a scope or anchor not found, a diff that fits neither way) is `broken`."""
    try:
        return patch.edits[i].state(index, tree, patch, i)
    except EditProblem as problem:
        return EditState(i, EditStatus.BROKEN, problem.message, problem.candidates, problem.field)


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
    resolved, states = _choose_variants(LineIndex.of(decoded.text), tree, patch)
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
        where = f" in {edit.scope_name}" if edit.scope_name is not None else ""
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
    with collection_paused():  # a plan makes many trees and no cycles
        return _apply_patch(source, patch, relpath or patch.target.module_relpaths()[0])


def _apply_patch(source: bytes, patch: PatchSpec, relpath: str) -> PlanOutcome:
    try:
        decoded, tree = _decode(source)
    except SourceDecodeError as exc:
        return NotApplicable(patch.id, str(exc))
    original = patch
    detection, patch = _detect_resolved(decoded, tree, patch)
    matched = matched_alternatives(original, detection.edits)
    judged = _judged(source, decoded, tree, patch, detection, matched, relpath)
    if judged is not None:
        return judged
    placed = _place_edits(decoded, tree, patch, detection)
    if isinstance(placed, NotApplicable):
        return placed
    text, current_tree, for_min_python, records, scopes = placed
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
        new_tree_for_min_python=for_min_python,
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


def _judged(
    source: bytes,
    decoded: SourceText,
    tree: ast.Module,
    patch: PatchSpec,
    detection: Detection,
    matched: tuple[str, ...],
    relpath: str,
) -> PlanOutcome | None:
    """The plan's outcome when the detection alone decides it (a problem, partly applied,
    already applied, a pre-image not accepted); None when the edits are to be placed."""
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
            + f"; restore the original file (`{remedy_text(Command.ROLLBACK, patch.id)}` where "
            "opspatch wrote it) or finish the change by hand",
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
    return None


PLACERS: tuple[type[ScopedReparse | WholeReparse], ...] = (ScopedReparse, WholeReparse)
"""How the edits are placed, tried in turn: parsing again only the scope each edit changed
(`core/regions.py`), and where that is unsure, the whole file after every edit (the reference)."""


def _place_edits(
    decoded: SourceText, tree: ast.Module, patch: PatchSpec, detection: Detection
) -> tuple[str, ast.Module, bool, list[EditRecord], list[str]] | NotApplicable:
    """Place every edit in turn, each by its kind (`EditKind.place`) on the text the edits
    before it left: the new text, its tree, whether that tree was parsed for the patch's
    `min_python`, the edit records and the scopes edited."""
    for placer in PLACERS[:-1]:
        try:
            return _place_with(placer(decoded.text, tree), decoded.newline, patch, detection)
        except Unsure:
            continue
    return _place_with(PLACERS[-1](decoded.text, tree), decoded.newline, patch, detection)


def _place_with(
    edited: ScopedReparse | WholeReparse, newline: str, patch: PatchSpec, detection: Detection
) -> tuple[str, ast.Module, bool, list[EditRecord], list[str]] | NotApplicable:
    records: list[EditRecord] = []
    scopes: list[str] = []
    try:
        for i, edit in enumerate(patch.edits):
            text = edited.text
            try:
                splices, edit_scopes = edit.place(
                    text, edited.tree_for(edit.scope_name), patch, newline, i
                )
            except EditProblem:
                if edited.whole_fresh:
                    raise
                # the problem is said as the whole file's tree shows it (the lines of others)
                splices, edit_scopes = edit.place(text, edited.tree_for(None), patch, newline, i)
            records.append(
                EditRecord(
                    index=i,
                    kind=edit.kind,
                    scope=",".join(edit_scopes),
                    description=edit.description(),
                    splices=tuple(splices),
                    undo=undo_splices(text, splices),
                    variant=detection.edits[i].variant,
                )
            )
            scopes.extend(s for s in edit_scopes if s not in scopes)
            try:
                edited.apply(edit.scope_name, splices)
            except SyntaxError as exc:
                where = f" (line {exc.lineno})" if exc.lineno else ""
                return NotApplicable(
                    patch.id,
                    f"the result does not parse after this edit: {exc.msg}{where}",
                    edit_field(i),
                )
    except EditProblem as problem:
        return NotApplicable(patch.id, problem.message, problem.field, problem.candidates)
    final, for_min_python = edited.final_tree(patch.target.feature_version)
    return edited.text, final, for_min_python, records, scopes


def _recognised_by(patch: PatchSpec) -> str:
    """How the engine saw the edits in place: a diff by its reverse applying, others by tree."""
    ways = {edit.recognised_by for edit in patch.edits}
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


def undone_from_text(patch: PatchSpec) -> bool:
    """Whether `unapply` can remove the patch from the patched text alone: only inserts and
    diffs can; a replace, delete or move is undone from its recorded pre-image."""
    return all(edit.undone_from_text for edit in patch.edits)


def unapply(
    source: bytes, patch: PatchSpec, *, relpath: str | None = None
) -> Reverted | NotApplicable:
    """Remove `patch` from a patched file without any record of how it was applied.

    Each edit, the last first, is taken out by its kind (`EditKind.undo`) in the variant
    (alternative) found in the file: an `insert` (the inserted block, marker included, is found
    by its syntax tree and removed line for line) and a `diff` (the reversed diff is applied). A
    `replace`, `delete` or `move` edit cannot be undone from the patched text alone: it is undone
    from the recorded pre-image (the ledger, or the backup beside a local file), so this returns
    `NotApplicable` for it.
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
        tree = parse_python(text)
        try:
            text = patch.edits[i].undo(text, tree, patch, decoded.newline, i)
        except EditProblem as problem:
            return NotApplicable(patch.id, problem.message, problem.field, problem.candidates)
    old_source = decoded.encode(text)
    return Reverted(old_source=old_source, diff=unified_diff(decoded.text, text, relpath))
