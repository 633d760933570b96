"""Backports of real SGLang upstream fixes (tests/data/backports/), proven on the real released files.

Each patch in `BACKPORTS` is an upstream fix found by diffing released wheels: `upstream` is the
first release that has it, `before` the release just before, `older` earlier releases the patch
also claims. SGLang is test data here: its files are read from the cached wheels
(`tests/sglang_wheels.py`, downloaded once, skipped with the reason when offline), never imported.

How "the same as upstream" is judged, by syntax tree (comments, markers and layout aside):

- on `before`, every function the patch edits is, after the patch, equal to the same function of
  `upstream` (`ast.dump` without positions, `strip_positions`): between those two releases upstream changed that
  function by the fix alone, so nothing less than equality is the upstream result;
- on each older release the function has drifted for unrelated reasons (renames, new checks),
  so equality cannot hold; instead the patch must make the same change there that upstream made:
  the same lines of the function's `ast.unparse` replaced by the same lines, each after the same
  line where that line is itself unchanged in the older release (`tree_change`, `same_change`).
  A patch that edits a different occurrence, or puts the right code in the wrong place, changes
  different lines or follows a different one, and fails;
- where the code the fix changes differs in an older release and an edit's per-release
  alternative fits instead (`own_statement`), upstream's change is compared with its statement
  read as the one that release has: the same statement moved (or changed) the same way;
- `upstream` itself reads as already applied: the patch recognises the upstream code as itself.

A patch set (one fix in several modules) is judged module by module, each with its own edits:
every module must pass, which is what the set's all-or-nothing plan needs too.

On every release it is applied to, the patch also changes no other function, applying it again
is already-applied (the bytes stay as they are), and undoing it gives the release's bytes back
byte for byte (from the recorded splices, as rollback restores a recorded pre-image; and from
the patched text alone where the edit kinds allow it).
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.anchors import iter_definitions, resolve_scope, strip_positions
from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, apply_patch, reverse, unapply
from opspatch.core.spec import PatchSpec
from tests.sglang_wheels import WheelUnavailable, release_file

# in this process, but each backport on each real release it names: ~14 s, so not the fast tier
pytestmark = [pytest.mark.pure, pytest.mark.slow]

BACKPORTS_DIR = Path(__file__).resolve().parent / "data" / "backports"


@dataclass(frozen=True)
class Backport:
    patch_id: str
    upstream: str  # the first release with the fix
    before: str  # the release just before `upstream`
    older: tuple[str, ...]  # earlier releases in the patch's range, proven too
    # Older releases where an edit's alternative fits, each with the statement as upstream has it
    # and as that release has it: there upstream's change is compared with the one read as the other.
    own_statement: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def parts(self) -> tuple[PatchSpec, ...]:
        """One single-file patch per module the fix changes (a patch set has several)."""
        return load_patch(BACKPORTS_DIR / f"{self.patch_id}.toml").parts


PRIORITY_CHECK = "if not self._set_or_validate_priority(req):\n    return"
BACKPORTS = (
    Backport("scheduler-internal-state-copy", "0.5.11", "0.5.10", ("0.5.4", "0.5.8")),
    Backport("cuda-graph-pp-proxy-dtype", "0.5.5", "0.5.4", ("0.4.7", "0.5.3")),
    Backport("scheduler-pp-allocatable-reqs", "0.5.12", "0.5.11", ("0.4.7", "0.5.4")),
    # a move; in 0.5.3 and 0.5.4 the check was a bare call (an alternative)
    Backport(
        "scheduler-priority-all-modes",
        "0.5.12",
        "0.5.11",
        ("0.5.3", "0.5.4", "0.5.5", "0.5.9"),
        own_statement={
            "0.5.3": (PRIORITY_CHECK, "self._set_or_validate_priority(req)"),
            "0.5.4": (PRIORITY_CHECK, "self._set_or_validate_priority(req)"),
        },
    ),
    # a patch set over three modules, two of them a move
    Backport("eagle-draft-positions-after-forward", "0.5.12", "0.5.11", ("0.5.8", "0.5.10")),
)


def _release(version: str, relpath: str) -> bytes:
    try:
        return release_file(version, relpath)
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang {version} wheel not available (offline?): {exc}")


def _relpath(patch: PatchSpec) -> str:
    return patch.target.module_relpaths()[0]


def _scopes(patch: PatchSpec) -> list[str]:
    return sorted({edit.scope for edit in patch.edits if hasattr(edit, "scope")})


def _function(source: bytes, qualname: str) -> ast.AST:
    return resolve_scope(ast.parse(source), qualname).node


def _function_dumps(source: bytes) -> dict[str, str]:
    return {
        qualname: strip_positions(node)
        for qualname, node in iter_definitions(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


Change = tuple[str, tuple[str, ...], tuple[str, ...]]


def tree_change(old: bytes, new: bytes, qualname: str) -> list[Change]:
    """What changed in one function, by syntax tree: for each changed run of `ast.unparse` lines,
    the line before it in the new text, the old lines and the new lines."""
    old_lines = ast.unparse(_function(old, qualname)).splitlines()
    new_lines = ast.unparse(_function(new, qualname)).splitlines()
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    return [
        (new_lines[j1 - 1] if j1 else "", tuple(old_lines[i1:i2]), tuple(new_lines[j1:j2]))
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def same_change(ours: list[Change], upstream: list[Change], old_lines: set[str]) -> bool:
    """The same lines replaced by the same lines; each after the same line where that line is
    in the older release at all (a line before that drifted, say a renamed call, is not held
    against the patch)."""
    if [(o, n) for _, o, n in ours] != [(o, n) for _, o, n in upstream]:
        return False
    return all(
        our_before == up_before
        for (our_before, _, _), (up_before, _, _) in zip(ours, upstream, strict=True)
        if up_before in old_lines
    )


def _apply_and_round_trip(patch: PatchSpec, version: str, before: bytes) -> Applied:
    """Apply `patch` to a release's file, check it changes only its own functions, re-applies
    as already-applied and comes off byte-identically; return what it did."""
    assert patch.target.specifier.contains(version, prereleases=True), (
        f"{version} is proven here but outside the patch's versions {patch.target.versions}"
    )
    outcome = apply_patch(before, patch, relpath=_relpath(patch))
    assert isinstance(outcome, Applied), f"{version}: {getattr(outcome, 'reason', outcome)}"
    after = outcome.new_source

    old_functions, new_functions = _function_dumps(before), _function_dumps(after)
    assert old_functions.keys() == new_functions.keys()
    changed = {q for q in old_functions if old_functions[q] != new_functions[q]}
    scopes = _scopes(patch)
    # a nested function's change shows in the function around it too
    assert changed == {
        q for q in old_functions if any(s == q or s.startswith(q + ".") for s in scopes)
    }

    again = apply_patch(after, patch, relpath=_relpath(patch))
    assert isinstance(again, AlreadyApplied), f"{version}: applying again gave {again.outcome}"
    assert reverse(outcome) == before
    undone = unapply(after, patch, relpath=_relpath(patch))
    if not isinstance(undone, NotApplicable):  # replace/delete/move come off from the record
        assert undone.old_source == before
    return outcome


def _read_as(change: list[Change], upstream_statement: str, own: str) -> list[Change]:
    """Upstream's change with its statement read as the release's own (same indentation)."""
    theirs = ast.unparse(ast.parse(upstream_statement)).splitlines()
    ours = ast.unparse(ast.parse(own)).splitlines()

    def swap(lines: tuple[str, ...]) -> tuple[str, ...]:
        if [line.strip() for line in lines] != [line.strip() for line in theirs]:
            return lines
        indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
        return tuple(indent + line for line in ours)

    return [(before, swap(old), swap(new)) for before, old, new in change]


def _variants(outcome: Applied) -> list[int]:
    """Which variant of each edit fit (0: as written; n: its alternatives[n - 1])."""
    return [record.variant for record in outcome.edits]


@pytest.mark.parametrize("backport", BACKPORTS, ids=lambda b: b.patch_id)
def test_backport_gives_the_upstream_code_on_the_release_before_the_fix(backport: Backport) -> None:
    for part in backport.parts:
        before = _release(backport.before, _relpath(part))
        upstream = _release(backport.upstream, _relpath(part))
        outcome = _apply_and_round_trip(part, backport.before, before)
        assert set(_variants(outcome)) == {0}  # the edits as written fit the newest release
        for scope in _scopes(part):
            assert strip_positions(_function(outcome.new_source, scope)) == strip_positions(
                _function(upstream, scope)
            ), scope


@pytest.mark.parametrize(
    ("backport", "version"),
    [(b, v) for b in BACKPORTS for v in b.older],
    ids=lambda x: x.patch_id if isinstance(x, Backport) else x,
)
def test_backport_makes_the_upstream_change_on_older_releases(
    backport: Backport, version: str
) -> None:
    for part in backport.parts:
        relpath = _relpath(part)
        old = _release(version, relpath)
        outcome = _apply_and_round_trip(part, version, old)
        assert (max(_variants(outcome)) > 0) == (version in backport.own_statement)
        before, upstream = _release(backport.before, relpath), _release(backport.upstream, relpath)
        for scope in _scopes(part):
            upstream_change = tree_change(before, upstream, scope)
            assert upstream_change, f"upstream changed nothing in {scope}"
            if version in backport.own_statement:
                upstream_change = _read_as(upstream_change, *backport.own_statement[version])
            ours = tree_change(old, outcome.new_source, scope)
            old_lines = set(ast.unparse(_function(old, scope)).splitlines())
            assert same_change(ours, upstream_change, old_lines), (scope, ours, upstream_change)


@pytest.mark.parametrize("backport", BACKPORTS, ids=lambda b: b.patch_id)
def test_the_upstream_release_reads_as_already_applied(backport: Backport) -> None:
    for part in backport.parts:
        upstream = _release(backport.upstream, _relpath(part))
        assert not part.target.specifier.contains(backport.upstream, prereleases=True)
        outcome = apply_patch(upstream, part, relpath=_relpath(part))
        assert isinstance(outcome, AlreadyApplied), getattr(outcome, "reason", outcome)


@pytest.mark.process
def test_a_backport_through_apply_and_rollback_on_a_real_release_file(tmp_path: Path) -> None:
    """The console script on the real 0.5.8 scheduler: applied, applied again (already-applied,
    the bytes as they were), rolled back to the release's bytes."""
    from tests.clirunner import opspatch

    patch_file = BACKPORTS_DIR / "scheduler-internal-state-copy.toml"
    relpath = "sglang/srt/managers/scheduler.py"
    target = tmp_path / "site-packages" / relpath
    target.parent.mkdir(parents=True)
    release = _release("0.5.8", relpath)
    target.write_bytes(release)
    env = {"OPSPATCH_STATE_DIR": str(tmp_path / "state")}
    args = ("--file", str(target), "--target-version", "0.5.8", "--yes", "--json")

    run = opspatch("apply", str(patch_file), *args, env=env)
    assert run.code == 0, run.stdout + run.stderr
    assert run.json()["hosts"][0]["outcome"] == "applied"
    patched = target.read_bytes()
    assert b"ret = dict(vars(get_global_server_args()))" in patched

    again = opspatch("apply", str(patch_file), *args, env=env)
    assert again.code == 0 and again.json()["hosts"][0]["outcome"] == "already-applied"
    assert target.read_bytes() == patched

    back = opspatch("rollback", str(patch_file), "--file", str(target), "--yes", env=env)
    assert back.code == 0, back.stdout + back.stderr
    assert target.read_bytes() == release
