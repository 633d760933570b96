"""Judging what `diagnose` read on a host: pure functions from facts to findings, and their text."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opspatch.analysis.fixes import FixMatch
from opspatch.analysis.missingattr import MissingAttributeReport
from opspatch.core.codec import Record, json_field
from opspatch.core.vocabulary import FileAction, FileState, FindingLevel
from opspatch.errors import EXIT_HOST_FAILED, EXIT_OK
from opspatch.hosts.diagnosis import (
    CachedBytecode,
    Checkout,
    HostDiagnosis,
    InstalledCopy,
    LogWindow,
    ModuleDiagnosis,
    TracebackGroup,
)
from opspatch.hosts.image import BakedLabels
from opspatch.hosts.results import RemoteFile
from opspatch.ledger.records import FileVersion
from opspatch.runs.judgments.patchset import Place, read_file
from opspatch.runs.judgments.views import file_state, unresolved_state

PROBLEM, WARNING, INFO = FindingLevel.PROBLEM, FindingLevel.WARNING, FindingLevel.INFO
MAX_DIFF_LINES = 400


@dataclass(frozen=True)
class Finding(Record):
    """`text` reads the same on every host that has it (so hosts group in the summary); `detail` is
    this host's particulars."""

    kind: str
    level: FindingLevel
    text: str
    detail: str = ""


@dataclass(frozen=True)
class FileVerdict(Record):
    """Where one imported file stands, and what else bears on the code the server runs."""

    module: str
    state: FileState
    detail: str
    path: str | None = None
    sha256: str | None = None
    install: str = "unknown"  # wheel | editable | unknown
    patch_id: str | None = json_field(key="patch", default=None)
    run_id: str | None = None
    diff: str | None = None
    diff_against: str | None = None
    checkout: Checkout | None = None
    copies: tuple[InstalledCopy, ...] = ()
    stale_bytecode: tuple[CachedBytecode, ...] = ()
    server_older_than_file: bool | None = None
    changed_after_log_start: bool | None = None


@dataclass(frozen=True)
class ExceptionReport:
    """One logged exception, the patches that declare they fix it, and for a missing attribute its
    class's source as the host has it."""

    group: TracebackGroup
    fixes: tuple[FixMatch, ...] = ()
    analysis: MissingAttributeReport | None = None
    note: str | None = None
    passed_over: str | None = None  # the `ignore_patterns` entry each traceback was logged with

    def to_json(self) -> dict[str, Any]:
        g = self.group
        return {
            "type": g.type,
            "message": g.message,
            "count": g.count,
            "first_time": g.first_time,
            "last_time": g.last_time,
            "frame": g.frame,
            "context": g.context,
            "fixed_by": [f.to_json() for f in self.fixes],
            "missing_attribute": self.analysis.to_json() if self.analysis else None,
            "note": self.note,
            "passed_over": self.passed_over,
        }


@dataclass(frozen=True)
class HostReport:
    """Everything `diagnose` says about one host (an unreachable host is a report too)."""

    host: str
    diagnosis: HostDiagnosis | None
    files: tuple[FileVerdict, ...] = ()
    exceptions: tuple[ExceptionReport, ...] = ()
    findings: tuple[Finding, ...] = ()
    error: str | None = None

    @property
    def status(self) -> str:
        """`unreachable`, `healthy-but-crashing`, `down`, `attention` or `clean`."""
        if self.error is not None:
            return "unreachable"
        kinds = {f.kind for f in self.findings}
        if "healthy-but-crashing" in kinds:
            return "healthy-but-crashing"
        if "server-down" in kinds:
            return "down"
        return "attention" if any(f.level == PROBLEM for f in self.findings) else "clean"

    def to_json(self) -> dict[str, Any]:
        d = self.diagnosis
        server = d.server if d else None
        log = d.log if d else None
        return {
            "host": self.host,
            "status": self.status,
            "error": self.error,
            "findings": [f.to_json() for f in self.findings],
            "files": [f.to_json() for f in self.files],
            "server": None
            if server is None
            else {**server.__dict__, "cmdline": list(server.cmdline)},
            "decode": d.smoke.to_json() if d and d.smoke else None,
            "log": None
            if log is None
            else {
                "path": log.path,
                "basis": log.basis,
                "first_line": log.first_line,
                "size": log.size,
                "truncated": log.truncated,
                "markers": [m.__dict__ for m in log.markers],
            },
            "exceptions": [e.to_json() for e in self.exceptions],
            "facts": d.facts.to_json() if d and d.facts else None,
            "sources_left_out": list(d.sources_left_out) if d else [],
        }


