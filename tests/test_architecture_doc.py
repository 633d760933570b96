"""docs/architecture.md stays a true map: under 15 KB, every file and name it cites exists, and
its "To add ..." lists have as many places as they say. The lists for a command and an agent
operation name every registry the code keeps of all commands or all operations, so a new
registry fails here until the doc names it."""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import re
from collections.abc import Mapping, Set
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from opspatch.core.vocabulary import Command
from opspatch.hosts.agent import protocol
from opspatch.hosts.results import OPERATIONS, Operation

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
MAX_BYTES = 15_000

# Packages that are not the controller's code: SGLang's stand-in sources, the real sandbox's
# engine files, and the live plugin that runs inside an engine.
NOT_IMPORTED = (
    "opspatch.sandbox.engine_src",
    "opspatch.sandbox.real.engine_files",
    "opspatch.hosts.liveplugin",
)

# The registries that fill themselves: an `Operation` adds itself to results.OPERATIONS and
# `@operation` to the agent's; neither is a place to touch.
SELF_FILLED = (OPERATIONS, protocol.OPERATIONS)

HEADING = re.compile(r"^### To add (?P<what>.+): (?P<count>\d+) places?$", re.MULTILINE)
ITEM = re.compile(r"^\d+\. `(?P<cited>[^`]+)`", re.MULTILINE)
CITED = re.compile(r"`((?:opspatch|tests|docs)/[\w/<>.-]+\.(?:py|md))(?::(\w+))?`")


def _lists() -> dict[str, tuple[int, list[str]]]:
    """Each "To add" list: its stated count and the first citation of each numbered item."""
    text = DOC.read_text(encoding="utf-8")
    lists = {}
    for heading in HEADING.finditer(text):
        end = text.find("\n#", heading.end())
        body = text[heading.end() : end if end >= 0 else len(text)]
        lists[heading["what"]] = (int(heading["count"]), ITEM.findall(body))
    return lists


def _defines(path: Path, name: str) -> bool:
    source = path.read_text(encoding="utf-8")
    return (
        re.search(rf"^\s*(class|def) {name}\b|^\s*{name}\s*[:=]", source, re.MULTILINE) is not None
    )


def _exists(cited: str) -> bool:
    path, _, name = cited.partition(":")
    if "<" in path:  # a new file of a folder: the folder exists
        return (ROOT / path).parent.is_dir()
    return (ROOT / path).is_file() and (not name or _defines(ROOT / path, name))


@functools.cache
def _controller_modules() -> list[ModuleType]:
    modules = []
    for path in sorted((ROOT / "opspatch").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if not name.startswith(NOT_IMPORTED) and not name.endswith("__main__"):
            modules.append(importlib.import_module(name))
    return modules


def _members(value: Any) -> list[Any]:
    if isinstance(value, type) or not isinstance(value, (Mapping, Set, tuple, list)):
        return []
    return list(value)


def _word(member: object) -> str | None:
    """A command by its word, an operation by its name (a descriptor or the name itself)."""
    if isinstance(member, Operation):
        return member.name
    return str(member) if isinstance(member, str) else None


def _registries(covers: Any) -> set[str]:
    """`path:NAME` of every module-level collection, in the package or its tests' tables, whose
    keys or members include every one of `covers`' words (a registry a new one must join)."""
    words = {str(word) for word in covers}
    found: dict[int, str] = {}
    for module in _controller_modules():
        path = Path(module.__file__ or "").relative_to(ROOT).as_posix()
        for name, value in vars(module).items():
            members = _members(value)
            if id(value) in found or not members or any(value is own for own in SELF_FILLED):
                continue
            if words <= {_word(member) for member in members}:
                found[id(value)] = f"{path}:{name}"
    for test in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.parse(test.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
                keys = {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if words <= keys and isinstance(target, ast.Name):
                    found[id(node)] = f"tests/{test.name}:{target.id}"
    return set(found.values())


def test_the_map_is_under_15_kb() -> None:
    assert DOC.stat().st_size < MAX_BYTES


def test_every_file_and_name_the_map_cites_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    cited = [f"{path}:{name}" if name else path for path, name in CITED.findall(text)]
    assert cited
    assert [one for one in cited if not _exists(one)] == []


def test_each_list_has_as_many_places_as_it_says() -> None:
    lists = _lists()
    assert {"a command", "an agent operation", "a transport", "an edit kind"} <= set(lists)
    for what, (count, places) in lists.items():
        assert len(places) == count, what
        assert [place for place in places if not _exists(place)] == [], what


def test_a_command_touches_every_registry_of_commands() -> None:
    count, places = _lists()["a command"]
    # the member, the CLI function, its module and the generated reference are the same for
    # every command; the rest are the registries the code keeps of all of them
    fixed = {
        "opspatch/core/vocabulary.py:Command",
        "opspatch/cli/<group>.py",
        "opspatch/runs/commands/<name>.py",
        "docs/cli.md",
    }
    registries = _registries(Command)
    assert "opspatch/core/remedy.py:FLAGS" in registries  # the scan finds one it should
    assert set(places) == fixed | registries
    assert count == len(fixed | registries)


def test_an_agent_operation_touches_every_registry_of_operations() -> None:
    count, places = _lists()["an agent operation"]
    # what a descriptor must be given that someone has to write: a type or a function each
    written = [
        field.name
        for field in dataclasses.fields(Operation)
        if field.default is dataclasses.MISSING
        and field.default_factory is dataclasses.MISSING
        and str(field.type).startswith(("type[", "Callable["))
    ]
    assert written == ["request", "reply", "record", "function"]
    registries = _registries(OPERATIONS)
    assert "tests/test_operations.py:RUNS_AS" in registries  # the scan finds one it should
    assert registries <= set(places)
    # the descriptor itself, what it names, and the hand-kept registries
    assert count == 1 + len(written) + len(registries)
