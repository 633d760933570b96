"""Has upstream shipped the fix? A patch judged on a release's pristine file: `fixed-upstream`
(the patch is redundant there), `not-fixed` (still needed) or `anchor-gone` (needs a port)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from opspatch.core.codec import Record, json_field
from opspatch.core.edit import detect
from opspatch.core.source import SourceDecodeError, SourceText
from opspatch.core.spec import (
    AssignedBeforeCalls,
    ClassAttribute,
    LoadedPatch,
    PatchSpec,
    Postcondition,
    Upstream,
)
from opspatch.core.syntax import parse_python
from opspatch.core.validate import check_postconditions
from opspatch.core.vocabulary import Detected, UpstreamState


@dataclass(frozen=True, kw_only=True)
class UpstreamVerdict(Record):
    """Whether a release's file already carries a patch's fix, why, and (for a patch set) the
    verdict of each file."""

    patch_id: str = json_field(key="patch")
    state: UpstreamState
    reason: str
    version: str | None = None
    disagreement: str | None = json_field(default=None, omit_none=True)
    """`upstream.fixed_in` and the file disagree (both are said)."""
    module: str | None = json_field(default=None, omit_none=True)
    files: tuple[UpstreamVerdict, ...] = ()

    @property
    def fixed(self) -> bool:
        return self.state == UpstreamState.FIXED_UPSTREAM


def upstream_verdict(
    patch: LoadedPatch, sources: Mapping[str, bytes], version: str | None = None
) -> UpstreamVerdict:
    """The verdict of `patch` on a release whose target files are `sources` (by module)."""
    parts = [
        part_verdict(part, sources[part.target.module], version)
        if part.target.module in sources
        else UpstreamVerdict(
            patch_id=part.id,
            state=UpstreamState.ANCHOR_GONE,
            reason=f"the release has no {part.target.module_relpaths()[0]}",
            version=version,
            module=part.target.module,
        )
        for part in patch.parts
    ]
    if not patch.is_set:
        return parts[0]
    return combine_files(patch.spec, parts, version)


def combine_files(
    header: PatchSpec, files: Sequence[UpstreamVerdict], version: str | None
) -> UpstreamVerdict:
    """A patch set's verdict from its files': fixed only where every file is."""
    states = {f.state for f in files}
    if states == {UpstreamState.FIXED_UPSTREAM}:
        state = UpstreamState.FIXED_UPSTREAM
    elif UpstreamState.ANCHOR_GONE in states:
        state = UpstreamState.ANCHOR_GONE
    else:
        state = UpstreamState.NOT_FIXED
    reason = "; ".join(f"{f.module}: {f.state}: {f.reason}" for f in files)
    return UpstreamVerdict(
        patch_id=header.id,
        state=state,
        reason=reason,
        version=version,
        disagreement=fixed_in_disagreement(header.upstream, version, state, reason),
        files=tuple(files),
    )


def part_verdict(part: PatchSpec, source: bytes, version: str | None = None) -> UpstreamVerdict:
    """The verdict of one single-target patch on one release file."""
    state, reason = _judge(part, source)
    return UpstreamVerdict(
        patch_id=part.id,
        state=state,
        reason=reason,
        version=version,
        disagreement=fixed_in_disagreement(part.upstream, version, state, reason),
        module=part.target.module,
    )


def _judge(part: PatchSpec, source: bytes) -> tuple[UpstreamState, str]:
    if part.marker.encode() in source:
        return UpstreamState.NOT_FIXED, (
            f"the file carries opspatch's marker `{part.marker}`: it is this patch applied, not "
            "an upstream release"
        )
    try:
        tree = parse_python(SourceText.decode(source).text)
    except (SourceDecodeError, SyntaxError, ValueError) as exc:
        return UpstreamState.ANCHOR_GONE, f"the file cannot be read as Python: {exc}"
    detection = detect(source, part)
    problems = check_postconditions(tree, part) if part.postconditions else []
    proving = _proving_conditions(part)
    if detection.state == Detected.UNKNOWN:
        also = (
            " (its postconditions hold, but the code it edits is not where the patch says: "
            "port it, or retire it after reading the file)"
            if proving and not problems
            else ""
        )
        return UpstreamState.ANCHOR_GONE, detection.reason + also
    # A kind that leaves no code of its own (a delete) reads applied when its code is gone,
    # which a rewrite does as well: at least one edit must have its own code in the file.
    in_place = detection.state == Detected.APPLIED and any(edit.leaves_code for edit in part.edits)
    if in_place:
        if problems:
            return UpstreamState.NOT_FIXED, (
                "the edits' code is in the file, but a postcondition fails: " + problems[0]
            )
        holds = " and every postcondition holds" if part.postconditions else ""
        each = "; ".join(f"edits[{s.index}]: {s.reason}" for s in detection.edits)
        return UpstreamState.FIXED_UPSTREAM, (
            f"every edit's code is already in the file, without opspatch's marker ({each}){holds}"
        )
    if not part.postconditions:
        return UpstreamState.NOT_FIXED, (
            f"{detection.reason}, and the patch has no postconditions that could prove the fix "
            "written another way"
        )
    if problems:
        return UpstreamState.NOT_FIXED, problems[0]
    if not proving:
        return UpstreamState.NOT_FIXED, (
            "the postconditions hold, but none is about a scope the patch edits, so they prove "
            "nothing about its fix"
        )
    shown = "; ".join(describe_condition(c) for c in part.postconditions)
    return UpstreamState.FIXED_UPSTREAM, (
        f"the edit would not be needed: every postcondition already holds ({shown})"
    )


def _proving_conditions(part: PatchSpec) -> list[Postcondition]:
    """The postconditions about a scope the patch edits (or encloses one of them)."""
    edited = {scope for edit in part.edits if (scope := edit.scope_name) is not None}

    def related(scope: str) -> bool:
        return any(
            scope == e or scope.startswith(e + ".") or e.startswith(scope + ".") for e in edited
        )

    return [c for c in part.postconditions if related(condition_scope(c))]


def condition_scope(condition: Postcondition) -> str:
    """The scope a postcondition is about."""
    if isinstance(condition, AssignedBeforeCalls):
        return condition.scope
    return condition.class_


def describe_condition(condition: Postcondition) -> str:
    if isinstance(condition, ClassAttribute):
        return f"class `{condition.class_}` has a class-level `{condition.name}`"
    return f"`{condition.attribute}` is assigned in `{condition.scope}` before any call"


def fixed_in_disagreement(
    upstream: Upstream | None, version: str | None, state: UpstreamState, reason: str
) -> str | None:
    """What to say when the patch's `upstream.fixed_in` and the file disagree, or None."""
    if upstream is None or upstream.fixed_in_version is None or version is None:
        return None
    try:
        release = Version(version)
    except InvalidVersion:
        return None
    claims = release >= upstream.fixed_in_version
    if claims and state != UpstreamState.FIXED_UPSTREAM:
        return (
            f"upstream.fixed_in says {upstream.fixed_in} ships the fix, but the file of "
            f"{version} does not pass the patch's proof of it ({reason}): check the release, "
            "or correct fixed_in"
        )
    if not claims and state == UpstreamState.FIXED_UPSTREAM:
        return (
            f"the file of {version} already has the fix, but upstream.fixed_in says it first "
            f"shipped in {upstream.fixed_in}: a backport, or fixed_in is wrong"
        )
    return None
