"""`opspatch sandbox up|status|down|prepare|...`: the local fleet of engines (the stand-in or real
SGLang on the CPU), from the command line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from opspatch.cli.context import options
from opspatch.cli.params import JsonOption
from opspatch.cli.render import emit_json, err, out
from opspatch.errors import EXIT_HOST_FAILED, InputError
from opspatch.sandbox import MAX_HOSTS
from opspatch.sandbox.dist import STANDIN_FIXED_IN

if TYPE_CHECKING:  # the fleet module is imported by the commands (it pulls the runs in)
    from opspatch.sandbox.dist import InstallShape
    from opspatch.sandbox.fleet import DownReport, HostStatus, StatusReport, UpReport
    from opspatch.sandbox.real.build import BuildEvent, BuildProgress
    from opspatch.sandbox.real.release import EngineChoice
    from opspatch.sandbox.units import UnitShape

sandbox_app = typer.Typer(
    name="sandbox",
    no_args_is_help=True,
    rich_markup_mode=None,
    help=(
        "A local fleet of SGLang engines (no GPU, no remote host), the stand-in or real SGLang "
        "on the CPU: `up`, then `opspatch apply eagle-init-guard --hosts sandbox`."
    ),
)


def _progress(message: str) -> None:
    err.print(message, markup=False)


def _install_shape(value: str | None) -> InstallShape | None:
    """`--install` checked: one clear message (exit 2) for anything but the two shapes."""
    if value is None:
        return None
    if value == "wheel":
        return "wheel"
    if value == "editable":
        return "editable"
    raise InputError(
        f"--install {value!r}: expected wheel or editable",
        hint="wheel installs each engine like a wheel; editable as a git checkout (pip install -e)",
    )


def _unit_shape(units: int | None, nodes: int | None, tp: int | None) -> UnitShape | None:
    """`--units/--nodes/--tp` checked: --nodes only with --units (`--tp` alone shapes single
    servers)."""
    from opspatch.sandbox.units import DEFAULT_NODES, UnitShape

    if units is None:
        if nodes is not None:
            raise InputError(
                "--nodes shapes the units of `--units U`",
                hint="e.g. opspatch sandbox up --units 1 --nodes 2 --tp 1",
            )
        return None
    return UnitShape(units, DEFAULT_NODES if nodes is None else nodes, 1 if tp is None else tp)


def _engine(value: str | None) -> EngineChoice | None:
    """`--engine` checked (one clear message, exit 2, for an engine or release it cannot run)."""
    from opspatch.sandbox.real.release import parse_engine

    return None if value is None else parse_engine(value)


@contextmanager
def build_display() -> Iterator[BuildProgress]:
    """How a real engine's build shows its minutes: a spinner with the step and the latest line
    on a terminal; on a pipe or file, a line per step and per logged event (a batch of
    downloads, the models' training lines)."""
    if not err.is_terminal:
        said: set[tuple[int, str]] = set()

        def lines(event: BuildEvent) -> None:
            if (event.step, event.title) not in said or event.logged or event.title == "models":
                said.add((event.step, event.title))
                where = f"[{event.step}/{event.steps} {event.title}]"
                err.print(f"{where} {event.detail}".rstrip(), markup=False)

        yield lines
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as display:
        task = display.add_task("real SGLang's environment", total=None)

        def spinner(event: BuildEvent) -> None:
            detail = event.detail if len(event.detail) < 90 else event.detail[:87] + "..."
            display.update(task, description=f"[{event.step}/{event.steps} {event.title}] {detail}")

        yield spinner


@sandbox_app.command()
def up(
    count: Annotated[
        int | None,
        typer.Option(
            "--count",
            "-n",
            help=f"How many hosts (1-{MAX_HOSTS}; default: as many as the sandbox has, else 3)",
            metavar="N",
        ),
    ] = None,
    ssh: Annotated[
        bool,
        typer.Option(
            "--ssh", help="Also run a private sshd per host on 127.0.0.2, ... (sandbox-ssh)"
        ),
    ] = False,
    install: Annotated[
        str | None,
        typer.Option(
            "--install",
            metavar="wheel|editable",
            help="How each engine is installed: like a wheel in site-packages (wheel), or as a "
            "git checkout <host>/sglang installed with pip install -e (editable). "
            "Default: the sandbox's, else wheel",
        ),
    ] = None,
    containers: Annotated[
        bool,
        typer.Option(
            "--containers",
            help="Run each engine in a podman container from a locally built image, installed "
            "editable in /sgl-workspace/sglang as in the upstream image (needs podman, runc and "
            "debootstrap, as root)",
        ),
    ] = False,
    router: Annotated[
        bool,
        typer.Option(
            "--router",
            help="Also run a real sglang-router (retries off) in front of the engines on "
            "127.0.0.1, written into the inventories as every host's router",
        ),
    ] = False,
    units: Annotated[
        int | None,
        typer.Option(
            "--units",
            metavar="U",
            help="Build U multi-node servers instead of single hosts: each of --nodes hosts, "
            "started with --nnodes/--node-rank/--dist-init-addr, declared as units in the "
            "inventories (default: the sandbox's units, else none)",
        ),
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(
            "--nodes", metavar="N", help="Nodes (hosts) per unit, with --units (default 2)"
        ),
    ] = None,
    tp: Annotated[
        int | None,
        typer.Option(
            "--tp",
            metavar="T",
            help="Scheduler processes (TP ranks) of each server, or per node with --units (the "
            "engine's --tp-size is T x N); default: the sandbox's, else 1",
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            metavar="standin|sglang|sglang==V",
            help="The engine: the stand-in (fast, nothing to download) or real SGLang on the "
            "CPU (sglang = 0.5.23; its ~3 GB environment and models are built once and cached). "
            "Default: the sandbox's, else standin",
        ),
    ] = None,
    live: Annotated[
        bool | None,
        typer.Option(
            "--live/--no-live",
            help="Write `live = true` into the inventories (live fixes may be taken on the "
            "engines); default: the sandbox's, else off",
        ),
    ] = None,
    restart_seconds: Annotated[
        float | None,
        typer.Option(
            "--restart-seconds",
            metavar="S",
            help="Make every engine start (this one and each later restart) take S more seconds, "
            "as a real model's weight loading and CUDA graph capture do (default: the "
            "sandbox's, else 0)",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Create and start the sandbox hosts, wait until they are ready, write the inventories.

    Safe to run again: running hosts are left alone, stopped ones started, ports kept, the
    install shape kept, and patched files never reinstalled.
    """
    # Long because: one typer option per flag in the signature; the body is a dozen lines
    from opspatch.sandbox.fleet import SandboxLayout, sandbox_up

    shape = _unit_shape(units, nodes, tp)
    with build_display() as build_progress:
        report = sandbox_up(
            SandboxLayout.default(),
            hosts=count,
            ssh=ssh,
            install=_install_shape(install),
            containers=True if containers else None,
            router=router,
            units=shape,
            restart_seconds=restart_seconds,
            engine=_engine(engine),
            tp=None if shape is not None else tp,
            live=live,
            progress=_progress,
            build_progress=build_progress,
        )
    if as_json:
        emit_json(report.to_json())
    else:
        _print_up(report)
    if not report.ok:
        raise typer.Exit(EXIT_HOST_FAILED)


@sandbox_app.command()
def prepare(
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            metavar="sglang|sglang==V",
            help="The real engine to build (default: sglang, 0.5.23)",
        ),
    ] = "sglang",
    as_json: JsonOption = False,
) -> None:
    """Build a real engine's shared environment and models into the engine cache and start
    nothing (what `up --engine sglang` does first; CI runs it before the real-engine tests).
    The cache: OPSPATCH_ENGINE_CACHE, else ~/.cache/opspatch/engines."""
    from opspatch.sandbox.real.prepare import prepare_real_engine

    choice = _engine(engine)
    if choice is None or not choice.real:
        raise InputError("the stand-in needs no preparing", hint="--engine sglang")
    with build_display() as build_progress:
        record = prepare_real_engine(choice, build_progress)
    if as_json:
        emit_json({"engine": choice.label, **record.to_json()})
        return
    out.print(f"{choice.label}: environment {record.base}", markup=False)
    out.print(f"  models: {record.target}, {record.draft}", markup=False)


@sandbox_app.command()
def status(as_json: JsonOption = False) -> None:
    """Each host: engine pid, port, /health, the patches its file carries, its ssh address."""
    from opspatch.sandbox.fleet import SandboxLayout, sandbox_status

    report = sandbox_status(SandboxLayout.default(), options.workspace_dir())
    if as_json:
        emit_json(report.to_json())
    else:
        _print_status(report)


@sandbox_app.command()
def down(
    purge: Annotated[
        bool,
        typer.Option(
            "--purge", help="Also remove the host folders, the manifest and the inventories"
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Stop every sandbox engine and sshd by pid; remove nothing unless --purge."""
    from opspatch.sandbox.fleet import SandboxLayout, sandbox_down

    report = sandbox_down(SandboxLayout.default(), purge=purge, progress=_progress)
    if as_json:
        emit_json(report.to_json())
    else:
        _print_down(report)


# ---------------------------------------------------------------------------------------------
# printing


def _title(root: object, engine: EngineChoice, install: str, tp: int, live: bool) -> str:
    words = [f"engine: {engine.label}", f"install: {install}"]
    words += [f"tp: {tp}"] if tp > 1 else []
    words += ["live"] if live else []
    return f"sandbox {root} ({', '.join(words)})"


def _print_up(report: UpReport) -> None:
    title = _title(report.root, report.engine, report.install, report.tp, report.live)
    table = Table(title=title, title_justify="left")
    for column in ("host", "outcome", "pid", "url", "ssh"):
        table.add_column(column)
    for host in report.hosts:
        ssh = f"{host.ssh.address}:{host.ssh.port}" if host.ssh and host.ssh.port else "-"
        style = "red" if host.outcome == "failed" else ""
        table.add_row(host.host, host.outcome, str(host.pid or "-"), host.url, ssh, style=style)
    out.print(table)
    for host in report.hosts:
        if host.error:
            out.print(f"{host.host}: {host.error}", markup=False)
    for unit in report.units:
        out.print(
            f"{unit.name}: head {unit.head}, nodes {', '.join(unit.hosts)} "
            f"(--tp-size {unit.tp_size}, --dist-init-addr port {unit.dist_port})",
            markup=False,
        )
    if report.router:
        out.print(f"router: {report.router.url} (pid {report.router.pid})", markup=False)
    if report.restart_seconds:
        out.print(
            f"each engine start takes {report.restart_seconds:g} s more (--restart-seconds)",
            markup=False,
        )
    if report.inventory:
        out.print(f"inventory: {report.inventory} (--hosts sandbox)", markup=False)
    if report.ssh_inventory:
        out.print(f"inventory: {report.ssh_inventory} (--hosts sandbox-ssh)", markup=False)
    if not report.ok:
        out.print("not every host is ready; the inventories were not updated", markup=False)


def _health_text(host: HostStatus) -> str:
    if host.health is None:
        return host.health_detail
    return str(host.health)


def _carried(host: HostStatus) -> str:
    """The patches the host's files carry; partial or undecidable ones are marked."""
    shown = [
        p.patch if p.state == "applied" else f"{p.patch} ({p.state})"
        for p in host.patches
        if p.state != "not-applied"
    ]
    return ", ".join(shown) or "none"


def _node_text(unit: str, nodes: tuple[str, ...], host: str) -> str:
    rank = nodes.index(host)
    return f"{unit} rank {rank}" + (" (head)" if rank == 0 else "")


def _print_status(report: StatusReport) -> None:
    title = _title(report.root, report.engine, report.install, report.tp, report.live)
    table = Table(title=title, title_justify="left")
    columns = ("host", "pid", "port", "health", "install", "carries", "ssh")
    for column in (*columns, "unit") if report.units else columns:
        table.add_column(column)
    for host in report.hosts:
        pid = str(host.pid) if host.pid is not None else "stopped"
        if host.container is not None:
            state = host.container.status or "unknown"
            pid = f"container {host.container.id[:12]} ({state})"
        patches = _carried(host)
        ssh = "-"
        if host.ssh is not None and host.ssh.port:
            ssh = f"{host.ssh.address}:{host.ssh.port}" + ("" if host.ssh_running else " (stopped)")
        install = host.install or "-"
        row = [host.host, pid, str(host.port), _health_text(host), install, patches, ssh]
        if report.units:
            unit = report.unit_of(host.host)
            row.append("-" if unit is None else _node_text(unit.name, unit.nodes, host.host))
        table.add_row(*row)
    out.print(table)
    for unit in report.units:
        serves = "serves" if unit.head_serves else "does NOT serve"
        out.print(
            f"{unit.name}: head {unit.head} {serves}; nodes {', '.join(unit.nodes)} "
            f"({len(unit.running)}/{len(unit.nodes)} running)",
            markup=False,
        )
    for host in report.hosts:
        if host.checkout:
            inside = f" in container {host.container.name}" if host.container else ""
            out.print(f"{host.host}: git checkout {host.checkout}{inside}", markup=False)
        for note in host.notes:
            err.print(f"{host.host}: {note}", markup=False)
    if report.router:
        running = f"pid {report.router.pid}" if report.router.pid else "not running"
        out.print(f"router: {report.router.url} ({running})", markup=False)
    for note in report.notes:
        err.print(note, markup=False)


@sandbox_app.command()
def load(
    requests: Annotated[
        int | None,
        typer.Option(
            "--requests",
            metavar="N",
            help="Send at most N requests (default: no count; --seconds alone ends the load)",
        ),
    ] = None,
    seconds: Annotated[
        float, typer.Option("--seconds", metavar="S", help="Stop after S seconds")
    ] = 30.0,
    concurrency: Annotated[
        int, typer.Option("--concurrency", metavar="C", help="Clients sending at once")
    ] = 4,
    url: Annotated[
        str | None,
        typer.Option("--url", metavar="URL", help="The router (default: the sandbox's router)"),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Steady generate requests through the router: which limit ended the load, sent,
    succeeded, failed (with reasons), latency percentiles, and per worker what it served after
    its last re-admission."""
    from opspatch.sandbox.fleet import SandboxLayout
    from opspatch.sandbox.load import run_load
    from opspatch.sandbox.manifest import load_manifest

    if url is None:
        manifest = load_manifest(SandboxLayout.default())
        if manifest is None or manifest.router is None:
            raise InputError(
                "the sandbox has no router", hint="start one: opspatch sandbox up --router"
            )
        url = manifest.router.url
    report = run_load(url, requests=requests, seconds=seconds, concurrency=concurrency)
    if as_json:
        emit_json(report.to_json())
        return
    latency = ", ".join(f"{k} {v:g} ms" for k, v in report.latency_ms.items()) or "-"
    out.print(
        f"{report.sent} sent in {report.seconds:.1f}s through {report.router}: "
        f"{report.succeeded} succeeded, {report.failed} failed; latency {latency}; "
        f"ended by {report.ended}",
        markup=False,
    )
    for reason, count in sorted(report.failures.items()):
        out.print(f"  failed: {count} x {reason}", markup=False)
    for worker in report.workers:
        served = (
            "?"
            if worker.served_after_last_admission is None
            else worker.served_after_last_admission
        )
        since = "since its re-admission" if worker.registrations > 1 else "since it started"
        out.print(f"  {worker.url}: {served} requests {since}", markup=False)


@sandbox_app.command()
def reinstall(
    host: Annotated[str, typer.Argument(help="The sandbox host, e.g. sandbox-01", metavar="HOST")],
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            metavar="V",
            help="Install release V instead (an upgrade or downgrade; from "
            f"{STANDIN_FIXED_IN} on the release ships the incident's fix). Default: the "
            "installed release",
        ),
    ] = None,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart", help="Then restart the host's engine onto it and wait until it is ready"
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Reinstall the engine on a sandbox host as pip would (its release's files back, a patch
    or hand edit in them gone), or upgrade it with --version: what status, drift and sync then
    meet. The running engine keeps the code it loaded unless --restart."""
    from opspatch.sandbox.fleet import SandboxLayout
    from opspatch.sandbox.reinstall import sandbox_reinstall

    report = sandbox_reinstall(SandboxLayout.default(), host, version=version, restart=restart)
    if as_json:
        emit_json(report.to_json())
        return
    what = (
        f"upgraded sglang {report.version_before} -> {report.version}"
        if report.upgrade
        else f"reinstalled sglang {report.version}"
    )
    if report.restarted:
        engine = f"the engine was restarted onto it (pid {report.pid})"
    elif report.pid is not None:
        engine = (
            f"the running engine (pid {report.pid}) still runs the code it loaded: add --restart "
            "to restart it"
        )
    else:
        engine = "the engine is not running (`opspatch sandbox up` starts it)"
    out.print(
        f"{report.host}: {what} ({report.install}), the release's files as it ships them; {engine}",
        markup=False,
    )


def _print_down(report: DownReport) -> None:
    for host in report.hosts:
        parts = []
        if host.stopped:
            named = f" (pid {host.pid})" if host.pid is not None else ""
            tree = ", ".join(map(str, host.stopped))
            parts.append(f"engine{named} stopped, its process tree: pids {tree}")
        if host.sshd_stopped:
            parts.append(f"sshd stopped (pid {host.sshd_stopped})")
        if host.container:
            parts.append(f"container {host.container}")
        out.print(f"{host.host}: {'; '.join(parts) or 'was not running'}", markup=False)
    for path in report.removed:
        out.print(f"removed {path}", markup=False)
    for note in report.notes:
        out.print(note, markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
