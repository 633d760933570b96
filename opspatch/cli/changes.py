"""`opspatch apply | rollback | recover`: the commands that change hosts."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from opspatch.cli.context import options
from opspatch.cli.localapply import apply_local
from opspatch.cli.params import (
    AcceptKeysOption,
    FileOption,
    HostsOption,
    JsonOption,
    LeaseExpiryOption,
    PatchArgument,
    PlaybookOption,
    YesOption,
)
from opspatch.cli.patches import (
    RootOption,
    TargetVersionOption,
    one_target,
    show_fleet_plan,
    show_local_plan,
)
from opspatch.cli.render import LiveProgress, confirm_or_refuse, finish
from opspatch.core.vocabulary import RestartPolicy
from opspatch.errors import InputError, OpspatchError

if TYPE_CHECKING:
    from opspatch.core.host import Host
    from opspatch.core.policy import Playbook
    from opspatch.core.spec import LoadedPatch
    from opspatch.ledger.records import RunDetail
    from opspatch.ledger.store import Ledger

PythonOption = Annotated[
    str,
    typer.Option(
        "--python",
        help="With --file or --root: the interpreter that validates the new text.",
        metavar="PYTHON",
        # the path differs per machine (and per `python`/`python3`): the reference shows a word
        show_default="the Python opspatch runs on",
    ),
]


def with_lease_expiry(playbook: Playbook, seconds: float | None) -> Playbook:
    """The playbook with `--lease-expiry` over its `[team] lease_expiry` (the flag wins)."""
    if seconds is None:
        return playbook
    return replace(playbook, team=replace(playbook.team, lease_expiry=seconds))


def restart_policy(playbook: Playbook, restart: str | None) -> Playbook:
    """The playbook with `--restart` over its `restart` (the flag wins).

    Raises:
        InputError: `restart` is neither `always` nor `never`.
    """
    if restart is None:
        return playbook
    if restart not in ("always", "never"):
        raise InputError(f"--restart {restart!r}: expected always or never")
    return replace(playbook, restart=RestartPolicy(restart))


def apply(
    patch: PatchArgument,
    file: FileOption = None,
    root: RootOption = None,
    hosts: HostsOption = None,
    playbook: PlaybookOption = "default",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show every host's plan; change nothing.")
    ] = False,
    yes: YesOption = False,
    restart: Annotated[
        str | None,
        typer.Option(
            "--restart",
            help="always: restart, wait, smoke after the swap (default: the playbook's); never: "
            "stage the file only (hosts are `staged` until `opspatch restart`).",
            metavar="RESTART",
        ),
    ] = None,
    python: PythonOption = sys.executable,
    target_version: TargetVersionOption = None,
    accept_new_host_keys: AcceptKeysOption = False,
    lease_expiry: LeaseExpiryOption = None,
    live: Annotated[
        bool,
        typer.Option(
            "--live",
            help="Take the fix into the running engines (every process, at one scheduling "
            "boundary) instead of restarting them; the file is swapped too, for the next "
            "restart. Needs live = true and `opspatch live enable`; a change whose live form "
            "is refused refuses the run before any change (exit 2): apply without --live "
            "restarts.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Apply a patch: to a local file or tree, or across hosts (lock, swap, restart, smoke, roll back on failure)."""
    one_target(file, hosts, "apply", root)
    if live and hosts is None:
        raise InputError("--live takes a fix into running engines: it needs --hosts TARGET")
    loaded = options.load_patch(patch)
    if file is not None or root is not None:
        if dry_run:
            show_local_plan(loaded, file, target_version, as_json, root)
            return
        apply_local(loaded, file, root, python, target_version, yes, as_json)
    assert hosts is not None
    if dry_run:
        show_fleet_plan(loaded, hosts, playbook, accept_new_host_keys, as_json)
    from opspatch.runs.commands.apply import apply_to_hosts
    from opspatch.runs.fleet.liveapply import live_former

    selected = options.hosts(hosts)
    playbook_obj = restart_policy(options.load_playbook(playbook), restart)
    playbook_obj = with_lease_expiry(fleet_governed(playbook_obj), lease_expiry)
    names = [h.name for h in selected]
    staging = " (staged: no restart)" if playbook_obj.restart == RestartPolicy.NEVER else ""
    staging = " (live: no restart)" if live else staging
    confirm_or_refuse(
        f"Apply {loaded.spec.id} to {len(names)} host(s): {', '.join(names)} "
        f"(playbook {playbook_obj.name}){staging}?",
        yes=yes,
    )
    ledger = options.open_ledger()
    with LiveProgress(names, enabled=not as_json) as progress:
        report = apply_to_hosts(
            loaded,
            selected,
            playbook_obj,
            factory=options.connector(accept_new_host_keys=accept_new_host_keys),
            ledger=ledger,
            progress=progress,
            live=live_former if live else None,
        )
    finish(report, as_json)


