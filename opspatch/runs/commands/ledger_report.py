"""`opspatch ledger report`: the postmortem timeline, from the ledger alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from opspatch.core.codec import Record, json_field
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command, Outcome
from opspatch.errors import LedgerError
from opspatch.ledger.chain import GENESIS_HASH
from opspatch.ledger.records import FileVersion, RunDetail, RunSummary
from opspatch.ledger.store import Ledger
from opspatch.runs.judgments.findings import unified_diff

MAX_RUNS = 100_000
MAX_DIFF_LINES = 300


@dataclass(frozen=True)
class Change(Record):
    """One file version of a run, with the diff between its stored images (when both are)."""

    version: FileVersion = json_field(inline=True)
    diff: str | None = None


@dataclass(frozen=True, kw_only=True)
class ReportRun(Record):
    detail: RunDetail = json_field(inline=True)
    relation: str | None  # "rollback of run X" for a run that undoes another
    changes: tuple[Change, ...]
    rolled_back: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class LedgerReport(Record):
    window: str
    generated_at: str
    ledger_path: str = json_field(key="ledger")
    chain_ok: bool
    head_hash: str
    runs: tuple[ReportRun, ...]


def parse_time(stamp: str) -> datetime:
    """A ledger time (`2026-12-01T00:55:02.123456Z`) as an aware UTC datetime."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(timezone.utc)


def _diff(ledger: Ledger, version: FileVersion) -> str | None:
    try:
        before = ledger.blob(version.sha256_before)
        after = ledger.blob(version.sha256_after)
    except LedgerError:
        return None
    return unified_diff(before, after, version.path.lstrip("/"), MAX_DIFF_LINES)


def _relation(summary: RunSummary) -> str | None:
    if summary.parent_run is None:
        return None
    return f"{summary.command} of run {summary.parent_run}"


def _rolled_back(detail: RunDetail) -> list[str]:
    lines = []
    s = detail.summary
    for host in detail.hosts:
        if host.outcome == Outcome.ROLLED_BACK:
            failed = next((st for st in host.steps if st.status == "failed"), None)
            step = f" at step {failed.step}" if failed else ""
            lines.append(
                f"{host.host}: rolled back by this run{step} because: "
                f"{(host.error or 'no reason recorded').splitlines()[0]}"
            )
        elif host.outcome in (Outcome.RESTORED, Outcome.RESTORED_NOT_SERVING, Outcome.STAGED_BACK):
            undid = f"run {s.parent_run}" if s.parent_run else f"patch {s.patch_id or '?'}"
            lines.append(
                f"{host.host}: restored ({undid}) by `{s.command_line}` ({s.operator})"
                + (f"; note: {host.error}" if host.error else "")
            )
    return lines


def _since(since: timedelta | None, now: datetime) -> tuple[str, datetime]:
    """The window of runs started since `since` ago (default 24 hours), and its start."""
    cutoff = now - (since or timedelta(hours=24))
    return f"runs started since {cutoff:%Y-%m-%d %H:%M:%S} UTC", cutoff


def _window_runs(
    ledger: Ledger, run_id: str | None, since: timedelta | None, now: datetime
) -> tuple[str, list[RunSummary]]:
    runs = ledger.list_runs(limit=MAX_RUNS)  # newest first
    if run_id is None:
        window, cutoff = _since(since, now)
        chosen = [r for r in runs if parse_time(r.started_at) >= cutoff]
        return window, chosen[::-1]
    chain = ledger.run_chain(run_id)  # the run and its ancestors
    root = chain[0]
    keep = {r.run_id for r in chain}
    started = parse_time(chain[-1].started_at)
    for r in reversed(runs):  # oldest first: a descendant comes after its parent
        if r.run_id in keep:
            continue
        follows = r.parent_run in keep
        same_patch = (
            root.patch_id is not None
            and r.patch_id == root.patch_id
            and parse_time(r.started_at) >= started
            and bool(set(r.hosts) & set(root.hosts))
        )
        if follows or same_patch:
            keep.add(r.run_id)
    chosen = [r for r in runs if r.run_id in keep][::-1]
    return f"run {root.run_id} and the runs that followed it up", chosen


def build_report(
    ledger: Ledger,
    *,
    run_id: str | None = None,
    since: timedelta | None = None,
    now: datetime | None = None,
) -> LedgerReport:
    """One run and what followed it up, or every run since `since` ago (default 24 hours)."""
    moment = now or datetime.now(timezone.utc)
    window, summaries = _window_runs(ledger, run_id, since, moment)
    verified = ledger.verify()
    runs = []
    for summary in summaries:
        detail = ledger.get_run(summary.run_id)
        changes = tuple(
            Change(v, _diff(ledger, v)) for host in detail.hosts for v in host.file_versions
        )
        runs.append(
            ReportRun(
                detail=detail,
                relation=_relation(summary),
                changes=changes,
                rolled_back=tuple(_rolled_back(detail)),
            )
        )
    return LedgerReport(
        window=window,
        generated_at=f"{moment:%Y-%m-%dT%H:%M:%SZ}",
        ledger_path=str(ledger.path),
        chain_ok=verified.ok,
        head_hash=verified.head_hash,
        runs=tuple(runs),
    )


