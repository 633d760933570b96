"""`opspatch diagnose`: what every host really runs and why it crashed, read, never changed."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from opspatch.analysis.fixes import FixMatch, RaisedException, patches_fixing
from opspatch.analysis.missingattr import analyze_missing_attribute, parse_missing_attribute
from opspatch.core.host import Host
from opspatch.core.policy import Playbook, StepTimeouts
from opspatch.core.spec import LoadedPatch, PatchSpec
from opspatch.core.vocabulary import FileState
from opspatch.errors import HostError, InputError, LedgerError, OpspatchError, TargetError
from opspatch.hosts.diagnosis import DiagnoseRequest, HostDiagnosis, ModuleDiagnosis, diagnose_host
from opspatch.hosts.engine import EXEC_MARGIN, smoke_args
from opspatch.hosts.image import BakedLabels
from opspatch.hosts.live import LiveEngineReply
from opspatch.hosts.operations import HostOperations
from opspatch.ledger.records import FileVersion
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.live import list_fixes
from opspatch.runs.fleet.connect import TransportFactory, opened
from opspatch.runs.fleet.executor import map_hosts
from opspatch.runs.fleet.session import describe_error
from opspatch.runs.judgments.findings import (
    INFO,
    PROBLEM,
    WARNING,
    ExceptionReport,
    FileVerdict,
    Finding,
    FleetDiagnosis,
    HostReport,
    judge_file,
    judge_host,
)
from opspatch.runs.judgments.live import HeldFix, drift, held_fixes
from opspatch.runs.judgments.patchset import baked_in, recreated_since

MAX_HOSTS_AT_ONCE = 16


@dataclass(frozen=True)
class DiagnoseOptions:
    """How far to look; `decode` runs the smoke decode (it may crash a broken server), each of
    `modules` must resolve on some host."""

    since_seconds: float | None = None
    decode: bool = False
    playbook: Playbook = field(default_factory=Playbook)
    modules: tuple[str, ...] = ()
    max_log_read: int | None = None


def _read(
    host: Host, factory: TransportFactory, request: DiagnoseRequest, timeout: float
) -> HostDiagnosis | str:
    try:
        with opened(factory, host) as ops:
            live = _live_list(ops)
            if isinstance(live, LiveEngineReply):  # a fix's module is judged too (its drift)
                held = [h.module for h in held_fixes(live) if h.module]
                more = tuple(m for m in dict.fromkeys(held) if m not in request.modules)
                request = replace(request, modules=(*request.modules, *more))
            found = diagnose_host(ops, request, timeout=timeout)
            return replace(
                found,
                container=ops.transport.container,
                live=live if not isinstance(live, str) else None,
                live_error=live if isinstance(live, str) else None,
            )
    except InputError as exc:
        return exc.render()
    except OpspatchError as exc:
        return describe_error(exc)


def _live_list(ops: HostOperations) -> LiveEngineReply | str | None:
    """On a `live = true` host only; why not, when the engine cannot be asked."""
    if not ops.host.live:
        return None
    try:
        return list_fixes(ops)
    except OpspatchError as exc:
        return describe_error(exc)


def _with_live(report: HostReport, d: HostDiagnosis) -> HostReport:
    """Each live fix in memory (a warning when the file drifted from it), and a problem when
    the engine could not be fully listed: a clean report must not stand on a look not made.
    A fix taken live from the file's very bytes replaces `server-runs-old-code`."""
    found: list[Finding] = []
    silent = [p.describe() for p in d.live.processes() if not p.ok] if d.live else []
    if d.live is not None and d.live.unread:
        silent.append(d.live.missing or "its processes could not be asked")
    unread = d.live_error or "; ".join(silent)
    if unread:
        found.append(
            Finding(
                "live-fixes-unread", PROBLEM, "the engine's live fixes could not be listed", unread
            )
        )
    if d.live is None:
        return replace(report, findings=(*report.findings, *found)) if found else report
    files = {m.module: m.file for m in d.modules if m.file is not None}
    stale = {m.module for m in d.modules if m.server_older_than_file}
    by_fix: dict[str, list[HeldFix]] = {}
    for held in held_fixes(d.live):
        by_fix.setdefault(held.fix_id, []).append(held)
    running_live: set[str] = set()
    for fix_id, holders in by_fix.items():
        module = holders[0].module or "its module"
        file = files.get(module)
        on_disk = file.sha256 if file is not None else None
        drifted = [s for h in holders if (s := drift(h, on_disk))]
        who = ", ".join(h.process for h in holders)
        detail = (
            f"{fix_id} ({', '.join(holders[0].names)}) taken from {module} sha256 "
            f"{(holders[0].sha256 or '?')[:12]}, held by "
            + ", ".join(f"{h.process} (pid {h.pid})" if h.pid else h.process for h in holders)
        )
        if drifted:
            found.append(
                Finding(
                    "live-fix-drift",
                    WARNING,
                    f"live fix {fix_id} in memory disagrees with the file",
                    "; ".join(drifted),
                )
            )
        elif not unread and file is not None and module in stale:
            running_live.add(file.realpath)
            found.append(
                Finding(
                    "live-fix",
                    INFO,
                    f"the server started before {module} last changed and runs it live as "
                    f"{fix_id} in {who}",
                    f"{detail}: the file's very bytes; the file carries it for the next restart",
                )
            )
        else:
            found.append(
                Finding("live-fix", INFO, f"live fix {fix_id} is held in memory by {who}", detail)
            )
    kept = tuple(  # its detail is the file's path
        f
        for f in report.findings
        if not (f.kind == "server-runs-old-code" and f.detail in running_live)
    )
    return replace(report, findings=(*kept, *found))


