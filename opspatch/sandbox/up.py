"""`opspatch sandbox up`: create missing hosts, start stopped engines and sshds, wait until every
engine is ready, write the inventories. Idempotent: see `opspatch.sandbox.fleet`."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import HostError, InputError
from opspatch.hosts.agent.processes import stop_process_tree
from opspatch.hosts.engine import EngineControl, RestartReply
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.hosts.transport.container import ContainerIdentity
from opspatch.sandbox import containers as sandbox_containers
from opspatch.sandbox.checkout import require_git
from opspatch.sandbox.dist import InstallShape
from opspatch.sandbox.install import make_host_python
from opspatch.sandbox.layout import (
    ENGINE_ADDRESS,
    Progress,
    SandboxLayout,
    check_host_count,
    engine_url,
    quiet,
    sandbox_playbook,
)
from opspatch.sandbox.liveplugin import enable_live_before_start
from opspatch.sandbox.manifest import (
    HostRecord,
    Manifest,
    RealEngineRecord,
    RouterRecord,
    SshEndpoint,
    UnitRecord,
    load_manifest,
    render_inventory,
    sandbox_inventory,
    save_manifest,
    write_atomically,
)
from opspatch.sandbox.plan import UpRequest, planned_manifest
from opspatch.sandbox.processes import (
    engine_pid,
    free_port,
    port_taken,
    sandbox_lock,
    server_pid,
    sshd_pid,
)
from opspatch.sandbox.real.build import BuildProgress, no_progress
from opspatch.sandbox.real.prepare import make_real_host, prepare_real_engine
from opspatch.sandbox.real.release import STANDIN, EngineChoice
from opspatch.sandbox.router import require_router_package, router_pid, start_router
from opspatch.sandbox.sshd import SshdError, find_sshd, generate_keypair, start_sshd
from opspatch.sandbox.units import UnitShape, partly_running

PURGE = remedy_text(Command.SANDBOX_DOWN, purge=True)
"""The command that removes the sandbox, for hints."""

UP = remedy_text(Command.SANDBOX_UP)
"""The command that builds the sandbox, for hints."""

HostUpOutcome = Literal["started", "already-running", "failed"]


@dataclass(frozen=True)
class HostUp:
    """What `up` did to one host. `error` says why it failed (with the log's tail)."""

    host: str
    outcome: HostUpOutcome
    port: int
    url: str
    pid: int | None
    ready_seconds: float | None = None
    ssh: SshEndpoint | None = None
    ssh_outcome: Literal["started", "already-running"] | None = None
    error: str | None = None
    container: ContainerIdentity | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "container": None if self.container is None else container_json(self.container),
            "outcome": self.outcome,
            "pid": self.pid,
            "port": self.port,
            "url": self.url,
            "ready_seconds": self.ready_seconds,
            "ssh": None
            if self.ssh is None
            else {
                "address": self.ssh.address,
                "port": self.ssh.port,
                "pid": self.ssh.pid,
                "outcome": self.ssh_outcome,
            },
            "error": self.error,
        }


@dataclass(frozen=True)
class UpReport:
    """Every host's outcome, the install shape of the sandbox and the inventories written (None
    when a host failed)."""

    root: Path
    hosts: tuple[HostUp, ...]
    inventory: Path | None
    ssh_inventory: Path | None
    install: InstallShape = "wheel"
    containers: bool = False
    router: RouterUp | None = None
    units: tuple[UnitRecord, ...] = ()
    restart_seconds: float = 0.0
    engine: EngineChoice = STANDIN
    tp: int = 1
    live: bool = False

    @property
    def ok(self) -> bool:
        return all(h.outcome != "failed" for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {
            "sandbox": str(self.root),
            "ok": self.ok,
            "engine": self.engine.label,
            "tp": self.tp,
            "live": self.live,
            "install": self.install,
            "containers": self.containers,
            "units": [unit.to_json() for unit in self.units],
            "restart_seconds": self.restart_seconds,
            "inventory": None if self.inventory is None else str(self.inventory),
            "ssh_inventory": None if self.ssh_inventory is None else str(self.ssh_inventory),
            "hosts": [h.to_json() for h in self.hosts],
            "router": self.router.to_json() if self.router else None,
        }


def container_json(identity: ContainerIdentity) -> dict[str, Any]:
    """A sandbox host's container as `up --json` and `status --json` show it."""
    return {"runtime": identity.runtime, "name": identity.name, "id": identity.id}


@dataclass(frozen=True)
class RouterUp:
    """The sandbox router `up` started or found running."""

    url: str
    pid: int
    prometheus_port: int

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "pid": self.pid, "prometheus_port": self.prometheus_port}


