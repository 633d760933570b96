"""Golden before/after pairs for every edit kind and position (LibCST's assertCodemod style).

Each case: a source, a patch, the exact expected result. Every Applied result is also checked to
reverse to the exact pre-image, to be recognised as applied afterwards, and to change nothing but
the edited spans.
"""

from __future__ import annotations

import textwrap

import pytest

from opspatch.core.edit import (
    AlreadyApplied,
    Applied,
    NotApplicable,
    apply_patch,
    reverse,
    unapply,
)
from tests.editkit import DIFF_BEFORE, DIFF_PATCH, assert_golden
from tests.patchkit import make_patch, src

pytestmark = pytest.mark.pure

# ---------------------------------------------------------------------------------------------
# insert: start of a method (docstring, super().__init__ present and absent)

WORKER = src(
    '''
    import torch


    class Worker(Base):
        """A worker."""

        def __init__(self, args):
            """Build it."""
            super().__init__(args)

            # Parse arguments
            self.args = args
            self.init_cuda_graphs()
            self.threshold = args.threshold
    '''
)

GUARD = """
[[edits]]
kind = "insert"
scope = "Worker.__init__"
position = "start"
comment = "set before anything can fail"
code = "self.threshold = 0"
"""


def test_insert_start_after_docstring_and_super_init() -> None:
    expected = WORKER.replace(
        b"            super().__init__(args)\n",
        b"            super().__init__(args)\n"
        b"            # opspatch:t-patch: set before anything can fail\n"
        b"            self.threshold = 0\n",
    ).replace(b"            ", b"        ")
    expected = src(
        '''
        import torch


        class Worker(Base):
            """A worker."""

            def __init__(self, args):
                """Build it."""
                super().__init__(args)
                # opspatch:t-patch: set before anything can fail
                self.threshold = 0

                # Parse arguments
                self.args = args
                self.init_cuda_graphs()
                self.threshold = args.threshold
        '''
    )
    assert_golden(WORKER, make_patch(GUARD), expected)


def test_insert_start_without_super_goes_above_leading_comments() -> None:
    before = src(
        """
        class Worker:
            def __init__(
                self,
                args,
            ):
                # Parse arguments
                self.args = args
        """
    )
    expected = src(
        """
        class Worker:
            def __init__(
                self,
                args,
            ):
                # opspatch:t-patch: set before anything can fail
                self.threshold = 0
                # Parse arguments
                self.args = args
        """
    )
    assert_golden(before, make_patch(GUARD), expected)


def test_insert_at_class_level_after_class_docstring() -> None:
    patch = """
    [[edits]]
    kind = "insert"
    scope = "Worker"
    code = "threshold: int = 0"
    """
    before = src(
        '''
        class Worker:
            """Doc."""
            @property
            def x(self):
                return 1
        '''
    )
    expected = src(
        '''
        class Worker:
            """Doc."""
            # opspatch:t-patch+blank
            threshold: int = 0

            @property
            def x(self):
                return 1
        '''
    )
    assert_golden(before, make_patch(patch), expected)


def test_a_class_level_block_brings_its_blank_line_and_unapply_takes_exactly_it_away() -> None:
    """Before a method the block is set apart by a blank line it adds (the marker records it),
    so the structural unapply removes that line and no other; where a blank line already
    follows the insertion point, none is added (issue 11)."""
    patch = """
    [[edits]]
    kind = "insert"
    scope = "Worker"
    comment = "safe default"
    code = "threshold: int = 0"
    """
    glued = src(
        """
        class Worker:
            def __init__(self):
                self.threshold = 5
        """
    )
    assert_golden(
        glued,
        make_patch(patch),
        src(
            """
            class Worker:
                # opspatch:t-patch+blank: safe default
                threshold: int = 0

                def __init__(self):
                    self.threshold = 5
            """
        ),
    )
    spaced = src(
        """
        class Worker:

            def __init__(self):
                self.threshold = 5
        """
    )
    assert_golden(
        spaced,
        make_patch(patch),
        src(
            """
            class Worker:
                # opspatch:t-patch: safe default
                threshold: int = 0

                def __init__(self):
                    self.threshold = 5
            """
        ),
    )


