"""`apply PATCH --file PATH --yes` without building the typer app (issue 44: typer was a tenth
of the command). Only exactly the plain shape is read here; anything else (help, `--dry-run`, a
typo) goes to typer, which owns every usage message. Both run `apply_local`.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from opspatch.core.spec import LoadedPatch
    from opspatch.runs.commands.local_files import LocalPlan


@dataclass(frozen=True)
class LocalApply:
    """The arguments of a plain `[-w DIR] [--ledger FILE|URL] apply PATCH --file PATH --yes`."""

    patch: str
    file: Path
    target_version: str | None = None
    python: str = sys.executable
    as_json: bool = False
    workspace: Path | None = None
    ledger: str | None = None


ROOT_VALUES = {"--workspace": "workspace", "-w": "workspace", "--ledger": "ledger"}
APPLY_VALUES = {"--file": "file", "-f": "file", "--target-version": "target_version", "--python": "python"}  # fmt: skip
APPLY_FLAGS = {"--yes": "yes", "-y": "yes", "--json": "as_json"}
"""The options read here (the same names as `cli/app.py:_global` and `cli/changes.py:apply`)."""


def scripted_local_apply(args: Sequence[str]) -> LocalApply | None:
    """`args` as a `LocalApply`, or None when they are not exactly that plain shape: each option
    once, every value a separate word that is neither empty nor option-like, `--file` and
    `--yes` given (without `--yes` a terminal may be asked, which is typer's prompt)."""
    given: dict[str, str] = {}
    words = list(args)
    while words and words[0] in ROOT_VALUES:
        if not _take(given, ROOT_VALUES[words[0]], words[1:2]):
            return None
        words = words[2:]
    if words[:1] != ["apply"] or len(words) < 2 or not _plain(words[1]):
        return None
    given["patch"] = words[1]
    words = words[2:]
    while words:
        word = words.pop(0)
        if word in APPLY_FLAGS and APPLY_FLAGS[word] not in given:
            given[APPLY_FLAGS[word]] = ""
        elif word not in APPLY_VALUES or not _take(given, APPLY_VALUES[word], words[:1]):
            return None
        else:
            words.pop(0)
    if "file" not in given or given.pop("yes", None) is None:
        return None
    return LocalApply(
        patch=given["patch"],
        file=Path(given["file"]),
        target_version=given.get("target_version"),
        python=given.get("python", sys.executable),
        as_json="as_json" in given,
        workspace=Path(given["workspace"]) if "workspace" in given else None,
        ledger=given.get("ledger"),
    )


def _take(given: dict[str, str], name: str, value: list[str]) -> bool:
    """Record option `name`'s value; False if it is missing, not plain, or given before."""
    if name in given or not value or not _plain(value[0]):
        return False
    given[name] = value[0]
    return True


def _plain(word: str) -> bool:
    return bool(word) and not word.startswith("-")


def run_scripted(request: LocalApply) -> NoReturn:
    """Run `request` as `apply` does, with the same messages and exit codes (`cli/exits.py`)."""
    gc.disable()  # the imports and the plan make next to no cycles; `apply_local` freezes them
    from opspatch.cli.context import options
    from opspatch.cli.exits import exit_reporting

    def run() -> int:
        options.workspace, options.ledger = request.workspace, request.ledger
        loaded = options.load_patch(request.patch)
        apply_local(
            loaded,
            request.file,
            None,
            request.python,
            request.target_version,
            True,
            request.as_json,
        )

    exit_reporting(run, as_json=request.as_json)


def plan_local(
    loaded: LoadedPatch, file: Path | None, root: Path | None, target_version: str | None
) -> LocalPlan:
    """The plan on the local file (`--file`) or the local tree (`--root`)."""
    from opspatch.runs.commands.local_files import plan_local_file, plan_local_tree

    if root is not None:
        return plan_local_tree(loaded, root, target_version)
    assert file is not None
    return plan_local_file(loaded, file, target_version)


def apply_local(
    loaded: LoadedPatch,
    file: Path | None,
    root: Path | None,
    python: str,
    target_version: str | None,
    yes: bool,
    as_json: bool,
) -> NoReturn:
    """`apply --file` or `--root`: plan, show the diff, confirm, apply, report and exit."""
    from opspatch.cli.context import options
    from opspatch.cli.render import confirm_or_refuse, err, finish, print_diff
    from opspatch.core.edit import Applied
    from opspatch.runs.commands.local_files import apply_local_file

    plan = plan_local(loaded, file, root, target_version)
    changes = [o for o in plan.outcomes if isinstance(o, Applied)]
    if changes:
        if not as_json:
            for change in changes:
                print_diff(change.diff, err)
        where = f"the files under {root}" if root is not None else str(file)
        confirm_or_refuse(f"Apply {loaded.spec.id} to {where}?", yes=yes)
    # What exists now (modules, the patch, the plan) lives until the process ends: the collector
    # need not walk it again in the apply's passes and at exit (issue 44: about a tenth of it).
    gc.freeze()
    gc.enable()
    report = apply_local_file(
        loaded, plan, python=python, ledger=options.open_ledger(), state_dir=options.state_dir()
    )
    finish(report, as_json)