def read_hosts(
    hosts: Sequence[Host],
    factory: TransportFactory,
    request_for: Mapping[str, DiagnoseRequest],
    timeout: float,
) -> dict[str, HostDiagnosis | str]:
    """One `diagnose` exec per host, in parallel: the diagnosis, or why not (a string)."""
    by_name = {h.name: h for h in hosts}
    return map_hosts(
        lambda name: _read(by_name[name], factory, request_for[name], timeout),
        list(by_name),
        limit=MAX_HOSTS_AT_ONCE,
    )


def _require_resolving(modules: Sequence[str], found: Mapping[str, HostDiagnosis | str]) -> None:
    read = [d for d in found.values() if isinstance(d, HostDiagnosis)]
    for module in modules:
        errors = [d.module(module).error for d in read if d.module(module).error]
        if read and len(errors) == len(read):
            raise TargetError(
                f"module {module!r} does not resolve on any host read: {errors[0]}",
                hint="check the module name and the hosts' engine.python",
            )


def reference_texts(
    found: Mapping[str, HostDiagnosis | str],
) -> tuple[dict[str, bytes], dict[str, str]]:
    """Bytes by sha256 from the fleet itself (RECORD-verified files, checkouts' HEADs), and
    where each came from."""
    texts: dict[str, bytes] = {}
    sources: dict[str, str] = {}
    for host, d in found.items():
        if not isinstance(d, HostDiagnosis):
            continue
        for m in d.modules:
            if m.file is not None and m.record_sha256 == m.file.sha256:
                texts.setdefault(m.file.sha256, m.file.content)
                sources.setdefault(m.file.sha256, f"RECORD-verified copy on {host}")
            c = m.checkout
            if c is not None and c.head_sha256:
                if c.head_content is not None:
                    texts.setdefault(c.head_sha256, c.head_content)
                elif m.file is not None and m.file.sha256 == c.head_sha256:
                    texts.setdefault(c.head_sha256, m.file.content)
                sources.setdefault(c.head_sha256, f"git HEAD on {host}")
    return texts, sources


def _ledger_texts(ledger: Ledger | None, wanted: set[str], texts: dict[str, bytes]) -> None:
    if ledger is None:
        return
    for sha in sorted(wanted - set(texts)):
        try:
            texts[sha] = ledger.blob(sha)
        except LedgerError:
            continue  # not stored, or altered (then `ledger verify` says so): not a reference


