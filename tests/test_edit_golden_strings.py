"""Golden pairs for code holding multi-line strings (issue 31, item 22): the code's own lines take
their block's indentation, a string's lines are kept byte for byte (never re-indented, stripped or
emptied), so an upstream fix's docstring can be pasted as it is. Each case applies, re-applies
(already applied), reverses to the exact pre-image and, for inserts, is removed by `unapply`.
"""

from __future__ import annotations

import ast

import pytest

from opspatch.core.edit import Applied
from opspatch.core.spec import PatchSpec, parse_patch
from opspatch.core.tomlsource import parse_toml
from tests.editkit import assert_golden
from tests.patchkit import HEADER, make_patch, src

pytestmark = pytest.mark.pure

WORKER = src(
    """
    class Worker:
        def __init__(self):
            self.draft = None

        def verify(self):
            return self.draft
    """
)


def _insert(code: str, position: str = "end", scope: str = "Worker") -> str:
    return (
        f'[[edits]]\nkind = "insert"\nscope = "{scope}"\nposition = "{position}"\n'
        f"code = '''\n{code}'''\n"
    )


def _undedented_patch(body: str) -> PatchSpec:
    """`make_patch` without its dedent of the TOML text (which would empty a whitespace-only
    line inside the code's string)."""
    return parse_patch(parse_toml(HEADER.format(id="t-patch") + body, "<test>"))


def _docstring(source: bytes, name: str) -> str | None:
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_docstring(node, clean=False)


def test_a_def_pasted_as_upstream_has_it_keeps_its_docstring_byte_for_byte() -> None:
    """Pasted at its upstream indentation (a method, four spaces in): written exactly so."""
    method = (
        "    def reset(self):\n"
        '        """Forget the draft state.\n'
        "\n"
        "        Called after a failed verify; `verify` then returns None.\n"
        '        """\n'
        "        self.draft = None\n"
    )
    outcome = assert_golden(
        WORKER, make_patch(_insert(method)), WORKER + b"    # opspatch:t-patch\n" + method.encode()
    )
    assert _docstring(outcome.new_source, "reset") == _docstring(method.encode()[4:], "reset")


def test_a_def_pasted_at_the_margin_takes_the_block_indentation_but_its_string_does_not() -> None:
    """Written at column 0, the code's lines are indented for the class; the docstring's later
    lines stay as written, so the string is the one the patch holds."""
    method = 'def reset(self):\n    """Forget.\n\n    More.\n    """\n    self.draft = None\n'
    expected = WORKER + (
        b"    # opspatch:t-patch\n"
        b"    def reset(self):\n"
        b'        """Forget.\n'
        b"\n"
        b"    More.\n"
        b'    """\n'
        b"        self.draft = None\n"
    )
    outcome = assert_golden(WORKER, make_patch(_insert(method)), expected)
    assert _docstring(outcome.new_source, "reset") == "Forget.\n\n    More.\n    "


def test_an_insert_before_a_method_brings_its_blank_line_after_the_string() -> None:
    method = 'def reset(self):\n    """Forget.\n\n    More.\n    """\n    self.draft = None\n'
    patch = make_patch(
        '[[edits]]\nkind = "insert"\nscope = "Worker"\nposition = "before"\n'
        f"anchor = {{ defines = \"verify\" }}\ncode = '''\n{method}'''\n"
    )
    expected = WORKER.replace(
        b"    def verify(self):\n",
        b"    # opspatch:t-patch+blank\n"
        b"    def reset(self):\n"
        b'        """Forget.\n'
        b"\n"
        b"    More.\n"
        b'    """\n'
        b"        self.draft = None\n"
        b"\n"
        b"    def verify(self):\n",
    )
    assert_golden(WORKER, patch, expected)


def test_a_string_s_blank_and_trailing_whitespace_and_f_string_lines_are_kept() -> None:
    """A whitespace-only line and trailing blanks inside a string are its text: never emptied or
    stripped (the code's own lines are right-stripped as before)."""
    code = 'text = f"""head   \n    \n  {self.draft}\n"""\nself.text = text\n'
    patch = _undedented_patch(_insert(code, scope="Worker.verify", position="start"))
    assert patch.edits[0].code == code
    expected = WORKER.replace(
        b"    def verify(self):\n",
        b"    def verify(self):\n"
        b"        # opspatch:t-patch\n"
        b'        text = f"""head   \n'
        b"    \n"
        b"  {self.draft}\n"
        b'"""\n'
        b"        self.text = text\n",
    )
    assert_golden(WORKER, patch, expected)


def test_a_replace_with_code_holding_a_multi_line_string_is_written() -> None:
    before = src(
        """
        def usage():
            if verbose:
                text = "short"
            return text
        """
    )
    patch = make_patch(
        """
[[edits]]
kind = "replace"
scope = "usage"
select = { assigns = "text" }
code = '''
text = \"\"\"usage: run
  --fast   skip the checks
\"\"\"
'''
"""
    )
    expected = before.replace(
        b'        text = "short"\n',
        b"        # opspatch:t-patch\n"
        b'        text = """usage: run\n'
        b"  --fast   skip the checks\n"
        b'"""\n',
    )
    assert_golden(before, patch, expected)


def test_code_in_a_tab_indented_block_takes_tabs_but_its_string_keeps_its_spaces() -> None:
    before = b"class T:\n\tdef f(self):\n\t\tself.a = 1\n"
    code = 'if self.a:\n    self.b = """\n    two\n    """\n'
    patch = make_patch(_insert(code, scope="T.f"))
    expected = before + (
        b'\t\t# opspatch:t-patch\n\t\tif self.a:\n\t\t\tself.b = """\n    two\n    """\n'
    )
    assert_golden(before, patch, expected)


def test_a_move_of_a_statement_holding_a_multi_line_string_keeps_the_string() -> None:
    """The statement's own line moves to its new block's indentation, the string's lines stay as
    they stood (this was refused before)."""
    before = src(
        '''
        def f():
            if on:
                text = """
        kept as written
        """
                go()
            done()
        '''
    )
    patch = make_patch(
        """
[[edits]]
kind = "move"
scope = "f"
select = { assigns = "text" }
position = "before"
anchor = { calls = "done" }
"""
    )
    expected = src(
        '''
        def f():
            if on:
                go()
            # opspatch:t-patch
            text = """
        kept as written
        """
            done()
        '''
    )
    outcome = assert_golden(before, patch, expected)
    assert isinstance(outcome, Applied)
