"""How the CLI shows things: diffs, the run table, dry-run plans, live progress, JSON, and the
confirmation rule. Results go to stdout (a table, a diff, or one JSON document); progress, logs
and errors go to stderr, so `--json` output can be piped.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from opspatch.core.remedy import recover_after_stop
from opspatch.core.vocabulary import Step, StepStatus
from opspatch.errors import ConfirmationRequired

if TYPE_CHECKING:
    from rich.live import Live

    from opspatch.runs.report import RunReport


def _width(stream: TextIO) -> int | None:
    """A terminal's own width; piped, `COLUMNS` when set (rich reads it), else 160: piped output
    is read by people in logs and by scripts, so tables get room instead of 80 columns."""
    return None if stream.isatty() or os.environ.get("COLUMNS") else 160


out = Console(highlight=False, emoji=False, soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True, width=_width(sys.stderr))
"""The two consoles. Text is printed as written: no `:name:` in a host, path or message becomes
an emoji (rich's default, whose table is also a few milliseconds of every command's start)."""

OUTCOME_STYLE = {
    "applied": "green",
    "already-applied": "green",
    "restored": "green",
    "unlocked": "green",
    "baked": "green",
    "staged": "cyan",
    "staged-back": "cyan",
    "would-apply": "cyan",
    "rolled-back": "yellow",
    "restored-not-serving": "red",
    "skipped": "yellow",
    "failed": "red",
    "needs-attention": "bold red",
    "not-applicable": "yellow",
}
STATE_STYLE = {
    "applied": "green",
    "staged": "cyan",
    "drifted": "yellow",
    "unreachable": "red",
    "fixed-upstream": "blue",
}


class _JsonState:
    """Whether this process already wrote its JSON document (an error raised after it must not
    add a second one: stdout under --json holds exactly one document)."""

    written = False


def emit_json(document: Any) -> None:
    """One JSON document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()
    _JsonState.written = True


def print_error(message: str, *, hint: str | None, exit_code: int, as_json: bool) -> None:
    """The one way an error reaches the operator: `error: MESSAGE` and its hint on stderr, and
    with --json also `{"error": {"message", "hint", "exit_code"}}` on stdout, so a script reading
    stdout learns why there is no result."""
    text = f"error: {message}" if not hint else f"error: {message}\n  hint: {hint}"
    err.print(Text(text, style="red"))
    if as_json and not _JsonState.written:
        emit_json({"error": {"message": message, "hint": hint, "exit_code": exit_code}})


def print_diff(diff: str, console: Console = out) -> None:
    """A unified diff, coloured on a terminal and plain when piped."""
    for line in diff.splitlines():
        style = ""
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("@@"):
            style = "cyan"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        console.print(Text(line, style=style))


def short_path(path: str, width: int = 48) -> str:
    """The end of a long path (the module part is what tells files apart), cut at a `/` (no
    folder name is cut) and never shorter than its file name."""
    if len(path) <= width:
        return path
    cut = path.find("/", max(0, len(path) - (width - 1)))
    if cut < 0:  # no `/` in the room: the file name alone
        cut = path.rfind("/")
    return "…" + path[cut:] if cut >= 0 else path


_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[^\s/\"',()]+/)+([^\s/\"',()]+)")


def one_line(text: str, limit: int = 160) -> str:
    """A failure as one short line for a person: its first line, absolute paths cut to their
    file name (`…/eagle_worker_v2.py`), at most `limit` characters. The whole text stays in the
    ledger and `--json` (and under `--verbose`)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = _ABSOLUTE_PATH.sub(lambda m: "…/" + m.group(1), first)
    return first if len(first) <= limit else first[: limit - 1] + "…"


class Column(str, Enum):
    """How a table column gives way when the terminal is narrow."""

    ID = "id"  # never cut: run ids, patch ids and host names are what the operator copies
    PATH = "path"  # cut from the left, keeping the file name; below the row when even that is not
    TEXT = "text"  # wraps
    DETAIL = "detail"  # wraps at a readable width, else goes below the row, whole


DETAIL_MIN_WIDTH = 30
"""The narrowest a DETAIL column is wrapped at in the table (a sentence, not a word a line);
with less room it is printed below the table, under its row's key."""
DETAIL_WIDTH = 60
"""The width a DETAIL column gets before the room left goes to the paths."""
_TEXT_RESERVE = 7