def analyse_exceptions(
    d: HostDiagnosis, specs: Sequence[PatchSpec], ignore: Sequence[str] = ()
) -> tuple[ExceptionReport, ...]:
    """Each logged exception with the patches that fix it, a missing attribute explained from
    the host's source; one `ignore` names is passed over, as the smoke passes it."""
    reports = []
    for group in d.log.tracebacks if d.log else ():
        fixes: tuple[FixMatch, ...] = ()
        if group.type:
            fixes = patches_fixing(RaisedException(group.type, group.message or ""), specs)
        missing = parse_missing_attribute(group.message or "") if group.type else None
        analysis, note = None, None
        if missing is not None and str(group.type).endswith("AttributeError"):
            defines = re.compile(rf"^\s*class\s+{re.escape(missing.class_name)}\b", re.M)
            candidates = [p for p in (group.file or "", *sorted(d.sources)) if p in d.sources]
            main = next((p for p in candidates if defines.search(d.sources[p])), None)
            if main is None and candidates:
                main = candidates[0]
            if main is None:
                note = "the source of the class was not read from the host"
            else:
                related = {p: t for p, t in d.sources.items() if p != main}
                try:
                    analysis = analyze_missing_attribute(
                        d.sources[main],
                        main,
                        missing,
                        related=related,
                        log_text=d.log.text if d.log else None,
                    )
                except InputError as exc:
                    note = f"not analysed: {exc.message}"
            changed = [
                m for m in d.modules
                if m.file is not None and m.file.realpath == main and m.changed_after_log_start
            ]  # fmt: skip
            if changed:
                note = (
                    f"{main} changed after the server's last start: the analysis reads the file "
                    "as it is now, the logged exception ran the earlier one"
                )
            if d.sources_left_out:
                note = (note + "; " if note else "") + (
                    f"{len(d.sources_left_out)} related file(s) not read (size bound)"
                )
        passed = d.log.passed_over(group, ignore) if d.log else None
        reports.append(ExceptionReport(group, tuple(fixes), analysis, note, passed))
    return tuple(reports)


def diagnose_fleet(
    hosts: Sequence[Host],
    patches: Sequence[LoadedPatch],
    factory: TransportFactory,
    ledger: Ledger | None,
    options: DiagnoseOptions,
) -> FleetDiagnosis:
    """Never raises for a host-level problem; TargetError: a named module resolves nowhere."""
    modules = tuple(
        dict.fromkeys([q.target.module for p in patches for q in p.parts] + list(options.modules))
    )
    timeouts: StepTimeouts = options.playbook.timeouts
    requests = {
        h.name: DiagnoseRequest(
            modules=modules,
            since_seconds=options.since_seconds,
            max_log_read=options.max_log_read,
            smoke=smoke_args(h, options.playbook, log_offset=None) if options.decode else None,
            traceback_sources=True,
        )
        for h in hosts
    }
    timeout = timeouts.inspect + (timeouts.smoke if options.decode else 0.0) + EXEC_MARGIN
    found = read_hosts(hosts, factory, requests, timeout)
    _require_resolving(options.modules, found)
    texts, copy_sources = reference_texts(found)
    histories: dict[tuple[str, str], list[FileVersion]] = {}
    wanted: set[str] = set()
    for name, d in found.items():
        if not isinstance(d, HostDiagnosis):
            continue
        for m in d.modules:
            if m.file is None:
                continue
            history = ledger.file_history(name, m.file.realpath) if ledger else []
            histories[(name, m.module)] = history
            wanted |= {m.record_sha256} if m.record_sha256 else set()
            if history:
                wanted |= {history[0].sha256_after, history[-1].sha256_before}
    _ledger_texts(ledger, wanted, texts)
    for sha in wanted & set(texts):
        copy_sources.setdefault(sha, "the ledger's copy")
    specs = [p.spec for p in patches]
    reports: list[HostReport] = []
    for host in hosts:
        d = found[host.name]
        if not isinstance(d, HostDiagnosis):
            reports.append(HostReport(host.name, None, error=d))
            continue
        files: list[FileVerdict] = [
            judge_file(
                m, histories.get((host.name, m.module), []), texts, copy_sources, _baked(d, m)
            )
            for m in d.modules
        ]
        files = [
            f for f in files if f.state != FileState.NOT_INSTALLED or f.module in options.modules
        ]
        ignore = options.playbook.log.ignore_patterns
        report = judge_host(d, files, analyse_exceptions(d, specs, ignore))
        reports.append(_with_live(_with_recreated(report, d, histories), d))
    return FleetDiagnosis(tuple(reports), modules)


