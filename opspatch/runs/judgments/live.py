"""What the engine's processes said about a live fix, judged (pure)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opspatch.core.live import NotLive
from opspatch.core.vocabulary import NotLiveReason
from opspatch.hosts.live import LiveEngineReply, LiveFix, ProcessAnswer, missing_definitions


@dataclass(frozen=True)
class TakeVerdict:
    took: tuple[ProcessAnswer, ...]
    not_loaded: tuple[ProcessAnswer, ...]
    failure: str | None

    def describe(self) -> str:
        """The step's detail: who took it, who had nothing to take."""
        parts = [
            "took on " + ", ".join(_who(p) for p in self.took) if self.took else "took nowhere"
        ]
        if self.not_loaded:
            parts.append("module not loaded in " + ", ".join(_who(p) for p in self.not_loaded))
        return "; ".join(parts)


def _who(answer: ProcessAnswer) -> str:
    return f"{answer.process} (pid {answer.pid})" if answer.pid is not None else answer.process


def judge_take(
    reply: LiveEngineReply, names: Sequence[str], *, required: bool = True
) -> TakeVerdict:
    """Every process that has the module must take every definition; `required=False`: none here
    need (a unit's other node, whose ranks take it through the head's entry rank)."""
    if reply.missing is not None:
        return TakeVerdict((), (), reply.missing)
    processes = reply.processes()
    took, not_loaded, problems = [], [], []
    for answer in processes:
        if answer.not_loaded:
            not_loaded.append(answer)
        elif not answer.ok:
            problems.append(answer.describe())
        elif missing := missing_definitions(answer, names):
            problems.append(f"{_who(answer)}: says ok but does not hold {', '.join(missing)}")
        else:
            took.append(answer)
    if required and not problems and not took:
        problems.append("no process of the engine has the module loaded")
    failure = "; ".join(problems) if problems else None
    return TakeVerdict(tuple(took), tuple(not_loaded), failure)


def unanswered(reply: LiveEngineReply) -> str | None:
    """Why not every process answered ok (None: each did, or never loaded the module): what a `list`
    did not hear from may hold a fix."""
    if reply.missing is not None:
        return reply.missing
    problems = [a.describe() for a in reply.processes() if not a.ok and not a.not_loaded]
    return "; ".join(problems) or None


@dataclass(frozen=True)
class HeldFix:
    process: str
    pid: int | None
    fix_id: str
    module: str | None
    sha256: str | None
    names: tuple[str, ...]


def held_fixes(reply: LiveEngineReply) -> tuple[HeldFix, ...]:
    """Every live fix each process reports in its `list` (`took` entries grouped by `fix_id`)."""
    found: list[HeldFix] = []
    for answer in reply.processes():
        if not answer.ok:
            continue
        by_fix: dict[str, list[dict[str, object]]] = {}
        for entry in answer.took:
            by_fix.setdefault(str(entry.get("fix_id") or "?"), []).append(entry)
        for fix_id, entries in by_fix.items():
            module = next((str(e["module"]) for e in entries if e.get("module")), None)
            sha = next((str(e["sha256"]) for e in entries if e.get("sha256")), None)
            names = tuple(str(e["name"]) for e in entries if "name" in e)
            found.append(HeldFix(answer.process, answer.pid, fix_id, module, sha, names))
    return tuple(found)


def drift(held: HeldFix, file_sha256: str | None) -> str | None:
    """A file reinstalled or changed since the take means the next restart loses the fix."""
    if held.sha256 is None or file_sha256 is None or held.sha256 == file_sha256:
        return None
    return (
        f"{held.process} holds live fix {held.fix_id} taken from {held.module or 'its module'} "
        f"sha256 {held.sha256[:12]}, but the file is {file_sha256[:12]} now: the next restart "
        "loses the fix (reinstalled or changed since)"
    )


def _readback(entries: Sequence[Mapping[str, Any]], fix_id: str) -> tuple[tuple[str, ...], ...]:
    keys = ("name", "kind", "sha256", "value", "code_sha256")
    return tuple(
        sorted(
            tuple(str(e.get(k)) for k in keys) for e in entries if str(e.get("fix_id")) == fix_id
        )
    )


def _said(readback: tuple[tuple[str, ...], ...]) -> str:
    """Definitions read back, for a message: `A.x = 0, A.f code 1c5a8e25f929`."""
    if not readback:
        return "nothing"
    return ", ".join(
        f"{name} = {value}" if value != "None" else f"{name} code {code[:12]}"
        for name, _, _, value, code in readback
    )


@dataclass(frozen=True)
class HeldVerdict:
    """One node's `list` after a take through the head."""

    holding: tuple[ProcessAnswer, ...]
    ranks: tuple[str, ...]
    failure: str | None

    def describe(self) -> str:
        return "holds it: " + (", ".join(_who(p) for p in self.holding) or "no process")


def judge_held(
    listing: LiveEngineReply,
    fix_id: str,
    *,
    took: Mapping[str, Sequence[Mapping[str, Any]]],
    not_loaded: Collection[str],
) -> HeldVerdict:
    """Each process must read back what it took; a scheduler rank in neither `took` nor `not_loaded`
    is one the head's broadcast did not reach."""
    if listing.missing is not None:
        return HeldVerdict((), (), listing.missing)
    holding, ranks, problems = [], [], []
    for answer in listing.processes():
        if answer.process.startswith("scheduler-"):
            ranks.append(answer.process)
        if not answer.ok:
            problems.append(answer.describe())
        elif answer.process in took:
            now, then = _readback(answer.took, fix_id), _readback(took[answer.process], fix_id)
            if now == then:
                holding.append(answer)
            else:
                problems.append(
                    f"{_who(answer)}: does not hold {fix_id} as it took it (reads back "
                    f"{_said(now)}; took {_said(then)})"
                )
        elif answer.process.startswith("scheduler-") and answer.process not in not_loaded:
            problems.append(f"{_who(answer)}: the take through the head did not reach it")
    failure = "; ".join(problems) if problems else None
    return HeldVerdict(tuple(holding), tuple(ranks), failure)


