"""The test tiers' check (tests/tiers.py): which command lines start a resource, and a pytest run
where a test that starts one without its marker fails naming it, however the process is started
(directly, by a shell, by a Python child, by a module-scoped fixture for an earlier test)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.tiers import hook

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("argv", "resources"),
    [
        (["/usr/sbin/sshd", "-D", "-e", "-f", "/x/sshd_config"], ["ssh"]),
        (["/usr/bin/python3", "-m", "sglang.launch_server", "--port", "1"], ["engine"]),
        (["python3", "-u", "-m", "sglang_router.launch_router", "--port", "1"], ["router"]),
        (
            ["/bin/sh", "-c", "cd /x && A=1 exec '/v/bin/python' -m sglang.launch_server"],
            ["engine"],
        ),
        (["/bin/sh", "-c", "true\nnohup env X=1 python -m sglang.launch_server &"], ["engine"]),
        (["sudo", "-H", "-n", "-u", "svc", "--", "python3", "-c", "print(1)"], ["root"]),
        (["runuser", "-u", "pg", "--", "/usr/bin/env", "sshd"], ["root", "ssh"]),
        (["/bin/sh", "-c", "sudo -n true; /usr/sbin/sshd -D"], ["root", "ssh"]),
        # what is no resource: an argument, code, a module not an engine, a test's own stub
        (["/bin/sh", "-c", "command -v sudo; echo sshd podman"], []),
        (["python3", "-c", "import os", "-m", "sglang.launch_server"], []),
        (["python3", "-m", "opspatch.cli", "sandbox", "up"], []),
        (["/bin/sh", "-c", "python3 -m pytest -m 'not slow'"], []),
        (["/no/such/folder/podman", "ps"], []),
    ],
)
def test_a_command_line_is_a_resource_by_its_program_or_module(
    argv: list[str], resources: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # as if every program named were installed, but the one in /no/such (the stub's own test)
    monkeypatch.setattr(hook, "_is_stub", lambda program, env: program.startswith("/no/such/"))

    assert [resource for resource, _ in hook.classify(argv)] == resources


def test_a_real_sglang_server_is_told_from_the_stand_in_by_its_environment() -> None:
    engine = ["/v/bin/python", "-m", "sglang.launch_server", "--port", "1"]
    real = {"SGLANG_USE_CPU_ENGINE": "1", "PATH": "/usr/bin"}

    assert [r for r, _ in hook.classify(engine, real)] == ["sglang"]
    assert [r for r, _ in hook.classify(engine, {b"SGLANG_USE_CPU_ENGINE": b"1"})] == ["sglang"]
    assert [r for r, _ in hook.classify(engine, {"PATH": "/usr/bin"})] == ["engine"]
    script = "cd /x && SGLANG_USE_CPU_ENGINE=1 exec /v/bin/python -m sglang.launch_server"
    assert [r for r, _ in hook.classify(["/bin/sh", "-c", script], {})] == ["sglang"]


def test_a_program_found_in_the_temporary_folder_is_a_stub_and_no_resource(tmp_path: Path) -> None:
    stub = tmp_path / "bin" / "podman"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)

    assert hook.classify([str(stub), "info"]) == []
    assert hook.classify(["podman", "info"], {"PATH": str(stub.parent)}) == []
    assert hook.classify(["/bin/sh", "-c", f"{stub} info"]) == []


INNER = """
import subprocess
import sys
import threading

import pytest

FAKE = {"sglang/__init__.py": "", "sglang/launch_server.py": "print('an engine')"}
ENGINE = [sys.executable, "-m", "sglang.launch_server"]


def fake_engine(folder):
    for name, text in FAKE.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def start_engine(folder):
    subprocess.run(ENGINE, cwd=fake_engine(folder), check=True, capture_output=True)


@pytest.fixture(scope="module")
def module_engine(tmp_path_factory):
    start_engine(tmp_path_factory.mktemp("module"))


@pytest.mark.engine
def test_marked_starts_an_engine(tmp_path):
    start_engine(tmp_path)


@pytest.mark.pure
def test_unmarked_starts_an_engine(tmp_path):
    start_engine(tmp_path)


@pytest.mark.pure
def test_unmarked_starts_one_through_the_shell(tmp_path):
    command = f"true; exec {sys.executable} -m sglang.launch_server"
    subprocess.run(command, shell=True, cwd=fake_engine(tmp_path), check=True)


@pytest.mark.pure
def test_unmarked_starts_one_through_a_python_child(tmp_path):
    code = f"import subprocess; subprocess.run({ENGINE!r}, cwd={str(fake_engine(tmp_path))!r})"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.process
def test_marked_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.pure
def test_pure_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.pure
def test_pure_starts_nothing():
    pass


@pytest.mark.engine
def test_marked_sets_up_the_module_engine(module_engine):
    pass


@pytest.mark.pure
def test_unmarked_uses_the_module_engine_started_earlier(module_engine):
    pass


def test_without_a_tier_marker():
    pass


LEFT = {}


@pytest.mark.pure
def test_leaves_a_thread_behind_that_starts_a_process_later():
    go, done = threading.Event(), threading.Event()

    def later():
        go.wait()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        done.set()

    threading.Thread(target=later, daemon=True).start()
    LEFT.update(go=go, done=done)


@pytest.mark.pure
def test_pure_while_a_thread_an_earlier_test_left_starts_a_process():
    LEFT["go"].set()
    assert LEFT["done"].wait(120)
"""


@pytest.mark.process
def test_a_test_that_starts_a_resource_without_its_marker_fails_naming_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_inner=INNER)
    # the inner pytest finds tests.tiers as this one does (this checkout first)
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), path])
    try:
        result = pytester.runpytest_subprocess("-p", "tests.tiers", "-p", "no:cacheprovider", "-rA")
    finally:
        os.environ["PYTHONPATH"] = path

    said = [
        re.match(r"(PASSED|FAILED|ERROR) test_inner.py::(\w+)", line) for line in result.outlines
    ]
    assert {found[2]: found[1] for found in said if found and found[1] != "PASSED"} == {
        "test_unmarked_starts_an_engine": "FAILED",
        "test_unmarked_starts_one_through_the_shell": "FAILED",
        "test_unmarked_starts_one_through_a_python_child": "FAILED",
        "test_pure_starts_a_process": "FAILED",
        "test_unmarked_uses_the_module_engine_started_earlier": "ERROR",
        "test_without_a_tier_marker": "ERROR",
    }, result.stdout.str()
    result.assert_outcomes(passed=6, failed=4, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*test_unmarked_starts_an_engine started what its markers do not say:",
            "  engine: * -m sglang.launch_server",
            "add pytest.mark.engine to the file's pytestmark, or to the test's own marks *",
        ]
    )
    result.stdout.fnmatch_lines(
        ["  engine: * -m sglang.launch_server (by the module fixture module_engine)"]
    )
    result.stdout.fnmatch_lines(["  process: * -c pass", "add pytest.mark.process *"])
    result.stdout.fnmatch_lines(["*test_without_a_tier_marker carries no tier marker*"])
