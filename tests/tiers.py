"""pytest plugin: the test tiers, and the check that keeps them true.

Every test carries a tier marker (a file's `pytestmark`; a file may carry several, a test or a
parameter more): `pure` or `scripted` for the fast tier (this process only), `process` for one
that starts processes that are no resource (the console script, the agent over the local
transport, git), and the marker of every resource it starts (`RESOURCES`). A test that starts
what its markers do not say fails, naming the marker to add: `tests/sitehook/sitecustomize.py`
sees every process this process starts during a test's setup and call, and each resource that a
Python process below it starts. What a module- or session-scoped fixture started counts for
every later test that uses it. `slow` is added to every test that carries `process` or a
resource's marker, so `-m "not slow"` is the fast tier; `scripts/test.sh --fast` runs it. The
tiers and their times: docs/development.md.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

FAST = {
    "pure": "fast tier: runs in this process only, starts no process",
    "scripted": "fast tier: the pipeline over the scripted transport (hosts as data), in this "
    "process only",
}
PROCESS = "process"
RESOURCES = {
    PROCESS: "starts processes that are no resource: the console script, the host agent over "
    "the local transport, git, a virtual environment",
    "ssh": "starts a real OpenSSH sshd (skipped with a reason when sshd is not installed)",
    "postgres": "starts a throwaway PostgreSQL server (tests/pgkit.py)",
    "podman": "runs podman: containers, images, the sandbox's base image",
    "router": "starts the real SGLang router (sglang-router)",
    "root": "needs root and changes the machine: sudo, system users, /etc/sudoers.d, mounts",
    "engine": "starts engine servers (stand-in SGLang processes, a sandbox fleet)",
    "sglang": "starts real SGLang servers on the CPU (`--engine sglang`; skipped with a reason "
    "when the package index cannot be reached to build their environment)",
}
"""What a test starts, each with its marker; a resource's marker stands for `process` too."""
OTHER_MARKERS = {
    "slow": "not the fast tier: added to every test that carries `process` or a resource's "
    "marker; set by hand on a test that is slow by itself",
    "network": "downloads from PyPI (skipped with a reason when offline)",
    "alone": "judges latencies on this machine: `scripts/test.sh` runs these after the rest, "
    "with no other test beside them",
}
HOOK_FOLDER = Path(__file__).resolve().parent / "sitehook"