@dataclass(frozen=True)
class FleetDiagnosis:
    """Every host's report; `summary()` groups hosts by finding."""

    hosts: tuple[HostReport, ...]
    modules: tuple[str, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        """0 when every host is clean, 1 otherwise (an unreachable host included)."""
        return EXIT_OK if all(h.status == "clean" for h in self.hosts) else EXIT_HOST_FAILED

    def summary(self) -> list[tuple[Finding, tuple[str, ...]]]:
        """Problems first, in order of first appearance."""
        groups: dict[tuple[str, str, str], tuple[Finding, list[str]]] = {}
        for report in self.hosts:
            for finding in report.findings:
                key = (finding.level, finding.kind, finding.text)
                groups.setdefault(key, (finding, []))[1].append(report.host)
        order = {PROBLEM: 0, WARNING: 1, INFO: 2}
        ranked = sorted(groups.values(), key=lambda item: order.get(item[0].level, 3))
        return [(finding, tuple(hosts)) for finding, hosts in ranked]

    def to_json(self) -> dict[str, Any]:
        return {
            "modules": list(self.modules),
            "hosts": [h.to_json() for h in self.hosts],
            "summary": [{**f.to_json(), "hosts": list(hosts)} for f, hosts in self.summary()],
            "status": {h.host: h.status for h in self.hosts},
        }


# ---------------------------------------------------------------------------------------------
# one file


def module_relpath(module: str, path: str | None) -> str:
    """The file's path relative to the package root (`sglang/srt/x.py`), for diff headers."""
    base = module.replace(".", "/")
    if path and path.endswith("/__init__.py"):
        return base + "/__init__.py"
    return base + ".py"


def unified_diff(
    before: bytes, after: bytes, relpath: str, max_lines: int | None = MAX_DIFF_LINES
) -> str:
    """`before` -> `after` as a unified diff with a/ b/ paths (at most `max_lines` lines)."""
    old = before.decode("utf-8", "replace").splitlines(keepends=True)
    new = after.decode("utf-8", "replace").splitlines(keepends=True)
    lines = list(difflib.unified_diff(old, new, f"a/{relpath}", f"b/{relpath}"))
    kept = [line if line.endswith("\n") else line + "\n" for line in lines]
    if max_lines is not None and len(kept) > max_lines:
        return "".join(kept[:max_lines]) + f"[... {len(kept) - max_lines} more lines]\n"
    return "".join(kept)


def install_shape(m: ModuleDiagnosis) -> str:
    if m.record_sha256:
        return "wheel"
    if (m.installed and m.installed.get("editable")) or (m.checkout and m.checkout.head):
        return "editable"
    return "unknown"


def judge_file(
    m: ModuleDiagnosis,
    history: Sequence[FileVersion],
    texts: Mapping[str, bytes],
    copy_sources: Mapping[str, str],
    baked: BakedLabels | None = None,
) -> FileVerdict:
    """`texts`: known bytes by sha256 (other hosts' RECORD-verified copies, the ledger's images)."""
    if m.error is not None or m.file is None:
        return FileVerdict(m.module, unresolved_state(m.error_code), m.error or "not read")
    f = m.file
    live, common = f.sha256, _what_else(m, f)
    reference, label = _reference(m)
    standing = read_file(
        f.realpath,
        live,
        history,
        [v for v in history if v.action == FileAction.PATCH],
        pristine=reference,
        baked=baked,
    )
    state = file_state(standing)
    if baked is not None and standing.place == Place.BAKED:  # an earlier container's write is moot
        return FileVerdict(
            m.module,
            state,
            f"baked into the container's image by run {baked.run_id} (patch {baked.patch_id}, "
            f"FROM {baked.base})",
            patch_id=baked.patch_id,
            run_id=baked.run_id,
            **common,
        )
    if standing.place == Place.NEW:
        assert standing.located is not None
        written = standing.located.version
        return FileVerdict(
            m.module,
            state,
            f"written by run {written.run_id} (patch {written.patch_id})",
            patch_id=written.patch_id,
            run_id=written.run_id,
            **common,
        )
    if state == FileState.PRISTINE:
        restored = next((v for v in history if v.sha256_after == live), None)
        again = f"; put back by run {restored.run_id}" if restored else ""
        return FileVerdict(m.module, state, f"matches {label}{again}", **common)
    if state == FileState.UNKNOWN:
        first = history[-1] if history else None
        said = (
            f"equals the bytes run {first.run_id} found before its change"
            if first is not None and first.sha256_before == live
            else "no RECORD entry and no git checkout to compare it with"
        )
        return FileVerdict(m.module, state, said, **common)
    assert reference is not None
    diff, against = _edit_diff(m, history, texts, copy_sources, reference, label)
    detail = f"sha256 {live[:12]} is not {label} ({reference[:12]})"
    latest = history[0] if history else None
    if latest is not None and latest.action == FileAction.PATCH:
        detail += f"; changed since run {latest.run_id} wrote {latest.sha256_after[:12]}"
    if diff is None:
        detail += "; no pristine text known to diff against (RECORD holds only its hash)"
    return FileVerdict(m.module, state, detail, diff=diff, diff_against=against, **common)


def _what_else(m: ModuleDiagnosis, f: RemoteFile) -> dict[str, Any]:
    """A resolved file's verdict's other fields: what else bears on the code the server runs."""
    return {
        "path": f.realpath,
        "sha256": f.sha256,
        "install": install_shape(m),
        "checkout": m.checkout,
        "copies": m.copies,
        "stale_bytecode": tuple(b for b in m.bytecode if b.runs_old_code),
        "server_older_than_file": m.server_older_than_file,
        "changed_after_log_start": m.changed_after_log_start,
    }


def _reference(m: ModuleDiagnosis) -> tuple[str | None, str | None]:
    """pip's RECORD, else the checkout's git HEAD; (None, None) when neither is known."""
    if m.record_sha256:
        return m.record_sha256, f"the RECORD of {m.distribution} {m.distribution_version}"
    if m.checkout and m.checkout.head_sha256 and m.checkout.head:
        return m.checkout.head_sha256, f"git HEAD {m.checkout.head[:12]}"
    return None, None


def _edit_diff(
    m: ModuleDiagnosis,
    history: Sequence[FileVersion],
    texts: Mapping[str, bytes],
    copy_sources: Mapping[str, str],
    reference: str,
    label: str | None,
) -> tuple[str | None, str | None]:
    """Against what opspatch last wrote, else the checkout's diff, a known pristine copy, or the
    first recorded pre-image."""
    assert m.file is not None
    content, relpath = m.file.content, module_relpath(m.module, m.file.realpath)
    latest = history[0] if history else None
    if latest is not None and latest.action == FileAction.PATCH and latest.sha256_after in texts:
        against = f"what run {latest.run_id} ({latest.patch_id}) wrote"
        return unified_diff(texts[latest.sha256_after], content, relpath), against
    if m.checkout and m.checkout.diff:
        return m.checkout.diff, label
    if reference in texts:
        against = f"{label} ({copy_sources.get(reference, 'known copy')})"
        return unified_diff(texts[reference], content, relpath), against
    if history and history[-1].sha256_before in texts:
        against = f"the pre-image run {history[-1].run_id} recorded"
        return unified_diff(texts[history[-1].sha256_before], content, relpath), against
    return None, None


# ---------------------------------------------------------------------------------------------
# one host


_STATE_FINDINGS = {
    FileState.EDITED_OUTSIDE: ("edited-outside", PROBLEM, "{} edited outside opspatch"),
    FileState.PATCHED_BY_OPSPATCH: ("patched-by-opspatch", INFO, "{} patched by opspatch ({})"),
    FileState.UNKNOWN: ("provenance-unknown", WARNING, "{}: cannot tell if pristine"),
    FileState.UNRESOLVED: ("module-unresolved", WARNING, "{} does not resolve"),
}
"""The finding a file's state makes (kind, level, text of the module and its patch)."""


def _file_findings(v: FileVerdict, server_running: bool) -> list[Finding]:
    found: list[Finding] = []
    if v.state in _STATE_FINDINGS:
        kind, level, text = _STATE_FINDINGS[v.state]
        diff = f"; diff against {v.diff_against}" if v.diff else ""
        detail = f"{v.path}: {v.detail}{diff}" if v.state == FileState.EDITED_OUTSIDE else v.detail
        found.append(Finding(kind, level, text.format(v.module, v.patch_id), detail))
    if v.stale_bytecode:
        found.append(
            Finding(
                "stale-bytecode",
                PROBLEM,
                f"stale bytecode for {v.module}: the next import runs old code",
                "; ".join(f"{b.path}: {b.verdict}" for b in v.stale_bytecode),
            )
        )
    if v.server_older_than_file and server_running:
        found.append(
            Finding(
                "server-runs-old-code",
                PROBLEM,
                f"the server started before {v.module} last changed: it still runs the old code",
                f"{v.path}",
            )
        )
    elif v.changed_after_log_start and not server_running:
        found.append(
            Finding(
                "changed-after-start",
                WARNING,
                f"{v.module} changed after the server's last start: the logged crash ran the "
                "earlier code",
                f"{v.path}",
            )
        )
    present = [c for c in v.copies if c.exists]
    paths = list(dict.fromkeys(c.path for c in present))
    if len(paths) > 1:
        imported = next((c.path for c in present if c.imported), "?")
        others = [f"{c.path} ({c.kind} via {c.via})" for c in present if c.path != imported]
        found.append(
            Finding(
                "other-copies",
                WARNING,
                f"{len(paths)} copies of {v.module.split('.')[0]} installed",
                f"imported: {imported}; also: " + "; ".join(dict.fromkeys(others)),
            )
        )
    for stale in (c for c in v.copies if not c.exists):
        found.append(
            Finding(
                "stale-link",
                WARNING,
                f"stale {stale.kind} for {v.module.split('.')[0]}",
                f"{stale.via} points to {stale.path}, which does not exist",
            )
        )
    return found


def _checkout_findings(verdicts: Sequence[FileVerdict]) -> list[Finding]:
    """The incident's fleet ran a local feature patch under the fix: said once per checkout."""
    found: list[Finding] = []
    seen: set[str] = set()
    ours = {
        (v.checkout.root, v.checkout.relpath)
        for v in verdicts
        if v.checkout and v.state == FileState.PATCHED_BY_OPSPATCH
    }
    for v in verdicts:
        c = v.checkout
        if c is None or c.root in seen:
            continue
        seen.add(c.root)
        if c.error:
            found.append(
                Finding(
                    "checkout-unreadable",
                    WARNING,
                    "git checkout not readable",
                    f"{c.root}: {c.error}",
                )
            )
            continue
        changes = [line.strip() for line in c.uncommitted if (c.root, line[3:]) not in ours]
        if changes:
            found.append(
                Finding(
                    "uncommitted-changes",
                    WARNING,
                    f"uncommitted changes in the checkout (HEAD {(c.head or '?')[:12]})",
                    f"{c.root}: "
                    + ", ".join(changes[:10])
                    + (" ..." if c.uncommitted_count > 10 else ""),
                )
            )
    return found


def crashed_after_ready(d: HostDiagnosis) -> bool:
    log = d.log
    if log is None:
        return False
    ready = log.marker("ready")
    if ready is None:
        return False
    crash = log.marker("scheduler-exception")
    after = [t for t in log.tracebacks if t.first_line_number > ready.line_number]
    return bool(after) or (crash is not None and crash.line_number > ready.line_number)


def judge_host(
    d: HostDiagnosis, files: Sequence[FileVerdict], exceptions: Sequence[ExceptionReport]
) -> HostReport:
    """One host's findings from what it showed and the judged files."""
    found: list[Finding] = []
    server = d.server
    running = bool(server and server.running)
    for verdict in files:
        found += _file_findings(verdict, running)
    found += _checkout_findings(files)
    found += _serving_findings(d)
    if d.log is not None:
        found += _log_findings(d.log)
    found += _exception_findings(exceptions)
    return HostReport(d.host, d, tuple(files), tuple(exceptions), tuple(found))


def _serving_findings(d: HostDiagnosis) -> list[Finding]:
    """What the server and its smoke decode showed: down, unhealthy, or healthy but crashing."""
    found: list[Finding] = []
    server = d.server
    decode_failed = d.smoke is not None and not d.smoke.ok
    healthy = server is not None and server.health_status == 200
    if (decode_failed and healthy) or crashed_after_ready(d):
        why = (
            "/health answered 200, but a real decode failed"
            if decode_failed and healthy
            else "the server reported ready, then crashed on a request"
        )
        detail = d.smoke.failures[0] if decode_failed and d.smoke and d.smoke.failures else ""
        found.append(
            Finding("healthy-but-crashing", PROBLEM, f"healthy but crashing: {why}", detail)
        )
    elif decode_failed and d.smoke:
        found.append(
            Finding(
                "decode-failed", PROBLEM, "the smoke decode failed", "; ".join(d.smoke.failures)
            )
        )
    if server is not None:
        if not server.running:
            found.append(
                Finding(
                    "server-down",
                    PROBLEM,
                    "the server is not running",
                    f"pid {server.pid} ({server.found_by})",
                )
            )
        elif server.health_status != 200:
            found.append(
                Finding(
                    "health-failed",
                    PROBLEM,
                    f"/health answers {server.health_status or 'nothing'}",
                    server.health_error or "",
                )
            )
    return found


def _log_findings(log: LogWindow) -> list[Finding]:
    """What the server log showed: missing, read from its tail, and the markers it holds."""
    found: list[Finding] = []
    if not log.exists:
        found.append(Finding("no-log", WARNING, "no server log", log.path))
    if log.truncated:
        found.append(Finding("log-truncated", INFO, "log read from its tail only", log.basis))
    for marker, level, text in (
        ("scheduler-exception", PROBLEM, "Scheduler hit an exception"),
        ("warmup-failed", PROBLEM, "warm-up failed"),
        ("cuda-oom", PROBLEM, "CUDA out of memory"),
        ("cuda-graph-capture-failed", WARNING, "CUDA graph capture failed"),
    ):
        hit = log.marker(marker)
        if hit is not None:
            found.append(Finding(marker, level, text, f"{hit.count}x, first: {hit.line}"))
    return found


def _exception_findings(exceptions: Sequence[ExceptionReport]) -> list[Finding]:
    """Each exception group the log showed, and each patch that declares it fixes one."""
    found: list[Finding] = []
    for report in exceptions:
        g = report.group
        detail = f"{g.count}x, {g.when}" + (f", at {g.frame}" if g.frame else "")
        if report.passed_over is not None:
            detail += f"; logged with a warning the playbook passes over ({report.passed_over})"
        found.append(
            Finding("exception", INFO if report.passed_over else PROBLEM, g.exception, detail)
        )
        for fix in report.fixes:
            found.append(
                Finding(
                    "fix-available",
                    INFO,
                    f"patch {fix.patch_id} declares it fixes {g.type}",
                    fix.summary,
                )
            )
    return found