def _cell_len(cell: str | Text) -> int:
    """The width of a cell's longest line."""
    text = cell.plain if isinstance(cell, Text) else cell
    return max((Text(line).cell_len for line in text.splitlines()), default=0)


def _plain(cell: str | Text) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def _cut_path(cell: str | Text, width: int) -> str | Text:
    """Each line of a path cell cut from the left to `width` (keeping its file name)."""
    if not isinstance(cell, str):
        return cell
    return "\n".join(short_path(line, width) for line in cell.splitlines())


def _path_floor(cell: str | Text) -> int:
    """The narrowest a path cell is shown: its file names whole (`…/name`)."""
    return max(
        (min(len(line), len(line.rsplit("/", 1)[-1]) + 2) for line in _plain(cell).splitlines()),
        default=0,
    )


def _detail_floor(name: str, cells: Sequence[str | Text]) -> int:
    """The narrowest a DETAIL column is wrapped at in the table: a readable line, at least its
    longest word, or all of its longest line when that is shorter."""
    longest = max([0, *(_cell_len(c) for c in cells)])
    word = max([0, *(len(w) for c in cells for w in _plain(c).split())])
    return max(len(name), min(longest, max(DETAIL_MIN_WIDTH, word)))


def table_of(
    columns: Sequence[tuple[str, Column]],
    rows: Sequence[Sequence[str | Text]],
    *,
    title: str | None = None,
    console: Console | None = None,
    key: int = 1,
) -> RenderableType:
    """A table readable at 80 columns and wider: ids whole, paths cut from the left (never
    past their file name), text wrapped, and a DETAIL column wrapped at a readable width. What
    does not fit so (a detail, then a path) is printed below the table, whole, one line per
    row under its key (the row's first `key` cells), so nothing is ever cut mid-word."""
    width = (console or out).width

    def widest(index: int, name: str) -> int:
        return max([len(name), *(_cell_len(row[index]) for row in rows)])

    ids = sum(widest(i, name) for i, (name, kind) in enumerate(columns) if kind is Column.ID)
    texts = sum(1 for _, kind in columns if kind is Column.TEXT)
    paths = [i for i, (_, kind) in enumerate(columns) if kind is Column.PATH]
    details = [i for i, (_, kind) in enumerate(columns) if kind is Column.DETAIL]
    floor = {i: max(len(columns[i][0]), *(_path_floor(r[i]) for r in rows), 0) for i in paths}
    floor |= {i: _detail_floor(columns[i][0], [r[i] for r in rows]) for i in details}

    below: list[int] = []
    shown = list(range(len(columns)))

    def room() -> int:  # what is left once everything shown has its floor
        borders = 3 * len(shown) - 1  # no outer edge
        return width - ids - _TEXT_RESERVE * texts - borders - sum(floor.get(i, 0) for i in shown)

    for moving in (details, paths):  # the details go below first, then the paths
        if room() >= 0:
            break
        below += moving
        shown = [i for i in shown if i not in moving]
    given = {i: floor[i] for i in shown if i in floor}
    extra = max(0, room())
    for index, cap in [*((i, DETAIL_WIDTH) for i in details), *((i, None) for i in paths),
                       *((i, None) for i in details)]:  # fmt: skip
        if index not in given:
            continue
        whole = widest(index, columns[index][0])
        want = (whole if cap is None else min(cap, whole)) - given[index]
        step = max(0, min(extra, want))
        given[index] += step
        extra -= step

    table = Table(title=title, title_justify="left", show_edge=False)
    for index in shown:
        name, kind = columns[index]
        if kind is Column.TEXT:
            table.add_column(name)
        elif kind is Column.DETAIL:
            table.add_column(name, width=given[index], overflow="fold")
        else:
            cells = [_cut_path(r[index], given[index]) if kind is Column.PATH else r[index]
                     for r in rows]  # fmt: skip
            table.add_column(name, no_wrap=True, min_width=max([len(name), *map(_cell_len, cells)]))
    for row in rows:
        table.add_row(
            *(_cut_path(row[i], given[i]) if columns[i][1] is Column.PATH else row[i]
              for i in shown)
        )  # fmt: skip
    if not below:
        return table
    return Group(table, _below(columns, rows, sorted(below), key=key, width=width))