def empty_report(
    location: str, *, since: timedelta | None = None, now: datetime | None = None
) -> LedgerReport:
    """A ledger not yet written to (a read must not create the file) reports no run."""
    moment = now or datetime.now(timezone.utc)
    return LedgerReport(
        window=_since(since, moment)[0],
        generated_at=f"{moment:%Y-%m-%dT%H:%M:%SZ}",
        ledger_path=location,
        chain_ok=True,
        head_hash=GENESIS_HASH,
        runs=(),
    )


def cell(value: object) -> str:
    """A Markdown table cell: one line, pipes escaped."""
    text = "" if value is None else str(value)
    text = " ".join(text.split("\n")).replace("|", "\\|")
    return text if len(text) <= 300 else text[:297] + "..."


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def _longest_backticks(text: str) -> int:
    """The longest run of backticks in `text` (a code fence must be longer)."""
    longest, current = 0, 0
    for ch in text:
        current = current + 1 if ch == "`" else 0
        longest = max(longest, current)
    return longest


def _short(stamp: str | None) -> str:
    return "" if not stamp else parse_time(stamp).strftime("%Y-%m-%d %H:%M:%S")


def render_markdown(report: LedgerReport) -> str:
    """A table of runs, then each run's steps, changes (with diffs) and what it rolled back."""
    verify = remedy_text(Command.LEDGER_VERIFY)
    chain = "intact" if report.chain_ok else f"BROKEN (run `{verify}`)"
    lines = [
        "# opspatch ledger report",
        "",
        f"{report.window}; {len(report.runs)} run(s). Generated {report.generated_at} from "
        f"`{report.ledger_path}` (hash chain {chain}, head `{report.head_hash[:16]}`).",
        "",
        "## Runs",
        "",
    ]
    lines += table(
        ("started (UTC)", "run", "command", "patch", "operator", "controller", "hosts", "outcome"),
        [
            (
                _short(r.detail.summary.started_at),
                r.detail.run_id,
                r.detail.summary.command,
                r.detail.summary.patch_id or "",
                r.detail.summary.operator,
                f"{r.detail.summary.controller.hostname} (pid {r.detail.summary.controller.pid})",
                ", ".join(r.detail.summary.hosts),
                r.detail.summary.outcome or str(r.detail.summary.status),
            )
            for r in report.runs
        ],
    )
    if not report.runs:
        lines += ["", "No run in this window."]
    for r in report.runs:
        lines += ["", *_render_run(r)]
    return "\n".join(lines) + "\n"


def _render_run(r: ReportRun) -> list[str]:
    s = r.detail.summary
    lines = [f"## {s.command} {s.patch_id or ''} (run {s.run_id})".replace("  ", " "), ""]
    lines.append(f"- who: {s.operator} on {s.controller.hostname} (pid {s.controller.pid})")
    lines.append(f"- command line: `{s.command_line}`")
    ended = f", finished {_short(s.finished_at)}" if s.finished_at else ""
    lines.append(f"- started {_short(s.started_at)}{ended}; {s.status}, outcome {s.outcome or '-'}")
    if r.relation:
        lines.append(f"- {r.relation}")
    if s.recovered_by:
        lines.append(f"- recovered by run {s.recovered_by}")
    if s.approved_by:
        lines.append(f"- patch approved by: {', '.join(s.approved_by)}")
    lines += ["", "### Steps", ""]
    steps = sorted(
        ((host.host, step) for host in r.detail.hosts for step in host.steps),
        key=lambda item: item[1].event_id,  # the order the ledger recorded them in
    )
    rows = [
        (_short(step.recorded_at), host, step.step, step.status,
         "" if step.seconds is None else f"{step.seconds:.2f}", step.detail)
        for host, step in steps
        if step.status != "started"
    ]  # fmt: skip
    lines += table(("time (UTC)", "host", "step", "status", "seconds", "detail"), rows)
    lines += ["", "### Outcomes", ""]
    lines += table(
        ("host", "outcome", "error"),
        [(h.host, h.outcome or "(none recorded)", h.error or "") for h in r.detail.hosts],
    )
    if r.changes:
        lines += ["", "### Changes", ""]
        lines += table(
            ("time (UTC)", "host", "file", "action", "sha256 before", "sha256 after"),
            [
                (_short(c.version.recorded_at), c.version.host, c.version.path, c.version.action,
                 c.version.sha256_before[:12], c.version.sha256_after[:12])
                for c in r.changes
            ],
        )  # fmt: skip
        for c in r.changes:
            if c.diff:
                lines += ["", f"{c.version.host}: `{c.version.path}` ({c.version.action})", ""]
                fence = "`" * max(3, _longest_backticks(c.diff) + 1)
                lines += [f"{fence}diff", c.diff.rstrip("\n"), fence]
    if r.rolled_back:
        lines += ["", "### Rolled back", ""]
        lines += [f"- {line}" for line in r.rolled_back]
    return lines
