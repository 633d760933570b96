"""The `opspatch` command line: builds objects, prints, maps errors to exit codes.

Only this module knows typer. Results go to stdout (a diff, a table, or one JSON document with
`--json`); progress, logs and errors go to stderr. Exit codes (architecture.md): 0 every host
reached the goal; 1 a host failed (and was restored); 2 bad input, configuration or usage
(nothing was changed); 3 needs attention. `errors.exit_code_for` is the one place that decides.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from opspatch import __version__
from opspatch.edit import AlreadyApplied, Applied, NotApplicable, PlanOutcome, apply_patch
from opspatch.errors import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    ConfirmationRequired,
    InputError,
    Location,
    OpspatchError,
    SpecError,
    TargetError,
    exit_code_for,
)
from opspatch.localfiles import distribution_version_for
from opspatch.spec import LoadedPatch, load_patch, patch_json_schema
from opspatch.tomlsource import parse_field_path
from opspatch.workspace import Workspace

app = typer.Typer(
    name="opspatch",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help=(
        "Safe, structural hot fixes for live SGLang inference fleets: typed patch files anchored on "
        "code structure, validated, applied atomically with byte-exact backups, smoke-tested, rolled "
        "back on failure, recorded in a ledger."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class _Options:
    workspace: Path | None = None


_options = _Options()


def _print_version(value: bool) -> None:
    if value:
        out.print(f"opspatch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _global(
    workspace: Annotated[
        Path | None,
        typer.Option(
            "--workspace",
            "-w",
            help="Folder holding patches/, inventories/, playbooks/ (default: $OPSPATCH_HOME or .)",
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", is_eager=True, callback=_print_version
        ),
    ] = False,
) -> None:
    _options.workspace = workspace


def _workspace() -> Workspace:
    return Workspace.discover(_options.workspace)


def _load(reference: str) -> LoadedPatch:
    return load_patch(_workspace().find("patches", reference))


def _emit_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def print_diff(diff: str, console: Console = out) -> None:
    """A unified diff, coloured on a terminal and plain when piped."""
    for line in diff.splitlines():
        style = ""
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("@@"):
            style = "cyan"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        console.print(Text(line, style=style))


def confirm_or_refuse(question: str, *, yes: bool) -> None:
    """The confirmation rule: `--yes` proceeds; a terminal is asked; anything else is refused.

    Raises:
        ConfirmationRequired: no terminal and no `--yes` (exit 2, nothing changed).
    """
    if yes:
        return
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise ConfirmationRequired(
            f"{question} needs confirmation and there is no terminal to ask on; nothing was changed",
            hint="re-run with --yes to proceed without asking",
        )
    if not typer.confirm(question, default=False, err=True):
        raise ConfirmationRequired("not confirmed; nothing was changed")


def not_applicable_error(loaded: LoadedPatch, target: str, outcome: NotApplicable) -> OpspatchError:
    """A NotApplicable outcome as an error naming the patch file, line and field, and the target."""
    reason = f"{target}: {outcome.reason}"
    if outcome.candidates:
        reason += "\n" + "\n".join(f"    {c}" for c in outcome.candidates)
    if outcome.field:
        location = loaded.location(parse_field_path(outcome.field))
        return SpecError(location, reason)
    return SpecError(Location(loaded.path), reason)


def _check_local_target(loaded: LoadedPatch, file: Path, target_version: str | None) -> str | None:
    version = target_version or distribution_version_for(file, loaded.spec.target)
    mismatch = loaded.spec.target.mismatch(str(file.resolve()), version)
    if mismatch:
        field = (
            ("target", "versions") if "outside the versions" in mismatch else ("target", "module")
        )
        raise TargetError(
            f"{loaded.location(field)}: {mismatch}",
            hint="check that the file is the module and release this patch is for"
            + ("" if version else "; pass --target-version when no dist-info says"),
        )
    return version


def _plan_json(
    loaded: LoadedPatch, file: Path, version: str | None, outcome: PlanOutcome
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "patch": loaded.spec.id,
        "patch_file": loaded.path,
        "file": str(file),
        "version": version,
        "outcome": outcome.outcome,
    }
    if isinstance(outcome, Applied):
        doc.update(
            sha256_before=outcome.sha256_before,
            sha256_after=outcome.sha256_after,
            diff=outcome.diff,
        )
    elif isinstance(outcome, AlreadyApplied):
        doc["reason"] = outcome.reason
    else:
        doc.update(reason=outcome.reason, field=outcome.field, candidates=list(outcome.candidates))
    return doc


# ---------------------------------------------------------------------------------------------
# commands


@app.command()
def schema() -> None:
    """Print the JSON Schema of patch files (point your editor's TOML validation at it)."""
    _emit_json(patch_json_schema())


@app.command()
def check(
    patches: Annotated[
        list[str] | None,
        typer.Argument(help="Patch ids or .toml paths (default: every patch in the workspace)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout")] = False,
) -> None:
    """Lint patch files: schema, snippets parse, anchors well-formed."""
    workspace = _workspace()
    references = patches or sorted(workspace.available("patches"))
    if not references:
        raise InputError(
            "no patches to check", hint="give patch ids or paths, or add patches/*.toml"
        )
    results = []
    for reference in references:
        try:
            loaded = load_patch(workspace.find("patches", reference))
        except OpspatchError as exc:
            results.append({"patch": reference, "ok": False, "error": exc.render()})
            continue
        spec = loaded.spec
        results.append(
            {
                "patch": spec.id,
                "ok": True,
                "file": loaded.path,
                "sha256": loaded.sha256,
                "target": f"{spec.target.module} ({spec.target.distribution} {spec.target.versions or 'any'})",
                "edits": len(spec.edits),
                "postconditions": len(spec.postconditions),
            }
        )
    failed = [r for r in results if not r["ok"]]
    if as_json:
        _emit_json({"ok": not failed, "patches": results})
    else:
        for result in results:
            if result["ok"]:
                out.print(
                    f"[green]ok[/green]    {result['patch']}  {result['file']}  "
                    f"{result['edits']} edit(s), {result['postconditions']} postcondition(s)  "
                    f"-> {result['target']}"
                )
            else:
                out.print(f"[red]error[/red] {result['error']}")
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)


