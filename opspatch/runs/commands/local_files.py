"""`plan`, `apply` and `rollback` on the controller's own files: `--file` (a patch's one
target) or `--root` (a tree holding each target of a set at `<root>/a/b/c.py`)."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opspatch.core.edit import AlreadyApplied, Applied, NotApplicable, apply_patch
from opspatch.core.gate import version_gate
from opspatch.core.host import EngineSettings, Host
from opspatch.core.policy import Playbook
from opspatch.core.remedy import remedy_text
from opspatch.core.source import sha256_hex
from opspatch.core.spec import LoadedPatch, Target
from opspatch.core.vocabulary import Command, FileAction, Outcome
from opspatch.errors import InputError, TargetError
from opspatch.ledger.store import FileVersion, Ledger, RunDetail
from opspatch.runs.commands.apply import LocalFiles, apply_to_hosts, not_applicable_error
from opspatch.runs.fleet.connect import transport_factory
from opspatch.runs.report import RunReport


def distribution_version_for(file: Path, target: Target) -> str | None:
    """The version in the dist-info beside the package holding `file` (None: a checkout)."""
    resolved = file.resolve().as_posix()
    for relpath in target.module_relpaths():
        if resolved.endswith("/" + relpath):
            site = Path(resolved[: -len(relpath) - 1])
            break
    else:
        return None
    from opspatch.runs.commands.releasecache import normalize_name  # not when a version is given

    wanted = normalize_name(target.distribution)
    for info in sorted(site.glob("*.dist-info")):
        name = info.name[: -len(".dist-info")]
        dist, _, version = name.partition("-")
        if normalize_name(dist) != wanted:
            continue
        metadata = info / "METADATA"
        if metadata.is_file():
            from email.parser import HeaderParser  # only here: a file of an installed distribution

            headers = HeaderParser().parsestr(
                metadata.read_text(encoding="utf-8", errors="replace")
            )
            return headers.get("Version") or version or None
        return version or None
    return None


def local_file_host(python: str, state_dir: Path, key: Path) -> Host:
    """The controller as host `local:<hostname>`, its lock, backups and lease `key`'s (the file
    or tree): runs on different files of one machine do not hold each other off."""
    key = key.resolve()
    folder = f"{key.name or 'root'}-{sha256_hex(str(key).encode())[:16]}"
    return Host.local(
        f"local:{socket.gethostname()}",
        str(state_dir / "local" / folder),
        EngineSettings(python=python, serves=False),
    )


@dataclass(frozen=True)
class LocalPlan:
    files: tuple[Path, ...]
    version: str | None
    outcomes: tuple[Applied | AlreadyApplied | NotApplicable, ...]
    root: Path | None = None

    @property
    def file(self) -> Path:
        return self.files[0]

    @property
    def outcome(self) -> Applied | AlreadyApplied | NotApplicable:
        return self.outcomes[0]

    @property
    def key(self) -> Path:
        return self.root if self.root is not None else self.files[0]


def _check_target(
    loaded: LoadedPatch, part: int, file: Path, version: str | None, *, root: Path | None
) -> None:
    target = loaded.parts[part].target
    path = str(file.resolve())
    field = loaded.target_field(part, "module")
    mismatch = target.mismatch(path, None)
    if mismatch is None:
        field = loaded.target_field(part, "versions")
        mismatch = version_gate(
            target, path, owner=None, owner_version=None, installed_version=version
        )
    if mismatch:
        if loaded.is_set:
            mismatch = f"{target.module}: {mismatch}"
        what = "the tree holds the modules" if root is not None else "the file is the module"
        raise TargetError(
            f"{loaded.location(field)}: {mismatch}",
            hint=f"check that {what} and release this patch is for"
            + ("" if version else "; pass --target-version when no dist-info says"),
        )


def plan_local_file(loaded: LoadedPatch, file: Path, target_version: str | None) -> LocalPlan:
    if loaded.is_set:
        modules = ", ".join(p.target.module for p in loaded.parts)
        raise InputError(
            f"{loaded.path}: {loaded.spec.id} is a patch set ({modules}); --file takes a patch "
            "with one [target]",
            hint="give the tree that holds the set's modules instead: --root DIR (e.g. the "
            "site-packages folder, or a checkout's source folder), or --hosts TARGET",
        )
    if not file.is_file():
        raise InputError(f"{file}: no such file")
    return _planned(loaded, (file,), target_version, root=None)


def tree_files(loaded: LoadedPatch, root: Path) -> tuple[Path, ...]:
    """Each target's module file under `root` (`a/b/c.py`, else `a/b/c/__init__.py`)."""
    _require_folder(root)
    files = []
    for index, part in enumerate(loaded.parts):
        relpaths = part.target.module_relpaths()
        found = next((root / rel for rel in relpaths if (root / rel).is_file()), None)
        if found is None:
            raise InputError(
                f"{loaded.location(loaded.target_field(index, 'module'))}: {part.target.module} "
                f"is not in {root} (neither {relpaths[0]} nor {relpaths[1]})",
                hint="--root is the folder the modules' top package is in (site-packages, or "
                "a checkout's python/ folder)",
            )
        files.append(found)
    return tuple(files)