def _choose_ports(manifest: Manifest, *, want_router: bool = False) -> Manifest:
    """Give hosts without a port (0) a free loopback port, distinct from every recorded one;
    with `want_router` and no router recorded yet, the router's two ports as well."""
    taken = {record.port for record in manifest.hosts if record.port}
    taken |= {unit.dist_port for unit in manifest.units if unit.dist_port}
    if manifest.router is not None:
        taken |= {manifest.router.port, manifest.router.prometheus_port}
    chosen = []
    for record in manifest.hosts:
        if not record.port:
            record = replace(record, port=free_port(ENGINE_ADDRESS, taken))
            taken.add(record.port)
        chosen.append(record)
    units = []
    for unit in manifest.units:  # each unit's rendezvous, on its head's loopback
        if not unit.dist_port:
            unit = replace(unit, dist_port=free_port(ENGINE_ADDRESS, taken))
            taken.add(unit.dist_port)
        units.append(unit)
    router = manifest.router
    if want_router and router is None:
        port = free_port(ENGINE_ADDRESS, taken)
        router = RouterRecord(port, free_port(ENGINE_ADDRESS, taken | {port}))
    return replace(manifest, hosts=tuple(chosen), router=router, units=tuple(units))


def _refuse_taken_ports(layout: SandboxLayout, manifest: Manifest, running: set[str]) -> None:
    """Every stopped host's recorded engine and ssh ports must be free before anything starts.

    Raises:
        InputError: a port (or address) is held by another process; names host and port.
    """
    for record in manifest.hosts:
        if record.name not in running and port_taken(ENGINE_ADDRESS, record.port):
            raise InputError(
                f"{record.name}: port {ENGINE_ADDRESS}:{record.port} is in use by another "
                "process; nothing was started",
                hint=f"stop that process, or `{PURGE}` and `up` again to choose new ports",
            )
        ssh = record.ssh
        if (
            ssh is not None
            and ssh.port is not None
            and sshd_pid(layout, record) is None
            and port_taken(ssh.address, ssh.port)
        ):
            raise InputError(
                f"{record.name}: ssh port {ssh.address}:{ssh.port} is in use by another "
                "process; nothing was started",
                hint=f"stop that process, or `{PURGE}` and `up` again",
            )


def _drop_stale_pid_file(layout: SandboxLayout, name: str) -> None:
    """Remove a pid file whose pid is not this host's engine (it exited; the pid may since have
    been given to an unrelated process, which the restart's stop step must never signal)."""
    if engine_pid(layout, name) is None:
        with contextlib.suppress(FileNotFoundError):
            layout.pid_file(name).unlink()


def _log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _failure_text(error: HostError, log_file: Path) -> str:
    """Why a host did not come up: the failed step, the reason, and the tail of its log."""
    text = f"{error.step}: {error.detail}" if error.step else error.detail
    tail = _log_tail(log_file)
    return text + (f"\n  log ({log_file}):\n{tail}" if tail else "")


