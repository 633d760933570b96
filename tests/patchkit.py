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


def _test_patch(patch_id: str, code: str, summary: str) -> str:
    """A patch inserting `code` at the end of eagle_worker_v2's module (valid Python)."""
    return textwrap.dedent(
        f'''
        id = "{patch_id}"
        summary = "{summary}"
        rationale = "test fault injection"
        [target]
        module = "sglang.srt.speculative.eagle_worker_v2"
        versions = ">=0.5.4"
        [[edits]]
        kind = "insert"
        scope = "<module>"
        position = "end"
        code = \'\'\'
        {{code}}
        \'\'\'
        '''
    ).replace("{code}", textwrap.dedent(code).strip().replace("\n", "\n"))


ONE_TOKEN = textwrap.dedent(
    """
    id = "one-token"
    summary = "judge test: one token of the vocabulary turned into another"
    rationale = "a change the smoke passes and the judge must not"
    [target]
    module = "sglang.srt.layers.sampler"
    versions = ">=0.5.4"
    [[edits]]
    kind = "insert"
    scope = "greedy_token"
    position = "start"
    code = '''
    if int(torch.argmax(logits_row)) == 70:  # "d"
        return 90  # "x"
    '''
    """
)
