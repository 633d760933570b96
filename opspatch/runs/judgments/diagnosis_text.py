"""The readable text of a diagnosis: one block per host and the fleet summary (pure)."""

from __future__ import annotations

import time
from collections import Counter

from opspatch.runs.judgments.findings import INFO, FleetDiagnosis, HostReport


def _when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) if epoch else "?"


def render_host(report: HostReport) -> str:
    """The readable report of one host (docs/incident-response.md, `opspatch diagnose`)."""
    lines = [f"== {report.host}: {report.status}"]
    if report.error is not None:
        return "\n".join([*lines, f"  {report.error}"])
    d = report.diagnosis
    assert d is not None
    s = d.server
    if s is not None:
        health = s.health_status if s.health_status is not None else f"no answer ({s.health_error})"
        state = (
            f"pid {s.pid} ({s.found_by}), started {_when(s.started_at)}"
            if s.running
            else f"not running (pid {s.pid}, {s.found_by})"
        )
        lines.append(f"server  {state}; /health {health}")
        if s.cmdline:
            lines.append(f"        {' '.join(s.cmdline)}")
        settings = [f"{k}={v}" for k, v in s.speculative.items()]
        if s.spec_v2_env is not None:
            settings.append(f"SGLANG_ENABLE_SPEC_V2={s.spec_v2_env}")
        if settings:
            lines.append("        speculative: " + ", ".join(settings))
    if d.smoke is not None:
        if d.smoke.ok:
            lines.append(f"decode  ok: {d.smoke.summary()}")
        else:
            crashed = s is not None and s.running_after_decode is False
            lines.append("decode  FAILED" + (" (the server died during it)" if crashed else ""))
            lines += [f"        {failure}" for failure in d.smoke.failures]
    for v in report.files:
        lines.append(f"file    {v.module}: {v.state} ({v.detail})")
        if v.path:
            lines.append(f"        {v.path} sha256 {(v.sha256 or '')[:12]}, install {v.install}")
        c = v.checkout
        if c is not None and c.head is not None:
            lines.append(
                f"        checkout {c.root} at {c.head[:12]} ({c.branch}) {c.subject or ''}".rstrip()
            )
            if c.uncommitted:
                left = c.uncommitted_count - len(c.uncommitted)
                more = f" (+{left} more)" if left > 0 else ""
                lines.append(
                    "        uncommitted: " + ", ".join(u.strip() for u in c.uncommitted) + more
                )
        if v.diff:
            lines.append(f"        diff against {v.diff_against}:")
            lines += ["          " + line for line in v.diff.rstrip("\n").splitlines()]
    log = d.log
    if log is not None:
        lines.append(f"log     {log.path}: {log.basis} (from line {log.first_line})")
        for m in log.markers:
            lines.append(f"        {m.kind}: {m.count}x, first {m.first_time}: {m.line}")
    for e in report.exceptions:
        g = e.group
        lines.append(f"exception {g.exception}")
        lines.append(f"        {g.count}x, {g.when}; {g.context or ''}".rstrip("; "))
        if g.frame:
            lines.append(f"        raised at {g.frame}")
        if e.passed_over is not None:
            lines.append(f"        passed over: logged with a warning ({e.passed_over})")
        for fix in e.fixes:
            lines.append(f"        fixed by: {fix.render()}")
        if e.analysis is not None:
            lines += ["        " + line for line in e.analysis.render().splitlines()]
        if e.note:
            lines.append(f"        {e.note}")
    if report.findings:
        lines.append("findings")
        lines += [
            f"  [{f.level}] {f.text}" + (f": {f.detail}" if f.detail and f.level != INFO else "")
            for f in report.findings
        ]
    return "\n".join(lines)


def render_summary(fleet: FleetDiagnosis) -> str:
    """The fleet summary: host count by status, then each finding with its hosts."""
    counts = Counter(h.status for h in fleet.hosts)
    head = ", ".join(f"{n} {status}" for status, n in counts.items())
    lines = [f"== fleet: {len(fleet.hosts)} host(s): {head}"]
    for finding, hosts in fleet.summary():
        lines.append(f"  [{finding.level}] {finding.text}: {', '.join(hosts)}")
    clean = [h.host for h in fleet.hosts if h.status == "clean"]
    if clean:
        lines.append(f"  clean: {', '.join(clean)}")
    return "\n".join(lines)
