"""`opspatch rehearse PATCH`: a hot fix tried on the real release on this CPU, then torn down
(`opspatch.sandbox.rehearse`); a table of its stages, or one JSON document with `--json`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from opspatch.cli.context import options
from opspatch.cli.params import JsonOption, PatchArgument
from opspatch.cli.render import Column, emit_json, err, out, table_of
from opspatch.cli.sandbox import build_display
from opspatch.sandbox.real.release import DEFAULT_REAL_RELEASE, REAL_RELEASES

if TYPE_CHECKING:
    from opspatch.sandbox.rehearsal import RehearsalReport


def rehearse(
    patch: PatchArgument,
    release: Annotated[
        str,
        typer.Option(
            "--release",
            metavar="VERSION",
            help=f"The real SGLang release to rehearse on (it runs {', '.join(REAL_RELEASES)}; "
            "its environment and models are built once and cached, as for `sandbox up --engine "
            "sglang`).",
        ),
    ] = DEFAULT_REAL_RELEASE,
    as_json: JsonOption = False,
) -> None:
    """Try a patch on the real release before a fleet: a throwaway real server measured, the patch
    applied, restarted, smoked and judged against it, a report of each stage, all torn down.

    Catches what `check --releases` cannot: a patch that fits and compiles but fails at import,
    at start or at the first decode of real code. Exit codes as `apply` (0 passed, 1 a stage
    failed, 2 nothing rehearsed, 3 the restore failed); the operator's ledger and sandbox are not
    touched (docs/rehearse.md).
    """
    from opspatch.sandbox.real.release import real_release
    from opspatch.sandbox.rehearse import rehearse as run_rehearsal

    engine = real_release(
        release, given_as=f"--release {release}", instead=f"--release {DEFAULT_REAL_RELEASE}"
    )
    loaded = options.load_patch(patch)
    with build_display() as build_progress:
        report = run_rehearsal(
            loaded,
            engine,
            progress=lambda line: err.print(line, markup=False),
            build_progress=build_progress,
        )
    if as_json:
        emit_json(report.to_json())
    else:
        _print(report)
    if report.exit_code:
        raise typer.Exit(report.exit_code)


STAGE_COLUMNS = (
    ("stage", Column.ID),
    ("status", Column.ID),
    ("seconds", Column.ID),
    ("detail", Column.DETAIL),
)


def _print(report: RehearsalReport) -> None:
    title = f"rehearsal of {report.patch} on real {report.release} (this CPU): {report.outcome}"
    rows = [
        (
            str(stage.stage),
            Text(str(stage.status), style="red" if stage.status == "failed" else ""),
            "-" if stage.seconds is None else f"{stage.seconds:.0f}",
            stage.detail,
        )
        for stage in report.stages
    ]
    out.print(table_of(STAGE_COLUMNS, rows, title=title))
    host = report.host
    if host is not None and host.error:
        out.print(f"the apply: {host.outcome}: {host.error}", markup=False)
    teardown = report.teardown
    if teardown.folder:
        stopped = ", ".join(map(str, teardown.stopped)) or "none left"
        removed = "removed" if teardown.removed else "NOT removed"
        out.print(f"torn down: processes stopped {stopped}; {teardown.folder} {removed}")
    if teardown.problem:
        err.print(f"teardown: {teardown.problem}", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(rehearse)
