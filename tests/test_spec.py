"""Loading patch files: every bad input is one message naming file, line and field."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.spec import InsertEdit, patch_json_schema
from opspatch.core.tomlsource import format_field_path, locate_lines, parse_field_path
from opspatch.errors import SpecError

pytestmark = pytest.mark.pure

GOOD = """\
id = "p"
summary = "s"
rationale = "r"

[target]
module = "pkg.mod"
versions = ">=0.5.4"

[[edits]]
kind = "insert"
scope = "Worker.__init__"
code = "self.x = 0"

[[edits]]
kind = "insert"
scope = "Worker"
position = "before"
anchor = { defines = "__init__" }
code = "x = 0"

[[postconditions]]
kind = "class-attribute"
class = "Worker"
name = "x"
"""


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_good_patch_loads_into_typed_models(tmp_path: Path) -> None:
    loaded = load_patch(write(tmp_path, GOOD))
    assert loaded.spec.id == "p"
    assert isinstance(loaded.spec.edits[0], InsertEdit)
    assert loaded.spec.edits[1].anchor is not None  # type: ignore[union-attr]
    assert loaded.spec.postconditions[0].class_ == "Worker"  # type: ignore[union-attr]
    assert len(loaded.sha256) == 64


def test_shipped_patches_load() -> None:
    root = Path(__file__).resolve().parent.parent / "patches"
    ids = sorted(p.stem for p in root.glob("*.toml"))
    assert "eagle-init-guard" in ids
    assert any(load_patch(root / f"{i}.toml").spec.edits[0].kind == "diff" for i in ids)
    for patch_id in ids:
        assert load_patch(root / f"{patch_id}.toml").spec.id == patch_id


BAD_CASES = [
    # (replace this, with that, expected line, expected field, words in the problem)
    ('module = "pkg.mod"', 'module = "pkg.mod"\nmodul = "x"', 7, "target.modul", "unknown key"),
    (
        'kind = "insert"\nscope = "Worker.__init__"',
        'kind = "insrt"\nscope = "Worker.__init__"',
        10,
        "edits[0].kind",
        "unknown kind 'insrt'",
    ),
    ('code = "self.x = 0"', 'code = "self.x = = 0"', 12, "edits[0].code", "does not parse"),
    (
        'anchor = { defines = "__init__" }',
        'anchor = { calls = "a b" }',
        18,
        "edits[1].anchor",
        "not a dotted name",
    ),
    (
        'anchor = { defines = "__init__" }',
        'anchor = { calls = "f", assigns = "x" }',
        18,
        "edits[1].anchor",
        "exactly one",
    ),
    (
        'position = "before"\nanchor = { defines = "__init__" }\n',
        'position = "before"\n',
        17,
        "edits[1].position",
        "needs an anchor",
    ),
    (
        'versions = ">=0.5.4"',
        'versions = "at least 0.5"',
        7,
        "target.versions",
        "not a version range",
    ),
    (
        'scope = "Worker.__init__"',
        'scope = "Worker.__init__()"',
        11,
        "edits[0].scope",
        "is not a scope",
    ),
    ('class = "Worker"', 'klass = "Worker"', 23, "postconditions[0].klass", "unknown key"),
    ('summary = "s"\n', "", 1, "summary", "required"),
    (
        'versions = ">=0.5.4"',
        'versions = ">=0.5.4"\nmin_python = 3.10',
        8,
        "target.min_python",
        "must be a string, got a number (3.1)\n  hint: put it in quotes, written as you mean it",
    ),
]


@pytest.mark.parametrize("old, new, line, field, words", BAD_CASES)
def test_bad_patch_names_file_line_and_field(
    tmp_path: Path, old: str, new: str, line: int, field: str, words: str
) -> None:
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(SpecError) as caught:
        load_patch(path)
    error = caught.value
    assert error.location.file == str(path)
    assert error.location.field == field
    assert error.location.line == line, error.render()
    assert words in error.render()


def test_malformed_toml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace('rationale = "r"', 'rationale = "r'))
    with pytest.raises(SpecError) as caught:
        load_patch(path)
    assert caught.value.location.line == 3
    assert "malformed TOML" in caught.value.render()


def test_id_must_match_file_name(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_patch(write(tmp_path, GOOD, name="other.toml"))
    assert caught.value.location.field == "id"
    assert caught.value.location.line == 1


def test_diff_with_wrong_hunk_count_is_refused_at_load(tmp_path: Path) -> None:
    text = GOOD + textwrap.dedent(
        '''
        [[edits]]
        kind = "diff"
        diff = """
        --- a/pkg/mod.py
        +++ b/pkg/mod.py
        @@ -1,1 +1,2 @@
         a = 1
        +b = 2
        +c = 3
        """
        '''
    )
    with pytest.raises(SpecError) as caught:
        load_patch(write(tmp_path, text))
    assert caught.value.location.field == "edits[2].diff"
    assert "more lines than its header says" in caught.value.render()


def test_several_problems_are_all_reported(tmp_path: Path) -> None:
    text = GOOD.replace('module = "pkg.mod"', 'module = "pkg.mod"\nx = 1').replace(
        'name = "x"', 'name = "x"\ny = 2'
    )
    with pytest.raises(SpecError) as caught:
        load_patch(write(tmp_path, text))
    rendered = caught.value.render()
    assert "target.x" in rendered and "postconditions[0].y" in rendered


def test_json_schema_describes_edit_kinds() -> None:
    schema = patch_json_schema()
    text = json.dumps(schema)
    for kind in ("insert", "replace", "diff", "assigned-before-calls", "class-attribute"):
        assert f'"{kind}"' in text
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) >= {"id", "summary", "rationale", "target", "edits"}


def test_field_paths_round_trip() -> None:
    for path in [("edits", 1, "anchor", "calls"), ("target",), ("postconditions", 0, "class")]:
        assert parse_field_path(format_field_path(path)) == path


def test_locator_ignores_keys_inside_multiline_strings() -> None:
    lines = locate_lines('a = """\nb = 1\n"""\nc = 2\n')
    assert ("b",) not in lines
    assert lines[("c",)] == 4