def _ensure_user_key(layout: SandboxLayout) -> str:
    """The sandbox user's public key line, generating the key pair on first use."""
    public = layout.user_key.with_name(layout.user_key.name + ".pub")
    if layout.user_key.exists() and public.exists():
        return public.read_text(encoding="utf-8").strip()
    return generate_keypair(layout.user_key, "opspatch-sandbox-user").public_line


def _start_sshd_for(layout: SandboxLayout, record: HostRecord, public_key_line: str) -> SshEndpoint:
    assert record.ssh is not None
    try:
        server = start_sshd(
            layout.sshd_dir(record.name),
            address=record.ssh.address,
            authorized_keys=[public_key_line],
            port=record.ssh.port,
        )
    except SshdError as exc:
        raise HostError(str(exc), host=record.name, step="sshd") from None
    return SshEndpoint(record.ssh.address, server.port, server.pid, server.host_public_key)


def _write_known_hosts(layout: SandboxLayout, manifest: Manifest) -> None:
    lines = []
    for record in manifest.hosts:
        ssh = record.ssh
        if ssh and ssh.port and ssh.host_public_key:
            lines.append(f"[{ssh.address}]:{ssh.port} {ssh.host_public_key}\n")
    write_atomically(layout.known_hosts, "".join(lines))


def sandbox_up(
    layout: SandboxLayout,
    *,
    hosts: int | None = None,
    ssh: bool = False,
    install: InstallShape | None = None,
    containers: bool | None = None,
    router: bool = False,
    units: UnitShape | None = None,
    restart_seconds: float | None = None,
    engine: EngineChoice | None = None,
    tp: int | None = None,
    live: bool | None = None,
    progress: Progress = quiet,
    build_progress: BuildProgress = no_progress,
    prepared: RealEngineRecord | None = None,
) -> UpReport:
    """Create missing hosts, start stopped engines (and sshds), wait until all are ready, and
    write the sandbox inventories.

    What each option asks for, and which the sandbox keeps or refuses on a later `up`:
    `opspatch.sandbox.plan`. `hosts`: how many (3 for a new sandbox); `units`: multi-node
    servers (`opspatch.sandbox.units`; a unit some of whose nodes run is restarted whole);
    `ssh`: a private sshd per host; `install`: `wheel` or `editable` (a git checkout,
    `opspatch.sandbox.checkout`); `router`: a real sglang-router in front, every host's router
    in the inventories; `restart_seconds`: every start takes that much longer; `engine`: the
    stand-in or real SGLang (`opspatch.sandbox.real`: its environment and models built first
    where not cached, shown by `build_progress`, or as a rehearsal `prepared` them); `tp`: TP
    ranks of each single server; `live`: `live = true` in the inventories, the plugin installed
    before an engine starts (`sandbox.liveplugin`). A host that does not come up is `failed`
    (its log's tail); the others still start; the inventories are written once all are ready.

    Raises:
        InputError: a bad host count, fewer hosts than the sandbox has, another shape than the
            sandbox's, a recorded port or address held by another process, sshd (or, for
            `editable`, git) not installed, another sandbox command running; a real engine's
            build failing (`IndexUnreachable` when the package index does not answer).
        HostError: a private sshd did not start (the ones started are recorded for `down`).
    """
    if hosts is not None:
        check_host_count(hosts)
    with sandbox_lock(layout):
        current = load_manifest(layout)
        asked = UpRequest(
            hosts, ssh, install, containers, units, restart_seconds, engine, tp, live, router
        )
        manifest, added = planned_manifest(current, asked)
        image = _require_tools(layout, manifest, router, progress)
        manifest = _with_real_engine(manifest, progress, build_progress, prepared)
        manifest = _choose_ports(manifest, want_router=router)
        running = {r.name for r in manifest.hosts if _engine_running(layout, manifest, r.name)}
        running -= _stop_partial_units(layout, manifest, running, progress)
        _refuse_taken_ports(layout, manifest, running)
        save_manifest(layout, manifest)  # ports are kept from here on, whatever happens next
        if manifest.ssh:
            manifest = _bring_up_sshds(layout, manifest, progress)

        controls = engine_controls(layout, manifest)
        if image is not None:
            restarts: dict[str, RestartReply] = {}
            failed = _start_containers(layout, manifest, image, running, progress)
        else:
            restarts, failed = _start_engines(layout, manifest, controls, running, added, progress)
        outcomes = failed | _await_engines(
            layout, manifest, controls, restarts, failed, progress, running
        )
        results = tuple(
            replace(outcomes[r.name], ssh=r.ssh, ssh_outcome=_sshd_outcome(current, r))
            for r in manifest.hosts
        )
        report = _report(layout, manifest, results)
        if not report.ok:
            return report
        router_up = _bring_up_router(layout, manifest, progress)
        write_atomically(layout.inventory, render_inventory(layout, manifest, over_ssh=False))
        report = replace(report, inventory=layout.inventory, router=router_up)
        if not manifest.ssh:
            return report
        write_atomically(layout.ssh_inventory, render_inventory(layout, manifest, over_ssh=True))
        return replace(report, ssh_inventory=layout.ssh_inventory)