def test_insert_at_class_start_above_a_decorated_first_method() -> None:
    patch = """
    [[edits]]
    kind = "insert"
    scope = "Worker"
    code = "threshold = 0"
    """
    before = src(
        """
        class Worker(
            Base,
        ):
            @property
            def x(self):
                return 1
        """
    )
    expected = src(
        """
        class Worker(
            Base,
        ):
            # opspatch:t-patch+blank
            threshold = 0

            @property
            def x(self):
                return 1
        """
    )
    assert_golden(before, make_patch(patch), expected)


# ---------------------------------------------------------------------------------------------
# insert: end, before, after; nested classes, decorators, async


def test_insert_at_end_of_async_function() -> None:
    patch = """
    [[edits]]
    kind = "insert"
    scope = "serve"
    position = "end"
    code = '''
    if done:
        log("done")
    '''
    """
    before = src(
        """
        @app.route("/x")
        async def serve(request):
            done = await handle(request)
            return None  # trailing comment stays


        def other():
            pass
        """
    )
    expected = src(
        """
        @app.route("/x")
        async def serve(request):
            done = await handle(request)
            return None  # trailing comment stays
            # opspatch:t-patch
            if done:
                log("done")


        def other():
            pass
        """
    )
    assert_golden(before, make_patch(patch), expected)


def test_insert_before_first_call_keeps_attached_comment_with_its_statement() -> None:
    patch = """
    [[edits]]
    kind = "insert"
    scope = "Worker.__init__"
    position = "before"
    anchor = { calls = "init_cuda_graphs" }
    code = "self.threshold = 0"
    """
    before = src(
        """
        class Worker:
            def __init__(self):
                self.a = 1

                # capture graphs (may fail)
                self.init_cuda_graphs()
                self.b = 2
        """
    )
    expected = src(
        """
        class Worker:
            def __init__(self):
                self.a = 1

                # opspatch:t-patch
                self.threshold = 0
                # capture graphs (may fail)
                self.init_cuda_graphs()
                self.b = 2
        """
    )
    assert_golden(before, make_patch(patch), expected)


def test_insert_after_assignment_nested_in_if_block_of_nested_class() -> None:
    patch = """
    [[edits]]
    kind = "insert"
    scope = "Outer.Inner.method"
    position = "after"
    anchor = { assigns = "self.y" }
    code = "self.z = self.y + 1"
    """
    before = src(
        """
        class Outer:
            class Inner:
                def method(self, flag):
                    if flag:
                        self.y = (
                            1
                        )
                    return self
        """
    )
    expected = src(
        """
        class Outer:
            class Inner:
                def method(self, flag):
                    if flag:
                        self.y = (
                            1
                        )
                        # opspatch:t-patch
                        self.z = self.y + 1
                    return self
        """
    )
    assert_golden(before, make_patch(patch), expected)


def test_insert_at_module_start_after_docstring_and_future_imports() -> None:
    patch = """
    [[edits]]
    kind = "insert"
    scope = "<module>"
    code = "import os"
    """
    before = src(
        '''
        #!/usr/bin/env python
        """Module doc."""
        from __future__ import annotations

        import sys
        '''
    )
    expected = src(
        '''
        #!/usr/bin/env python
        """Module doc."""
        from __future__ import annotations
        # opspatch:t-patch
        import os

        import sys
        '''
    )
    assert_golden(before, make_patch(patch), expected)


def test_insert_at_end_of_file_without_final_newline() -> None:
    patch = """
    [[edits]]
    kind = "insert"
    scope = "f"
    position = "end"
    code = "return 2"
    """
    before = b"def f():\n    x = 1"
    expected = b"def f():\n    x = 1\n    # opspatch:t-patch\n    return 2"
    assert_golden(before, make_patch(patch), expected)


# ---------------------------------------------------------------------------------------------
# bytes that must survive: CRLF, tabs, encoding cookie, BOM


def test_crlf_file_stays_crlf_everywhere() -> None:
    before = WORKER.replace(b"\n", b"\r\n")
    outcome = apply_patch(before, make_patch(GUARD))
    assert isinstance(outcome, Applied)
    assert b"\n" not in outcome.new_source.replace(b"\r\n", b"")
    assert (
        b"        # opspatch:t-patch: set before anything can fail\r\n        self.threshold = 0\r\n"
        in outcome.new_source
    )
    assert reverse(outcome) == before
    undone = unapply(outcome.new_source, make_patch(GUARD))
    assert not isinstance(undone, NotApplicable) and undone.old_source == before