def _plan_local(
    patch: str, file: Path, target_version: str | None
) -> tuple[LoadedPatch, str | None, PlanOutcome]:
    loaded = _load(patch)
    if not file.is_file():
        raise InputError(f"{file}: no such file")
    version = _check_local_target(loaded, file, target_version)
    outcome = apply_patch(file.read_bytes(), loaded.spec)
    return loaded, version, outcome


@app.command()
def plan(
    patch: Annotated[str, typer.Argument(help="Patch id (looked up in patches/) or a .toml path")],
    file: Annotated[Path | None, typer.Option("--file", "-f", help="A local source file")] = None,
    target_version: Annotated[
        str | None,
        typer.Option(
            "--target-version", help="Version of the file's distribution when no dist-info says"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout")] = False,
) -> None:
    """Show the diff a patch would make, and change nothing."""
    if file is None:
        raise InputError("plan needs --file PATH", hint="opspatch plan PATCH --file PATH")
    loaded, version, outcome = _plan_local(patch, file, target_version)
    if as_json:
        _emit_json(_plan_json(loaded, file, version, outcome))
        raise typer.Exit(EXIT_BAD_INPUT if isinstance(outcome, NotApplicable) else EXIT_OK)
    if isinstance(outcome, NotApplicable):
        raise not_applicable_error(loaded, str(file), outcome)
    if isinstance(outcome, AlreadyApplied):
        out.print(f"{file}: already applied: {outcome.reason}")
        return
    print_diff(outcome.diff)
    err.print(
        f"{loaded.spec.id}: {len(outcome.edits)} edit(s) in {', '.join(outcome.edited_scopes)}; "
        f"sha256 {outcome.sha256_before[:12]} -> {outcome.sha256_after[:12]}"
    )


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point: run the app, turn every failure into one message + exit code."""
    try:
        # Without standalone mode, an Exit raised by a command comes back as its exit code.
        returned = app(args=argv, prog_name="opspatch", standalone_mode=False)
        code = returned if isinstance(returned, int) else EXIT_OK
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        err.print("aborted; nothing was changed")
        code = EXIT_BAD_INPUT
    except OpspatchError as exc:
        err.print(Text(f"error: {exc.render()}", style="red"))
        code = exit_code_for(exc)
    except KeyboardInterrupt:
        err.print("interrupted")
        code = exit_code_for(KeyboardInterrupt())
    except Exception as exc:
        # Usage errors of the option parser (typer vendors click; older typers use click itself):
        # they know how to show themselves and always mean bad usage (exit 2).
        show = getattr(exc, "show", None)
        if show is None or not hasattr(exc, "exit_code"):
            raise
        show()
        code = EXIT_BAD_INPUT
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()


# Table is re-exported for commands added in later modules of the CLI.
__all__ = ["Table", "app", "confirm_or_refuse", "main", "print_diff"]
