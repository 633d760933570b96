"""`opspatch adopt`: a hand edit on a host (the `sed -i` kind) becomes a patch like any other."""

from __future__ import annotations

import getpass
import re
import socket
import tempfile
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch
from opspatch.core.host import Host
from opspatch.core.reasons import Reason
from opspatch.core.remedy import remedy_text
from opspatch.core.source import sha256_hex
from opspatch.core.spec import LoadedPatch
from opspatch.core.vocabulary import Command, FileAction, Outcome, Step, StepStatus
from opspatch.errors import HostError, InputError, LedgerError, TargetError
from opspatch.hosts.diagnosis import DiagnoseRequest, HostDiagnosis, ModuleDiagnosis
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.diagnose import read_module
from opspatch.runs.fleet.connect import TransportFactory
from opspatch.runs.fleet.executor import one_batch
from opspatch.runs.fleet.fleetrun import FleetRun, per_node
from opspatch.runs.fleet.recorded import run_recorded
from opspatch.runs.fleet.session import HostSession
from opspatch.runs.fleet.steps import file_version
from opspatch.runs.judgments.findings import module_relpath, unified_diff
from opspatch.runs.judgments.units import target_of
from opspatch.runs.report import FileChange, HostOutcome, RunReport, StepResult

_PATCH_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Pristine:
    content: bytes
    source: str

    @property
    def sha256(self) -> str:
        return sha256_hex(self.content)


@dataclass(frozen=True)
class AdoptReport:
    """The patch file written and the run recorded (never a proof: adopt runs no smoke)."""

    patch_id: str
    patch_path: str
    module: str
    pristine_source: str
    diff: str
    run: RunReport

    @property
    def exit_code(self) -> int:
        return self.run.exit_code

    def to_json(self) -> dict[str, Any]:
        return {
            "patch": self.patch_id,
            "patch_file": self.patch_path,
            "module": self.module,
            "pristine_from": self.pristine_source,
            "diff": self.diff,
            **{k: v for k, v in self.run.to_json().items() if k not in ("patch",)},
        }


def _toml_multiline(value: str) -> str:
    """Literal when it can be, else basic with every backslash, quote and control escaped."""
    if "'''" not in value and all(c in "\n\t" or ord(c) >= 32 for c in value):
        return "'''\n" + value + "'''"
    escaped = "".join(
        "\\\\" if c == "\\" else '\\"' if c == '"' else c if c in "\n\t" or ord(c) >= 32
        else f"\\u{ord(c):04x}"
        for c in value
    )  # fmt: skip
    return '"""\n' + escaped + '"""'


def _toml_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if ord(c) >= 32 else f"\\u{ord(c):04x}" for c in escaped) + '"'


def patch_text(
    *,
    patch_id: str,
    module: str,
    distribution: str,
    version: str | None,
    min_python: str | None,
    diff: str,
    hosts: Sequence[str],
    path: str,
    pristine: Pristine,
    live_sha256: str,
    when: datetime,
    operator: str,
) -> str:
    """A `diff` edit, gated to the installed release."""
    summary = f"Adopt the hand edit of {module_relpath(module, path)} found on {hosts[0]}"
    rationale = (
        textwrap.fill(
            f"Adopted by `opspatch adopt` on {when:%Y-%m-%d %H:%M:%S} UTC by {operator}: {path} on "
            f"{', '.join(hosts)} had been edited outside opspatch (sha256 {live_sha256[:12]} instead "
            f"of the pristine {pristine.sha256[:12]}, taken from {pristine.source}). The edit is kept "
            "as it is, so that status, rollback and rollout treat it as any other patch. Say here why "
            "it was made.",
            width=96,
            break_long_words=False,
            break_on_hyphens=False,
        )
        + "\n"
    )
    lines = [
        f"# Adopted from a hand edit by `opspatch adopt` ({when:%Y-%m-%dT%H:%M:%SZ}).",
        f"id = {_toml_string(patch_id)}",
        f"summary = {_toml_string(summary)}",
        f"rationale = {_toml_multiline(rationale)}",
        "",
        "[target]",
        f"module = {_toml_string(module)}",
        f"distribution = {_toml_string(distribution)}",
    ]
    if version:
        lines.append(f"versions = {_toml_string('==' + version)}")
    if min_python:
        lines.append(f"min_python = {_toml_string(min_python)}")
    lines += ["", "[[edits]]", 'kind = "diff"', f"diff = {_toml_multiline(diff)}", ""]
    return "\n".join(lines)


