"""The host side of `opspatch diagnose` (`opspatch.hosts.agent.diagnose`, `.provenance`).

The pure parts are called directly (they are the very functions the agent runs on hosts); the
operation itself runs on a stand-in host's own interpreter (a real venv with the stand-in engine
installed as a wheel, no engine started) over the local transport and over a real sshd, and must
leave the host byte for byte as it found it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import py_compile
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from opspatch.hosts.agent.diagnose import (
    grouped_tracebacks,
    log_markers,
    log_window,
    speculative_settings,
)
from opspatch.hosts.agent.provenance import bytecode_state, checkout_state
from opspatch.hosts.diagnosis import DiagnoseRequest, diagnose_host
from opspatch.hosts.operations import HostOperations
from opspatch.hosts.transport.local import LocalTransport
from tests.enginekit import host_on, python_38
from tests.sshfleet import HostMaker, Target
from tests.standin import EAGLE_WORKER_MODULE, make_host

pytestmark = pytest.mark.process

CRASH_LOG = """\
[2026-12-01 00:05:09] server_args=ServerArgs(model_path='tiny', port=1)
[2026-12-01 00:05:09] The server is fired up and ready to roll!
[2026-12-01 00:05:09 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/old/eagle_worker_v2.py", line 9, in f
    x = self.y
AttributeError: 'W' object has no attribute 'y'
[2026-12-01 00:05:10] server_args=ServerArgs(model_path='tiny', port=1)
[2026-12-01 00:05:10 TP0] Capture cuda graph begin (target).
[2026-12-01 00:05:10 TP0] CUDA graph capture failed: no CUDA; falling back to eager decode
[2026-12-01 00:05:11] The server is fired up and ready to roll!
[2026-12-01 00:05:12 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/site/sglang/srt/speculative/eagle_worker_v2.py", line 123, in should_disable_speculation
    threshold = self.spec_disable_batch_threshold
AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'
[2026-12-01 00:05:12] SIGQUIT received. It usually means the scheduler failed; shutting down the server.
[2026-12-01 00:05:13 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/site/sglang/srt/speculative/eagle_worker_v2.py", line 123, in should_disable_speculation
AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'
[2026-12-01 00:05:14 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
"""


# -- the log ------------------------------------------------------------------------------------


def test_the_window_starts_at_the_last_start_and_groups_its_tracebacks(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(CRASH_LOG)

    window = log_window(str(log), None, None, 1 << 20)

    assert window["basis"] == "since the server's last start"
    assert window["first_line"] == 7
    assert window["started_at"] == time.mktime(
        time.strptime("2026-12-01 00:05:10", "%Y-%m-%d %H:%M:%S")
    )
    text = window["text"]
    assert "'W' object" not in text  # the previous start's crash is not this start's
    (group,) = grouped_tracebacks(text)
    assert (group["type"], group["count"]) == ("AttributeError", 2)
    assert (
        group["message"] == "'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"
    )
    assert (group["first_time"], group["last_time"]) == (
        "2026-12-01 00:05:12",
        "2026-12-01 00:05:13",
    )
    assert group["file"] == "/site/sglang/srt/speculative/eagle_worker_v2.py"
    assert group["lineno"] == 123
    kinds = {m["kind"]: m for m in log_markers(text)}
    assert kinds["scheduler-exception"]["count"] == 2
    assert kinds["cuda-graph-capture-failed"]["count"] == 1
    assert kinds["cuda-oom"]["count"] == 1
    assert kinds["ready"]["line_number"] < kinds["scheduler-exception"]["line_number"]
    assert "warmup-failed" not in kinds


def test_the_window_starts_at_the_last_start_of_a_real_0_5_23_server(tmp_path: Path) -> None:
    # From 0.5.20 SGLang logs its arguments as a dict (what the real 0.5.23 wrote, abridged),
    # and warnings without a stamp come before it
    log = tmp_path / "server.log"
    log.write_text(
        "/site/sglang/launch_server.py:71: UserWarning: 'python -m sglang.launch_server' is "
        "still supported, but 'sglang serve' is the recommended entrypoint.\n"
        "[2026-12-06 03:15:00] server_args={'model_path': '/m/target', 'port': 1}\n"
        "[2026-12-06 03:16:00] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/site/a.py", line 1, in f\n'
        "AttributeError: 'W' object has no attribute 'y'\n"
        "/site/sglang/launch_server.py:71: UserWarning: 'python -m sglang.launch_server' ...\n"
        "[2026-12-06 03:20:55] server_args={'model_path': '/m/target', 'port': 1}\n"
        "[2026-12-06 03:21:36] The server is fired up and ready to roll!\n"
    )
    window = log_window(str(log), None, None, 1 << 20)
    assert window["basis"] == "since the server's last start"
    assert window["first_line"] == 7
    assert "'W' object" not in window["text"]


def test_since_takes_the_lines_stamped_after_the_cutoff(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    now = time.time()
    stamp = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))  # noqa: E731
    log.write_text(
        f"[{stamp(now - 7200)}] server_args=ServerArgs()\n"
        f"[{stamp(now - 7000)}] old line\n"
        f"[{stamp(now - 60)}] Scheduler hit an exception: Traceback (most recent call last):\n"
        "KeyError: 'x'\n"
    )

    window = log_window(str(log), 600.0, None, 1 << 20)

    assert (
        window["text"]
        .splitlines()[0]
        .endswith("Scheduler hit an exception: Traceback (most recent call last):")
    )
    assert window["basis"].startswith("since ")
    assert window["started_at"] is None  # a time, not a start: nothing to compare files with


def test_a_log_larger_than_the_bound_is_read_from_its_tail(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    filler = "".join(f"[2026-12-01 00:00:00] request {i} done\n" for i in range(20000))
    log.write_text("[2026-12-01 00:00:00] server_args=ServerArgs()\n" + filler + CRASH_LOG[-300:])
    size = log.stat().st_size

    window = log_window(str(log), None, None, 64 * 1024)

    assert window["truncated"] and window["read_from"] == size - 64 * 1024
    assert len(window["text"].encode()) <= 64 * 1024
    assert window["text"].startswith("[2026-12-01 00:00:00] request ")  # a whole line first
    assert "only the last 65536 bytes were read" in window["basis"]
    assert window["text"].rstrip().endswith("Tried to allocate 2.00 GiB")


def test_no_log_file_is_a_value(tmp_path: Path) -> None:
    window = log_window(str(tmp_path / "missing.log"), None, None, 1024)
    assert (window["exists"], window["text"], window["basis"]) == (False, "", "no log file")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3",
             "--speculative-num-steps=3", "--speculative-eagle-topk", "1", "--port", "30000"],
            {"speculative-algorithm": "EAGLE3", "speculative-num-steps": "3",
             "speculative-eagle-topk": "1"},
        ),
        (["sglang", "serve", "--speculative-adaptive", "--port", "1"], {"speculative-adaptive": "true"}),
        (["python", "-m", "sglang.launch_server"], {}),
    ],
)  # fmt: skip
def test_speculative_settings_from_the_command_line(
    argv: list[str], expected: dict[str, str]
) -> None:
    assert speculative_settings(argv) == expected


# -- bytecode -------------------------------------------------------------------------------------


def _pyc(source: Path, mode: py_compile.PycInvalidationMode) -> Path:
    cached = Path(importlib.util.cache_from_source(str(source)))
    py_compile.compile(str(source), cfile=str(cached), doraise=True, invalidation_mode=mode)
    return cached


def _verdicts(source: Path) -> list[tuple[str, bool]]:
    return [
        (b["kind"], b["runs_old_code"]) for b in bytecode_state([str(source)], source.read_bytes())
    ]


def test_a_same_size_same_second_edit_leaves_a_stale_timestamp_pyc(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("THRESHOLD = 1\n")
    _pyc(source, py_compile.PycInvalidationMode.TIMESTAMP)
    assert _verdicts(source) == [("timestamp", False)]
    before = source.stat()

    source.write_text("THRESHOLD = 0\n")  # same size; the mtime put back as a same-second write
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))

    (found,) = bytecode_state([str(source)], source.read_bytes())
    assert found["runs_old_code"] and found["verdict"].startswith("STALE: it matches the source's")
    os.utime(source, (before.st_atime + 5, before.st_mtime + 5))
    (found,) = bytecode_state([str(source)], source.read_bytes())
    assert not found["runs_old_code"] and found["verdict"].startswith("outdated")


def test_hash_based_pycs_unchecked_runs_old_code_checked_is_recompiled(tmp_path: Path) -> None:
    unchecked = tmp_path / "a.py"
    checked = tmp_path / "b.py"
    for source, mode in (
        (unchecked, py_compile.PycInvalidationMode.UNCHECKED_HASH),
        (checked, py_compile.PycInvalidationMode.CHECKED_HASH),
    ):
        source.write_text("X = 1\n")
        _pyc(source, mode)
    assert _verdicts(unchecked) == [("hash-unchecked", False)]
    assert _verdicts(checked) == [("hash-checked", False)]

    unchecked.write_text("X = 22\n")
    checked.write_text("X = 22\n")

    assert _verdicts(unchecked) == [("hash-unchecked", True)]
    assert _verdicts(checked) == [("hash-checked", False)]
    # Python agrees: the unchecked pyc runs, the source's new value is not seen.
    done = subprocess.run(
        [sys.executable, "-c", "import a, b; print(a.X, b.X)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert done.stdout.split() == ["1", "22"]


def test_a_pyc_of_another_interpreter_is_named_and_ignored(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("X = 1\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "m.cpython-38.pyc").write_bytes(b"\x00" * 20)
    (found,) = bytecode_state([str(source)], source.read_bytes())
    assert found["kind"] == "other" and "another interpreter" in found["verdict"]


# -- a git checkout -------------------------------------------------------------------------------


requires_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


@requires_git
def test_checkout_state_names_the_commit_the_diff_and_every_uncommitted_change(
    tmp_path: Path,
) -> None:
    root = tmp_path / "sglang"
    package = root / "python" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    target = package / "mod.py"
    target.write_text("A = 1\n")
    (package / "feature.py").write_text("F = 0\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "release 1.0")
    head = _git(root, "rev-parse", "HEAD").strip()
    clean = checkout_state(str(target), target.read_bytes())
    assert clean is not None
    assert (clean["head"], clean["branch"], clean["subject"]) == (head, "main", "release 1.0")
    assert clean["head_sha256"] == hashlib.sha256(b"A = 1\n").hexdigest()
    assert clean["head_content_b64"] is None and clean["diff"] == "" and clean["uncommitted"] == []

    target.write_text("A = 2\n")  # the hand edit
    (package / "feature.py").write_text("F = 1\n")  # a local feature change under it
    index = root / ".git" / "index"
    index_before = (index.stat().st_mtime_ns, index.read_bytes())

    state = checkout_state(str(target), target.read_bytes())

    assert state is not None
    assert state["relpath"] == "python/pkg/mod.py"
    assert "-A = 1\n+A = 2\n" in state["diff"]
    assert sorted(state["uncommitted"]) == [" M python/pkg/feature.py", " M python/pkg/mod.py"]
    assert state["head_content_b64"] is not None  # HEAD's text differs from the live one
    assert (index.stat().st_mtime_ns, index.read_bytes()) == index_before  # git wrote nothing
    assert checkout_state(str(tmp_path / "elsewhere.py"), b"") is None


def test_a_wheel_installed_inside_some_git_work_tree_is_not_a_checkout(tmp_path: Path) -> None:
    """A virtual environment that lives inside a repository (ignored there, as a demo's or a
    test's state folder is) holds a wheel install: its files are not the repository's, and that
    repository's own changes say nothing about the engine."""
    root = tmp_path / "ops-repo"
    site = root / ".state" / "venv" / "lib" / "python3.11" / "site-packages" / "pkg"
    site.mkdir(parents=True)
    (root / ".gitignore").write_text(".state/\n")
    (root / "README.md").write_text("tools\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "tools")
    (root / "README.md").write_text("tools, edited\n")  # the outer repository's own change
    target = site / "mod.py"
    target.write_text("A = 1\n")
    assert checkout_state(str(target), target.read_bytes()) is None


# -- the operation on a host ----------------------------------------------------------------------


def _snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            info = path.stat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path)] = (info.st_size, info.st_mtime_ns, digest)
    return found


def test_the_operation_reads_provenance_and_sources_and_writes_nothing(
    remote_target: Target, make_inventory_host: HostMaker, tmp_path: Path
) -> None:
    standin = make_host(tmp_path / "host")
    # A second copy of the package behind a .pth (shadowed: site-packages comes first), and a
    # develop install's link to a folder that is gone.
    other = tmp_path / "host" / "old-checkout"
    shutil.copytree(standin.site_packages / "sglang", other / "sglang")
    (standin.site_packages / "zz-old-sglang.pth").write_text(f"{other}\n")
    (standin.site_packages / "sglang.egg-link").write_text(f"{tmp_path / 'gone'}\n.\n")
    eagle = standin.eagle_worker_file
    _pyc(eagle, py_compile.PycInvalidationMode.UNCHECKED_HASH)
    eagle.write_text(
        eagle.read_text().replace("speculation_disabled = False", "speculation_disabled = None")
    )
    host = make_inventory_host(
        remote_target.kind, fleet=remote_target.fleet, state_dir=tmp_path / "state",
        python=str(standin.python),
    )  # fmt: skip
    before = _snapshot(tmp_path / "host")

    d = diagnose_host(
        remote_target.with_host(host),
        DiagnoseRequest(
            modules=(EAGLE_WORKER_MODULE, "sglang.srt.no_such_module"),
            server=False, log=False, source_modules=(EAGLE_WORKER_MODULE,),
        ),
        timeout=120,
    )  # fmt: skip

    assert _snapshot(tmp_path / "host") == before
    m = d.module(EAGLE_WORKER_MODULE)
    assert m.file is not None and m.file.realpath == str(eagle)
    assert m.record_sha256 and m.record_sha256 != m.file.sha256  # edited since pip wrote it
    assert (m.distribution, m.version) == ("sglang", "0.5.23")
    imported = [c for c in m.copies if c.imported]
    assert [c.path for c in imported] == [str(standin.site_packages / "sglang")]
    assert str(other / "sglang") in {c.path for c in m.copies if c.exists and not c.imported}
    stale = [c for c in m.copies if not c.exists]
    assert [(c.kind, c.path) for c in stale] == [("egg-link", str(tmp_path / "gone"))]
    assert [(b.kind, b.runs_old_code) for b in m.bytecode] == [("hash-unchecked", True)]
    missing = d.module("sglang.srt.no_such_module")
    assert missing.error_code == "module-not-found" and missing.file is None
    names = {Path(p).name for p in d.sources}
    assert {"eagle_worker_v2.py", "base_spec_worker.py", "standalone_worker_v2.py"} <= names
    assert "tp_worker.py" in names  # imported by eagle_worker_v2 from another package folder
    assert d.facts is not None and d.facts.sglang_version == "0.5.23"


def test_the_operation_runs_under_python_38(tmp_path: Path) -> None:
    python = python_38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter here (pyenv 3.8.18)")
    package = tmp_path / "lib" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "worker.py").write_text("from pkg.base import Base\nclass W(Base):\n    pass\n")
    (package / "base.py").write_text("class Base:\n    pass\n")
    log = tmp_path / "server.log"
    log.write_text(CRASH_LOG)
    host = host_on(python, tmp_path / "state")
    engine = replace(host.engine, log_file=str(log), env={"PYTHONPATH": str(tmp_path / "lib")})
    host = replace(host, engine=engine)
    with LocalTransport("py38") as transport:
        d = diagnose_host(
            HostOperations(transport, host),
            DiagnoseRequest(modules=("pkg.worker",), source_modules=("pkg.worker",)),
            timeout=120,
        )
    assert d.facts is not None and d.facts.python_version.startswith("3.8.")
    m = d.module("pkg.worker")
    assert m.file is not None and m.file.content.startswith(b"from pkg.base")
    assert d.log is not None and d.log.tracebacks[0].count == 2
    assert {Path(p).name for p in d.sources} == {"worker.py", "base.py", "__init__.py"}
    assert d.server is not None and not d.server.running