def test_tab_indented_file_gets_tab_indented_code() -> None:
    before = b"class Worker:\n\tdef __init__(self):\n\t\tself.args = 1\n\t\tif x:\n\t\t\tpass\n"
    expected = (
        b"class Worker:\n\tdef __init__(self):\n"
        b"\t\t# opspatch:t-patch: set before anything can fail\n\t\tself.threshold = 0\n"
        b"\t\tself.args = 1\n\t\tif x:\n\t\t\tpass\n"
    )
    assert_golden(before, make_patch(GUARD), expected)


def test_latin1_encoding_cookie_and_bytes_are_kept() -> None:
    before = (
        "# -*- coding: latin-1 -*-\nclass Worker:\n    def __init__(self):\n"
        "        self.name = 'caf\xe9'\n"
    ).encode("latin-1")
    outcome = assert_golden(
        before,
        make_patch(GUARD),
        before.replace(
            b"    def __init__(self):\n",
            b"    def __init__(self):\n        # opspatch:t-patch: set before anything can fail\n"
            b"        self.threshold = 0\n",
        ),
    )
    assert outcome.encoding == "iso-8859-1"
    assert b"caf\xe9" in outcome.new_source


def test_utf8_bom_is_kept() -> None:
    before = b"\xef\xbb\xbf" + src(
        """
        class Worker:
            def __init__(self):
                self.s = "\u00fc"
        """
    )
    outcome = apply_patch(before, make_patch(GUARD))
    assert isinstance(outcome, Applied)
    assert outcome.new_source.startswith(b"\xef\xbb\xbf")
    assert reverse(outcome) == before


def test_non_utf8_bytes_without_cookie_are_refused_not_corrupted() -> None:
    before = b"class Worker:\n    def __init__(self):\n        self.s = '\xff'\n"
    outcome = apply_patch(before, make_patch(GUARD))
    assert isinstance(outcome, NotApplicable)
    assert "not valid utf-8" in outcome.reason


# ---------------------------------------------------------------------------------------------
# replace


def test_replace_statement_keeps_its_trailing_comment() -> None:
    patch = """
    [[edits]]
    kind = "replace"
    scope = "Worker.__init__"
    select = { assigns = "self.threshold" }
    code = "self.threshold = getattr(args, 'threshold', 0)"
    """
    before = src(
        """
        class Worker:
            def __init__(self, args):
                self.threshold = args.threshold  # from the CLI
        """
    )
    expected = src(
        """
        class Worker:
            def __init__(self, args):
                # opspatch:t-patch
                self.threshold = getattr(args, 'threshold', 0)  # from the CLI
        """
    )
    assert_golden(before, make_patch(patch), expected)


def test_replace_expression() -> None:
    patch = """
    [[edits]]
    kind = "replace"
    scope = "f"
    select = { expression = "args.topk" }
    code = "max(args.topk, 1)"
    """
    before = src(
        """
        def f(args):
            return compute(
                args.topk,  # keep
                2,
            )
        """
    )
    expected = src(
        """
        def f(args):
            # opspatch:t-patch
            return compute(
                max(args.topk, 1),  # keep
                2,
            )
        """
    )
    assert_golden(before, make_patch(patch), expected)


def test_replace_expression_beside_a_keyword_only_argument_without_default() -> None:
    """`def inner(*, k)` has None among its keyword defaults: the selector skips it (it used to
    crash with AttributeError, e.g. on scope EAGLEWorkerV2 of the real releases)."""
    patch = """
    [[edits]]
    kind = "replace"
    scope = "W.m"
    select = { expression = "self.limit" }
    code = "max(self.limit, 1)"
    """
    before = src(
        """
        class W:
            def m(self):
                def inner(*, k):
                    return k

                return self.limit
        """
    )
    expected = src(
        """
        class W:
            def m(self):
                def inner(*, k):
                    return k

                # opspatch:t-patch
                return max(self.limit, 1)
        """
    )
    assert_golden(before, make_patch(patch), expected)


