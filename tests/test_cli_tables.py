"""Tables for people at 80 columns: run ids, patch ids and host names are never cut (they are
what the operator copies), paths are cut from the left keeping the file name, text wraps."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.text import Text

from opspatch.cli.render import Column, short_path, table_of

pytestmark = pytest.mark.pure

RUN_ID = "20261201T013050Z-52e288"
PATH = "/srv/sglang/venv/lib/python3.11/site-packages/sglang/srt/speculative/eagle_worker_v2.py"


def rendered(width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    columns = (  # the run table `apply` prints
        ("host", Column.ID),
        ("outcome", Column.ID),
        ("file", Column.PATH),
        ("sha256", Column.ID),
        ("steps", Column.TEXT),
        ("time", Column.ID),
    )
    rows = [
        ("sandbox-01", Text("applied"), PATH, "402350841416 ->\n17eafd84bf32",
         "begin plan backup swap restart ready smoke", "2.9s"),
    ]  # fmt: skip
    title = f"apply eagle-init-guard  (run {RUN_ID})"
    console.print(table_of(columns, rows, title=title, console=console))
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue()


def test_at_80_columns_ids_are_whole_and_the_path_keeps_its_file_name() -> None:
    text = rendered(80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    for whole in (RUN_ID, "eagle-init-guard", "sandbox-01", "applied", "eagle_worker_v2.py", "2.9s", "restart",
                  "402350841416", "17eafd84bf32"):  # fmt: skip
        assert whole in text, text
    assert "…" in text and "/srv/sglang" not in text  # the path was cut from the left


def test_a_wide_terminal_shows_the_whole_path() -> None:
    assert PATH in rendered(300)


def test_short_path_never_cuts_the_file_name() -> None:
    assert short_path("/a/b/c/a_rather_long_module_name.py", 10) == "…/a_rather_long_module_name.py"
    assert short_path("/a/b.py", 48) == "/a/b.py"


def test_a_smoke_line_says_in_words_what_the_server_did_not_give() -> None:
    from opspatch.cli.inspect import smoke_line

    assert smoke_line("The capital of France is", None, None) == (
        "'The capital of France is' -> no text (the server gave no completion)"
    )
    assert smoke_line("def f():", "return", 4) == "'def f():' -> 'return' (spec_verify_ct 4)"


def test_a_failure_is_one_short_line_with_paths_cut_to_their_file_name() -> None:
    from opspatch.cli.render import one_line

    crash = (
        "prompt 1: the server crashed: AttributeError: 'EAGLEWorkerV2' object has no attribute "
        "'spec_disable_batch_threshold' (File \"/srv/a/venv/lib/python3.11/site-packages/sglang/"
        'srt/speculative/eagle_worker_v2.py", line 120, in forward)\n[log] Traceback (most recent'
    )
    line = one_line(crash)
    assert "\n" not in line and len(line) <= 160
    assert '"…/eagle_worker_v2.py"' in line and "site-packages" not in line
    assert line.startswith("prompt 1: the server crashed: AttributeError:")
    assert one_line("short") == "short"