def _below(
    columns: Sequence[tuple[str, Column]],
    rows: Sequence[Sequence[str | Text]],
    moved: Sequence[int],
    *,
    key: int,
    width: int,
) -> Table:
    """The cells that did not fit the table: per row, its key, then each moved column's name
    and value (wrapped at the words; a path cut from the left to the room, its file name
    whole)."""
    keys = [" ".join(_plain(c) for c in row[:key]) for row in rows]
    key_width = max([0, *map(len, keys)])
    name_width = max(len(columns[i][0]) for i in moved)
    value_width = max(20, width - key_width - name_width - 4)
    grid = Table.grid(padding=(0, 2, 0, 0))
    grid.add_column(no_wrap=True, min_width=key_width)
    grid.add_column(no_wrap=True, min_width=name_width)
    grid.add_column(overflow="fold", max_width=value_width)
    for row_key, row in zip(keys, rows, strict=True):
        first = True
        for index in moved:
            name, kind = columns[index]
            value = _cut_path(row[index], value_width) if kind is Column.PATH else row[index]
            if not _plain(value).strip():
                continue
            grid.add_row(row_key if first else "", name, value)
            first = False
    return grid


RUN_COLUMNS = (
    ("host", Column.ID),
    ("outcome", Column.ID),
    ("file", Column.PATH),
    ("sha256", Column.ID),
    ("steps", Column.DETAIL),
    ("time", Column.ID),
)
"""The run table's columns (`apply`, `sync`, `rollback`, ...): a row per host."""


def print_report(report: RunReport) -> None:
    """The summary table of a run, then the reason for every host that did not reach the goal."""
    title = f"{report.command} {report.patch or ''}".strip()
    if report.run_id:
        title += f"  (run {report.run_id})"
    columns = RUN_COLUMNS
    rows: list[tuple[str | Text, ...]] = []
    for host in report.hosts:
        sha = ""
        if host.file is not None and host.file.sha256_before and host.file.sha256_after:
            before, after = host.file.sha256_before[:12], host.file.sha256_after[:12]
            sha = before if before == after else f"{before} ->\n{after}"
        path = host.file.path if host.file else ""
        if host.file is not None and host.file.set_files:  # a patch set: a line per file
            path = "\n".join(f.path for f in host.file.set_files)
            sha = "\n".join(
                f"{(f.live_sha256 or '?')[:12]} ({f.standing})" for f in host.file.set_files
            )
        seconds = sum(s.seconds for s in host.steps)
        rows.append(
            (
                host.host,
                Text(str(host.outcome), style=OUTCOME_STYLE.get(host.outcome, "")),
                path,
                sha,
                " ".join(s.step for s in host.steps if s.status == "ok"),
                f"{seconds:.1f}s",
            )
        )
    out.print(table_of(columns, rows, title=title))
    for host in report.hosts:
        if host.error:
            out.print(Text(f"{host.host}: {host.error}", style=OUTCOME_STYLE.get(host.outcome, "")))
        if host.note:
            out.print(f"{host.host}: {host.note}")
    if report.halted:
        out.print(Text(f"halted: {report.halted}", style="red"))
    out.print(f"outcome: {report.outcome} (exit {report.exit_code})")