def _read_one(
    hosts: Sequence[Host], factory: TransportFactory, module: str, timeout: float
) -> dict[str, HostDiagnosis]:
    # The server too: one started before the edit makes the host `staged`, as `status` says.
    request = DiagnoseRequest(modules=(module,), server=True, log=False)
    return read_module(
        hosts, factory, request, timeout, unread="could not be read; nothing adopted"
    )


@dataclass
class _PristineFinder:
    """A host's pristine text: the one given, else its checkout's git HEAD, else a copy with its
    RECORD hash (on a host read, in the ledger, then on the inventory's other hosts)."""

    given: Pristine | None
    ledger: Ledger | None
    read: dict[str, HostDiagnosis]
    reference_hosts: Callable[[], Sequence[Host]]
    read_more: Callable[[Sequence[Host]], dict[str, HostDiagnosis]]
    module: str
    searched_inventory: bool = False

    def _verified_copy(self, record: str) -> Pristine | None:
        for name, d in self.read.items():
            m = d.module(self.module)
            if m.file is not None and m.file.sha256 == record:
                return Pristine(m.file.content, f"the RECORD-verified copy on {name}")
        return None

    def find(self, host: str, m: ModuleDiagnosis) -> Pristine:
        assert m.file is not None
        record = m.record_sha256
        if self.given is not None:
            if record and self.given.sha256 != record:
                raise InputError(
                    f"{self.given.source} is not the pristine file of {m.distribution} "
                    f"{m.distribution_version}: its sha256 {self.given.sha256[:12]} is not the "
                    f"{record[:12]} the RECORD on {host} lists",
                    hint="give the file of the release the host runs",
                )
            return self.given
        c = m.checkout
        if c is not None and c.head and c.head_sha256:
            head = c.head_content if c.head_content is not None else m.file.content
            return Pristine(head, f"git HEAD {c.head[:12]} of {c.root} on {host}")
        if record:
            found = self._verified_copy(record)
            if found is None and self.ledger is not None:
                try:
                    found = Pristine(self.ledger.blob(record), "the ledger's copy (RECORD hash)")
                except LedgerError:
                    found = None
            if found is None and not self.searched_inventory:
                self.searched_inventory = True
                for other in self.reference_hosts():
                    if other.name in self.read:
                        continue
                    try:
                        self.read.update(self.read_more([other]))
                    except (HostError, TargetError):
                        continue
                    found = self._verified_copy(record)
                    if found is not None:
                        break
            if found is not None:
                return found
        raise InputError(
            f"[{host}] no pristine text known for {m.file.realpath}: "
            + (
                f"no host holds a copy matching its RECORD hash {record[:12]} and the ledger has none"
                if record
                else "no RECORD entry and no git checkout"
            ),
            hint="give the release's file with --pristine FILE",
        )