def plan_local_tree(loaded: LoadedPatch, root: Path, target_version: str | None) -> LocalPlan:
    return _planned(loaded, tree_files(loaded, root), target_version, root=root)


def _planned(
    loaded: LoadedPatch, files: tuple[Path, ...], target_version: str | None, *, root: Path | None
) -> LocalPlan:
    """Each part planned on its file, checked against `target_version` (else the first
    dist-info beside the files naming its distribution): a `--file` is a tree of one."""
    version = target_version or next(
        (
            found
            for file, part in zip(files, loaded.parts, strict=True)
            if (found := distribution_version_for(file, part.target)) is not None
        ),
        None,
    )
    for index, file in enumerate(files):
        _check_target(loaded, index, file, version, root=root)
    outcomes = tuple(
        apply_patch(file.read_bytes(), part) for file, part in zip(files, loaded.parts, strict=True)
    )
    return LocalPlan(files, version, outcomes, root=root)


def apply_local_file(
    loaded: LoadedPatch, plan: LocalPlan, *, python: str, ledger: Ledger, state_dir: Path
) -> RunReport:
    """The fleet apply with the controller as its one host (nothing to restart)."""
    for index, (file, outcome) in enumerate(zip(plan.files, plan.outcomes, strict=True)):
        if isinstance(outcome, NotApplicable):
            raise not_applicable_error(loaded, str(file), outcome, part=index)
    host = local_file_host(python, state_dir, plan.key)
    return apply_to_hosts(
        loaded,
        [host],
        Playbook(),
        factory=transport_factory(),
        ledger=ledger,
        local=LocalFiles(tuple(str(f.resolve()) for f in plan.files), plan.version, plan.outcomes),
    )


@dataclass(frozen=True)
class LocalRollback:
    host: Host
    paths: tuple[str, ...]
    patch: LoadedPatch | None
    source_run: RunDetail | None

    def run(self, ledger: Ledger) -> RunReport:
        from opspatch.runs.commands.rollback import rollback_hosts  # not on `apply`'s path

        return rollback_hosts(
            ledger=ledger,
            hosts=[self.host],
            factory=transport_factory(),
            playbook=Playbook(),
            patch=self.patch,
            source_run=self.source_run,
            restart_engine=False,
            unrestarted=Outcome.RESTORED,  # there is no server: the files back are the goal
            only_paths=self.paths,
        )


