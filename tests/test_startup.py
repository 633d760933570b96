"""Start-up stays light: the commands an operator runs most often for a quick answer import
neither the SSH libraries nor torch (they cost hundreds of milliseconds and, for torch, can touch
the GPU). Checked in a fresh interpreter per command, as the console script runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.core

from opspatch.cli import app

pytestmark = pytest.mark.process

PROBE = """
import atexit, gc, json, sys
atexit.register(lambda: sys.stderr.write(f"\\nFROZEN {gc.get_freeze_count()} {gc.isenabled()}\\n"))
from opspatch.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = ("paramiko", "fabric", "invoke", "torch", "cryptography")
sys.stderr.write("\\nLOADED " + json.dumps(sorted(m for m in heavy if m in sys.modules)) + "\\n")
groups = [m.rsplit(".", 1)[1] for m in sys.modules if m.rsplit(".", 1)[0] == "opspatch.cli"]
sys.stderr.write("\\nGROUPS " + json.dumps(sorted(groups)) + "\\n")
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
spec = sys.modules.get("opspatch.core.spec")
built = [n for n, v in (vars(spec) if spec else {}).items() if getattr(v, "__pydantic_complete__", 0) is True]
sys.stderr.write("\\nBUILT " + json.dumps(built) + "\\n")
"""

OFF_THE_APPLY_FILE_PATH = {
    "opspatch.hosts.transport.ssh": "a host over SSH",
    "opspatch.config.playbook": "a playbook file (`apply --file` runs the default playbook)",
    "opspatch.config.inventory": "an inventory (`--hosts`)",
    "opspatch.runs.fleet.liveapply": "`apply --live`",
    "opspatch.hosts.engine": "an engine restarted, awaited or smoke-tested (no engine here)",
    "opspatch.hosts.live": "a live fix in a running engine",
    "opspatch.runs.commands.rollback": "`rollback`",
    "opspatch.analysis.upstream": "a pristine file judged against its release (`status`)",
    "opspatch.analysis.initprogress": "`lint-init`",
    "opspatch.hosts.image": "a container image's bake labels",
    "opspatch.ledger.postgres": "a PostgreSQL ledger",
    "opspatch.sandbox": "the sandbox",
    "yaml": "YAML inventories and playbooks",
    "psycopg": "a PostgreSQL ledger",
    "unidiff": "a `diff` edit (its unified diff parsed)",
    "opspatch.core.unified": "a `diff` edit's hunks parsed and placed",
    "opspatch.runs.judgments.views": "the status views (a multi-node unit's odd node, `status`)",
    "typer": "the option parser: a plain `apply --file --yes` is read by `cli/localapply.py`",
    "opspatch.cli.app": "the typer app and its command groups",
    "opspatch.cli.params": "typer's option types",
    "opspatch.runs.fleet.judging": "a judged run (a playbook's `[judge]`; the default judges none)",
    "opspatch.runs.judgments.canary": "the judge's verdict",
    "opspatch.hosts.measure": "the judge's prompts decoded on a running server",
    "opspatch.hosts.router": "a host behind a router (drain and admit)",
    "opspatch.hosts.transport.container": "an engine in a container",
    "opspatch.runs.commands.releasecache": "`check --releases` (and a file's version read from its dist-info)",
    "opspatch.analysis.proofs": "the releases a patch is proven on (`check`)",
    "rich._emoji_codes": "none: the consoles print `:name:` as written (`cli/render.py`)",
}
"""Modules `apply --file` must not import, each with the command or case that needs it: every
one costs start-up time that an apply of one local file does not use (issue 44: within 6x of
py_compile)."""

UNBUILT_ON_THE_APPLY_FILE_PATH = {
    "PatchSetSpec": "a patch set ([[targets]]): its validator is built when a set is read",
    "SetTarget": "a patch set's target, built with `PatchSetSpec`",
}
"""Models of `opspatch.core.spec` whose validators an apply of a plain patch must not build
(`defer_build`): each is a few milliseconds of pydantic's schema building (issue 44)."""


@pytest.mark.parametrize("args", [["--version"], ["check"], ["schema"], ["check", "--json"]])
def test_quick_commands_import_neither_ssh_libraries_nor_torch(
    args: list[str], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stderr.rsplit("LOADED ", 1)[1].splitlines()[0])
    assert loaded == [], f"`opspatch {' '.join(args)}` imported {loaded}"