def fleet_governed(playbook: Playbook) -> Playbook:
    """The playbook an apply runs under: a workspace whose fleet.toml asks for approval
    (`[team]`) gets it for a plain apply too, so apply is no way around what sync must honour.

    Raises:
        SpecError: the workspace's fleet.toml is not valid (file:line: field).
    """
    from opspatch.config.fleet import fleet_path, load_fleet

    workspace = options.workspace_dir()
    if not fleet_path(workspace).is_file():
        return playbook
    return load_fleet(workspace).governing(playbook)


def rollback(
    patch: Annotated[
        str | None, typer.Argument(help="Patch id or path (or use --run)", metavar="PATCH")
    ] = None,
    run: Annotated[
        str | None, typer.Option("--run", help="Undo the changes of this run id", metavar="RUN_ID")
    ] = None,
    file: FileOption = None,
    root: RootOption = None,
    hosts: HostsOption = None,
    playbook: PlaybookOption = "default",
    restart: Annotated[
        str | None,
        typer.Option(
            "--restart",
            help="always: restart, wait, smoke after the restore (default: the playbook's); "
            "never: restore the files only (hosts are `staged-back`; for a host whose "
            "inventory sets no engine restart).",
            metavar="RESTART",
        ),
    ] = None,
    yes: YesOption = False,
    python: PythonOption = sys.executable,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Restore the pre-images opspatch recorded (where the file is still what opspatch wrote), restart, smoke."""
    from opspatch.runs.commands.rollback import rollback_hosts

    if (patch is None) == (run is None):
        raise InputError("rollback needs exactly one of PATCH or --run RUN_ID")
    if hosts is None and (file is not None or root is not None):
        one_target(file, None, "rollback", root)
        _rollback_local(patch, run, file, root, python, yes, as_json)
    # the run to undo is in a ledger that is there; for a patch, one is made once it is asked
    ledger = options.reading_ledger() if run is not None else None
    source_run = ledger.get_run(run) if ledger is not None and run is not None else None
    if hosts is None and source_run is not None:
        selected = hosts_of_run(source_run.summary.hosts, source_run.summary.inventories)
    else:
        one_target(file, hosts, "rollback", root)
        assert hosts is not None
        selected = options.hosts(hosts)
    loaded = options.load_patch(patch) if patch is not None else None
    names = [h.name for h in selected]
    what = loaded.spec.id if loaded else f"run {run}"
    playbook_obj = restart_policy(options.load_playbook(playbook), restart)
    restart_engine = playbook_obj.restart != RestartPolicy.NEVER
    staging = "" if restart_engine else " (files only: no restart)"
    confirm_or_refuse(
        f"Roll back {what} on {len(names)} host(s): {', '.join(names)}{staging}?", yes=yes
    )
    with LiveProgress(names, enabled=not as_json) as progress:
        report = rollback_hosts(
            ledger=ledger if ledger is not None else options.open_ledger(),
            hosts=selected,
            factory=options.connector(accept_new_host_keys=accept_new_host_keys),
            playbook=playbook_obj,
            patch=loaded,
            source_run=None if loaded else source_run,
            progress=progress,
            restart_engine=restart_engine,
        )
    finish(report, as_json)


def _rollback_local(
    patch: str | None,
    run: str | None,
    file: Path | None,
    root: Path | None,
    python: str,
    yes: bool,
    as_json: bool,
) -> NoReturn:
    """`rollback --file F` / `--root DIR`: the local file's (tree's) recorded pre-images."""
    from opspatch.runs.commands.local_files import rollback_local_file, rollback_local_tree

    ledger = options.open_ledger()
    source_run = ledger.get_run(run) if run is not None else None
    loaded = options.load_patch(patch) if patch is not None else None
    what = loaded.spec.id if loaded else f"run {run}"
    local = rollback_local_tree if root is not None else rollback_local_file
    target = root if root is not None else file
    assert target is not None
    checked = local(  # a refusal (no record, one file of a set) comes before the question
        target,
        patch=loaded,
        source_run=source_run,
        python=python,
        ledger=ledger,
        state_dir=options.state_dir(),
    )
    where = f"the files under {root} to their" if root is not None else f"{file} to its"
    confirm_or_refuse(f"Restore {where} state before {what}?", yes=yes)
    finish(checked.run(ledger), as_json)


def hosts_of_run(
    names: Sequence[str], inventories: Mapping[str, str] | None = None
) -> tuple[Host, ...]:
    """The inventory hosts of a recorded run: each from the inventory the run took it from (its
    `inventories`, when the workspace still finds that inventory), else looked up by name across
    the workspace's inventories. Without the first, a host name that two inventories share (the
    sandbox's `sandbox` and `sandbox-ssh`) could not be recovered at all."""
    workspace = options.workspace_dir()
    items = []
    for name in names:
        inventory = (inventories or {}).get(name)
        found = inventory and workspace.locate("inventories", inventory) is not None
        items.append(f"{inventory}:{name}" if found else name)
    return options.hosts(",".join(items))