# ---------------------------------------------------------------------------------------------
# diff


def test_diff_applies_by_context() -> None:
    expected = DIFF_BEFORE.replace(
        b'falling back", exc)\n', b'falling back", exc)\n        raise\n'
    )
    assert_golden(DIFF_BEFORE, make_patch(DIFF_PATCH), expected)


def test_diff_applies_with_offset_and_keeps_crlf() -> None:
    before = (b"# a new header line\n# and another\n" + DIFF_BEFORE).replace(b"\n", b"\r\n")
    expected = before.replace(
        b'falling back", exc)\r\n', b'falling back", exc)\r\n        raise\r\n'
    )
    assert_golden(before, make_patch(DIFF_PATCH), expected)


def test_diff_with_fuzz_ignores_a_changed_outer_context_line() -> None:
    before = DIFF_BEFORE.replace(
        b"def build(worker_cls, args):", b"def build(worker_cls, args, extra=None):"
    )
    patch = make_patch(DIFF_PATCH)
    outcome = apply_patch(before, patch)
    assert isinstance(outcome, Applied), outcome
    assert b"        raise\n    return worker" in outcome.new_source


def test_diff_context_found_twice_is_refused_with_both_places() -> None:
    doubled = (
        DIFF_BEFORE
        + b"\n\n"
        + DIFF_BEFORE.split(b"\n\n\n", 1)[1]
        .replace(b"def build", b"def build2")
        .replace(b"def build2(worker_cls, args):", b"def build(worker_cls, args):")
    )
    outcome = apply_patch(doubled, make_patch(DIFF_PATCH))
    assert isinstance(outcome, NotApplicable)
    assert "matches 2 places" in outcome.reason
    assert outcome.field == "edits[0].diff"


def test_diff_context_missing_is_not_applicable() -> None:
    outcome = apply_patch(src("def build():\n    return 1\n"), make_patch(DIFF_PATCH))
    assert isinstance(outcome, NotApplicable)
    assert "does not match" in outcome.reason


# ---------------------------------------------------------------------------------------------
# detection and refusals


def test_applied_state_detected_even_with_marker_comment_removed() -> None:
    patch = make_patch(GUARD)
    applied = apply_patch(WORKER, patch)
    assert isinstance(applied, Applied)
    stripped = applied.new_source.replace(
        b"            # opspatch:t-patch: set before anything can fail\n", b""
    )
    stripped = stripped.replace(b"        # opspatch:t-patch: set before anything can fail\n", b"")
    assert b"opspatch" not in stripped
    assert isinstance(apply_patch(stripped, patch), AlreadyApplied)


def test_partly_applied_file_is_refused() -> None:
    patch = make_patch(
        GUARD
        + """
[[edits]]
kind = "insert"
scope = "Worker"
code = "threshold = 0"
"""
    )
    only_first = apply_patch(WORKER, make_patch(GUARD))
    assert isinstance(only_first, Applied)
    outcome = apply_patch(only_first.new_source, patch)
    assert isinstance(outcome, NotApplicable)
    assert "partly applied" in outcome.reason
    assert "`opspatch rollback t-patch`" in outcome.reason  # the hint names the patch


def test_missing_scope_offers_nearest_names() -> None:
    outcome = apply_patch(WORKER, make_patch(GUARD.replace("Worker.__init__", "Worker.__int__")))
    assert isinstance(outcome, NotApplicable)
    assert outcome.field == "edits[0].scope"
    assert any("Worker.__init__" in c for c in outcome.candidates)


def test_anchor_matching_several_statements_lists_them_all() -> None:
    patch = """
    [[edits]]
    kind = "insert"
    scope = "f"
    position = "after"
    anchor = { calls = "step" }
    code = "done = True"
    """
    before = src("def f():\n    step()\n    x = 1\n    step()\n")
    outcome = apply_patch(before, make_patch(patch))
    assert isinstance(outcome, NotApplicable)
    assert outcome.candidates == ("line 2", "line 4")
    assert outcome.field == "edits[0].anchor"
    first = apply_patch(
        before, make_patch(patch.replace('calls = "step"', 'calls = "step", which = "first"'))
    )
    assert isinstance(first, Applied)