def rollback_local_file(
    file: Path,
    *,
    patch: LoadedPatch | None = None,
    source_run: RunDetail | None = None,
    python: str,
    ledger: Ledger,
    state_dir: Path,
) -> LocalRollback:
    """Checked against the ledger before anything is asked or changed; a file of a set is
    refused (a set is rolled back whole: `--root`)."""
    if patch is not None:
        patch.only_target("rollback --file")
    if not file.is_file():
        raise InputError(f"{file}: no such file")
    host = local_file_host(python, state_dir, file)
    path = str(file.resolve())
    history = ledger.file_history(host.name, path)
    if source_run is not None:
        _refuse_one_file_of_a_set(source_run, path, host.name)
        by = f"run {source_run.run_id}"
        recorded = any(v.run_id == source_run.run_id for v in history)
    else:
        by = patch.spec.id if patch else "?"
        recorded = bool(history)
    if not recorded:
        raise InputError(
            f"the ledger has no change by {by} to {path} on this machine",
            hint=_elsewhere(source_run, path)
            or "rollback restores what opspatch recorded; "
            f"see `{remedy_text(Command.LEDGER_LIST)}`",
        )
    return LocalRollback(host, (path,), patch, source_run)


def rollback_local_tree(
    root: Path,
    *,
    patch: LoadedPatch | None = None,
    source_run: RunDetail | None = None,
    python: str,
    ledger: Ledger,
    state_dir: Path,
) -> LocalRollback:
    """Checked against the ledger before anything is asked or changed."""
    _require_folder(root)
    host = local_file_host(python, state_dir, root)
    inside = str(root.resolve()) + "/"
    history = ledger.file_history(host.name)
    if patch is not None:
        paths = [str(f.resolve()) for f in tree_files(patch, root)]
        by = patch.spec.id
        recorded = any(v.path in paths and v.patch_id == patch.spec.id for v in history)
    else:
        assert source_run is not None
        by = f"run {source_run.run_id}"
        paths = list(
            dict.fromkeys(
                v.path
                for v in history
                if v.run_id == source_run.run_id and v.path.startswith(inside)
            )
        )
        recorded = bool(paths)
    if not recorded:
        raise InputError(
            f"the ledger has no change by {by} under {root.resolve()} on this machine",
            hint="rollback restores what opspatch recorded; "
            f"see `{remedy_text(Command.LEDGER_LIST)}`",
        )
    return LocalRollback(host, tuple(paths), patch, source_run)


def _require_folder(root: Path) -> None:
    if not root.is_dir():
        raise InputError(
            f"{root}: no such folder", hint="--root names the tree holding the modules"
        )


def _set_of(versions: Sequence[FileVersion], path: str) -> list[str] | None:
    """The paths of the set `path` is one file of, among one host's `versions` of one run."""
    paths = list(dict.fromkeys(v.path for v in versions if v.action == FileAction.PATCH))
    return paths if path in paths and len(paths) > 1 else None


def _refuse_one_file_of_a_set(source_run: RunDetail, path: str, local: str) -> None:
    for record in source_run.hosts:
        members = _set_of(record.file_versions, path)
        if members is None:
            continue
        run = source_run.run_id
        patch = source_run.summary.patch_id or "?"
        if record.host == local:
            root = _common_root(members)
            how = f"`{remedy_text(Command.ROLLBACK, run=run, root=str(root))}`"
        else:
            how = f"`{remedy_text(Command.ROLLBACK, run=run, hosts=record.host)}`"
        raise InputError(
            f"{path} is one file of the patch set {patch} that run {run} changed on "
            f"{record.host} ({', '.join(members)}); a set is rolled back whole, not one file",
            hint=f"roll the set back with {how}",
        )


def _common_root(paths: Sequence[str]) -> str:
    """The `--root` a local set's files were found in: their shared folder, above packages."""
    folder = Path(os.path.commonpath([str(Path(p).parent) for p in paths]))
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        folder = folder.parent
    return str(folder)


def _elsewhere(source_run: RunDetail | None, path: str) -> str | None:
    if source_run is None:
        return None
    hosts = [r.host for r in source_run.hosts if any(v.path == path for v in r.file_versions)]
    if not hosts:
        return None
    return (
        f"run {source_run.run_id} changed {path} on {', '.join(hosts)}: "
        f"`{remedy_text(Command.ROLLBACK, run=source_run.run_id, hosts=','.join(hosts))}`"
    )
