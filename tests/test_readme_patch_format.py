"""The README's patch format section is true: its edits block is a valid patch body, one edit of
each kind it names, and every selector below the statement it names loads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opspatch.core.spec import parse_patch
from opspatch.core.tomlsource import parse_toml
from tests.patchkit import HEADER, make_patch

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parent.parent


def _section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split("## Patch format", 1)[1].split("\n## ", 1)[0]


def test_the_readme_edits_block_loads_as_a_patch() -> None:
    block = _section().split("```toml\n", 1)[1].split("```", 1)[0]
    # `edits = [...]` is a top-level key: it goes before the header's [target] table
    patch = parse_patch(parse_toml(block + HEADER.format(id="readme"), "README.md"))
    assert [edit.kind for edit in patch.edits] == ["insert", "replace", "delete", "move"]


def test_the_readme_selectors_below_the_statement_load() -> None:
    selectors = re.findall(r"`(\{ [^`]+\})`", _section().replace("\n", " "))
    selectors = [s for s in selectors if "kind" not in s]
    assert len(selectors) == 3
    for selector in selectors:
        make_patch(f'[[edits]]\nkind = "replace"\nscope = "f"\nselect = {selector}\ncode = "x"\n')