def _report(layout: SandboxLayout, manifest: Manifest, results: tuple[HostUp, ...]) -> UpReport:
    """What `up` did, before the router and the inventories (added once every host is ready)."""
    return UpReport(
        layout.root,
        results,
        None,
        None,
        manifest.install,
        manifest.containers,
        units=manifest.units,
        restart_seconds=manifest.restart_seconds,
        engine=manifest.engine,
        tp=manifest.tp,
        live=manifest.live,
    )


def _require_tools(
    layout: SandboxLayout, manifest: Manifest, router: bool, progress: Progress
) -> str | None:
    """What the sandbox's shape needs, checked before anything starts: git for `editable`,
    podman and the engine image for containers (the image's name), the router package, sshd.

    Raises:
        InputError: a tool is missing, or --router with units.
    """
    if manifest.install == "editable":
        require_git()
    image = None
    if manifest.containers:
        sandbox_containers.require_podman()
        podman = sandbox_containers.podman_env(layout)
        image = sandbox_containers.ensure_engine_image(podman, progress)
    if router or manifest.router is not None:
        if manifest.units:
            raise InputError(
                "--router does not go with --units yet (only each unit's head is a worker)",
                hint=f"drop --router, or `{PURGE}` first",
            )
        require_router_package()
    if manifest.ssh and find_sshd() is None:
        raise InputError(
            "`--ssh` needs OpenSSH's sshd, which is not installed",
            hint=f"apt-get install openssh-server (or run `{UP}` without --ssh)",
        )
    return image


def _with_real_engine(
    manifest: Manifest,
    progress: Progress,
    build_progress: BuildProgress,
    prepared: RealEngineRecord | None,
) -> Manifest:
    """A real engine's manifest with its shared parts built or found (`prepare_real_engine`),
    or as the caller `prepared` them."""
    if not manifest.engine.real:
        return manifest
    if prepared is not None:
        return replace(manifest, real=prepared)
    progress(f"real SGLang {manifest.engine.version}: its environment and models")
    return replace(manifest, real=prepare_real_engine(manifest.engine, build_progress))


def _stop_partial_units(
    layout: SandboxLayout, manifest: Manifest, running: set[str], progress: Progress
) -> set[str]:
    """Stop the running nodes of each unit that does not run whole (a node started alone could
    not join them), so that every node of it starts together; returns the hosts stopped."""
    stopped: set[str] = set()
    for unit in partly_running(manifest.units, running):
        down = [h for h in unit.hosts if h not in running]
        progress(
            f"{unit.name}: {', '.join(down)} not running; stopping the others, to start the "
            "unit as one"
        )
        for name in unit.hosts:
            pid = engine_pid(layout, name)
            if name in running and pid is not None:
                stop_process_tree(pid, manifest.stop_timeout)
                stopped.add(name)
    return stopped