def test_anchor_matching_nothing_offers_nearest_calls() -> None:
    patch = """
    [[edits]]
    kind = "insert"
    scope = "Worker.__init__"
    position = "before"
    anchor = { calls = "init_cuda_graph" }
    code = "x = 1"
    """
    outcome = apply_patch(WORKER, make_patch(patch))
    assert isinstance(outcome, NotApplicable)
    assert "nearest: self.init_cuda_graphs" in outcome.candidates


def test_failed_postcondition_is_not_applicable_and_gives_no_bytes() -> None:
    patch = make_patch(
        """
        [[edits]]
        kind = "insert"
        scope = "Worker.__init__"
        position = "end"
        code = "self.late = 0"

        [[postconditions]]
        kind = "assigned-before-calls"
        scope = "Worker.__init__"
        attribute = "self.late"
        """
    )
    outcome = apply_patch(WORKER, patch)
    assert isinstance(outcome, NotApplicable)
    assert "calls `self.init_cuda_graphs`" in outcome.reason
    assert not hasattr(outcome, "new_source")


def test_class_attribute_postcondition() -> None:
    body = textwrap.dedent(
        """
        [[edits]]
        kind = "insert"
        scope = "Worker"
        position = "end"
        code = "threshold = 0"

        [[postconditions]]
        kind = "class-attribute"
        class = "Worker"
        name = "{name}"
        """
    )
    assert isinstance(apply_patch(WORKER, make_patch(body.format(name="threshold"))), Applied)
    missing = apply_patch(WORKER, make_patch(body.format(name="other")))
    assert isinstance(missing, NotApplicable)
    assert "no class-level value for `other`" in missing.reason


def test_result_that_does_not_parse_for_the_older_target_python_is_refused() -> None:
    header = """
id = "{id}"
summary = "s"
rationale = "r"
[target]
module = "pkg.mod"
min_python = "3.7"
"""
    patch = make_patch(
        """
        [[edits]]
        kind = "insert"
        scope = "f"
        code = "if (n := 1): pass"
        """,
        header=header,
    )
    outcome = apply_patch(src("def f():\n    return 1\n"), patch)
    assert isinstance(outcome, NotApplicable)
    assert "Python 3.7" in outcome.reason


@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("break", "'break' outside loop (line 5)"),
        ("nonlocal n", "name 'n' is used prior to nonlocal declaration (line 5)"),
        ("return 1\\ndef g(x, x): pass", "duplicate argument 'x' in function definition (line 6)"),
    ],
)
def test_result_that_parses_but_does_not_compile_is_refused_in_the_compilers_words(
    code: str, said: str
) -> None:
    # The check compiles the tree the plan parsed (issue 44): the compiler's own errors, as
    # compiling the text says them.
    patch = make_patch(
        f"""
        [[edits]]
        kind = "insert"
        scope = "f"
        position = "end"
        code = "{code}"
        """
    )
    outcome = apply_patch(src("def f():\n    n = 1\n    return n\n"), patch)
    assert isinstance(outcome, NotApplicable)
    assert outcome.reason == f"the result fails validation: does not compile: {said}"


def test_accept_sha256_refuses_other_pre_images() -> None:
    header = """
id = "{id}"
summary = "s"
rationale = "r"
[target]
module = "pkg.mod"
accept_sha256 = ["0000000000000000000000000000000000000000000000000000000000000000"]
"""
    outcome = apply_patch(WORKER, make_patch(GUARD, header=header))
    assert isinstance(outcome, NotApplicable)
    assert outcome.field == "target.accept_sha256"


@pytest.mark.parametrize("one_line", [b"def f(): return 1\n", b"def f():\n    a = 1; b = 2\n"])
def test_code_sharing_lines_is_refused_rather_than_reformatted(one_line: bytes) -> None:
    patch = """
    [[edits]]
    kind = "insert"
    scope = "f"
    position = "{pos}"
    code = "x = 0"
    """
    pos = "start" if b"return" in one_line else "end"
    outcome = apply_patch(one_line, make_patch(patch.format(pos=pos)))
    assert isinstance(outcome, NotApplicable)
