"""The controller side of `diagnose` (judging files and hosts, the fleet summary, the text), the
postmortem timeline of `ledger report` on a real ledger file, and the `--since` durations.

Table cases on values built as the agent's reply would make them; the timeline is read back
from a real SQLite ledger and its Markdown parsed by a real Markdown parser.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from opspatch.cli.respond import parse_duration
from opspatch.core.policy import DEFAULT_IGNORE_PATTERNS
from opspatch.errors import InputError
from opspatch.hosts.diagnosis import (
    CachedBytecode,
    Checkout,
    HostDiagnosis,
    InstalledCopy,
    LogMarker,
    LogWindow,
    ModuleDiagnosis,
    ServerState,
    TracebackGroup,
)
from opspatch.hosts.results import RemoteFile
from opspatch.ledger import Ledger, NewFileVersion
from opspatch.runs.commands.ledger_report import build_report, render_markdown
from opspatch.runs.judgments.diagnosis_text import render_host, render_summary
from opspatch.runs.judgments.findings import FleetDiagnosis, HostReport, judge_file, judge_host
from tests.ledgerkit import ORIGINAL, PATCHED, begin, full_run, sha

pytestmark = pytest.mark.pure

MODULE = "sglang.srt.speculative.eagle_worker_v2"
PATH = "/venv/site-packages/sglang/srt/speculative/eagle_worker_v2.py"
EDITED = ORIGINAL.replace(b"pass", b"self.x = 1  # hotfix")


def remote(content: bytes, path: str = PATH) -> RemoteFile:
    return RemoteFile(
        path, path, None, content, sha(content), len(content), 0o644, 0, 0, "root", "root", 0, 1
    )


def module(content: bytes, **kw: object) -> ModuleDiagnosis:
    values: dict[str, object] = {
        "module": MODULE,
        "file": remote(content),
        "origin": PATH,
        "distribution": "sglang",
        "distribution_version": "0.5.23",
        "record_sha256": sha(ORIGINAL),
        "copies": (
            InstalledCopy(
                PATH.rsplit("/sglang/", 1)[0] + "/sglang", "sys.path", "/venv", True, True
            ),
        ),
    }
    values.update(kw)
    return ModuleDiagnosis(**values)  # type: ignore[arg-type]


# -- one file -------------------------------------------------------------------------------------


def test_a_file_equal_to_its_record_hash_is_pristine() -> None:
    verdict = judge_file(module(ORIGINAL), [], {}, {})
    assert (verdict.state, verdict.install) == ("pristine", "wheel")
    assert verdict.detail == "matches the RECORD of sglang 0.5.23"


def test_a_file_opspatch_wrote_names_the_patch_and_run(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        run_id = full_run(ledger)
        history = ledger.file_history("gpu-01", "/srv/eagle_worker_v2.py")
    verdict = judge_file(module(PATCHED), history, {}, {})
    assert (verdict.state, verdict.patch_id, verdict.run_id) == (
        "patched-by-opspatch",
        "eagle-init-guard",
        run_id,
    )


def test_a_hand_edit_is_shown_against_a_record_verified_copy_from_another_host() -> None:
    texts = {sha(ORIGINAL): ORIGINAL}
    verdict = judge_file(
        module(EDITED), [], texts, {sha(ORIGINAL): "RECORD-verified copy on gpu-02"}
    )
    assert verdict.state == "edited-outside"
    assert verdict.diff_against == "the RECORD of sglang 0.5.23 (RECORD-verified copy on gpu-02)"
    assert verdict.diff is not None
    assert "-        pass\n+        self.x = 1  # hotfix\n" in verdict.diff
    assert verdict.diff.startswith(f"--- a/{MODULE.replace('.', '/')}.py\n")


def test_a_hand_edit_without_any_pristine_text_says_so() -> None:
    verdict = judge_file(module(EDITED), [], {}, {})
    assert verdict.state == "edited-outside" and verdict.diff is None
    assert "no pristine text known" in verdict.detail


def test_an_editable_install_is_judged_against_git_head() -> None:
    checkout = Checkout(
        "/root/sglang", "python/" + MODULE.replace(".", "/") + ".py", None, head="c0ffee" * 6,
        branch="main", tracked=True, head_sha256=sha(ORIGINAL), head_content=ORIGINAL,
        diff="diff --git a/x b/x\n-old\n+new\n", uncommitted=(" M python/sglang/x.py",),
        uncommitted_count=1,
    )  # fmt: skip
    verdict = judge_file(module(EDITED, record_sha256=None, checkout=checkout), [], {}, {})
    assert (verdict.state, verdict.install) == ("edited-outside", "editable")
    assert verdict.diff == checkout.diff and verdict.diff_against == "git HEAD c0ffeec0ffee"
    assert judge_file(
        module(ORIGINAL, record_sha256=None, checkout=checkout), [], {}, {}
    ).state == ("pristine")


def test_no_record_and_no_checkout_is_unknown_and_a_missing_module_not_installed() -> None:
    assert judge_file(module(EDITED, record_sha256=None), [], {}, {}).state == "unknown"
    missing = ModuleDiagnosis(
        MODULE, error="no module named 'sglang'", error_code="module-not-found"
    )
    assert judge_file(missing, [], {}, {}).state == "not-installed"


# -- one host, the fleet --------------------------------------------------------------------------


def _log(*, crash: bool) -> LogWindow:
    markers = [LogMarker("ready", 1, "t", "t", 5, "ready to roll!")]
    tracebacks: tuple[TracebackGroup, ...] = ()
    if crash:
        markers.append(
            LogMarker("scheduler-exception", 3, "t1", "t3", 9, "Scheduler hit an exception")
        )
        tracebacks = (
            TracebackGroup(
                "AttributeError", "'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'",
                3, "t1", "t3", 9, 'File "x.py", line 1, in f', "x.py", 1, "Scheduler hit an exception",
            ),
        )  # fmt: skip
    return LogWindow(
        "/log",
        True,
        100,
        "since the server's last start",
        markers=tuple(markers),
        tracebacks=tracebacks,
    )


def _server(running: bool = True, health: int | None = 200) -> ServerState:
    return ServerState(7, "pid file", running, 1.0, ("python",), {}, None, health, None)


def _host(name: str, content: bytes, *, crash: bool, **module_kw: object) -> HostReport:
    from opspatch.runs.commands.diagnose import analyse_exceptions

    d = HostDiagnosis(
        name,
        None,
        _server(running=not crash, health=None if crash else 200),
        (module(content, **module_kw),),
        None,
        _log(crash=crash),
    )
    files = [judge_file(m, [], {sha(ORIGINAL): ORIGINAL}, {}) for m in d.modules]
    return judge_host(d, files, analyse_exceptions(d, []))


def test_ready_then_a_crash_is_healthy_but_crashing_with_the_exception_and_its_count() -> None:
    report = _host("gpu-01", ORIGINAL, crash=True)
    assert report.status == "healthy-but-crashing"
    kinds = {f.kind: f for f in report.findings}
    assert kinds["exception"].text.startswith("AttributeError: 'EAGLEWorkerV2' object")
    assert kinds["exception"].detail.startswith("3x, first t1, last t3")
    assert "server-down" in kinds
    text = render_host(report)
    assert text.startswith("== gpu-01: healthy-but-crashing\n")
    assert "exception AttributeError: 'EAGLEWorkerV2' object" in text


def test_a_warning_logged_with_its_traceback_is_passed_over_as_the_smoke_passes_it() -> None:
    # real SGLang 0.5.23 with --skip-server-warmup: `logger.warning(..., exc_info=True)` puts
    # the traceback of a failed POST /freeze_gc on lines of its own, after its message; no time
    # can be read for it, and the server lives on
    from opspatch.runs.commands.diagnose import analyse_exceptions

    text = (
        "[2026-12-06 03:14:55] post-warmup freeze_gc failed\n"
        "Traceback (most recent call last):\n"
        '  File "adapters.py", line 729, in send\n'
        "requests.exceptions.ConnectionError: Max retries exceeded with url: /freeze_gc\n"
        "[2026-12-06 03:14:55] The server is fired up and ready to roll!\n"
    )
    group = TracebackGroup(
        "requests.exceptions.ConnectionError", "Max retries exceeded with url: /freeze_gc",
        1, None, None, 2, 'File "adapters.py", line 729, in send', "adapters.py", 729, None,
    )  # fmt: skip
    log = LogWindow(
        "/log", True, 100, "since the server's last start", text=text, tracebacks=(group,),
        markers=(LogMarker("ready", 1, "t", "t", 5, "ready to roll!"),),
    )  # fmt: skip
    d = HostDiagnosis("gpu-01", None, _server(), (module(ORIGINAL),), None, log)
    files = [judge_file(m, [], {sha(ORIGINAL): ORIGINAL}, {}) for m in d.modules]

    flagged = judge_host(d, files, analyse_exceptions(d, []))
    (finding,) = [f for f in flagged.findings if f.kind == "exception"]
    assert (finding.level, flagged.status) == ("problem", "attention")
    assert finding.detail.startswith("1x, time not logged, at ")
    assert "        1x, time not logged\n" in render_host(flagged)
    assert "None" not in render_host(flagged)

    passed = judge_host(d, files, analyse_exceptions(d, [], DEFAULT_IGNORE_PATTERNS))
    (finding,) = [f for f in passed.findings if f.kind == "exception"]
    assert finding.level == "info" and passed.status == "clean"
    said = render_host(passed)
    assert "passed over: logged with a warning (post-warmup freeze_gc failed)" in said


def test_stale_bytecode_old_code_and_other_copies_are_findings() -> None:
    copies = (
        InstalledCopy("/venv/sglang", "sys.path", "/venv", True, True),
        InstalledCopy("/opt/old/sglang", "pth", "/venv/old.pth", True, False),
        InstalledCopy("/gone", "egg-link", "/venv/sglang.egg-link", False, False),
    )
    stale = (CachedBytecode("/venv/x.pyc", "hash-unchecked", "STALE: ...", True),)
    report = _host(
        "gpu-01", ORIGINAL, crash=False, copies=copies, bytecode=stale, server_older_than_file=True
    )
    levels = {f.kind: f.level for f in report.findings}
    assert levels == {
        "stale-bytecode": "problem",
        "server-runs-old-code": "problem",
        "other-copies": "warning",
        "stale-link": "warning",
    }
    assert report.status == "attention"


def test_the_summary_groups_hosts_by_finding_and_clean_hosts_exit_0() -> None:
    crashing = [_host(f"gpu-0{i}", ORIGINAL, crash=True) for i in (1, 2)]
    edited = _host("gpu-03", EDITED, crash=False)
    clean = _host("gpu-04", ORIGINAL, crash=False)
    fleet = FleetDiagnosis((*crashing, edited, clean), (MODULE,))
    summary = {f.text: hosts for f, hosts in fleet.summary()}
    assert summary[
        "AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"
    ] == ("gpu-01", "gpu-02")
    assert summary[f"{MODULE} edited outside opspatch"] == ("gpu-03",)
    assert fleet.exit_code == 1
    assert "clean: gpu-04" in render_summary(fleet)
    assert FleetDiagnosis((clean,)).exit_code == 0
    assert FleetDiagnosis((HostReport("gpu-05", None, error="unreachable"),)).exit_code == 1
    assert fleet.to_json()["status"] == {
        "gpu-01": "healthy-but-crashing", "gpu-02": "healthy-but-crashing",
        "gpu-03": "attention", "gpu-04": "clean",
    }  # fmt: skip


# -- durations ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("1w", 604800),
     ("0.5h", 1800), (" 2H ", 7200)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "5", "5x", "h", "1h 30m", "-1h", "0m", "1h30"])
def test_bad_durations_are_one_message(text: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_duration(text)
    assert caught.value.message.startswith(f"--since {text!r}: ")


# -- the timeline -----------------------------------------------------------------------------------


def _tables(markdown: str) -> list[list[list[str]]]:
    """Every table of a Markdown document, as rows of cell texts (the header first)."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    tables: list[list[list[str]]] = []
    row: list[str] | None = None
    for token in tokens:
        if token.type == "table_open":
            tables.append([])
        elif token.type == "tr_open":
            row = []
        elif token.type == "inline" and row is not None:
            row.append(token.content)
        elif token.type == "tr_close" and row is not None:
            tables[-1].append(row)
            row = None
    return tables