def judge_gone(listing: LiveEngineReply, fixes: Collection[str]) -> str | None:
    """Why a node's processes still hold one of `fixes` after a revert (None: none holds any)."""
    if listing.missing is not None:
        return listing.missing
    problems = [a.describe() for a in listing.processes() if not a.ok]
    problems += [
        f"{_who(a)}: still holds {', '.join(sorted(held))}"
        for a in listing.processes()
        if (held := {str(e.get("fix_id")) for e in a.took} & set(fixes))
    ]
    return "; ".join(problems) or None


@dataclass(frozen=True)
class CheckVerdict:
    """`unanswered`: the engine does not take live fixes as asked; `refusal`: why a take would not
    be in effect."""

    answered: tuple[ProcessAnswer, ...]
    unanswered: str | None = None
    refusal: NotLive | None = None


def judge_check(
    reply: LiveEngineReply, takes: Sequence[LiveFix], *, required: bool = True
) -> CheckVerdict:
    """Every process must answer, and one must have the module unless not `required`."""
    if reply.missing is not None:
        return CheckVerdict((), reply.missing)
    processes = reply.processes()
    answered = tuple(p for p in processes if p.ok)
    if not answered:
        return CheckVerdict((), _no_answer_to_check(processes))
    silent = [p.describe() for p in processes if not p.ok]
    if silent:
        return CheckVerdict(answered, "not every process answered the check: " + "; ".join(silent))
    problems: list[NotLive] = []
    for take in takes:
        problems += _take_problems(answered, take, required=required)
    if not problems:
        return CheckVerdict(answered)
    text = "; ".join(problem.text for problem in problems)
    return CheckVerdict(answered, refusal=NotLive(problems[0].reason, text))


def _no_answer_to_check(processes: Sequence[ProcessAnswer]) -> str:
    if not processes:
        return "no process of the engine answered"
    first = processes[0]
    if first.code == "bad-request" and "check" in (first.message or ""):
        return (
            "its engine's live plugin predates the preflight's `check` (installed by an older "
            "opspatch): `opspatch live disable`, `live enable` and a restart update it"
        )
    return f"no process of the engine answered ({first.describe()})"


def _entries(answered: Sequence[ProcessAnswer], take: LiveFix) -> list[tuple[str, dict[str, Any]]]:
    """Each process's check of `take`, with who answered."""
    return [
        (_who(p), entry)
        for p in answered
        for entry in p.checks
        if entry.get("fix_id") == take.fix_id and entry.get("module") == take.module
    ]


def _take_problems(
    answered: Sequence[ProcessAnswer], take: LiveFix, *, required: bool
) -> list[NotLive]:
    """Why `take` would not be in effect, each problem once (the processes named)."""
    checked = _entries(answered, take)
    loaded = [(who, entry) for who, entry in checked if entry.get("loaded")]
    if not loaded:
        if not required:
            return []
        asked = ", ".join(_who(p) for p in answered)
        return [
            NotLive(
                NotLiveReason.NOT_IMPORTED,
                f"no process of the engine has imported {take.module} ({asked}): nothing "
                "running can take it (the file alone carries the change to the next import)",
            )
        ]
    found: dict[tuple[NotLiveReason, str], list[str]] = {}
    for who, entry in loaded:
        for reason, sentence in _check_sentences(take, entry):
            found.setdefault((reason, sentence), []).append(who)
    return [
        NotLive(reason, f"{sentence} (in {', '.join(where)})")
        for (reason, sentence), where in found.items()
    ]


def _check_sentences(take: LiveFix, entry: dict[str, Any]) -> list[tuple[NotLiveReason, str]]:
    said: list[tuple[NotLiveReason, str]] = []
    for held in _dicts(entry.get("held")):
        said.append(
            (
                NotLiveReason.ALREADY_HELD,
                f"{take.module}.{held.get('name')} is held by live fix {held.get('fix_id')}: a "
                "take would refuse it",
            )
        )
    for use in _dicts(entry.get("captured")):
        said.append(
            (
                NotLiveReason.CAPTURED_AT_IMPORT,
                f"{use.get('name')} is read while {use.get('module')} is imported (line "
                f"{use.get('line')}, {use.get('where')}): what was built then keeps the old value",
            )
        )
    for built in _dicts(entry.get("objects")):
        count = built.get("count")
        if isinstance(count, int) and count > 0:
            said.append(
                (
                    NotLiveReason.BUILT_OBJECTS,
                    f"{built.get('name')} runs only while a {built.get('class')} is built, and "
                    f"{count} {built.get('class')} object(s) already are: they keep the state "
                    "the old code gave them",
                )
            )
        elif built.get("complete") is False:
            said.append(
                (
                    NotLiveReason.BUILT_OBJECTS,
                    f"{built.get('name')} runs only while a {built.get('class')} is built, and "
                    f"the {built.get('class')} objects already built could not all be counted "
                    "(the search stopped at its limit): not shown to be none",
                )
            )
    for frame in _dicts(entry.get("frames")):
        said.append(
            (
                NotLiveReason.NEVER_RETURNS,
                f"{frame.get('name')} runs in a frame that stayed on thread "
                f"{frame.get('thread')}'s stack across {frame.get('across')}: that frame keeps "
                "the old code, so the new code would never run there",
            )
        )
    return said


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