def _engine_running(layout: SandboxLayout, manifest: Manifest, name: str) -> bool:
    """Whether host `name`'s engine runs: its pid file's process, or its container."""
    if not manifest.containers:
        return engine_pid(layout, name) is not None
    found = sandbox_containers.inspect_container(layout, name)
    if found is None or not found.running:
        return False
    # the container outlives its engine (its start script): an engine that crashed answers
    # nothing on its port, and `up` restarts the container
    port = next(r.port for r in manifest.hosts if r.name == name)
    return port_taken(ENGINE_ADDRESS, port)


def _start_containers(
    layout: SandboxLayout, manifest: Manifest, image: str, running: set[str], progress: Progress
) -> dict[str, HostUp]:
    """Start each host's stopped container, or create it from `image`; returns the hosts that
    failed to start. Readiness is waited for next, as for engines on the host."""
    env = sandbox_containers.podman_env(layout)
    failed: dict[str, HostUp] = {}
    for record in manifest.hosts:
        if record.name in running:
            progress(f"{record.name}: already running")
            continue
        name = sandbox_containers.container_name(layout, record.name)
        try:
            found = sandbox_containers.inspect_container(layout, record.name)
            if found is None:
                progress(f"{record.name}: creating container {name} from {image}")
                sandbox_containers.run_container(layout, record.name, record.port, image, env)
            elif found.running:
                progress(f"{record.name}: its engine is not running: restarting container {name}")
                sandbox_containers.restart_container(layout, record.name, env)
            else:
                progress(f"{record.name}: starting container {name}")
                sandbox_containers.start_container(layout, record.name, env)
        except HostError as exc:
            failed[record.name] = _host_up(record, "failed", None, error=exc.detail)
    return failed


def _bring_up_router(
    layout: SandboxLayout, manifest: Manifest, progress: Progress
) -> RouterUp | None:
    """Start the recorded router (once every engine is ready, so it registers them at once)."""
    if manifest.router is None:
        return None
    record = manifest.router
    if router_pid(layout) is None:
        progress(f"router: starting sglang-router on {record.url}")
    pid = start_router(
        layout,
        port=record.port,
        prometheus_port=record.prometheus_port,
        worker_urls=[engine_url(r.port) for r in manifest.hosts],
    )
    return RouterUp(record.url, pid, record.prometheus_port)


def engine_controls(layout: SandboxLayout, manifest: Manifest) -> dict[str, EngineControl]:
    """Engine control per host, built from the `sandbox` inventory exactly as a rollout builds
    it: its transport (local, into the container for a containerised sandbox), host operations
    under the host's interpreter, its restart strategy."""
    inventory = sandbox_inventory(layout, manifest, over_ssh=False)
    controls = {}
    for record in manifest.hosts:
        host = inventory.host(record.name)
        ops = HostOperations(open_transport(host), host)
        playbook = sandbox_playbook(manifest.restart_seconds, real=manifest.engine.real)
        controls[record.name] = EngineControl(ops, host, playbook)
    return controls


