"""Incident-response commands that read code, never hosts' state: `lint-init` (find
partial-initialisation hazards and write the guard patch), `export` (an upstreamable diff or
mail), and the release matrix behind `check --releases`."""

from __future__ import annotations

import dataclasses
import getpass
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from opspatch.cli.context import options
from opspatch.cli.params import AcceptKeysOption, HostsOption, JsonOption, PatchArgument
from opspatch.cli.render import emit_json, err, out
from opspatch.errors import EXIT_HOST_FAILED, InputError

if TYPE_CHECKING:
    from opspatch.analysis.portability import ReleaseMatrix
    from opspatch.core.spec import LoadedPatch


def _related_sources(file: Path) -> dict[str, str]:
    """The other Python files of the file's package folder: where its bases and subclasses live
    (SGLang keeps `StandaloneWorkerV2` beside `EAGLEWorkerV2`, not in its file)."""
    related: dict[str, str] = {}
    for sibling in sorted(file.parent.glob("*.py")):
        if sibling.resolve() == file.resolve():
            continue
        try:
            related[str(sibling)] = sibling.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # not readable as text: not a base or subclass we can analyse
    return related


def lint_init(
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="The Python source file to analyse.", metavar="PATH"),
    ] = None,
    hosts: HostsOption = None,
    class_name: Annotated[
        str | None,
        typer.Option("--class", help="Only this class (default: every class).", metavar="CLASS"),
    ] = None,
    module: Annotated[
        str | None,
        typer.Option(
            "--module",
            "-m",
            help="With --hosts: the module to read from the hosts. With --file and "
            "--write-patch: the dotted module the file is (the patch target).",
            metavar="MODULE",
        ),
    ] = None,
    write_patch: Annotated[
        Path | None,
        typer.Option(
            "--write-patch",
            help="Write a guard patch (class-level defaults) to this .toml; its name is the id.",
            metavar="FILE",
        ),
    ] = None,
    versions: Annotated[
        str,
        typer.Option(
            "--versions", help="With --write-patch: the patch's version range.", metavar="RANGE"
        ),
    ] = "",
    accept_new_host_keys: AcceptKeysOption = False,
    as_json: JsonOption = False,
) -> None:
    """Partial-initialisation hazards: attributes read elsewhere but assigned in __init__ only
    after a call that can raise, or only in an __init__ a subclass skips. Reads the file here
    (--file) or the module's file as hosts import it (--module M --hosts H)."""
    from opspatch.analysis.initlint import lint_init as analyse
    from opspatch.analysis.initlint import write_guard_patch

    sources = _lint_sources(file, hosts, module, write_patch, accept_new_host_keys)
    documents = []
    reports = []
    for source in sources:
        report = analyse(source.text, source.path, class_name=class_name, related=source.related)
        reports.append(report)
        guard = None
        if write_patch is not None:
            guard = write_guard_patch(
                report,
                module=source.module,
                patch_id=write_patch.stem,
                distribution=source.distribution or "sglang",
                versions=versions,
                class_name=class_name,
            )
            write_patch.write_text(guard.text, encoding="utf-8")
        document = {**report.to_json(), "guard_patch": guard.to_json() if guard else None}
        documents.append({"hosts": list(source.hosts), **document} if hosts else document)
        if not as_json:
            if source.hosts:
                out.print(f"== {', '.join(source.hosts)} (sha256 {source.sha256[:12]})")
            out.print(report.render(), markup=False)
            if guard is not None:
                out.print(guard.render(), markup=False)
                err.print(f"wrote {write_patch}; check it with `opspatch check {write_patch}`")
    if as_json:
        emit_json(documents[0] if file is not None else {"sources": documents})
    # A linter's convention: findings exit 1 (a guard patch written for them does not remove them
    # from the file), so scripts and CI can tell a clean file from one with hazards.
    if any(report.hazards for report in reports):
        raise typer.Exit(EXIT_HOST_FAILED)


@dataclass(frozen=True)
class _Source:
    """What lint-init analyses: a file's text, its package siblings, and the patch target."""

    path: str
    text: str
    related: dict[str, str]
    module: str
    sha256: str = ""
    hosts: tuple[str, ...] = ()
    distribution: str | None = None


def _lint_sources(
    file: Path | None,
    hosts: str | None,
    module: str | None,
    write_patch: Path | None,
    accept_new_host_keys: bool,
) -> list[_Source]:
    """The sources lint-init reads: the file here, or the module's file on the hosts (one source
    per distinct file); refused when the options do not fit together.

    Raises:
        InputError: not exactly one of --file or --hosts, --hosts without --module, a
            --write-patch that is not a new .toml, or hosts holding different files for it.
    """
    if (file is None) == (hosts is None):
        raise InputError(
            "lint-init needs exactly one of --file PATH or --module M --hosts TARGET",
            hint="opspatch lint-init --module sglang.srt.speculative.eagle_worker_v2 --hosts gpu-fleet",
        )
    if write_patch is not None and write_patch.suffix != ".toml":
        raise InputError(f"{write_patch}: a patch file ends in .toml (its name is its id)")
    if write_patch is not None and write_patch.exists():
        raise InputError(
            f"{write_patch} already exists; not overwriting it", hint="choose another name"
        )
    if hosts is not None:
        if module is None:
            raise InputError("lint-init --hosts needs --module M (the module to read)")
        sources = _host_sources(hosts, module, accept_new_host_keys)
    else:
        assert file is not None
        sources = [_file_source(file, module, need_module=write_patch is not None)]
    if write_patch is not None and len(sources) > 1:
        listing = "; ".join(f"{', '.join(s.hosts)}: {s.sha256[:12]}" for s in sources)
        raise InputError(
            f"the hosts hold different versions of {module}: {listing}",
            hint="select hosts that run the same file to write one guard patch",
        )
    return sources


