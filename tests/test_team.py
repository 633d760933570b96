"""Several operators on one ledger, fast: run leases in the ledger, and approvals signed with real
OpenSSH keys (`ssh-keygen -Y sign/verify`), over the scripted fleet of tests/scriptedkit.py
(real host agent on real files, real SQLite). The real-process cases (two controllers, a
SIGKILL, a takeover) are in test_team_leases.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from opspatch.core.ledgerlocation import PostgresLedger
from opspatch.core.policy import BatchSize, Playbook, TeamSettings
from opspatch.core.vocabulary import Rotation as RotationWord
from opspatch.errors import EXIT_BAD_INPUT, ApprovalRefused, InputError, LeaseHeld, LedgerError
from opspatch.hosts.agent.facts import host_name, machine_id
from opspatch.ledger.store import Ledger, operator_identity
from opspatch.runs.commands.apply import apply_to_hosts
from opspatch.runs.commands.recover import require_recoverable
from opspatch.runs.fleet.host_leases import host_identity
from opspatch.runs.judgments.approval import approve_patch
from opspatch.runs.report import RunReport
from tests.fleetkit import wait_until
from tests.ledgerkit import Notices, raw
from tests.pgkit import BACKENDS, PostgresServer, backend_location, backend_pid
from tests.scriptedkit import (
    PATCH,
    PRISTINE,
    REPO,
    FakeHost,
    FakeRouter,
    Fleet,
    RoutedFleet,
    book,
    worker_url,
)

pytestmark = [
    pytest.mark.scripted,
    pytest.mark.process,
    pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen"),
]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """tests/scriptedkit.py's fleet: three scripted hosts with real files and state folders."""
    from opspatch.config.patches import load_patch

    hosts = [FakeHost.installed(f"h{index + 1}", tmp_path / f"h{index + 1}") for index in range(3)]
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        yield Fleet(hosts, ledger, load_patch(REPO / "patches" / "eagle-init-guard.toml"))


def begin(ledger: Ledger, operator: str, hosts: list[str]) -> str:
    return ledger.begin_run(
        command="apply",
        patch_id="p",
        patch_sha256=None,
        operator=operator,
        command_line="opspatch apply p",
        hosts=hosts,
    )


def lease_steps(ledger: Ledger, run_id: str, host: str) -> list[str]:
    records = [r for r in ledger.get_run(run_id).hosts if r.host == host]
    return [s.detail for r in records for s in r.steps if s.step == "lease"]


# -- the lease table -----------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def ledger_location(request: pytest.FixtureRequest, tmp_path: Path) -> Path | PostgresLedger:
    """The lease table on both backends (on PostgreSQL as the writer role, which may change
    the leases and nothing of the history)."""
    return backend_location(request, tmp_path)


def test_a_live_lease_refuses_another_run_and_an_expired_one_is_taken_over_on_record(
    ledger_location: Path | PostgresLedger,
) -> None:
    with Ledger.open(ledger_location) as ledger:
        a = begin(ledger, "alice@laptop", ["gpu-1"])
        b = begin(ledger, "bob@jump", ["gpu-1"])
        assert ledger.take_leases(a, {"gpu-1": "m1/gpu-1:/s"}, expires_after=0.3).refused == ()
        refused = ledger.take_leases(b, {"gpu-one": "m1/gpu-1:/s"}, expires_after=60).refused
        assert [(h.run_id, h.operator, h.host) for h in refused] == [(a, "alice@laptop", "gpu-1")]
        assert lease_steps(ledger, b, "gpu-one") == []  # refused: nothing taken, nothing recorded
        assert wait_until(lambda: not ledger.leases_of([a])[0].live, timeout=10, interval=0.05)
        grant = ledger.take_leases(b, {"gpu-one": "m1/gpu-1:/s"}, expires_after=60)
        assert [h.run_id for h in grant.taken_over] == [a]
        (taken,) = lease_steps(ledger, b, "gpu-one")
        assert taken.startswith("took the lease on m1/gpu-1:/s, taken over from run " + a)
        assert ledger.renew_leases(a) == 0 and ledger.renew_leases(b) == 1
        assert ledger.give_back_leases(b) == 1
        assert lease_steps(ledger, b, "gpu-one")[-1] == "gave the lease on m1/gpu-1:/s back"
        assert ledger.leases_of([a, b]) == []
        assert ledger.verify().ok  # the lease table is beside the chain, not in it


def test_recover_run_refuses_a_run_whose_lease_is_live_naming_it(
    ledger_location: Path | PostgresLedger,
) -> None:
    with Ledger.open(ledger_location) as ledger:
        a = begin(ledger, "alice@laptop", ["gpu-1"])
        ledger.take_leases(a, {"gpu-1": "m1/gpu-1:/s"}, expires_after=60)
        with pytest.raises(LeaseHeld) as refused:
            require_recoverable(ledger, ledger.get_run(a))
        assert refused.value.exit_code == EXIT_BAD_INPUT
        assert f"run {a} of alice@laptop (controller " in refused.value.message
        assert f"opspatch recover --run {a}" in (refused.value.hint or "")


# -- leases on the apply path --------------------------------------------------------------------


def lease_to_another_run(fleet: Fleet, host: FakeHost, operator: str = "alice@laptop") -> str:
    """A run of `operator` holding a live lease on `host` (by the identity its facts give)."""
    other = begin(fleet.ledger, operator, [host.name])
    identity = f"{machine_id() or 'no-machine-id'}/{host_name()}:{host.state}"
    assert fleet.ledger.take_leases(other, {host.name: identity}, expires_after=60).refused == ()
    return other


