"""Property: hostile patch files never crash `check` or `plan --file` (issue 9).

Generated files are random mutations of the shipped `patches/eagle-init-guard.toml` (lines
deleted, duplicated or inserted, bytes flipped, keys renamed, values retyped, deep nesting in
TOML and in code snippets). Whatever the file, `opspatch check` and `opspatch plan --file` (on a
copy of the stand-in engine's eagle_worker_v2.py, `--target-version 0.5.23`) exit 0 or 2, and a
refusal names the patch file: never a traceback, never another exit code.

The many generated cases run the CLI in-process (tests/hostile.py); a handful of seeded ones run
through the real console script.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.clirunner import opspatch
from tests.hostile import (
    GUARD_PATCH,
    long_sum,
    nested_arrays,
    nested_inline_tables,
    run_in_process,
    target_copy,
)

pytestmark = pytest.mark.pure

T = TypeVar("T")
GUARD = GUARD_PATCH.read_bytes()
_KEY_LINE = re.compile(rb"^(\s*)([A-Za-z0-9_.\"-]+)(\s*=\s*)(.*)$")

NEW_KEYS = [
    b"kind",
    b"scope",
    b"code",
    b"position",
    b"anchor",
    b"versions",
    b"Kind",
    b"edits",
    b"x",
    b'"[/red]"',
    b'"[bold]oops"',
    '"ключ"'.encode(),
    b"a.b",
    b'"with space"',
    b"",
]
NEW_VALUES = [
    b"1",
    b"-1",
    b"0",
    b"3.5",
    b"nan",
    b"-inf",
    b"true",
    b'""',
    b'"x"',
    b'"insert"',
    b'"replace"',
    b'"<module>"',
    b'"before"',
    b"[]",
    b'[1, "a"]',
    b"{}",
    b'{ kind = "insert" }',
    b'{ calls = "self.x" }',
    b'{ expression = "a" }',
    b"1979-05-27",
    b"07:32:00",
    b'"""\nmulti\n"""',
    b'"[/red] markup [bold]"',
    *(nested_arrays(d).encode() for d in (5, 40, 600, 3000)),
    *(nested_inline_tables(d).encode() for d in (40, 3000)),
    *(f'"x = {long_sum(n)}"'.encode() for n in (140, 2_000, 50_000)),
    b"'x = " + b"(" * 5000 + b"1" + b")" * 5000 + b"'",
    b"'x = " + b"lambda: " * 3000 + b"1'",
    b"'" + b"a." * 3000 + b"b'",
]
NEW_LINES = [
    b"[[edits]]",
    b"[target]",
    b"[[postconditions]]",
    b"[edits]",
    b'kind = "replace"',
    b'select = { expression = "' + long_sum(5_000).encode() + b'" }',
    b'anchor = { matches = "x = ' + long_sum(3_000).encode() + b'" }',
    b"code = '''\n" + b"    " * 120 + b"x = 1\n'''",
    b"x = 1",
    b"\x00",
    b"\xff\xfe",
]
DEEP_CODE = [
    f"x = {long_sum(100_000)}".encode(),
    f"x = {long_sum(1_000)}".encode(),
    b"x = " + b"(" * 10_000 + b"1" + b")" * 10_000,
    b"x = " + b"lambda: " * 3_000 + b"1",
    b"x = " + b"not " * 5_000 + b"1",
    b"x = a" + b"[0]" * 20_000,
]


class Chooser(Protocol):
    """Where a mutation's choices come from: hypothesis (shrinks) or a seeded random."""

    def integer(self, low: int, high: int) -> int: ...

    def pick(self, options: Sequence[T]) -> T: ...


class DrawChooser:
    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(st.integers(low, high))

    def pick(self, options: Sequence[T]) -> T:
        return self.data.draw(st.sampled_from(options))


class RandomChooser:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def pick(self, options: Sequence[T]) -> T:
        return self.rng.choice(list(options))


def _key_lines(lines: list[bytes]) -> list[int]:
    return [i for i, line in enumerate(lines) if _KEY_LINE.match(line)] or [0]


