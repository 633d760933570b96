"""Deeply nested input (issue 9, item 11): every input path reports `file:line: field: problem`
and exits 2, quickly, instead of a RecursionError or MemoryError traceback.

Most cases run the CLI in-process (tests/hostile.py); a few run the real console script."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.config.lookup import Workspace
from opspatch.config.playbook import parse_playbook
from opspatch.errors import SpecError
from tests.clirunner import opspatch
from tests.hostile import (
    GUARD_PATCH,
    long_sum,
    nested_arrays,
    nested_inline_tables,
    run_in_process,
    target_copy,
)

pytestmark = pytest.mark.process

GUARD = GUARD_PATCH.read_text(encoding="utf-8")
LAMBDAS = "lambda: " * 3000 + "1"
PARENS = "(" * 10000 + "1" + ")" * 10000


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line)


def write_patch(workspace: Path, text: str) -> Path:
    path = workspace / "patches" / "eagle-init-guard.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def assert_clean_refusal(output: str, code: int, file: Path, line: int, field: str = "") -> None:
    assert code == 2, output
    assert "Traceback" not in output
    assert f"{file}:{line}: {field}" in output, output


# ---------------------------------------------------------------------------------------------
# patch files (check, plan --file)

# (what replaces `versions = ">=0.5.4"`, the field the error names)
DEEP_TOML = [
    pytest.param(f'versions = ">=0.5.4"\naccept_sha256 = {nested_arrays(3000)}', "", id="arrays"),
    pytest.param(f'versions = ">=0.5.4"\nextra = {nested_inline_tables(3000)}', "", id="tables"),
    pytest.param(
        f'versions = ">=0.5.4"\naccept_sha256 = {nested_arrays(100)}',
        "target.accept_sha256",
        id="arrays-within-the-parser",
    ),
]


@pytest.mark.parametrize(("replacement", "field"), DEEP_TOML)
def test_check_refuses_deep_toml_at_its_line(tmp_path: Path, replacement: str, field: str) -> None:
    text = GUARD.replace('versions = ">=0.5.4"', replacement, 1)
    path = write_patch(tmp_path, text)
    result = run_in_process("--workspace", str(tmp_path), "check", "eagle-init-guard")
    line = line_of(text, replacement.splitlines()[1][:12])
    assert_clean_refusal(result.output, result.code, path, line, field)


# (the snippet that replaces the second edit's code, the field the error names)
DEEP_SNIPPETS = [
    pytest.param(f"x = {PARENS}", "edits[1].code", id="parentheses-10000-deep"),
    pytest.param(f"x = {long_sum(100_000)}", "edits[1].code", id="sum-100000-terms"),
    pytest.param(f"x = {long_sum(2_000)}", "edits[1].code", id="sum-the-parser-accepts"),
    pytest.param(f"x = {LAMBDAS}", "edits[1].code", id="lambdas-3000-deep"),
]


def _with_snippet(code: str) -> str:
    return GUARD.replace('"""\nself.spec_disable_batch_threshold = 0\n"""', f"'''\n{code}\n'''", 1)


@pytest.mark.parametrize(("code", "field"), DEEP_SNIPPETS)
def test_check_refuses_deep_code_snippets_at_their_field(
    tmp_path: Path, code: str, field: str
) -> None:
    text = _with_snippet(code)
    path = write_patch(tmp_path, text)
    result = run_in_process("--workspace", str(tmp_path), "check", "eagle-init-guard")
    line = line_of(text, 'scope = "EAGLEWorkerV2.__init__"') + 3  # the `code = '''` line
    assert_clean_refusal(result.output, result.code, path, line, field)
    assert re.search(r"nested|deep", result.output), result.output


@pytest.mark.parametrize(
    ("anchor", "field"),
    [
        (f'anchor = {{ matches = "x = {long_sum(100_000)}" }}', "edits[1].anchor"),
        (f'anchor = {{ matches = "x = {long_sum(2_000)}" }}', "edits[1].anchor"),
        (f'anchor = {{ calls = "{".".join(["a"] * 5000)}" }}', ""),
    ],
    ids=["matches-too-deep-to-parse", "matches-too-deep-to-analyse", "long-dotted-call"],
)
def test_check_refuses_deep_anchor_snippets(tmp_path: Path, anchor: str, field: str) -> None:
    text = GUARD.replace(
        'scope = "EAGLEWorkerV2.__init__"\nposition = "start"',
        f'scope = "EAGLEWorkerV2.__init__"\nposition = "after"\n{anchor}',
        1,
    )
    path = write_patch(tmp_path, text)
    result = run_in_process("--workspace", str(tmp_path), "check", "eagle-init-guard")
    if not field:  # a long but shallow name is fine to check; it just matches nothing
        assert result.code in (0, 2) and "Traceback" not in result.output
        return
    assert_clean_refusal(result.output, result.code, path, line_of(text, "anchor = {"), field)


def test_check_refuses_a_deep_replace_expression(tmp_path: Path) -> None:
    text = GUARD + textwrap.dedent(
        f"""
        [[edits]]
        kind = "replace"
        scope = "EAGLEWorkerV2.__init__"
        select = {{ expression = "{long_sum(100_000)}" }}
        code = "0"
        """
    )
    path = write_patch(tmp_path, text)
    result = run_in_process("--workspace", str(tmp_path), "check", "eagle-init-guard")
    assert_clean_refusal(
        result.output, result.code, path, line_of(text, "select = {"), "edits[2].select"
    )


def test_plan_file_refuses_a_deep_snippet_at_its_field(tmp_path: Path) -> None:
    text = _with_snippet(f"x = {long_sum(100_000)}")
    path = write_patch(tmp_path / "ws", text)
    target = target_copy(tmp_path / "site")
    result = run_in_process(
        "--workspace",
        str(tmp_path / "ws"),
        "plan",
        "eagle-init-guard",
        "--file",
        str(target),
        "--target-version",
        "0.5.23",
    )
    line = line_of(text, 'scope = "EAGLEWorkerV2.__init__"') + 3
    assert_clean_refusal(result.output, result.code, path, line, "edits[1].code")


@pytest.mark.parametrize(
    "extra",
    [
        f"\nx = {long_sum(100_000)}\n",
        f"\nx = {long_sum(2_000)}\n",
        f"\nx = {LAMBDAS}\n",
        f"\nx = {PARENS}\n",
    ],
    ids=["sum-too-deep-to-parse", "sum-too-deep-to-analyse", "lambdas", "parentheses"],
)
def test_plan_file_on_a_target_too_deep_is_not_applicable(tmp_path: Path, extra: str) -> None:
    target = target_copy(tmp_path, extra)
    before = target.read_bytes()
    result = run_in_process(
        "plan", str(GUARD_PATCH), "--file", str(target), "--target-version", "0.5.23"
    )
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    assert f"{target}: the file does not parse" in result.output, result.output
    assert target.read_bytes() == before
    as_json = run_in_process(
        "plan", str(GUARD_PATCH), "--file", str(target), "--target-version", "0.5.23", "--json"
    )
    assert as_json.code == 2 and '"outcome": "not-applicable"' in as_json.stdout


# ---------------------------------------------------------------------------------------------
# inventories and playbooks


@pytest.mark.parametrize(
    "value",
    [nested_arrays(3000), nested_inline_tables(3000), nested_arrays(100)],
    ids=["arrays", "tables", "arrays-within-the-parser"],
)
def test_inventory_toml_nested_deep_is_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / "inventories" / "deep.toml"
    path.parent.mkdir()
    path.write_text(f'[hosts.a]\naddress = "a.fleet.example"\nvars = {{ v = {value} }}\n')
    with pytest.raises(SpecError) as caught:
        Workspace(tmp_path, tmp_path / "state").hosts("deep")
    assert caught.value.location.line == 3
    result = run_in_process("--workspace", str(tmp_path), "inventory", "show", "deep")
    assert_clean_refusal(result.output, result.code, path, 3)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("all:\n  hosts:\n    a:\n      deep: " + nested_arrays(3000) + "\n", 4),
        ("all:\n  hosts:\n    a:\n      deep: " + nested_arrays(100) + "\n", 4),
        ("all:\n  hosts:\n    a:\n      deep: &loop\n        - *loop\n", 4),
        (
            "all:\n  vars:\n"
            + "".join(
                f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 9) + "]\n"
                for i in range(12)
            ),
            3,
        ),
    ],
    ids=["arrays", "arrays-within-the-parser", "alias-loop", "alias-bomb"],
)
def test_inventory_yaml_nested_deep_is_refused(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "inventories" / "deep.yml"
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        parse_inventory(text, str(path))
    assert caught.value.location.line >= line - 1, caught.value.render()
    result = run_in_process("--workspace", str(tmp_path), "inventory", "show", "deep")
    assert result.code == 2, result.output
    assert "Traceback" not in result.output and f"{path}:" in result.output


@pytest.mark.parametrize(
    "value", [nested_arrays(3000), nested_inline_tables(3000), nested_arrays(100)]
)
def test_playbook_nested_deep_is_refused(tmp_path: Path, value: str) -> None:
    text = f"canary = 1\n\n[smoke]\nprompts = {value}\n"
    with pytest.raises(SpecError) as caught:
        parse_playbook(text, "playbooks/deep.toml")
    assert caught.value.location.line == 4
    assert caught.value.location.file == "playbooks/deep.toml"


def test_apply_with_a_deep_playbook_is_refused_before_anything(tmp_path: Path) -> None:
    (tmp_path / "playbooks").mkdir()
    book = tmp_path / "playbooks" / "deep.toml"
    book.write_text(f"canary = 1\nbatch = {nested_arrays(3000)}\n")
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "here.toml").write_text('[hosts.h]\ntransport = "local"\n')
    result = run_in_process(
        "--workspace",
        str(tmp_path),
        "apply",
        "eagle-init-guard",
        "--hosts",
        "here",
        "--playbook",
        "deep",
        "--dry-run",
    )
    assert_clean_refusal(result.output, result.code, book, 2)


# ---------------------------------------------------------------------------------------------
# the real console script, for a few of the above


def test_console_script_check_deep_arrays(tmp_path: Path) -> None:
    text = GUARD.replace(
        'versions = ">=0.5.4"', f'versions = ">=0.5.4"\naccept_sha256 = {nested_arrays(5000)}'
    )
    path = write_patch(tmp_path, text)
    run = opspatch("check", "eagle-init-guard", cwd=tmp_path, timeout=60)
    assert_clean_refusal(run.stdout + run.stderr, run.code, path, line_of(text, "accept_sha256"))


def test_console_script_plan_deep_target_and_deep_snippet(tmp_path: Path) -> None:
    target = target_copy(tmp_path / "site", f"\nx = {long_sum(100_000)}\n")
    run = opspatch(
        "plan", "eagle-init-guard", "--file", str(target), "--target-version", "0.5.23", timeout=60
    )
    assert run.code == 2 and "Traceback" not in run.stderr, run.stderr
    assert f"{target}: the file does not parse" in run.stderr
    text = _with_snippet(f"x = {LAMBDAS}")
    path = write_patch(tmp_path / "ws", text)
    run = opspatch("check", str(path), timeout=60)
    line = line_of(text, 'scope = "EAGLEWorkerV2.__init__"') + 3
    assert_clean_refusal(run.stdout + run.stderr, run.code, path, line, "edits[1].code")


def test_console_script_inventory_yaml_alias_loop(tmp_path: Path) -> None:
    (tmp_path / "inventories").mkdir()
    path = tmp_path / "inventories" / "loop.yml"
    path.write_text("all:\n  hosts:\n    a:\n      deep: &loop\n        - *loop\n")
    run = opspatch("inventory", "show", "loop", cwd=tmp_path, timeout=60)
    assert run.code == 2 and "Traceback" not in run.stderr, run.stderr
    assert f"{path}:" in run.stderr


def test_code_just_under_the_depth_limit_is_still_planned(tmp_path: Path) -> None:
    # The limit refuses only what real code never has: a long sum at the limit's edge, in the
    # patched class itself, is still analysed and patched (and the CLI's own frames fit).
    from opspatch.core.syntax import MAX_AST_DEPTH

    terms = MAX_AST_DEPTH - 10
    source = target_copy(tmp_path).read_text(encoding="utf-8")
    deep = source.replace(
        "class EAGLEWorkerV2(BaseSpecWorker):\n",
        f"class EAGLEWorkerV2(BaseSpecWorker):\n    total = {long_sum(terms)}\n",
        1,
    )
    assert deep != source
    target = target_copy(tmp_path)
    target.write_text(deep, encoding="utf-8")
    result = run_in_process(
        "plan", str(GUARD_PATCH), "--file", str(target), "--target-version", "0.5.23"
    )
    assert result.code == 0, result.output
    assert "+    spec_disable_batch_threshold: int = 0" in result.stdout


def test_a_playbook_regex_nested_too_deeply_is_refused_at_its_field() -> None:
    text = f"[log]\nfail_patterns = ['{'(' * 3000}{')' * 3000}']\n"
    with pytest.raises(SpecError) as caught:
        parse_playbook(text, "playbooks/deep.toml")
    assert caught.value.location.field == "log.fail_patterns[0]"
    assert caught.value.location.line == 2