def test_apply_file_imports_neither_ssh_libraries_nor_torch(tmp_path: Path) -> None:
    """`apply --file` reaches no host over SSH: it loads none of the SSH libraries, and none of
    the modules only other commands or cases need (`OFF_THE_APPLY_FILE_PATH`)."""
    patch = tmp_path / "patches" / "guard-value.toml"
    patch.parent.mkdir()
    patch.write_text(
        'id = "guard-value"\nsummary = "s"\nrationale = "r"\n[target]\nmodule = "pkg.mod"\n'
        '[[edits]]\nkind = "insert"\nscope = "f"\nposition = "start"\ncode = "x = 0"\n',
        encoding="utf-8",
    )
    target = tmp_path / "pkg" / "mod.py"
    target.parent.mkdir()
    target.write_text("def f():\n    return 1\n", encoding="utf-8")
    args = ["apply", "guard-value", "--file", str(target), "--target-version", "1", "--yes"]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=tmp_path,
        env={**os.environ, "OPSPATCH_STATE_DIR": str(tmp_path / "state")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "x = 0" in target.read_text(encoding="utf-8")
    loaded = json.loads(done.stderr.rsplit("LOADED ", 1)[1].splitlines()[0])
    assert loaded == [], f"`opspatch apply --file` imported {loaded}"
    groups = set(json.loads(done.stderr.rsplit("GROUPS ", 1)[1].splitlines()[0]))
    groups &= set(app.GROUPS)
    assert groups == set(), f"`apply --file --yes` imported the command groups {groups}"
    modules = json.loads(done.stderr.rsplit("MODULES ", 1)[1].splitlines()[0])
    off = {m: OFF_THE_APPLY_FILE_PATH[m] for m in modules if m in OFF_THE_APPLY_FILE_PATH}
    assert off == {}, f"`apply --file` imported modules only other cases need: {off}"
    built = json.loads(done.stderr.rsplit("BUILT ", 1)[1].splitlines()[0])
    unused = {
        m: UNBUILT_ON_THE_APPLY_FILE_PATH[m] for m in built if m in UNBUILT_ON_THE_APPLY_FILE_PATH
    }
    assert unused == {}, f"`apply --file` built the validators of models it never reads: {unused}"
    frozen, enabled = done.stderr.rsplit("FROZEN ", 1)[1].split()[:2]
    assert int(frozen) > 1000, "`apply --file` left its imports to the collector's passes"
    assert enabled == "True", "`apply --file` left the collector off after its freeze"


@pytest.mark.pure
def test_a_command_runs_with_its_own_group_only() -> None:
    """The app a command runs with holds the root and that command's group (typer reads every
    command's options it holds before parsing); help and unknown words get every group."""
    every = set().union(*app.GROUPS.values())
    for name, words in app.GROUPS.items():
        assert app.group_commands(app.group_module(name)) == words, name
        for word in words:
            for args in ([word, "--help"], ["-w", "somewhere", word], ["--ledger=x", word]):
                built = typer.main.get_command(app.app_for(args))
                assert isinstance(built, typer.core.TyperGroup)
                assert set(built.commands) == words, args
    full = typer.main.get_command(app.app_for(["--help"]))
    assert isinstance(full, typer.core.TyperGroup) and set(full.commands) == every
    assert app.app_for(["no-such-command"]) is app.app
    root = typer.main.get_command(app.app)
    assert {
        name for param in root.params if not getattr(param, "is_flag", False)
        for name in param.opts
    } == set(app.ROOT_OPTIONS_WITH_VALUES)  # fmt: skip


@pytest.mark.process
def test_a_command_built_alone_has_every_subcommand_the_full_app_has() -> None:
    """A group (`ledger`, `sandbox`, `live`, ...) built alone for its own word, in a fresh
    interpreter as a command runs, keeps every subcommand it has in the full app: one that
    another group's module registers into it would be lost (`ledger report`, written beside
    diagnose, was "No such command" once each command built only its own group)."""
    full = typer.main.get_command(app.app)
    assert isinstance(full, typer.core.TyperGroup)
    groups = {
        word: sorted(command.commands)
        for word, command in full.commands.items()
        if isinstance(command, typer.core.TyperGroup)
    }
    probe = (
        "import json, sys, typer\n"
        "from opspatch.cli import app\n"
        "built = typer.main.get_command(app.app_for([sys.argv[1], '--help']))\n"
        "print(json.dumps(sorted(built.commands[sys.argv[1]].commands)))\n"
    )
    for word, subcommands in groups.items():
        done = subprocess.run(
            [sys.executable, "-c", probe, word], capture_output=True, text=True, check=True
        )
        assert json.loads(done.stdout) == subcommands, word