def mutate(text: bytes, choose: Chooser) -> bytes:
    """One to four random mutations of a patch file's bytes."""
    for _ in range(choose.integer(1, 4)):
        lines = text.split(b"\n")
        operation = choose.pick(
            ["delete", "duplicate", "flip", "rename", "retype", "insert", "deep-code"]
        )
        if operation == "delete" and len(lines) > 1:
            del lines[choose.integer(0, len(lines) - 1)]
        elif operation == "duplicate":
            index = choose.integer(0, len(lines) - 1)
            lines.insert(index, lines[index])
        elif operation == "flip" and text:
            position = choose.integer(0, len(text) - 1)
            text = text[:position] + bytes([choose.integer(0, 255)]) + text[position + 1 :]
            continue
        elif operation in ("rename", "retype"):
            index = choose.pick(_key_lines(lines))
            match = _KEY_LINE.match(lines[index])
            if match:
                indent, key, equals, value = match.groups()
                if operation == "rename":
                    key = choose.pick(NEW_KEYS)
                else:
                    value = choose.pick(NEW_VALUES)
                lines[index] = indent + key + equals + value
        elif operation == "insert":
            lines.insert(choose.integer(0, len(lines)), choose.pick(NEW_LINES))
        elif operation == "deep-code":
            for index, line in enumerate(lines):
                if line.strip() in (
                    b"self.spec_disable_batch_threshold = 0",
                    b"spec_disable_batch_threshold: int = 0",
                ):
                    lines[index] = choose.pick(DEEP_CODE)
                    break
        text = b"\n".join(lines)
    return text


def _patch_and_target(root: Path, text: bytes) -> tuple[Path, Path]:
    workspace = root / "ws"
    patch = workspace / "patches" / "eagle-init-guard.toml"
    patch.parent.mkdir(parents=True, exist_ok=True)
    patch.write_bytes(text)
    target = root / "site" / "sglang" / "srt" / "speculative" / "eagle_worker_v2.py"
    if not target.exists():
        target_copy(root / "site")
    return workspace, target


def _assert_handled(code: int, output: str, patch: Path) -> None:
    assert code in (0, 2), output
    assert "Traceback" not in output, output
    if code == 2:
        assert str(patch) in output or "eagle-init-guard" in output, output


@pytest.mark.slow  # in this process, but 150 generated patch files take ~15 s
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_hostile_patch_files_exit_0_or_2_in_process(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    text = mutate(GUARD, DrawChooser(data))
    root = tmp_path_factory.mktemp("hostile")
    workspace, target = _patch_and_target(root, text)
    patch = workspace / "patches" / "eagle-init-guard.toml"
    before = target.read_bytes()
    checked = run_in_process("--workspace", str(workspace), "check", "eagle-init-guard")
    _assert_handled(checked.code, checked.output, patch)
    planned = run_in_process(
        "--workspace",
        str(workspace),
        "plan",
        "eagle-init-guard",
        "--file",
        str(target),
        "--target-version",
        "0.5.23",
    )
    _assert_handled(planned.code, planned.output, patch)
    assert target.read_bytes() == before  # plan changes nothing
    if checked.code == 2:  # a patch check refuses is refused by plan too
        assert planned.code == 2, planned.output


@pytest.mark.process
@pytest.mark.parametrize("seed", range(5))
def test_hostile_patch_files_through_the_console_script(tmp_path: Path, seed: int) -> None:
    chooser = RandomChooser(seed)
    text = mutate(mutate(GUARD, chooser), chooser)
    workspace, target = _patch_and_target(tmp_path, text)
    patch = workspace / "patches" / "eagle-init-guard.toml"
    checked = opspatch("check", "eagle-init-guard", cwd=workspace, timeout=60)
    _assert_handled(checked.code, checked.stdout + checked.stderr, patch)
    planned = opspatch(
        "plan",
        "eagle-init-guard",
        "--file",
        str(target),
        "--target-version",
        "0.5.23",
        cwd=workspace,
        timeout=60,
    )
    _assert_handled(planned.code, planned.stdout + planned.stderr, patch)