def test_the_timeline_names_every_step_change_and_rollback_as_tables(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        applied = full_run(ledger)
        undo = begin(ledger, hosts=("gpu-01",), command="rollback", parent_run=applied,
                     command_line="opspatch rollback --run " + applied)  # fmt: skip
        ledger.record_step(undo, "gpu-01", "restore", "ok", 0.1, "back to the pre-image")
        ledger.record_file_version(undo, "gpu-01", NewFileVersion(
            "/srv/eagle_worker_v2.py", sha(PATCHED), sha(ORIGINAL), 0o644, "root:root",
            pre_image=PATCHED, action="restore",
        ))  # fmt: skip
        ledger.record_host_outcome(undo, "gpu-01", "restored")
        ledger.finish_run(undo, "ok")
        unrelated = begin(ledger, hosts=("gpu-09",), patch_id="other-fix")
        ledger.finish_run(unrelated, "ok")

        one = build_report(ledger, run_id=applied)
        window = build_report(ledger, since=timedelta(hours=1))
        old = build_report(
            ledger, since=timedelta(hours=1), now=datetime.now(timezone.utc) + timedelta(hours=3)
        )

    assert [r.detail.run_id for r in one.runs] == [applied, undo]  # the run and its rollback
    assert [r.detail.run_id for r in window.runs] == [applied, undo, unrelated]
    assert old.runs == ()
    markdown = render_markdown(one)
    tables = _tables(markdown)
    runs_table = tables[0]
    assert runs_table[0] == [
        "started (UTC)",
        "run",
        "command",
        "patch",
        "operator",
        "controller",
        "hosts",
        "outcome",
    ]
    assert [row[1:4] for row in runs_table[1:]] == [
        [applied, "apply", "eagle-init-guard"], [undo, "rollback", "eagle-init-guard"],
    ]  # fmt: skip
    steps = next(t for t in tables if t[0][:3] == ["time (UTC)", "host", "step"])
    assert [(r[1], r[2], r[3]) for r in steps[1:]] == [
        ("gpu-01", "lock", "ok"), ("gpu-01", "swap", "ok"), ("gpu-02", "lock", "ok"),
        ("gpu-02", "swap", "ok"), ("gpu-01", "smoke", "ok"), ("gpu-02", "smoke", "failed"),
    ]  # fmt: skip
    changes = next(t for t in tables if "sha256 before" in t[0])
    assert [(r[1], r[3], r[4], r[5]) for r in changes[1:]] == [
        ("gpu-01", "patch", sha(ORIGINAL)[:12], sha(PATCHED)[:12]),
        ("gpu-02", "patch", sha(ORIGINAL)[:12], sha(PATCHED)[:12]),
        ("gpu-02", "restore", sha(PATCHED)[:12], sha(ORIGINAL)[:12]),
    ]
    assert "-        pass\n+        self.x = 0\n" in markdown  # the change itself, as a diff
    assert "- gpu-02: rolled back by this run at step smoke because: smoke failed" in markdown
    assert f"- gpu-01: restored (run {applied}) by `opspatch rollback --run {applied}`" in markdown
    assert f"rollback of run {applied}" in markdown
    document = one.to_json()
    assert document["chain_ok"] is True
    assert document["runs"][0]["rolled_back"] == [
        "gpu-02: rolled back by this run at step smoke because: smoke failed"
    ]
    assert hashlib.sha256(b"").hexdigest() not in markdown


def test_a_pipe_in_a_step_detail_stays_inside_its_cell(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        run_id = begin(ledger, hosts=("gpu-01",))
        ledger.record_step(run_id, "gpu-01", "smoke", "failed", 1.0, "text 'a | b'\nsecond line")
        ledger.finish_run(run_id, "failed")
        markdown = render_markdown(build_report(ledger, run_id=run_id))
    steps = next(t for t in _tables(markdown) if t[0][:3] == ["time (UTC)", "host", "step"])
    assert steps[1][1:] == ["gpu-01", "smoke", "failed", "1.00", "text 'a | b' second line"]