def _start_engines(
    layout: SandboxLayout,
    manifest: Manifest,
    controls: dict[str, EngineControl],
    running: set[str],
    added: set[str],
    progress: Progress,
) -> tuple[dict[str, RestartReply], dict[str, HostUp]]:
    """Make each stopped host's environment (kept when it exists) and start its engine; all
    start before any is waited for, so they boot side by side. Returns the restarts and the
    hosts that failed to start."""
    restarts: dict[str, RestartReply] = {}
    failed: dict[str, HostUp] = {}
    for record in manifest.hosts:
        if record.name in running:
            progress(f"{record.name}: already running")
            continue
        verb = "creating" if record.name in added else "preparing"
        shape = "an editable git checkout" if manifest.install == "editable" else "a wheel"
        if manifest.engine.real:
            shape = f"real SGLang {manifest.engine.version}'s wheel"
        progress(
            f"{record.name}: {verb} its environment ({shape}) in {layout.host_dir(record.name)}"
        )
        try:
            if manifest.engine.real:
                make_real_host(layout, manifest, record.name, progress)
            else:
                make_host_python(layout.host_dir(record.name), install=manifest.install)
            layout.host_state_dir(record.name).mkdir(parents=True, exist_ok=True)
            enable_live_before_start(layout, manifest, record.name, progress)
            progress(f"{record.name}: starting the engine on {engine_url(record.port)}")
            _drop_stale_pid_file(layout, record.name)
            restarts[record.name] = controls[record.name].restart(step="start")
        except HostError as exc:
            error = _failure_text(exc, layout.log_file(record.name))
            failed[record.name] = _host_up(record, "failed", None, error=error)
    return restarts, failed


def _await_engines(
    layout: SandboxLayout,
    manifest: Manifest,
    controls: dict[str, EngineControl],
    restarts: dict[str, RestartReply],
    failed: dict[str, HostUp],
    progress: Progress,
    running: set[str],
) -> dict[str, HostUp]:
    """Wait until every host that did not fail to start answers /health (the readiness check
    a rollout uses, failing fast when a started engine exits)."""
    outcomes: dict[str, HostUp] = {}
    for record in manifest.hosts:
        if record.name in failed:
            continue
        restart = restarts.get(record.name)
        try:
            readiness = controls[record.name].wait_ready(restart)
        except HostError as exc:
            error = _failure_text(exc, layout.log_file(record.name))
            pid = restart.get("pid") if restart else None
            outcomes[record.name] = _host_up(record, "failed", pid, error=error)
            continue
        if manifest.containers:
            outcome: HostUpOutcome = "already-running" if record.name in running else "started"
            container = sandbox_containers.inspect_container(layout, record.name)
            progress(f"{record.name}: ready ({outcome}, container {record.name})")
            outcomes[record.name] = replace(
                _host_up(record, outcome, None, ready=readiness.seconds), container=container
            )
            continue
        outcome = "already-running" if restart is None else "started"
        pid = server_pid(layout, record.name)  # the engine's own, as status and diagnose show
        progress(f"{record.name}: ready ({outcome}, pid {pid})")
        outcomes[record.name] = _host_up(record, outcome, pid, ready=readiness.seconds)
    return outcomes


def _sshd_outcome(
    previous: Manifest | None, record: HostRecord
) -> Literal["started", "already-running"] | None:
    if record.ssh is None:
        return None
    before = next((r for r in previous.hosts if r.name == record.name), None) if previous else None
    same = before is not None and before.ssh is not None and before.ssh.pid == record.ssh.pid
    return "already-running" if same else "started"


def _host_up(
    record: HostRecord,
    outcome: HostUpOutcome,
    pid: int | None,
    *,
    ready: float | None = None,
    error: str | None = None,
) -> HostUp:
    return HostUp(
        host=record.name,
        outcome=outcome,
        port=record.port,
        url=engine_url(record.port),
        pid=pid,
        ready_seconds=ready,
        error=error,
    )


def _bring_up_sshds(layout: SandboxLayout, manifest: Manifest, progress: Progress) -> Manifest:
    """Start every host's sshd that is not running; record each in the manifest as it starts."""
    public_key = _ensure_user_key(layout)
    records = list(manifest.hosts)
    for index, record in enumerate(records):
        if sshd_pid(layout, record) is not None:
            continue
        assert record.ssh is not None
        progress(f"{record.name}: starting sshd on {record.ssh.address}")
        records[index] = replace(record, ssh=_start_sshd_for(layout, record, public_key))
        manifest = replace(manifest, hosts=tuple(records))
        save_manifest(layout, manifest)  # `down` can stop it even if a later one fails
    _write_known_hosts(layout, manifest)
    return manifest