def recover(
    run: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="The run to finish or undo: interrupted, or begun on another machine whose "
            "lease expired (default: the newest interrupted run)",
            metavar="RUN_ID",
        ),
    ] = None,
    hosts: HostsOption = None,
    playbook: PlaybookOption = "default",
    yes: YesOption = False,
    accept_new_host_keys: AcceptKeysOption = False,
    lease_expiry: LeaseExpiryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Bring hosts a run left behind to a known state: an interrupted run and the runs it
    descends from (default: the newest interrupted run; with none, the hosts recent runs left
    needing attention), or `--hosts` whatever run touched them."""
    from opspatch.runs.commands.recover import (
        recover_hosts,
        recover_run,
        require_recoverable,
        run_chain,
    )

    factory = options.connector(accept_new_host_keys=accept_new_host_keys)
    playbook_obj = with_lease_expiry(options.load_playbook(playbook), lease_expiry)

    def recover_by_host(selected: tuple[Host, ...], question: str) -> NoReturn:
        """Whatever run touched them: confirm, recover, print the report and exit."""
        confirm_or_refuse(question, yes=yes)
        with LiveProgress([h.name for h in selected], enabled=not as_json) as progress:
            report = recover_hosts(
                ledger=options.open_ledger(),
                hosts=selected,
                factory=factory,
                playbook=playbook_obj,
                patch=None,
                progress=progress,
            )
        finish(report, as_json)

    if hosts is not None:
        if run is not None:
            raise InputError("recover takes --run RUN_ID or --hosts TARGET, not both")
        selected = options.hosts(hosts)
        names = [h.name for h in selected]
        recover_by_host(selected, f"Recover {len(names)} host(s): {', '.join(names)}?")
    ledger = options.reading_ledger()  # the run to recover is recorded in a ledger that is there
    if run is None:
        run = _newest_interrupted(ledger, recover_by_host)
    detail = ledger.get_run(run)
    require_recoverable(ledger, detail)
    chain = run_chain(ledger, detail.run_id)
    names = list(dict.fromkeys(h for d in reversed(chain) for h in d.summary.hosts))
    inventories = {h: i for d in reversed(chain) for h, i in (d.summary.inventories or {}).items()}
    selected = hosts_of_run(names, inventories)
    loaded = _patch_of_chain(chain)
    runs = ", ".join(d.run_id for d in chain)
    confirm_or_refuse(f"Recover run {runs} on {len(selected)} host(s)?", yes=yes)
    with LiveProgress([h.name for h in selected], enabled=not as_json) as progress:
        report = recover_run(
            ledger=ledger,
            chain=chain,
            hosts=selected,
            factory=factory,
            playbook=playbook_obj,
            patch=loaded,
            progress=progress,
        )
    finish(report, as_json)


def _newest_interrupted(
    ledger: Ledger, recover_by_host: Callable[[tuple[Host, ...], str], NoReturn]
) -> str:
    """The newest interrupted run's id; with none, the hosts recent runs left needing attention
    go to `recover_by_host` (which does not return).

    Raises:
        InputError: no interrupted run, and no host left needing attention.
    """
    from opspatch.runs.commands.recover import hosts_left_needing_attention

    interrupted = [r for r in ledger.list_runs(limit=200) if r.status == "interrupted"]
    if interrupted:
        return interrupted[0].run_id
    left = hosts_left_needing_attention(ledger)
    if not left:
        raise InputError(
            "no interrupted run in the ledger, and no host that a recent run left "
            "needing attention",
            hint="`opspatch ledger list` shows the runs; a host whose lock outlived its "
            "run: `opspatch recover --hosts TARGET` or `opspatch unlock --hosts TARGET`",
        )
    # a finished run can leave hosts behind too (its connection lost mid-swap, the
    # lock still held): reach them as `recover --hosts` would
    selected = hosts_of_run(list(left), {h: i for h, i in left.items() if i})
    names = [h.name for h in selected]
    recover_by_host(
        selected,
        f"No run is interrupted; recover the {len(names)} host(s) recent runs left "
        f"needing attention ({', '.join(names)})?",
    )


def _patch_of_chain(chain: Sequence[RunDetail]) -> LoadedPatch | None:
    """The patch the chain's runs applied, when it still loads from the workspace."""
    patch_id = next((d.summary.patch_id for d in chain if d.summary.patch_id), None)
    if not patch_id:
        return None
    try:
        return options.load_patch(patch_id)
    except OpspatchError:
        return None