def _file_source(file: Path, module: str | None, *, need_module: bool) -> _Source:
    if not file.is_file():
        raise InputError(f"{file}: no such file")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{file}: not a UTF-8 Python source file ({exc.reason})") from None
    target = module or (_module_of(file) if need_module else "")
    return _Source(str(file), text, _related_sources(file), target)


def _host_sources(hosts: str, module: str, accept_new_host_keys: bool) -> list[_Source]:
    from opspatch.core.policy import StepTimeouts
    from opspatch.runs.commands.diagnose import read_module_sources

    found = read_module_sources(
        options.hosts(hosts),
        options.connector(accept_new_host_keys=accept_new_host_keys),
        module,
        timeout=StepTimeouts().inspect,
    )
    return [
        _Source(s.path, s.text, dict(s.related), module, s.sha256, s.hosts, s.distribution)
        for s in found
    ]


def _module_of(file: Path) -> str:
    """The dotted module of a file inside a package tree (up to the first folder without
    `__init__.py`)."""
    resolved = file.resolve()
    parts = [resolved.stem]
    folder = resolved.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if len(parts) == 1:
        raise InputError(
            f"{file} is not inside a package; pass --module to name the patch's target"
        )
    return ".".join(parts)


def export(
    patch: PatchArgument,
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="The pristine file to diff against.", metavar="PATH"),
    ] = None,
    release: Annotated[
        str | None,
        typer.Option(
            "--release",
            help="Diff against this release's own file (fetched once).",
            metavar="VERSION",
        ),
    ] = None,
    from_dir: Annotated[
        Path | None,
        typer.Option(
            "--from", help="With --release: the release cache folder (offline).", metavar="DIR"
        ),
    ] = None,
    output_format: Annotated[
        str,
        typer.Option(
            "--format",
            help="diff (unified, git-style) or git (a mail for git am)",
            metavar="FORMAT",
        ),
    ] = "diff",
    prefix: Annotated[
        str,
        typer.Option(
            "--prefix", help="Path prefix in the upstream repository (python/).", metavar="PREFIX"
        ),
    ] = "",
    author: Annotated[
        str | None,
        typer.Option(
            "--author", help="With --format git: 'Name <email>' (default: git's).", metavar="AUTHOR"
        ),
    ] = None,
) -> None:
    """An upstreamable change: the patch as a unified diff with a/ b/ paths, or a
    git format-patch mail whose subject is the summary and body the rationale."""
    from opspatch.analysis.export import export_diff, render_mail

    if output_format not in ("diff", "git"):
        raise InputError(f"--format {output_format!r}: expected diff or git")
    if (file is None) == (release is None):
        raise InputError("export needs exactly one of --file PATH or --release VERSION")
    loaded = options.load_patch(patch)
    loaded.only_target("export")
    if file is not None:
        if not file.is_file():
            raise InputError(f"{file}: no such file")
        pristine = file.read_bytes()
    else:
        from opspatch.runs.commands.check_releases import release_module_source

        assert release is not None
        pristine = release_module_source(
            loaded.spec.target, release, cache=from_dir, offline=from_dir is not None
        )
    change = export_diff(loaded.spec, pristine, prefix=prefix)
    if output_format == "diff":
        out.file.write(change.diff)
        return
    mail = render_mail(
        change, loaded.spec, author=author or _default_author(), date=datetime.now(timezone.utc)
    )
    out.file.write(mail)


def _default_author() -> str:
    name = os.environ.get("GIT_AUTHOR_NAME") or getpass.getuser()
    email = os.environ.get("GIT_AUTHOR_EMAIL") or f"{getpass.getuser()}@{socket.gethostname()}"
    return f"{name} <{email}>"


def release_matrices(loaded: LoadedPatch, spec: str, offline: bool) -> list[ReleaseMatrix]:
    """`check PATCH --releases [SPEC]`: the patch on every release in its range (or SPEC); a
    patch set has one matrix per file (its coverage counts a release where every file passes)."""
    from opspatch.runs.commands.check_releases import check_releases

    matrices = [check_releases(part, spec=spec or None, offline=offline) for part in loaded.parts]
    if not loaded.is_set:
        return matrices
    return [
        dataclasses.replace(m, module=part.target.module)
        for m, part in zip(matrices, loaded.parts, strict=True)
    ]


def register(app: typer.Typer) -> None:
    app.command("lint-init")(lint_init)
    app.command()(export)