def _baked(d: HostDiagnosis, m: ModuleDiagnosis) -> BakedLabels | None:
    return baked_in(d.container, m.file.realpath, m.file.sha256) if m.file is not None else None


def _with_recreated(
    report: HostReport,
    d: HostDiagnosis,
    histories: Mapping[tuple[str, str], Sequence[FileVersion]],
) -> HostReport:
    """A problem for each module last patched in another container (recreated: fix gone)."""
    found = [
        Finding("container-recreated", PROBLEM, "the fix is no longer there", said)
        for m in d.modules
        if not _baked(d, m)
        and (said := recreated_since(histories.get((d.host, m.module), []), None, d.container))
    ]
    return replace(report, findings=(*found, *report.findings)) if found else report


@dataclass(frozen=True)
class ModuleSource:
    """A module's source, shared by the hosts with the same bytes; `related`: its package's."""

    hosts: tuple[str, ...]
    path: str
    text: str
    sha256: str
    related: Mapping[str, str]
    distribution: str | None
    version: str | None


def read_module(
    hosts: Sequence[Host],
    factory: TransportFactory,
    request: DiagnoseRequest,
    timeout: float,
    *,
    unread: str = "could not be read",
) -> dict[str, HostDiagnosis]:
    """Every host read about `request`'s one module. Raises HostError (a host not read) or
    TargetError (the module does not resolve there)."""
    (module,) = request.modules
    found = read_hosts(hosts, factory, {h.name: request for h in hosts}, timeout)
    read: dict[str, HostDiagnosis] = {}
    for host in hosts:
        d = found[host.name]
        if not isinstance(d, HostDiagnosis):
            raise HostError(f"{unread}: {d}", host=host.name, step="read")
        m = d.module(module)
        if m.error is not None or m.file is None:
            raise TargetError(
                f"[{host.name}] module {module!r} does not resolve: {m.error}",
                hint="check the module name and the host's engine.python",
            )
        read[host.name] = d
    return read


def read_module_sources(
    hosts: Sequence[Host], factory: TransportFactory, module: str, *, timeout: float
) -> list[ModuleSource]:
    """The module's source on every host, one entry per distinct text; InputError: not UTF-8."""
    request = DiagnoseRequest(
        modules=(module,), server=False, log=False, source_modules=(module,), facts=False
    )
    found = read_module(hosts, factory, request, timeout)
    distinct: dict[str, ModuleSource] = {}
    for host in hosts:
        d = found[host.name]
        m = d.module(module)
        assert m.file is not None
        sha = m.file.sha256
        if sha in distinct:
            distinct[sha] = replace(distinct[sha], hosts=(*distinct[sha].hosts, host.name))
            continue
        try:
            text = m.file.content.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(
                f"[{host.name}] {m.file.realpath}: not a UTF-8 Python source file ({exc.reason})"
            ) from None
        related = {p: t for p, t in d.sources.items() if p != m.file.realpath}
        distinct[sha] = ModuleSource(
            (host.name,), m.file.realpath, text, sha, related, m.distribution or (
                str(m.installed["name"]) if m.installed else None
            ), m.version,
        )  # fmt: skip
    return list(distinct.values())