def unlock(
    hosts: HostsOption = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Also remove a lock whose run this ledger does not know, or whose run's lease "
            "is live (another controller's; never a run running here).",
        ),
    ] = False,
    yes: YesOption = False,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Remove host locks left behind by runs that are over (recorded in the ledger)."""
    from opspatch.runs.commands.unlock import unlock_hosts

    if hosts is None:
        raise InputError("unlock needs --hosts TARGET", hint="opspatch unlock --hosts gpu-01")
    selected = options.hosts(hosts)
    names = [h.name for h in selected]
    confirm_or_refuse(
        f"Remove the opspatch lock on {len(names)} host(s): {', '.join(names)}?", yes=yes
    )
    with LiveProgress(names, enabled=not as_json) as progress:
        report = unlock_hosts(
            ledger=options.open_ledger(),
            hosts=selected,
            factory=options.connector(accept_new_host_keys=accept_new_host_keys),
            playbook=options.load_playbook("default"),
            force_unknown=force,
            progress=progress,
        )
    finish(report, as_json)


def restart(
    hosts: HostsOption = None,
    playbook: PlaybookOption = "default",
    yes: YesOption = False,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Complete staged patches (apply --restart never), a staged live plugin (live enable,
    live disable) and a file put back under a server still running the fix (rollback --restart
    never): restart each host's engine under the playbook, wait, smoke-decode, roll back the
    staged change on failure."""
    from opspatch.runs.commands.restart import restart_hosts

    if hosts is None:
        raise InputError("restart needs --hosts TARGET", hint="opspatch restart --hosts gpu-fleet")
    selected = options.hosts(hosts)
    names = [h.name for h in selected]
    playbook_obj = options.load_playbook(playbook)
    confirm_or_refuse(
        f"Restart the engines of {len(names)} host(s) with staged changes: {', '.join(names)}?",
        yes=yes,
    )
    with LiveProgress(names, enabled=not as_json) as progress:
        report = restart_hosts(
            ledger=options.open_ledger(),
            hosts=selected,
            factory=options.connector(accept_new_host_keys=accept_new_host_keys),
            playbook=playbook_obj,
            progress=progress,
        )
    finish(report, as_json)


def register(app: typer.Typer) -> None:
    app.command()(apply)
    app.command()(rollback)
    app.command()(recover)
    app.command()(unlock)
    app.command()(restart)