def test_an_apply_on_hosts_another_runs_live_lease_holds_is_refused_before_any_change(
    fleet: Fleet,
) -> None:
    other = lease_to_another_run(fleet, fleet.hosts[1])
    report = fleet.apply()
    assert report.refused and report.exit_code == EXIT_BAD_INPUT
    assert report.halted is not None
    assert {h.host: h.reason for h in report.hosts}["h2"] == "lease-held", report.hosts
    assert f"h2 is leased to run {other} of alice@laptop (controller " in report.halted  # who
    for host in fleet.hosts:
        assert host.file.read_bytes() and _sha(host.file) == PRISTINE
        assert not (host.state / "lock.json").exists()  # every lock given back
    fleet.ledger.give_back_leases(other)
    again = fleet.apply()
    assert again.exit_code == 0, again
    for host in fleet.hosts:  # taken in the preflight, given back at the end, on record
        taken, given = lease_steps(fleet.ledger, str(again.run_id), host.name)
        assert taken.startswith("took the lease on ") and taken.endswith(f":{host.state}")
        assert given.startswith("gave the lease on ")
    assert fleet.ledger.leases_of([str(again.run_id)]) == []


def test_an_apply_refused_in_its_preflight_records_every_host_it_printed(fleet: Fleet) -> None:
    """h2 is locked by a live run of alice's: the apply is refused in its preflight (exit 2),
    h2 naming alice's run and the others `skipped`. Before, the ledger's
    run had none of those hosts: `ledger show` said less than the command had printed."""
    from opspatch.hosts.transport.scripted import agent_operation

    other = lease_to_another_run(fleet, fleet.hosts[1])
    held = agent_operation(
        "lock",
        {
            "state_dir": str(fleet.hosts[1].state),
            "owner": "alice@laptop",
            "run_id": other,
            "ttl_seconds": 1800,
        },
    )
    assert isinstance(held, dict)
    report = fleet.apply()
    assert report.refused and report.exit_code == EXIT_BAD_INPUT
    assert {h.host: h.reason for h in report.hosts}["h2"] == "lease-held", report.hosts
    recorded = fleet.ledger.get_run(str(report.run_id))
    assert recorded.summary.outcome == "refused"
    for printed in report.hosts:
        on_record = recorded.host(printed.host)
        assert (on_record.outcome, on_record.error) == (printed.outcome, printed.error)
        assert on_record.reason == printed.reason
    assert f"run {other}" in (recorded.host("h2").error or ""), recorded.host("h2")
    assert not (fleet.hosts[0].state / "lock.json").exists()  # the locks taken given back


def test_a_rollback_refused_by_another_runs_lease_still_names_a_preflight_refusal(
    fleet: Fleet,
) -> None:
    """A host the rollback's preflight refused (its file changed by hand) keeps that refusal
    when the run is refused for another host's lease: it is not "not started: leased to..."."""
    from opspatch.runs.commands.rollback import rollback_hosts

    assert fleet.apply().exit_code == 0
    edited = fleet.hosts[2]
    edited.file.write_bytes(edited.file.read_bytes() + b"# changed by hand\n")
    lease_to_another_run(fleet, fleet.hosts[1])
    report = rollback_hosts(
        ledger=fleet.ledger,
        hosts=[h.host() for h in fleet.hosts],
        factory=fleet.factory,
        playbook=Playbook(),
        patch=fleet.patch,
    )
    assert report.refused and report.exit_code == EXIT_BAD_INPUT
    h1, h2, h3 = report.hosts
    assert (h1.reason, h2.reason) == ("lease-held", "lease-held")
    assert h3.outcome == "skipped" and h3.reason == "changed-since", h3
    recorded = fleet.ledger.get_run(str(report.run_id)).host("h3")
    assert recorded.reason == "changed-since"


CHANGING_OPS = {"lock", "begin", "swap", "restore", "restart", "unlock"}


def test_rollback_restart_and_recover_on_hosts_another_runs_live_lease_holds_are_refused(
    fleet: Fleet,
) -> None:
    """Every command that changes hosts takes their leases (`FleetRun.lease`): a live run's
    lease refuses them before any change, naming its run and operator; once given back, the
    rollback leases the hosts itself (read from their facts) and gives them back."""
    from opspatch.runs.commands.recover import recover_hosts
    from opspatch.runs.commands.restart import restart_hosts
    from opspatch.runs.commands.rollback import rollback_hosts

    assert fleet.apply().exit_code == 0
    patched = {h.name: _sha(h.file) for h in fleet.hosts}
    other = lease_to_another_run(fleet, fleet.hosts[1])
    common = {
        "ledger": fleet.ledger,
        "hosts": [h.host() for h in fleet.hosts],
        "factory": fleet.factory,
        "playbook": Playbook(max_in_flight=1),
    }
    for command, run in (
        ("rollback", lambda: rollback_hosts(patch=fleet.patch, **common)),  # type: ignore[arg-type]
        ("restart", lambda: restart_hosts(**common)),  # type: ignore[arg-type]
        ("recover", lambda: recover_hosts(patch=fleet.patch, **common)),  # type: ignore[arg-type]
    ):
        report = run()
        assert report.refused and report.exit_code == EXIT_BAD_INPUT, (command, report)
        assert {h.reason for h in report.hosts} == {"lease-held"}, (command, report.hosts)
        for host in fleet.hosts:
            assert _sha(host.file) == patched[host.name], command
            assert not (host.state / "lock.json").exists(), command
            assert not CHANGING_OPS & set(fleet.transports[host.name].ops), command
    fleet.ledger.give_back_leases(other)
    report = rollback_hosts(patch=fleet.patch, **common)  # type: ignore[arg-type]
    assert report.exit_code == 0, report
    for host in fleet.hosts:
        assert _sha(host.file) == PRISTINE
        taken, given = lease_steps(fleet.ledger, str(report.run_id), host.name)
        assert taken.startswith("took the lease on ") and taken.endswith(f":{host.state}")
        assert given.startswith("gave the lease on ")
    assert fleet.ledger.leases_of([str(report.run_id)]) == []


