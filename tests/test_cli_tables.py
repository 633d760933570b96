"""Tables for people at 80 columns and wider: run ids, patch ids and host names are never cut
(they are what the operator copies), paths are cut from the left keeping the file name, text
wraps, and a detail wraps at a readable width or is printed whole below the table (issue 31,
item 16: `status` and `apply` tables are read at 80 to 200 columns)."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

import pytest
from rich.console import Console
from rich.text import Text

from opspatch.cli.inspect import STATUS_COLUMNS
from opspatch.cli.render import RUN_COLUMNS, Column, short_path, table_of

pytestmark = pytest.mark.pure

RUN_ID = "20261201T013050Z-52e288"
PATH = "/srv/sglang/venv/lib/python3.11/site-packages/sglang/srt/speculative/eagle_worker_v2.py"


def rendered(width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    columns = RUN_COLUMNS  # the run table `apply` prints
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


STEPS = "begin plan backup swap restart ready smoke"
DETAIL = (
    "as written by run 20261201T013050Z-52e288, proven by its smoke decode; the server is not "
    "running (out of rotation at http://127.0.0.1:30000: the smoke before its re-admission failed)"
)
STATUS_ROWS = [
    ("sandbox-01", "eagle-init-guard", Text("applied"), PATH, "17eafd84bf32", DETAIL),
    ("sandbox-02", "eagle-init-guard", Text("not-applied"), PATH, "402350841416", ""),
    ("gpu-node-0017.prod", "eagle-init-guard", Text("drifted"), PATH, "9f0e3a51c2d4",
     "changed since run 20261201T013050Z-52e288 wrote 17eafd84bf32; restart or rollback"),
]  # fmt: skip
RUN_ROWS = [
    ("sandbox-01", Text("restored-not-serving"), PATH, "402350841416 ->\n17eafd84bf32", STEPS,
     "12.9s"),
    ("gpu-node-0017.prod", Text("applied"), PATH, "402350841416 ->\n17eafd84bf32", STEPS, "3.1s"),
]  # fmt: skip


def _render(
    columns: Sequence[tuple[str, Column]], rows: Sequence[Sequence[str | Text]], width: int,
    key: int,
) -> str:  # fmt: skip
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(table_of(columns, rows, console=console, key=key, title="a title"))
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue()


def _words(text: str) -> set[str]:
    return set(re.split(r"[\s│┃━╇]+", text))


@pytest.mark.parametrize("width", [80, 100, 120, 160, 200])
@pytest.mark.parametrize(
    ("columns", "rows", "key"), [(STATUS_COLUMNS, STATUS_ROWS, 2), (RUN_COLUMNS, RUN_ROWS, 1)],
    ids=["status", "apply"],
)  # fmt: skip
def test_status_and_run_tables_cut_no_word_at_any_width(
    columns: Sequence[tuple[str, Column]],
    rows: Sequence[Sequence[str | Text]],
    key: int,
    width: int,
) -> None:
    """Every word of every id and detail is there whole (a detail that has no room to be read
    in the table is printed below it), every file name too, and no line is wider than the
    terminal; the only `…` is a path's cut left end."""
    text = _render(columns, rows, width, key)

    assert max(len(line) for line in text.splitlines()) <= width, text
    shown = _words(text)
    for row in rows:
        for cell, (_, kind) in zip(row, columns, strict=True):
            plain = cell.plain if isinstance(cell, Text) else cell
            if kind is Column.PATH:
                assert "eagle_worker_v2.py" in text, text
                continue
            missing = set(plain.split()) - shown
            assert not missing, f"cut: {missing}\n{text}"
    assert re.search("…(?!/)", text) is None, text  # no word cut at its end


def test_a_detail_without_room_goes_below_its_row_under_the_rows_key() -> None:
    text = _render(STATUS_COLUMNS, STATUS_ROWS, 80, 2)
    header = text.splitlines()[1]
    assert "detail" not in header and "sha256" in header, text
    below = text.split("sandbox-01 eagle-init-guard", 2)[-1]
    assert below.lstrip().startswith("file") and "detail  as written by run" in below, text


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


def test_text_is_printed_as_written_emoji_codes_included(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A host, path or message holding `:name:` is printed as it is, never as an emoji (rich's
    default), on a terminal or piped; and the apply needs no emoji table (issue 44)."""
    from opspatch.cli.render import out, print_error

    print_error("host gpu:100:a at /srv/:rocket:/x.py", hint=None, exit_code=1, as_json=False)
    out.print("gpu:100:a :thumbs_up:")
    captured = capsys.readouterr()
    assert "gpu:100:a at /srv/:rocket:/x.py" in captured.err
    assert captured.out == "gpu:100:a :thumbs_up:\n"