def print_dry_run(report: RunReport) -> None:
    """A dry run, host by host: what was inspected, then the diff or why not (once)."""
    for host in report.hosts:
        out.print(Text(f"== {host.host}: {host.outcome}", style="bold"))
        for step in host.steps:
            if step.step == Step.INSPECT and step.detail and step.status == StepStatus.OK:
                out.print(f"   {step.detail}")
            if step.step == Step.PLAN and "; " in (step.detail or ""):  # alternatives that fit
                out.print(f"   plan: {step.detail}")
        if host.diff:
            print_diff(host.diff)
        elif host.error:
            out.print(f"   {host.error}")
    if report.halted:
        out.print(Text(report.halted, style="red"))


def finish(report: RunReport, as_json: bool) -> NoReturn:
    """Print a run's report (table or JSON) and exit with its code (`SystemExit`, not typer's
    `Exit`: `apply --file --yes` runs without typer)."""
    if as_json:
        emit_json(report.to_json())
    else:
        print_report(report)
    raise SystemExit(report.exit_code)


class LiveProgress:
    """A line per host with its current step and elapsed time (rich Live on a terminal, plain
    lines otherwise), on stderr. Implements `opspatch.runs.fleet.session.Progress`."""

    def __init__(self, hosts: Sequence[str], *, enabled: bool) -> None:
        self.enabled = enabled
        self.state = {h: ("waiting", "", time.monotonic()) for h in hosts}
        self.started = {h: time.monotonic() for h in hosts}
        self.lock = threading.Lock()
        self.live: Live | None = None

    def __enter__(self) -> LiveProgress:
        if self.enabled and err.is_terminal:
            from rich.live import Live  # only on a terminal: a scripted run never draws it

            self.live = Live(self._render(), console=err, refresh_per_second=4, transient=True)
            self.live.__enter__()
            _LIVE.append(self.live)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            _LIVE.remove(self.live)
            self.live.__exit__(None, None, None)

    def _render(self) -> Table:
        table = Table(show_header=True, box=None)
        for column in ("host", "step", "status", "elapsed"):
            table.add_column(column)
        now = time.monotonic()
        for host, (step, status, _) in self.state.items():
            table.add_row(host, step, status, f"{now - self.started.get(host, now):.1f}s")
        return table

    def run_started(self, run_id: str, summary: str) -> None:
        err.print(f"run {run_id}: {summary}")

    def notice(self, text: str) -> None:
        err.print(Text(text, style="yellow"))

    def after_stop(self, run_id: str | None) -> str | None:
        return recover_after_stop(run_id)

    def update(self, host: str, step: str, status: str) -> None:
        if not self.enabled:
            return
        with self.lock:
            self.started.setdefault(host, time.monotonic())
            self.state[host] = (step, status, time.monotonic())
            if self.live is not None:
                self.live.update(self._render())
            elif status != "running":
                err.print(f"{host}: {step} {status} ({time.monotonic() - self.started[host]:.1f}s)")


_LIVE: list[Live] = []
"""The progress display on screen (one process, one command), paused while a prompt is asked."""
_PROMPT_LOCK = threading.Lock()


def terminal_password_prompt() -> Callable[[str], str] | None:
    """How a run asks for the sudo password on the terminal (`become`), or None when there is
    no terminal to ask on (then only the inventory's environment variable can provide it).

    The prompt is asked from whichever host first needs it, so the live progress is paused
    while it is on screen; the answer is not echoed and is never printed or written anywhere.
    """
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None

    def ask(question: str) -> str:
        with _PROMPT_LOCK:
            paused = list(_LIVE)
            for live in paused:
                live.stop()
            try:
                return getpass.getpass(question, stream=sys.stderr)
            finally:
                for live in paused:
                    live.start()

    return ask


def confirm_or_refuse(question: str, *, yes: bool) -> None:
    """The confirmation rule: `--yes` proceeds; a terminal is asked; anything else is refused.

    Raises:
        ConfirmationRequired: no terminal and no `--yes` (exit 2, nothing changed).
    """
    if yes:
        return
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise ConfirmationRequired(
            f"{question} needs confirmation and there is no terminal to ask on; nothing was changed",
            hint="re-run with --yes to proceed without asking",
        )
    import typer

    if not typer.confirm(question, default=False, err=True):
        raise ConfirmationRequired("not confirmed; nothing was changed")
