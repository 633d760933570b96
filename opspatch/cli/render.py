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

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from opspatch.errors import ConfirmationRequired

if TYPE_CHECKING:
    from opspatch.runs.report import RunReport


def _width(stream: TextIO) -> int | None:
    """A terminal's own width; piped, `COLUMNS` when set (rich reads it), else 160: piped output
    is read by people in logs and by scripts, so tables get room instead of 80 columns."""
    return None if stream.isatty() or os.environ.get("COLUMNS") else 160


out = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))

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
    """The end of a long path (the module part is what tells files apart), never shorter than
    its file name."""
    width = max(width, len(path.rsplit("/", 1)[-1]) + 2)
    return path if len(path) <= width else "…" + path[-(width - 1) :]


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
    PATH = "path"  # cut from the left, keeping the file name
    TEXT = "text"  # wraps


def _cell_len(cell: str | Text) -> int:
    """The width of a cell's longest line."""
    text = cell.plain if isinstance(cell, Text) else cell
    return max((Text(line).cell_len for line in text.splitlines()), default=0)


def table_of(
    columns: Sequence[tuple[str, Column]],
    rows: Sequence[Sequence[str | Text]],
    *,
    title: str | None = None,
    console: Console | None = None,
) -> Table:
    """A table readable at 80 columns: ids whole, paths cut from the left, the rest wrapped."""
    width = (console or out).width
    # The room the paths have: the width less the whole ids, the borders (3 per column and 1)
    # (no outer edge) and a word of 7 for each text column; never less than a file name.
    fixed = sum(
        max([len(name), *(_cell_len(row[index]) for row in rows)])
        for index, (name, kind) in enumerate(columns)
        if kind is Column.ID
    )
    texts = sum(1 for _, kind in columns if kind is Column.TEXT)
    paths = sum(1 for _, kind in columns if kind is Column.PATH) or 1
    path_width = (width - fixed - (3 * len(columns) - 1) - 7 * texts) // paths
    cells = [
        [short_path(cell, path_width) if kind is Column.PATH and isinstance(cell, str) else cell
         for cell, (_, kind) in zip(row, columns, strict=True)]
        for row in rows
    ]  # fmt: skip
    table = Table(title=title, title_justify="left", show_edge=False)
    for index, (name, kind) in enumerate(columns):
        if kind is Column.TEXT:
            table.add_column(name)
            continue
        longest = max([len(name), *(_cell_len(row[index]) for row in cells)])
        table.add_column(name, no_wrap=True, min_width=longest)
    for row in cells:
        table.add_row(*row)
    return table


def print_report(report: RunReport) -> None:
    """The summary table of a run, then the reason for every host that did not reach the goal."""
    title = f"{report.command} {report.patch or ''}".strip()
    if report.run_id:
        title += f"  (run {report.run_id})"
    columns = (
        ("host", Column.ID),
        ("outcome", Column.ID),
        ("file", Column.PATH),
        ("sha256", Column.ID),
        ("steps", Column.TEXT),
        ("time", Column.ID),
    )
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
            if step.step == "inspect" and step.detail and step.status == "ok":
                out.print(f"   {step.detail}")
            if step.step == "plan" and "; " in (step.detail or ""):  # alternatives that fit
                out.print(f"   plan: {step.detail}")
        if host.diff:
            print_diff(host.diff)
        elif host.error:
            out.print(f"   {host.error}")
    if report.halted:
        out.print(Text(report.halted, style="red"))


def finish(report: RunReport, as_json: bool) -> NoReturn:
    """Print a run's report (table or JSON) and exit with its code."""
    if as_json:
        emit_json(report.to_json())
    else:
        print_report(report)
    raise typer.Exit(report.exit_code)


class LiveProgress:
    """A line per host with its current step and elapsed time (rich Live on a terminal, plain
    lines otherwise), on stderr. Implements `opspatch.runs.session.Progress`."""

    def __init__(self, hosts: Sequence[str], *, enabled: bool) -> None:
        self.enabled = enabled
        self.state = {h: ("waiting", "", time.monotonic()) for h in hosts}
        self.started = {h: time.monotonic() for h in hosts}
        self.lock = threading.Lock()
        self.live: Live | None = None

    def __enter__(self) -> LiveProgress:
        if self.enabled and err.is_terminal:
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
    if not typer.confirm(question, default=False, err=True):
        raise ConfirmationRequired("not confirmed; nothing was changed")