def adopt_edit(
    *,
    hosts: Sequence[Host],
    module: str,
    patch_id: str,
    patches_dir: Path,
    known_patch_ids: set[str],
    ledger: Ledger,
    factory: TransportFactory,
    pristine: Pristine | None = None,
    reference_hosts: Callable[[], Sequence[Host]] = lambda: (),
    timeout: float = 150.0,
) -> AdoptReport:
    """Turn the hand edit of `module` on `hosts` into `patches/<patch_id>.toml` and record it;
    any refusal comes before anything is written or recorded."""
    # Long because: the adoption's steps in the order they may refuse, nothing written before the last check
    if not _PATCH_ID.match(patch_id):
        raise InputError(
            f"--id {patch_id!r} is not a patch id (lower-case letters, digits, '-', '.', '_')"
        )
    target = patches_dir / f"{patch_id}.toml"
    if patch_id in known_patch_ids or target.exists():
        raise InputError(f"a patch {patch_id!r} already exists", hint="choose another --id")
    ledger.ensure_intact()
    read = _read_one(hosts, factory, module, timeout)
    finder = _PristineFinder(
        pristine, ledger, dict(read), reference_hosts,
        lambda more: _read_one(more, factory, module, timeout), module,
    )  # fmt: skip
    edited: dict[str, tuple[ModuleDiagnosis, Pristine]] = {}
    untouched: list[tuple[str, str]] = []
    for host in hosts:
        m = read[host.name].module(module)
        assert m.file is not None
        ours = next(
            (
                v
                for v in ledger.file_history(host.name, m.file.realpath)
                if v.action == FileAction.PATCH and v.sha256_after == m.file.sha256
            ),
            None,
        )
        if ours is not None:
            untouched.append((host.name, f"written by run {ours.run_id} ({ours.patch_id})"))
            continue
        found = finder.find(host.name, m)
        if found.content == m.file.content:
            untouched.append((host.name, "pristine here"))
        else:
            edited[host.name] = (m, found)
    if not edited:
        raise InputError(
            f"nothing to adopt: {module} is pristine or written by opspatch on every selected host",
            hint=f"`{remedy_text(Command.DIAGNOSE, hosts='...')}` shows which hosts were edited",
        )
    kinds = {(m.file.sha256 if m.file else "", p.sha256) for m, p in edited.values()}
    if len(kinds) > 1:
        listing = "; ".join(
            f"{h}: {m.file.sha256[:12] if m.file else '?'} (pristine {p.sha256[:12]})"
            for h, (m, p) in edited.items()
        )
        raise InputError(
            f"the selected hosts carry different edits of {module}: {listing}",
            hint="adopt one host (or hosts with the same bytes) at a time",
        )
    first = next(iter(edited))
    m, found = edited[first]
    assert m.file is not None
    diff = unified_diff(
        found.content, m.file.content, module_relpath(module, m.file.realpath), None
    )
    facts = read[first].facts
    python = ".".join(facts.python_version.split(".")[:2]) if facts else None
    when = datetime.now(timezone.utc)
    text = patch_text(
        patch_id=patch_id, module=module,
        distribution=m.distribution or (str(m.installed["name"]) if m.installed else module.split(".")[0]),
        version=m.version, min_python=python, diff=diff, hosts=list(edited),
        path=m.file.realpath, pristine=found, live_sha256=m.file.sha256, when=when,
        operator=f"{getpass.getuser()}@{socket.gethostname()}",
    )  # fmt: skip
    _prove(text, patch_id, found.content, m.file.content)
    patches_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open(target, "x", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError:
        raise InputError(f"{target} already exists; not overwriting it") from None
    loaded = load_patch(target)
    down = {name for name in edited if not _serving(read[name])}
    report = _record(ledger, loaded, hosts, edited, untouched, down, factory)
    return AdoptReport(patch_id, str(target), module, found.source, diff, report)


def _prove(text: str, patch_id: str, pristine: bytes, live: bytes) -> None:
    """The patch loads and, applied to the pristine bytes, gives the live bytes exactly."""
    with tempfile.TemporaryDirectory(prefix="opspatch-adopt-") as folder:
        path = Path(folder) / f"{patch_id}.toml"
        path.write_text(text, encoding="utf-8")
        spec = load_patch(path).spec
    outcome = apply_patch(pristine, spec)
    if not isinstance(outcome, Applied):
        raise InputError(
            f"the hand edit cannot be adopted as a patch: {getattr(outcome, 'reason', outcome)}",
            hint="a hand edit that does not validate is better undone (reinstall the package)",
        )
    if outcome.new_source != live:
        raise InputError(
            "the hand edit cannot be expressed as a diff patch that reproduces the file byte for "
            "byte (line endings or a missing final newline?); nothing was written"
        )


def _serving(diagnosis: HostDiagnosis) -> bool:
    return diagnosis.server is not None and diagnosis.server.running


def _record(
    ledger: Ledger,
    loaded: LoadedPatch,
    hosts: Sequence[Host],
    edited: dict[str, tuple[ModuleDiagnosis, Pristine]],
    untouched: Sequence[tuple[str, str]],
    down: set[str],
    factory: TransportFactory,
) -> RunReport:
    """A recorded run (no lock, no lease, nothing sent): per edited host a file version
    pristine -> live."""
    recorded_hosts = [h for h in hosts if h.name in edited]

    def one(session: HostSession) -> HostOutcome:
        m, pristine = edited[session.name]
        return _adopted(session, loaded, m, pristine, down=session.name in down)

    def adopt(fleet: FleetRun) -> RunReport:
        found, halted = fleet.execute(
            per_node(one), batches=one_batch(fleet.items(), 1), halt=lambda _: None
        )
        outcomes = [found[h.name] for h in recorded_hosts] + [
            HostOutcome(
                name, Outcome.SKIPPED, note=f"{why}: nothing to adopt", reason=Reason.NOTHING_TO_DO
            )
            for name, why in untouched
        ]
        return RunReport(
            fleet.recorder.run_id,
            Command.ADOPT,
            loaded.spec.id,
            hosts=tuple(outcomes),
            halted=halted,
        )

    return run_recorded(
        Command.ADOPT,
        adopt,
        ledger=ledger,
        hosts=recorded_hosts,
        factory=factory,
        playbook=None,
        patch=loaded,
    )


def _adopted(
    session: HostSession,
    loaded: LoadedPatch,
    m: ModuleDiagnosis,
    pristine: Pristine,
    *,
    down: bool,
) -> HostOutcome:
    """`applied` only where the running server started after the edit, else `staged`."""
    f = m.file
    assert f is not None
    detail = (
        f"{f.realpath} is {f.sha256[:12]}; pristine {pristine.sha256[:12]} from {pristine.source}"
    )
    said = f"recorded as patch {loaded.spec.id}"
    session.record(Step.READ, StepStatus.OK, 0.0, detail)
    version = file_version(
        f, pristine.sha256, f.sha256, pre_image=pristine.content, post_image=f.content
    )
    session.recorder.file_version(session.name, version)
    session.record(Step.ADOPT, StepStatus.OK, 0.0, said)
    session.steps += [
        StepResult(Step.READ, StepStatus.OK, 0.0, detail),
        StepResult(Step.ADOPT, StepStatus.OK, 0.0, said),
    ]
    change = FileChange(f.realpath, pristine.sha256, f.sha256)
    # What `status` will say: a server started before the edit still runs the old code, and one
    # that is not running serves nothing (adopt never saw the edit serve).
    staged = bool(m.server_older_than_file) or down
    note = f"the hand edit is now patch {loaded.spec.id}"
    name = target_of(session.host)  # a unit is restarted whole: its node alone is refused
    if down:
        note += (
            "; its server is not running, so nothing serves the edit yet: "
            f"`{remedy_text(Command.RESTART, hosts=name)}` starts it into the patch and "
            "proves it (smoke decode)"
        )
    elif staged:
        note += (
            "; the running server started before the edit, so it still runs the old "
            f"code: `{remedy_text(Command.RESTART, hosts=name)}` completes it"
        )
    else:
        note += (
            "; the running server started after the edit; adopt ran no smoke decode, "
            "so nothing is proven"
        )
    return session.outcome(Outcome.STAGED if staged else Outcome.APPLIED, file=change, note=note)
