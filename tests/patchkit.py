"""Helpers for tests of the patch engine: build patches from TOML text, in memory."""

from __future__ import annotations

import textwrap

from opspatch.core.spec import PatchSpec, parse_patch
from opspatch.core.tomlsource import parse_toml

HEADER = """
id = "{id}"
summary = "test patch"
rationale = "tests"
[target]
module = "pkg.mod"
"""


def make_patch(body: str, *, patch_id: str = "t-patch", header: str = HEADER) -> PatchSpec:
    """A PatchSpec from the TOML of its edits/postconditions (the header is filled in)."""
    text = header.format(id=patch_id) + textwrap.dedent(body)
    return parse_patch(parse_toml(text, "<test>"))


def src(text: str) -> bytes:
    """Dedented source as UTF-8 bytes (the first newline dropped)."""
    return textwrap.dedent(text).lstrip("\n").encode("utf-8")
