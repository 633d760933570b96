"""`opspatch schema | check | plan`: patch files and what they would do; nothing is changed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.text import Text

from opspatch.cli.context import options
from opspatch.cli.localapply import plan_local
from opspatch.cli.params import AcceptKeysOption, FileOption, HostsOption, JsonOption
from opspatch.cli.render import emit_json, err, out, print_diff, print_dry_run, print_error
from opspatch.errors import EXIT_BAD_INPUT, InputError, OpspatchError

if TYPE_CHECKING:
    from opspatch.analysis.provenance import Provenance
    from opspatch.core.edit import PlanOutcome
    from opspatch.core.spec import LoadedPatch
    from opspatch.runs.commands.local_files import LocalPlan

TargetVersionOption = Annotated[
    str | None,
    typer.Option(
        "--target-version",
        help="With --file or --root: the distribution version, when no dist-info says.",
        metavar="VERSION",
    ),
]
RootOption = Annotated[
    Path | None,
    typer.Option(
        "--root",
        help="A local tree holding the patch's modules (a set's too): each target is "
        "<DIR>/<module path>.py, e.g. a site-packages folder.",
        metavar="DIR",
    ),
]


def one_target(
    file: Path | None, hosts: str | None, command: str, root: Path | None = None
) -> None:
    """Exactly one of `--file`, `--root` and `--hosts`."""
    if sum(x is not None for x in (file, hosts, root)) != 1:
        raise InputError(
            f"{command} needs exactly one of --file PATH, --root DIR or --hosts TARGET",
            hint=f"opspatch {command} ... --hosts gpu-fleet   or   opspatch {command} ... --file "
            f"PATH   or (a patch set on a local tree)   opspatch {command} ... --root DIR",
        )


def schema() -> None:
    """Print the JSON Schema of patch files (point your editor's TOML validation at it)."""
    from opspatch.core.spec import patch_json_schema

    emit_json(patch_json_schema())


def check(
    patches: Annotated[
        list[str] | None,
        typer.Argument(
            help="Patch ids or .toml paths (default: every patch in the workspace)",
            metavar="PATCH",
        ),
    ] = None,
    releases: Annotated[
        str | None,
        typer.Option(
            "--releases",
            metavar="[SPEC]",
            help="Also apply each patch to every release of its distribution in its version "
            "range (or SPEC) from the package index: the portability matrix (exit 1 if a "
            "release in range fails).",
        ),
    ] = None,
    offline: Annotated[
        bool,
        typer.Option("--offline", help="With --releases: use only the release cache."),
    ] = False,
    playbook: Annotated[
        str | None,
        typer.Option(
            "--playbook",
            "-p",
            help="Verify each recorded signature against this playbook's [team] "
            "allowed_signers (default: the signers apply verifies against: the default "
            "playbook's, else fleet.toml's [team] when it asks for approval).",
            metavar="PLAYBOOK",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Lint patch files: schema, snippets parse, anchors well-formed (--releases: on every release).

    Without --releases, also shows each patch's provenance (origin, bug, forwarded,
    last_update, upstream), warns when it has not been forwarded upstream, and warns when its
    version range covers releases that `check --releases` has not proven it on (read from the
    release cache, offline)."""
    from opspatch.analysis.provenance import Provenance

    workspace = options.workspace_dir()
    references = patches or sorted(workspace.available("patches"))
    if not references:
        raise InputError(
            "no patches to check", hint="give patch ids or paths, or add patches/*.toml"
        )
    if releases is not None:
        check_releases_of(references, releases, offline, as_json)
    results: list[dict[str, Any]] = []
    provenances: dict[str, Provenance] = {}
    for reference in references:
        try:
            loaded = workspace.load_patch(reference)
        except OpspatchError as exc:
            results.append(
                {"patch": reference, "ok": False, "error": exc.message, "hint": exc.hint}
            )
            continue
        provenances[loaded.spec.id] = Provenance.of(loaded.spec, loaded.reference)
        results.append(_checked(loaded, provenances[loaded.spec.id], playbook))
    failed = [r for r in results if not r["ok"]]
    if as_json:
        emit_json({"ok": not failed, "patches": results})
    else:
        _print_checked(results, provenances)
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)


def _checked(loaded: LoadedPatch, provenance: Provenance, playbook: str | None) -> dict[str, Any]:
    """What `check` says of a patch that loads: its file, target, size, releases proven,
    provenance and recorded signatures."""
    from opspatch.runs.commands.releasecache import release_coverage

    parts = loaded.parts
    return {
        "patch": loaded.spec.id,
        "ok": True,
        "file": loaded.path,
        "sha256": loaded.sha256,
        "target": "; ".join(
            f"{p.target.module} ({p.target.distribution} {p.target.versions or 'any'})"
            for p in parts
        ),
        "edits": sum(len(p.edits) for p in parts),
        "postconditions": sum(len(p.postconditions) for p in parts),
        "releases": release_coverage(parts, reference=loaded.reference).to_json(),
        "provenance": {**provenance.to_json(), "warning": provenance.warning},
        "signed_by": recorded_signers(loaded.sha256, playbook),
    }


def _print_checked(results: list[dict[str, Any]], provenances: dict[str, Provenance]) -> None:
    """`check`'s results as text: each patch's line, signers, provenance and warnings, or its
    error."""
    for result in results:
        if result["ok"]:
            out.print(
                Text.assemble(
                    ("ok", "green"),
                    f"    {result['patch']}  {result['file']}  "
                    f"{result['edits']} edit(s), {result['postconditions']} postcondition(s)  "
                    f"-> {result['target']}",
                )
            )
            for signer in result["signed_by"]:
                out.print(
                    f"      signed by {signer['principal']} ({_verdict(signer)}; recorded "
                    f"by {signer['operator']} at {signer['recorded_at']})",
                    markup=False,
                )
            for line in provenances[result["patch"]].lines():
                out.print(f"      {line}", markup=False, highlight=False)
            for warning in (result["provenance"]["warning"], result["releases"]["warning"]):
                if warning:
                    err.print(
                        Text.assemble(("warning", "yellow"), f"  {result['patch']}: {warning}")
                    )
        else:  # the message quotes the file, which print_error shows as text, not markup
            print_error(
                result["error"], hint=result["hint"], exit_code=EXIT_BAD_INPUT, as_json=False
            )


def _allowed_signers(playbook: str | None) -> str | None:
    """The allowed_signers file `check` verifies signatures against: the one an apply under the
    same playbook verifies against (`fleet_governed`): the named playbook's (an unknown or
    invalid one is refused), else the default playbook's, if there is one; and where that
    playbook asks for no approval, the workspace fleet.toml's `[team]` signers when it asks.

    Raises:
        SpecError: the workspace's fleet.toml is not valid (as apply refuses it).
    """
    from opspatch.cli.changes import fleet_governed
    from opspatch.core.policy import Playbook

    if playbook is not None:
        chosen = options.load_playbook(playbook)
    elif options.workspace_dir().locate("playbooks", "default") is None:
        chosen = Playbook()  # no default playbook here: only fleet.toml can name signers
    else:
        chosen = options.load_playbook("default")
    return fleet_governed(chosen).team.allowed_signers


def recorded_signers(patch_sha256: str, playbook: str | None) -> list[dict[str, Any]]:
    """Who signed this sha256 (`opspatch approve`), from the ledger if there is one (`check`
    never creates a ledger), each verified against the playbook's allowed_signers (`verified`
    None: there is no such file to verify against)."""
    from opspatch.runs.judgments.approval import verifies

    ledger = options.existing_ledger()
    if ledger is None:
        return []
    with ledger:
        approvals = ledger.approvals(patch_sha256)
    if not approvals:
        return []
    allowed_signers = _allowed_signers(playbook)
    signers = Path(allowed_signers) if allowed_signers is not None else None
    return [
        {
            "principal": a.principal,
            "operator": a.operator,
            "recorded_at": a.recorded_at,
            "run_id": a.run_id,
            "verified": verifies(signers, a) if signers and signers.is_file() else None,
            "allowed_signers": allowed_signers,
        }
        for a in approvals
    ]


def _verdict(signer: Mapping[str, Any]) -> str:
    """`verified against F`, `does NOT verify against F`, or why it was not verified."""
    where = signer["allowed_signers"]
    if signer["verified"] is True:
        return f"verified against {where}"
    if signer["verified"] is False:
        return f"does NOT verify against {where}: apply refuses it"
    if where is None:
        return (
            "unverified: no allowed_signers in the playbook or in fleet.toml's [team]; "
            "--playbook P names one"
        )
    return f"unverified: {where} does not exist"


RELEASES_FLAG = "--releases"


def releases_without_spec(argv: list[str]) -> list[str]:
    """`--releases` may be given without a SPEC (then the patch's own range is used): a bare
    flag gets an empty value so the option parser accepts it. A SPEC is recognised by its
    comparison operator (`>=0.5.4`, `==0.5.10`), which patch ids and paths never start with."""
    fixed: list[str] = []
    for index, arg in enumerate(argv):
        fixed.append(arg)
        if arg == RELEASES_FLAG:
            following = argv[index + 1] if index + 1 < len(argv) else ""
            if not following or following.lstrip()[:1] not in ("<", ">", "=", "!", "~"):
                fixed.append("")
    return fixed


def check_releases_of(references: list[str], spec: str, offline: bool, as_json: bool) -> NoReturn:
    """The portability matrix of each patch (`check --releases [SPEC]`)."""
    from opspatch.cli.incident import release_matrices

    matrices = [
        m for r in references for m in release_matrices(options.load_patch(r), spec, offline)
    ]
    if as_json:
        emit_json(
            {
                "ok": all(m.exit_code == 0 for m in matrices),
                "matrices": [m.to_json() for m in matrices],
            }
        )
    else:
        for matrix in matrices:
            out.print(matrix.render(), markup=False)
    raise typer.Exit(max(m.exit_code for m in matrices))


def plan_json(loaded: LoadedPatch, plan: LocalPlan) -> dict[str, Any]:
    """What `plan --file --json` prints (`--root`: the tree, and one such entry per file)."""
    if plan.root is None:
        return {
            "patch": loaded.spec.id,
            "patch_file": loaded.path,
            **_file_plan_json(plan.file, plan.version, plan.outcome),
        }
    return {
        "patch": loaded.spec.id,
        "patch_file": loaded.path,
        "root": str(plan.root),
        "version": plan.version,
        "files": [
            {"module": part.target.module, **_file_plan_json(file, plan.version, outcome)}
            for part, file, outcome in zip(loaded.parts, plan.files, plan.outcomes, strict=True)
        ],
    }


def _file_plan_json(file: Path, version: str | None, outcome: PlanOutcome) -> dict[str, Any]:
    from opspatch.core.edit import AlreadyApplied, Applied

    doc: dict[str, Any] = {
        "file": str(file),
        "version": version,
        "outcome": outcome.outcome,
    }
    if isinstance(outcome, Applied):
        doc.update(
            sha256_before=outcome.sha256_before,
            sha256_after=outcome.sha256_after,
            diff=outcome.diff,
            edits=[
                {
                    "index": e.index,
                    "kind": e.kind,
                    "description": e.description,
                    "variant": e.variant,
                }
                for e in outcome.edits
            ],
            matched=list(outcome.matched),
        )
    elif isinstance(outcome, AlreadyApplied):
        doc.update(reason=outcome.reason, matched=list(outcome.matched))
    else:
        doc.update(reason=outcome.reason, field=outcome.field, candidates=list(outcome.candidates))
    return doc


def show_local_plan(
    loaded: LoadedPatch,
    file: Path | None,
    target_version: str | None,
    as_json: bool,
    root: Path | None = None,
) -> None:
    """Plan a patch on a local file (or each file of a local tree) and show the diff (or why
    not); exit 2 if it does not fit."""
    from opspatch.core.edit import AlreadyApplied, NotApplicable
    from opspatch.runs.commands.apply import not_applicable_error

    plan = plan_local(loaded, file, root, target_version)
    if as_json:
        emit_json(plan_json(loaded, plan))
        if any(isinstance(o, NotApplicable) for o in plan.outcomes):
            raise typer.Exit(EXIT_BAD_INPUT)
        return
    for index, (path, outcome) in enumerate(zip(plan.files, plan.outcomes, strict=True)):
        if isinstance(outcome, NotApplicable):
            raise not_applicable_error(loaded, str(path), outcome, part=index)
    for path, outcome in zip(plan.files, plan.outcomes, strict=True):
        if isinstance(outcome, AlreadyApplied):
            out.print(f"{path}: already applied: {outcome.reason}")
            continue
        assert not isinstance(outcome, NotApplicable)
        print_diff(outcome.diff)
        err.print(
            f"{loaded.spec.id}: {len(outcome.edits)} edit(s) in "
            f"{', '.join(outcome.edited_scopes)}"
            + (f" of {path}" if plan.root is not None else "")
            + f"; sha256 {outcome.sha256_before[:12]} -> {outcome.sha256_after[:12]}"
        )
        for matched in outcome.matched:
            err.print(f"  {matched}")


def show_fleet_plan(
    loaded: LoadedPatch, selection: str, playbook_ref: str, accept: bool, as_json: bool
) -> NoReturn:
    """Inspect and plan on every selected host (no lock, no record) and show each plan."""
    from opspatch.cli.render import LiveProgress
    from opspatch.runs.commands.apply import apply_to_hosts

    selected = options.hosts(selection)
    playbook = options.load_playbook(playbook_ref)
    with LiveProgress([h.name for h in selected], enabled=not as_json) as progress:
        report = apply_to_hosts(
            loaded,
            selected,
            playbook,
            factory=options.connector(accept_new_host_keys=accept),
            ledger=None,
            progress=progress,
            dry_run=True,
        )
    if as_json:
        emit_json(report.to_json())
    else:
        print_dry_run(report)
    raise typer.Exit(report.exit_code)


def plan(
    patch: Annotated[
        str | None,
        typer.Argument(
            help="Patch id (looked up in patches/) or a .toml path; none with --fleet",
            metavar="PATCH",
        ),
    ] = None,
    file: FileOption = None,
    root: RootOption = None,
    hosts: HostsOption = None,
    fleet: Annotated[
        bool,
        typer.Option(
            "--fleet",
            help="Per host: the patches fleet.toml wants, what is there, what `sync` would do.",
        ),
    ] = False,
    target_version: TargetVersionOption = None,
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Show the diff a patch would make (per host: facts, file, diff or why not); change nothing."""
    if fleet:
        if patch is not None or file is not None or root is not None:
            raise InputError(
                "plan --fleet takes no PATCH, --file or --root: the fleet file says which patches",
                hint="opspatch plan --fleet [--hosts TARGET]",
            )
        from opspatch.cli.fleet import show_desired_plan

        show_desired_plan(hosts, accept_new_host_keys, as_json)
        return
    if patch is None:
        raise InputError("plan needs PATCH (or --fleet)", hint="opspatch plan PATCH --hosts TARGET")
    one_target(file, hosts, "plan", root)
    loaded = options.load_patch(patch)
    if file is not None or root is not None:
        show_local_plan(loaded, file, target_version, as_json, root)
        return
    assert hosts is not None
    show_fleet_plan(loaded, hosts, "default", accept_new_host_keys, as_json)


def register(app: typer.Typer) -> None:
    app.command()(schema)
    app.command()(check)
    app.command()(plan)
