"""Edit-engine cases on real SGLang files, and the record of what the engine made of each.

The records of the engine before the speed-up of issue 20 are committed
(`tests/data/real_release_outcomes.json`, written by `tests/data/make_real_release_outcomes.py`);
`tests/test_real_release_outcomes.py` proves the engine still gives byte-identical results.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from opspatch.config.patches import load_patch
from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, apply_patch, detect, unapply
from opspatch.core.spec import PatchSpec
from opspatch.core.validate import validate_result
from tests.patchkit import make_patch
from tests.sglang_wheels import RELEASE_VERSIONS, release_file

REPO = Path(__file__).resolve().parent.parent
SCHEDULER_RELPATH = "sglang/srt/managers/scheduler.py"
EAGLE_RELPATH = "sglang/srt/speculative/eagle_worker_v2.py"

SCHEDULER_PATCH = """
[[edits]]
kind = "insert"
scope = "Scheduler"
position = "start"
comment = "benchmark default"
code = "opspatch_bench_flag: int = 0"

[[edits]]
kind = "insert"
scope = "Scheduler.__init__"
position = "start"
code = "self.opspatch_bench_flag = 0"

[[postconditions]]
kind = "class-attribute"
class = "Scheduler"
name = "opspatch_bench_flag"
"""

MISSING_ANCHOR = """
[[edits]]
kind = "insert"
scope = "{scope}"
position = "before"
anchor = {{ calls = "no_such_call_anywhere" }}
code = "x = 1"
"""


def release_source(version: str, relpath: str) -> bytes:
    """The file `relpath` of the SGLang `version` wheel.

    Raises:
        WheelUnavailable: offline and not cached.
    """
    return release_file(version, relpath)


def scheduler_patch() -> PatchSpec:
    return make_patch(SCHEDULER_PATCH, patch_id="bench-scheduler-init")


def eagle_guard() -> PatchSpec:
    return load_patch(REPO / "patches" / "eagle-init-guard.toml").spec


def _sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _plan_record(outcome: object) -> dict[str, object]:
    if isinstance(outcome, Applied):
        return {
            "outcome": outcome.outcome,
            "new_source": _sha(outcome.new_source),
            "diff": _sha(outcome.diff),
            "scopes": list(outcome.edited_scopes),
            "edits": [[e.description, e.scope, len(e.splices)] for e in outcome.edits],
        }
    if isinstance(outcome, NotApplicable):
        return {
            "outcome": outcome.outcome,
            "reason": outcome.reason,
            "field": outcome.field,
            "candidates": list(outcome.candidates),
        }
    assert isinstance(outcome, AlreadyApplied)
    return {"outcome": outcome.outcome, "reason": outcome.reason}


def cases() -> Iterator[tuple[str, str, bytes, PatchSpec]]:
    """(name, relpath, file, patch) for every case on the releases of RELEASE_VERSIONS."""
    for version in RELEASE_VERSIONS:
        eagle = release_source(version, EAGLE_RELPATH)
        scheduler = release_source(version, SCHEDULER_RELPATH)
        yield f"{version} eagle guard", EAGLE_RELPATH, eagle, eagle_guard()
        yield f"{version} scheduler insert", SCHEDULER_RELPATH, scheduler, scheduler_patch()
        yield (
            f"{version} scheduler missing anchor",
            SCHEDULER_RELPATH,
            scheduler,
            make_patch(MISSING_ANCHOR.format(scope="Scheduler.__init__")),
        )


def record(name: str, relpath: str, source: bytes, patch: PatchSpec) -> dict[str, object]:
    """What the engine makes of one case: the plan, the re-plan of its result, its detection and
    removal, and the validation of the result against wrongly narrowed edited scopes."""
    plan = apply_patch(source, patch, relpath=relpath)
    out: dict[str, object] = {"plan": _plan_record(plan)}
    if isinstance(plan, Applied):
        out["again"] = _plan_record(apply_patch(plan.new_source, patch, relpath=relpath))
        out["detect"] = detect(plan.new_source, patch).state
        undone = unapply(plan.new_source, patch, relpath=relpath)
        out["unapply"] = (
            undone.reason if isinstance(undone, NotApplicable) else _sha(undone.old_source)
        )
        old_text, new_text = source.decode("utf-8"), plan.new_source.decode("utf-8")
        narrowed = {
            "none": (),
            "first only": plan.edited_scopes[:1],
            "last only": plan.edited_scopes[-1:],
            "module": ("<module>",),
            "as edited": plan.edited_scopes,
        }
        out["validate"] = {
            label: validate_result(
                old_text=old_text,
                new_text=new_text,
                new_source=plan.new_source,
                patch=patch,
                edited_scopes=scopes,
                filename=relpath,
            )
            for label, scopes in narrowed.items()
        }
    return out