def _load_hook() -> ModuleType:
    """The hook module by its path: its folder goes on PYTHONPATH only, for the children (a
    pytest started by a test imported it as `sitecustomize`: the same one, not a second hook)."""
    started_with = sys.modules.get("sitecustomize")
    if Path(getattr(started_with, "__file__", None) or "/").parent == HOOK_FOLDER:
        assert started_with is not None
        return started_with
    spec = importlib.util.spec_from_file_location(
        "tests_sitehook_sitecustomize", HOOK_FOLDER / "sitecustomize.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _load_hook()
counted_as = hook.counted_as


@dataclass
class _State:
    folder: Path
    numbers: Iterator[int] = field(default_factory=itertools.count)
    # what a module- or session-scoped fixture started: (its definition, its param index)
    by_fixture: dict[tuple[Any, int], list[tuple[str, str]]] = field(default_factory=dict)
    python_path: str | None = None


_state: _State | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _state
    for name, text in {**FAST, **RESOURCES, **OTHER_MARKERS}.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    # set on every test (below); named here too for a run with xdist left out (`-p no:xdist`)
    config.addinivalue_line("markers", "xdist_group(name): the tests pytest -n runs on one worker")
    _state = _State(Path(tempfile.mkdtemp(prefix="opspatch-tiers-")))
    # a pytest that a test started writes to files of its own, not to the test's
    os.environ.pop(hook.LOG_VARIABLE, None)
    _state.python_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HOOK_FOLDER), *([_state.python_path] if _state.python_path else [])]
    )
    hook.install(every=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _state
    if _state is None:
        return
    if _state.python_path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = _state.python_path
    os.environ.pop(hook.LOG_VARIABLE, None)
    shutil.rmtree(_state.folder, ignore_errors=True)
    _state = None


SERIAL = ("sglang", "podman", "root")
"""Resources whose tests run one at a time under `pytest -n` (each group on one worker): real
SGLang servers take 2-3 GB each, podman's containers and root's users and sudoers are the
machine's, not a test's."""


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker, and before xdist reads groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        markers = _markers(item)
        if markers & RESOURCES.keys():
            item.add_marker(pytest.mark.slow)
        # `--dist loadgroup`: a file's tests stay on one worker (its module fleets start once)
        group = next((name for name in SERIAL if name in markers), item.path.stem)
        item.add_marker(pytest.mark.xdist_group(group))


class _Watch:
    """While it is open, what is started is written to its own file (the variable names it)."""

    def __init__(self, state: _State) -> None:
        # a thread already running (one a test before left behind) starts nothing of this one's
        self.earlier = {thread.ident for thread in threading.enumerate()} - {threading.get_ident()}
        self.path = state.folder / f"{next(state.numbers)}.log"
        self.outer = os.environ.get(hook.LOG_VARIABLE)
        os.environ[hook.LOG_VARIABLE] = str(self.path)

    def close(self) -> list[tuple[str, str]]:
        if self.outer is None:
            os.environ.pop(hook.LOG_VARIABLE, None)
        else:
            os.environ[hook.LOG_VARIABLE] = self.outer
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        self.path.unlink()
        if self.outer is not None:  # a fixture's starts are the test's too
            with open(self.outer, "a", encoding="utf-8") as outer:
                outer.write(text)
        starts = []
        for line in text.splitlines():
            said, _, program = line.partition(" ")
            resource, _, thread = said.partition("@")
            if not thread or int(thread) not in self.earlier:
                starts.append((resource, program))
        return starts


def _markers(item: pytest.Item) -> set[str]:
    return {marker.name for marker in item.iter_markers()}


def _fixture_starts(item: pytest.Item, state: _State) -> list[tuple[str, str]]:
    """What the module- and session-scoped fixtures this test uses started, when they were set
    up for an earlier test."""
    info = getattr(item, "_fixtureinfo", None)
    callspec = getattr(item, "callspec", None)
    indices: dict[str, int] = callspec.indices if callspec is not None else {}
    starts: list[tuple[str, str]] = []
    for name, definitions in info.name2fixturedefs.items() if info is not None else ():
        for definition in definitions:
            for resource, program in state.by_fixture.get((definition, indices.get(name, 0)), []):
                starts.append((resource, f"{program} (by the {definition.scope} fixture {name})"))
    return starts


def _check(item: pytest.Item, starts: list[tuple[str, str]]) -> None:
    unreadable = [program for resource, program in starts if resource not in RESOURCES]
    if unreadable:
        pytest.fail(f"the tier check could not read a process start: {unreadable[0]}", False)
    carried = _markers(item)
    missing: dict[str, list[str]] = {}
    for resource, program in starts:
        if resource not in carried and not (resource == PROCESS and carried & RESOURCES.keys()):
            missing.setdefault(resource, []).append(program)
    if missing.keys() - {PROCESS}:
        missing.pop(PROCESS, None)  # the resource's marker says it
    if missing:
        said = "".join(
            f"\n  {resource}: {programs[0]}"
            + (f" (and {len(programs) - 1} more)" if len(programs) > 1 else "")
            for resource, programs in missing.items()
        )
        marks = ", ".join(f"pytest.mark.{resource}" for resource in missing)
        pytest.fail(
            f"{item.nodeid} started what its markers do not say:{said}\n"
            f"add {marks} to the file's pytestmark, or to the test's own marks "
            "(the test tiers: docs/development.md)",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    if _state is None:
        return (yield)
    if not _markers(item) & (FAST.keys() | RESOURCES.keys()):
        pytest.fail(
            f"{item.nodeid} carries no tier marker: set the file's pytestmark to "
            f"pytest.mark.pure (or {', '.join(list(FAST)[1:] + list(RESOURCES))}; "
            "the test tiers: docs/development.md)",
            pytrace=False,
        )
    watch = _Watch(_state)
    try:
        result = yield
    finally:
        starts = watch.close()
    _check(item, starts + _fixture_starts(item, _state))
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    if _state is None:
        return (yield)
    watch = _Watch(_state)
    try:
        result = yield
    finally:
        starts = watch.close()
    _check(item, starts)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    if _state is None or fixturedef.scope == "function":
        return (yield)
    watch = _Watch(_state)
    try:
        return (yield)
    finally:
        starts = watch.close()
        if starts:
            key = (fixturedef, getattr(request, "param_index", 0))
            _state.by_fixture.setdefault(key, []).extend(starts)