def test_unlock_refuses_the_lock_of_a_run_whose_lease_is_live_unless_forced(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of another controller is `unknown` here, yet known to the ledger: its live lease
    says it may be changing the host, so its lock stays unless --force."""
    from opspatch.hosts.transport.scripted import agent_operation
    from opspatch.ledger import store
    from opspatch.ledger.liveness import ControllerProcess
    from opspatch.runs.commands.unlock import unlock_hosts

    elsewhere = ControllerProcess("alices-laptop", 4242, None)
    monkeypatch.setattr(store.ControllerProcess, "current", classmethod(lambda cls: elsewhere))
    host = fleet.hosts[1]
    other = lease_to_another_run(fleet, host)
    args = {"state_dir": str(host.state), "owner": "alice@laptop", "run_id": other}
    assert isinstance(agent_operation("lock", {**args, "ttl_seconds": 1800}), dict)

    def unlock(force: bool) -> RunReport:
        return unlock_hosts(
            ledger=fleet.ledger,
            hosts=[host.host()],
            factory=fleet.factory,
            playbook=Playbook(),
            force_unknown=force,
        )

    (refused,) = (report := unlock(False)).hosts
    assert refused.outcome == "skipped" and report.exit_code == EXIT_BAD_INPUT
    assert refused.reason == "lease-held", refused
    assert f"run {other}, whose lease is live: h2 is leased to run {other} of alice@laptop" in (
        refused.error or ""
    )
    assert (host.state / "lock.json").is_file()
    assert [h.outcome for h in unlock(True).hosts] == ["unlocked"]
    assert not (host.state / "lock.json").exists()


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_host_identity_is_the_machine_and_the_lock_folder() -> None:
    from opspatch.hosts.results import HostFacts
    from tests.scriptedkit import FakeHost

    facts = HostFacts.from_json(
        {
            "python_version": "3.11",
            "python_executable": "/p",
            "python_implementation": "CPython",
            "hostname": "gpu-7",
            "platform": "Linux",
            "machine": "x86_64",
            "machine_id": "abc",
        }
    )
    host = FakeHost("h", Path("/r")).host()
    assert host_identity(host, facts) == "abc/gpu-7:/r/state"


# -- approvals with real OpenSSH keys ------------------------------------------------------------


@dataclass
class Signers:
    folder: Path
    me: str  # the operator running the apply (the author)

    def key(self, name: str) -> Path:
        return self.folder / name

    @property
    def allowed(self) -> Path:
        return self.folder / "allowed_signers"


@pytest.fixture(scope="module")
def signers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signers]:
    """Keys for the author, bob and mallory; allowed_signers lists the author and bob only."""
    folder = tmp_path_factory.mktemp("signers")
    me = operator_identity().split("@", 1)[0]
    lines = []
    for name in ("author", "bob", "mallory"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(folder / name)],
            check=True,
        )
        public = (folder / f"{name}.pub").read_text().strip()
        principal = {"author": me, "bob": "bob"}.get(name)
        if principal is not None:
            lines.append(f'{principal} namespaces="opspatch" {public}')
    (folder / "allowed_signers").write_text("\n".join(lines) + "\n")
    yield Signers(folder, me)


def guarded(signers: Signers) -> Playbook:
    team = TeamSettings(require_approval=True, allowed_signers=str(signers.allowed))
    return Playbook(canary=0, batch=BatchSize(count=10), max_failures=1, team=team)


def sign(
    fleet: Fleet, signers: Signers, key: str, principal: str, operator: str | None = None
) -> None:
    """`principal` signs with `key`, recorded by `operator` (default: by the principal's own
    account, `principal@jump`, as a second operator's approve would be; the author's own
    signature is recorded by this process's identity)."""
    if operator is None:
        operator = operator_identity() if principal == signers.me else f"{principal}@jump"
    approve_patch(
        fleet.ledger,
        fleet.patch,
        key=signers.key(key),
        principal=principal,
        operator=operator,
        command_line="opspatch approve",
    )


def refused_apply(fleet: Fleet, signers: Signers) -> str:
    runs_before = len(fleet.ledger.list_runs(limit=1000))
    with pytest.raises(ApprovalRefused) as refused:
        apply_to_hosts(
            fleet.patch,
            [h.host() for h in fleet.hosts],
            guarded(signers),
            factory=fleet.factory,
            ledger=fleet.ledger,
        )
    assert refused.value.exit_code == EXIT_BAD_INPUT
    assert not fleet.transports, "a host was contacted"
    assert len(fleet.ledger.list_runs(limit=1000)) == runs_before  # no apply run begun
    assert all(_sha(h.file) == PRISTINE for h in fleet.hosts)
    return refused.value.message


def test_an_apply_needing_approval_is_refused_unsigned_wrong_key_and_self_signed(
    fleet: Fleet,
    signers: Signers,
) -> None:
    assert "nobody signed it" in refused_apply(fleet, signers)
    sign(fleet, signers, "mallory", "bob")  # a key allowed_signers does not give bob
    assert "verifies against" in refused_apply(fleet, signers)
    sign(fleet, signers, "author", signers.me)  # the author's own, valid signature
    said = refused_apply(fleet, signers)
    assert f"signed only by its author ({signers.me}" in said


def test_an_apply_signed_by_a_second_operator_goes_ahead_and_records_the_signer(
    fleet: Fleet,
    signers: Signers,
) -> None:
    sign(fleet, signers, "author", signers.me)
    sign(fleet, signers, "bob", "bob")
    report = apply_to_hosts(
        fleet.patch,
        [h.host() for h in fleet.hosts],
        guarded(signers),
        factory=fleet.factory,
        ledger=fleet.ledger,
    )
    assert report.exit_code == 0, report
    summary = fleet.ledger.get_run(str(report.run_id)).summary
    assert summary.approved_by == ("bob",)  # verified and not the author's
    assert summary.to_json()["approved_by"] == ["bob"]
    assert [a.principal for a in fleet.ledger.approvals(fleet.patch.sha256)] == [signers.me, "bob"]


def test_a_sync_whose_second_patch_lacks_an_approval_changes_nothing_not_even_the_first(
    fleet: Fleet, signers: Signers, tmp_path: Path
) -> None:
    """sync checks every approval it needs before its first run: the signed first patch is not
    applied when the second would be refused after it."""
    from opspatch.config.fleet import DesiredPatch, DesiredState
    from opspatch.errors import Location
    from opspatch.runs.commands.sync import sync_fleet
    from tests.scriptedkit import mark_patch

    mark = mark_patch(tmp_path)
    sign(fleet, signers, "bob", "bob")  # the first patch, eagle-init-guard, is approved
    hosts = [h.host() for h in fleet.hosts]
    names = tuple(h.name for h in hosts)
    desired = DesiredState(
        "fleet.toml",
        tuple(
            DesiredPatch(p, names, "", Location("fleet.toml", line, f"patches[{line}]"))
            for line, p in enumerate((fleet.patch, mark))
        ),
        {h.name: h for h in hosts},
    )
    runs_before = len(fleet.ledger.list_runs(limit=1000))

    with pytest.raises(ApprovalRefused) as refused:
        sync_fleet(desired, hosts, [], guarded(signers), factory=fleet.factory, ledger=fleet.ledger)

    assert "module-mark" in refused.value.message and "nobody signed it" in refused.value.message
    assert refused.value.exit_code == EXIT_BAD_INPUT
    assert all(_sha(h.file) == PRISTINE for h in fleet.hosts)  # eagle-init-guard not applied
    assert len(fleet.ledger.list_runs(limit=1000)) == runs_before  # no run begun or recorded


def test_a_playbook_requiring_approval_names_its_signers_file_relative_to_itself(
    tmp_path: Path,
) -> None:
    from opspatch.config.playbook import load_playbook
    from opspatch.errors import SpecError

    path = tmp_path / "playbooks" / "guarded.toml"
    path.parent.mkdir()
    path.write_text('[team]\nlease_expiry = 5\nrequire_approval = true\nallowed_signers = "s"\n')
    team = load_playbook(path).team
    assert (team.lease_expiry, team.require_approval) == (5.0, True)
    assert team.allowed_signers == str(path.parent.resolve() / "s")
    path.write_text("[team]\nrequire_approval = true\n")
    with pytest.raises(SpecError) as missing:
        load_playbook(path)
    assert f"{path}:2" in missing.value.render() and "allowed_signers" in missing.value.render()


def test_a_run_of_another_controller_is_recoverable_once_its_lease_expired_and_not_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What another machine can judge is the heartbeat: a run begun elsewhere (`unknown` here)
    is refused while its lease is live, taken over once it expired, refused without a lease."""
    from opspatch.ledger import store
    from opspatch.ledger.liveness import ControllerProcess

    elsewhere = ControllerProcess("alices-laptop", 4242, None)
    monkeypatch.setattr(store.ControllerProcess, "current", classmethod(lambda cls: elsewhere))
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        leased, bare = begin(ledger, "alice@laptop", ["g"]), begin(ledger, "alice@laptop", ["g"])
        ledger.take_leases(leased, {"g": "m/g:/s"}, expires_after=0.3)
        assert ledger.get_run(leased).summary.status == "unknown"
        with pytest.raises(LeaseHeld, match="controller alices-laptop"):
            require_recoverable(ledger, ledger.get_run(leased))
        assert wait_until(lambda: not ledger.leases_of([leased])[0].live, timeout=10, interval=0.05)
        require_recoverable(ledger, ledger.get_run(leased))  # expired: may be taken over
        with pytest.raises(InputError, match="is unknown, not interrupted"):
            require_recoverable(ledger, ledger.get_run(bare))


# -- approval asked by the fleet file ------------------------------------------------------------


def test_a_fleet_file_asks_for_approval_with_its_signers_file_relative_to_itself(
    tmp_path: Path,
) -> None:
    from opspatch.config.fleet import load_fleet
    from opspatch.config.lookup import Workspace
    from opspatch.errors import SpecError
    from tests.fleetkit import INVENTORY

    (tmp_path / "patches").mkdir()
    (tmp_path / "inventories").mkdir()
    shutil.copy(REPO / "patches" / "eagle-init-guard.toml", tmp_path / "patches")
    (tmp_path / "inventories" / "lab.toml").write_text(INVENTORY)
    workspace = Workspace(tmp_path, tmp_path / "state")
    entry = '[[patches]]\nid = "eagle-init-guard"\nhosts = ["lab"]\n'
    (tmp_path / "fleet.toml").write_text(entry)
    assert load_fleet(workspace).allowed_signers is None
    (tmp_path / "fleet.toml").write_text(entry + "[team]\nrequire_approval = true\n")
    with pytest.raises(SpecError) as missing:
        load_fleet(workspace)
    assert missing.value.message.startswith(f"{tmp_path}/fleet.toml:5: team.require_approval: ")
    assert "allowed_signers" in missing.value.message
    (tmp_path / "fleet.toml").write_text(
        entry + '[team]\nrequire_approval = true\nallowed_signers = "keys/allowed"\n'
    )
    desired = load_fleet(workspace)
    assert desired.allowed_signers == str(tmp_path / "keys" / "allowed")
    governed = desired.governing(Playbook()).team
    assert governed.require_approval and governed.allowed_signers == desired.allowed_signers
    # a playbook that already asks keeps its own signers: the fleet file cannot swap them
    strict = replace(Playbook(), team=TeamSettings(require_approval=True, allowed_signers="/team"))
    assert desired.governing(strict).team.allowed_signers == "/team"


def test_sync_under_a_fleet_file_asking_for_approval_needs_a_second_operators_signature(
    fleet: Fleet, signers: Signers
) -> None:
    """The playbook asks nothing; the fleet file's [team] does, and sync applies through the
    apply's approval check: refused unsigned before any host is changed, then signed by bob."""
    from opspatch.config.fleet import DesiredPatch, DesiredState
    from opspatch.errors import Location
    from opspatch.runs.commands.sync import sync_fleet

    hosts = [h.host() for h in fleet.hosts]
    desired = DesiredState(
        path="fleet.toml",
        entries=(
            DesiredPatch(fleet.patch, tuple(h.name for h in hosts), "", Location("fleet.toml", 2)),
        ),
        hosts={h.name: h for h in hosts},
        allowed_signers=str(signers.allowed),
    )
    playbook = Playbook(canary=0, batch=BatchSize(count=10), max_failures=1)

    def sync() -> list[RunReport]:
        done = sync_fleet(desired, hosts, [], playbook, factory=fleet.factory, ledger=fleet.ledger)
        return list(done.runs)

    with pytest.raises(ApprovalRefused, match="nobody signed it"):
        sync()
    assert all(_sha(h.file) == PRISTINE for h in fleet.hosts)
    sign(fleet, signers, "bob", "bob")
    (run,) = sync()
    assert run.exit_code == 0 and run.command == "sync", run
    assert fleet.ledger.get_run(str(run.run_id)).summary.approved_by == ("bob",)
    assert all(_sha(h.file) != PRISTINE for h in fleet.hosts)
    for host in fleet.hosts:  # sync applies through the apply's fleet run: leased too
        taken, given = lease_steps(fleet.ledger, str(run.run_id), host.name)
        assert taken.startswith("took the lease on ") and given.startswith("gave the lease on ")


def test_ledger_show_of_an_approve_run_names_the_signer_not_a_host(
    fleet: Fleet, signers: Signers
) -> None:
    """An approval's `sign` step keeps the principal in the host column; `ledger show` tells it
    as the signer, in the text and the JSON, and lists no host for it."""
    from tests.clirunner import opspatch

    sign(fleet, signers, "bob", "bob")
    (run,) = [r for r in fleet.ledger.list_runs() if r.command == "approve"]
    args = ("--ledger", str(fleet.ledger.path), "ledger", "show", run.run_id)
    shown = opspatch(*args, "--json")
    assert shown.code == 0, shown.stderr
    data = shown.json()
    assert data["host_records"] == []
    (approval,) = data["approvals"]
    assert approval["principal"] == "bob" and approval["operator"] == "bob@jump"
    assert approval["patch_sha256"] == fleet.patch.sha256 and approval["run_id"] == run.run_id
    assert approval["signature"].startswith("-----BEGIN SSH SIGNATURE-----")
    text = opspatch(*args)
    assert text.code == 0, text.stderr
    assert f"  signed by bob: the patch's sha256 {fleet.patch.sha256}, recorded " in text.stdout
    assert "  bob:" not in text.stdout  # not a host with an outcome
    applied = fleet.ledger.get_run(begin(fleet.ledger, "alice@laptop", ["h1"]))
    assert applied.approvals is None and "approvals" not in applied.to_json()


def test_check_verifies_each_recorded_signature_against_the_playbooks_signers(
    fleet: Fleet, signers: Signers, tmp_path: Path
) -> None:
    from tests.clirunner import opspatch

    (tmp_path / "patches").mkdir()
    shutil.copy(REPO / "patches" / "eagle-init-guard.toml", tmp_path / "patches")
    (tmp_path / "playbooks").mkdir()
    playbook = tmp_path / "playbooks" / "guarded.toml"
    playbook.write_text(f'[team]\nrequire_approval = true\nallowed_signers = "{signers.allowed}"\n')
    sign(fleet, signers, "bob", "bob")
    sign(fleet, signers, "mallory", "carol")  # a key the allowed_signers file does not list

    def check(*extra: str) -> Any:
        return opspatch(
            "--ledger", str(tmp_path / "ledger.sqlite3"), "check", "eagle-init-guard", *extra,
            cwd=tmp_path, env={"OPSPATCH_HOME": str(tmp_path)},
        )  # fmt: skip

    done = check("--playbook", "guarded", "--json")
    assert done.code == 0, done.stderr
    (result,) = done.json()["patches"]
    verdicts = {s["principal"]: s["verified"] for s in result["signed_by"]}
    assert verdicts == {"bob": True, "carol": False}
    text = check("--playbook", "guarded").stdout
    assert f"signed by bob (verified against {signers.allowed};" in text
    assert f"signed by carol (does NOT verify against {signers.allowed}: apply refuses it" in text
    plain = check().stdout  # no playbook naming allowed_signers: said, not implied
    assert "signed by bob (unverified: no allowed_signers in the playbook" in plain


def test_check_verifies_signatures_against_the_fleet_files_signers_as_apply_does(
    fleet: Fleet, signers: Signers, tmp_path: Path
) -> None:
    """fleet.toml's [team] asks for approval with its allowed_signers, which sync and apply
    verify against. Before, `check` read only the playbook's, so it called every signature
    "unverified: no allowed_signers in the playbook" in that workspace."""
    from tests.clirunner import opspatch

    (tmp_path / "patches").mkdir()
    shutil.copy(REPO / "patches" / "eagle-init-guard.toml", tmp_path / "patches")
    (tmp_path / "fleet.toml").write_text(
        f'[team]\nrequire_approval = true\nallowed_signers = "{signers.allowed}"\n'
    )
    sign(fleet, signers, "bob", "bob")
    sign(fleet, signers, "mallory", "carol")  # a key the allowed_signers file does not list
    args = ("--ledger", str(fleet.ledger.path), "check", "eagle-init-guard")
    env = {"OPSPATCH_HOME": str(tmp_path)}
    done = opspatch(*args, "--json", cwd=tmp_path, env=env)
    assert done.code == 0, done.stderr
    (result,) = done.json()["patches"]
    found = {s["principal"]: (s["verified"], s["allowed_signers"]) for s in result["signed_by"]}
    assert found == {"bob": (True, str(signers.allowed)), "carol": (False, str(signers.allowed))}
    text = opspatch(*args, cwd=tmp_path, env=env).stdout
    assert f"signed by bob (verified against {signers.allowed};" in text
    assert f"signed by carol (does NOT verify against {signers.allowed}: apply refuses it" in text
    # a playbook that asks for approval keeps its own signers, as for apply
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "strict.toml").write_text(
        f'[team]\nrequire_approval = true\nallowed_signers = "{tmp_path / "other"}"\n'
    )
    strict = opspatch(*args, "--playbook", "strict", "--json", cwd=tmp_path, env=env)
    assert {s["allowed_signers"] for s in strict.json()["patches"][0]["signed_by"]} == {
        str(tmp_path / "other")
    }


# -- a lease held across a cut connection ------------------------------------------------------


@pytest.mark.postgres
def test_a_lease_held_across_a_cut_ledger_connection_is_reported_then_taken_over_once_expired(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Controller A loses the PostgreSQL ledger and cannot reach it again (its session ended and
    its connections refused, as behind a network cut): A's heartbeat says so and, once its expiry
    passed with no beat through, A has lost its leases; B sees A's lease live until then, and
    takes it over. When A reaches the ledger again, its heartbeat says it got through and that
    its leases were taken over."""
    from opspatch.ledger import store
    from opspatch.ledger.liveness import ControllerProcess
    from opspatch.runs.fleet.host_leases import Heartbeat
    from opspatch.runs.fleet.recorder import Recorder as LedgerRecorder

    elsewhere = ControllerProcess("alices-laptop", 4242, None)  # A's run is another machine's
    monkeypatch.setattr(store.ControllerProcess, "current", classmethod(lambda cls: elsewhere))
    location, expiry, notices = postgres.fresh_ledger(), 6.0, Notices([])
    alices_role, alices_way = postgres.own_writer(location)
    with Ledger.open(alices_way) as alice:
        a = begin(alice, "alice@laptop", ["g"])
        assert alice.take_leases(a, {"g": "m/g:/s"}, expires_after=expiry).refused == ()
        heartbeat = Heartbeat(LedgerRecorder(alice, a), expiry, notices, held=1).start()
        try:
            with Ledger.open(location) as bob:
                postgres.keep_out(alices_role)
                postgres.end_session(backend_pid(alice))
                assert wait_until(lambda: bool(notices.said), timeout=30, interval=0.05)
                assert "the ledger did not take this run's lease heartbeat" in notices.said[0]
                assert "connecting again failed" in notices.said[0]
                (lease,) = bob.leases_of([a])
                assert lease.live, lease  # the lease outlives the cut until its expiry
                b = begin(bob, "bob@jump", ["g"])
                refused = bob.take_leases(b, {"g": "m/g:/s"}, expires_after=60).refused
                assert [h.run_id for h in refused] == [a]
                with pytest.raises(LeaseHeld, match=f"run {a} is alive"):
                    require_recoverable(bob, bob.get_run(a))
                assert wait_until(lambda: not bob.leases_of([a])[0].live, timeout=60)
                require_recoverable(bob, bob.get_run(a))  # expired: B may take A's run over
                grant = bob.take_leases(b, {"g": "m/g:/s"}, expires_after=60)
                assert [h.run_id for h in grant.taken_over] == [a]
            assert wait_until(lambda: heartbeat.lost is not None, timeout=30, interval=0.05)
            assert "leases could not be renewed" in str(heartbeat.lost)
            postgres.keep_out(alices_role, out=False)  # the network is back
            assert wait_until(lambda: len(notices.said) >= 3, timeout=30, interval=0.05)
            assert notices.said[1] == "the ledger takes this run's lease heartbeat again"
            assert "1 of this run's 1 leases were taken over by another run" in notices.said[2]
            assert "took this run's leases over" in str(heartbeat.lost)
        finally:
            heartbeat.stop()
            postgres.keep_out(alices_role, out=False)


@pytest.mark.postgres
def test_a_run_keeps_its_lease_across_a_ledger_session_the_server_ended(
    postgres: PostgresServer,
) -> None:
    """The server ends A's session (a restart, `pg_terminate_backend`): A's next heartbeat
    connects again and gets through, so A never stops holding its lease, and says nothing of
    it; B is still refused."""
    from opspatch.runs.fleet.host_leases import Heartbeat
    from opspatch.runs.fleet.recorder import Recorder as LedgerRecorder

    location, expiry, notices = postgres.fresh_ledger(), 3.0, Notices([])
    with Ledger.open(location) as alice:
        a = begin(alice, "alice@laptop", ["g"])
        assert alice.take_leases(a, {"g": "m/g:/s"}, expires_after=expiry).refused == ()
        heartbeat = Heartbeat(LedgerRecorder(alice, a), expiry, notices, held=1).start()
        try:
            postgres.end_session(backend_pid(alice))
            ended_ms = int(time.time() * 1000)

            def beat_since_the_end() -> bool:
                (beat,) = raw(location).execute("SELECT heartbeat_at_ms FROM leases").fetchone()
                return int(beat) > ended_ms

            assert wait_until(beat_since_the_end, timeout=30, interval=0.05)
            assert notices.said == []
            assert heartbeat.lost is None
            with Ledger.open(location) as bob:
                (lease,) = bob.leases_of([a])
                assert lease.live, lease
                b = begin(bob, "bob@jump", ["g"])
                refused = bob.take_leases(b, {"g": "m/g:/s"}, expires_after=60).refused
                assert [h.run_id for h in refused] == [a]
        finally:
            heartbeat.stop()


def test_a_run_that_lost_its_leases_starts_no_more_hosts(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opspatch.runs.fleet.host_leases import Heartbeat

    lost = "this run's leases could not be renewed for 61 s (longer than their 60 s expiry): cut"
    monkeypatch.setattr(Heartbeat, "lost", property(lambda self: lost))
    report = fleet.apply()
    assert report.halted is not None and lost in report.halted
    for outcome in report.hosts:
        assert outcome.outcome == "skipped" and outcome.reason == "not-started", outcome
    assert all(_sha(h.file) == PRISTINE for h in fleet.hosts)


def test_a_plain_apply_in_a_workspace_whose_fleet_file_asks_for_approval_is_refused_unsigned(
    tmp_path: Path,
) -> None:
    """fleet.toml's [team] governs apply too (apply is no way around it): unsigned, the apply is
    refused before any host is touched (exit 2, no ledger run); without the [team] table, the
    same apply is not refused for approval."""
    from tests.clirunner import opspatch
    from tests.fleetkit import INVENTORY

    (tmp_path / "patches").mkdir()
    (tmp_path / "inventories").mkdir()
    shutil.copy(REPO / "patches" / "eagle-init-guard.toml", tmp_path / "patches")
    (tmp_path / "inventories" / "lab.toml").write_text(INVENTORY)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "allowed").write_text("")
    entry = '[[patches]]\nid = "eagle-init-guard"\nhosts = ["lab"]\n'
    (tmp_path / "fleet.toml").write_text(
        entry + '[team]\nrequire_approval = true\nallowed_signers = "keys/allowed"\n'
    )
    ledger = tmp_path / "ledger.sqlite3"
    args = ("-w", str(tmp_path), "--ledger", str(ledger), "apply", "eagle-init-guard")
    refused = opspatch(*args, "--hosts", "lab", "--yes", "--json")
    assert refused.code == EXIT_BAD_INPUT, refused.stdout + refused.stderr
    assert "needs an approval and nobody signed it" in refused.stdout + refused.stderr
    if ledger.exists():
        with Ledger.open(ledger) as opened:
            assert opened.list_runs() == []
    (tmp_path / "fleet.toml").write_text(entry)
    ungoverned = opspatch(*args, "--hosts", "lab", "--yes", "--json")
    assert "needs an approval" not in ungoverned.stdout + ungoverned.stderr


def test_a_second_principal_recorded_by_the_authors_own_account_is_still_the_author(
    fleet: Fleet, signers: Signers
) -> None:
    """A valid signature under another principal, approved from the applying account itself
    (the author holding a second key, or `USER=x` set to pass as someone else): refused."""
    sign(fleet, signers, "bob", "bob", operator=operator_identity())
    assert "signed only by its author" in refused_apply(fleet, signers)


# -- a ledger outage during a rollout ------------------------------------------------------------

OUTAGE = 6.0  # seconds the PostgreSQL server is down: a restart, as an operator saw it


@pytest.fixture
def routed(postgres: PostgresServer, tmp_path: Path) -> Iterator[RoutedFleet]:
    """Three scripted hosts behind tests/scriptedkit.py's router, every one registered, and a
    fresh PostgreSQL ledger on the session's server (started again if a test left it down)."""
    router = FakeRouter()
    threading.Thread(target=router.serve_forever, daemon=True).start()
    fakes = {f"h{i}": FakeHost.installed(f"h{i}", tmp_path / f"h{i}") for i in range(1, 4)}
    try:
        with Ledger.open(postgres.fresh_ledger()) as ledger:
            fleet = RoutedFleet(router, fakes, ledger)
            fleet.register(*fakes)
            yield fleet
    finally:
        router.shutdown()


def _down_at_the_canarys_restart(postgres: PostgresServer, fake: FakeHost) -> threading.Event:
    """The server goes down (`pg_ctl stop -m fast`, every session ended) as the canary's engine
    restarts, after its `restart` step was recorded begun; set once it is down."""
    down = threading.Event()

    def stop(op: str, args: dict[str, Any]) -> None:
        if op == "restart" and not down.is_set():
            postgres.stop()
            down.set()
        return None

    fake.fault = stop
    return down


def _steps(run: Any, host: str) -> list[tuple[str, str]]:
    (record,) = [r for r in run.hosts if r.host == host]
    return [(s.step, s.status) for s in record.steps]


@pytest.mark.postgres
def test_a_ledger_restart_during_a_rollout_is_waited_out_and_the_run_goes_on(
    routed: RoutedFleet, postgres: PostgresServer
) -> None:
    """The ledger is down for about 6 s while the canary restarts behind the router: the run's
    writes are tried again until the server is back (well within the lease expiry), the canary
    is proven and admitted, the other hosts follow, exit 0. Nothing is recorded twice: the
    canary's steps are those of a host that saw no outage, and the chain verifies."""
    down = _down_at_the_canarys_restart(postgres, routed.fakes["h1"])
    back = threading.Event()

    def start_again() -> None:
        assert down.wait(120), "the canary never restarted"
        time.sleep(OUTAGE)
        postgres.start()
        back.set()

    restarter = threading.Thread(target=start_again, daemon=True)
    restarter.start()
    playbook = replace(book(), team=TeamSettings(lease_expiry=300))  # patient beyond any start
    try:
        report = apply_to_hosts(
            PATCH, routed.hosts(), playbook, factory=routed.factory, ledger=routed.ledger
        )
        assert back.is_set()  # the run ended only once the ledger was back: it waited
    finally:
        restarter.join(180)
    outcomes = {o.host: o for o in report.hosts}
    assert report.exit_code == 0, report.to_json()
    for name, outcome in outcomes.items():
        assert outcome.outcome == "applied", (name, outcome)
        assert outcome.rotation == RotationWord.IN_ROTATION, (name, outcome.note)
        assert routed.router.state.workers[worker_url(name)][1] is True  # healthy, listed
        assert _sha(routed.fakes[name].file) != PRISTINE
    run = routed.ledger.get_run(str(report.run_id))
    assert run.summary.status == "finished" and run.summary.outcome == str(report.outcome)
    assert _steps(run, "h1") == _steps(run, "h2") == _steps(run, "h3")
    done = [s for s, status in _steps(run, "h1") if status == "ok"]
    assert done.index("admit") == done.index("smoke") + 1  # proven, then admitted
    assert [r.outcome for r in run.hosts] == ["applied"] * 3
    verified = routed.ledger.verify()
    assert verified.ok, verified
    hashes = [row[0] for row in raw(routed.ledger.path).execute("SELECT hash FROM events")]
    assert len(hashes) == len(set(hashes)) == verified.events_checked


@pytest.mark.postgres
def test_a_ledger_gone_past_the_lease_expiry_stops_the_run_where_recover_expects_it(
    routed: RoutedFleet, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger still down after the run's lease expiry stops the run (exit 3, saying how long
    it was tried and naming recover): no other host is started, and what the canary did before
    is in the ledger (its pre-image, its steps up to the outage) for `recover` to finish from;
    the run is left unfinished, and the ledger verifies once it is back. Its controller then
    exits (exit 3), and `recover --run R` brings the canary back, proven and admitted, and
    gives the other hosts back unchanged."""
    from opspatch.ledger import store
    from opspatch.ledger.liveness import ControllerProcess
    from opspatch.runs.commands.recover import recover_run, run_chain

    # The run's controller as it will be once it exited: this pid, no longer the process that
    # began the run (its start token differs), so the run reads interrupted, as after exit 3.
    exited = ControllerProcess(socket.gethostname(), os.getpid(), "gone/0")
    _down_at_the_canarys_restart(postgres, routed.fakes["h1"])
    playbook = replace(book(), team=TeamSettings(lease_expiry=2))
    try:
        with monkeypatch.context() as begun, pytest.raises(LedgerError) as gone:
            begun.setattr(store.ControllerProcess, "current", classmethod(lambda cls: exited))
            apply_to_hosts(
                PATCH, routed.hosts(), playbook, factory=routed.factory, ledger=routed.ledger
            )
    finally:
        postgres.start()
    assert gone.value.exit_code == 3
    assert "tried again for" in gone.value.message and "lease expiry is 2 s" in gone.value.message
    assert "`opspatch recover` then brings the hosts run" in (gone.value.hint or "")
    for name in ("h2", "h3"):  # never started: untouched
        assert _sha(routed.fakes[name].file) == PRISTINE
        assert "restart" not in routed.fakes[name].requests
    (run,) = routed.ledger.list_runs(limit=1)
    assert run.finished_at is None  # unfinished: recover --run finds it
    detail = routed.ledger.get_run(run.run_id)
    (canary,) = [h for h in detail.hosts if h.host == "h1"]
    assert [v.action for v in canary.file_versions] == ["patch"]  # its pre-image is stored
    assert ("restart", "started") in _steps(detail, "h1")
    assert routed.ledger.verify().ok
    assert detail.summary.status == "interrupted"

    routed.fakes["h1"].fault = None
    recovered = recover_run(
        ledger=routed.ledger,
        chain=run_chain(routed.ledger, run.run_id),
        hosts=routed.hosts(),
        factory=routed.factory,
        playbook=book(),
        patch=PATCH,
    )
    outcomes = {o.host: o for o in recovered.hosts}
    assert outcomes["h1"].outcome == "applied", outcomes["h1"]
    assert outcomes["h1"].rotation == RotationWord.IN_ROTATION, outcomes["h1"].note
    assert routed.router.state.workers[worker_url("h1")][1] is True
    assert _sha(routed.fakes["h1"].file) != PRISTINE
    for name in ("h2", "h3"):
        assert _sha(routed.fakes[name].file) == PRISTINE
        assert not (routed.fakes[name].state / "lock.json").exists(), name
    assert recovered.exit_code == 0, recovered.to_json()
    assert routed.ledger.get_run(run.run_id).summary.status == "recovered"
    assert routed.ledger.verify().ok
