"""The host agent as a package: what travels to hosts, and the rules its modules keep.

The agent runs on hosts we do not control, under the engine's interpreter (Python 3.8 or newer),
with nothing installed: each module must parse with the 3.8 grammar, import only the standard
library and earlier agent modules (the bootstrap executes them in `MODULES` order), and stay a
readable size.
"""

from __future__ import annotations

import ast
import hashlib
import sys
from pathlib import Path

import pytest

from opspatch.core.host import EngineSettings, Host
from opspatch.errors import PreimageMismatch
from opspatch.hosts.agent import MODULES
from opspatch.hosts.operations import AGENT_PACKAGE, HostOperations, agent_modules
from opspatch.hosts.transport.local import LocalTransport
from tests.enginekit import host_on, python_38

pytestmark = pytest.mark.process


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def imported_modules(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == AGENT_PACKAGE:
                names.update(f"{AGENT_PACKAGE}.{alias.name}" for alias in node.names)
            else:
                names.add(node.module)
    return names


def test_every_module_travels_in_dependency_order_and_parses_as_python_38() -> None:
    sent = agent_modules()
    assert [name for name, _ in sent] == [f"{AGENT_PACKAGE}.{m}" for m in MODULES]
    assert MODULES[-1] == "dispatch"
    earlier: set[str] = set()
    for name, source in sent:
        tree = ast.parse(source, filename=name, feature_version=(3, 8))
        assert any(
            isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in tree.body
        ), f"{name} needs `from __future__ import annotations` (hints stay strings on 3.8)"
        for imported in imported_modules(tree):
            if imported.startswith("opspatch"):
                assert imported in earlier, f"{name} imports {imported}, not sent before it"
            else:
                top = imported.split(".")[0]
                assert top in sys.stdlib_module_names, f"{name} imports {imported}"
        earlier.add(name)


def test_each_module_holds_one_concern_of_a_readable_size() -> None:
    for name, source in agent_modules():
        assert len(source.splitlines()) < 600, name


def agent_python(folder: Path) -> str:
    """This interpreter by another path, so the agent runs in a process of its own as on a host
    (a local host whose interpreter is this very file is answered in the test's own process)."""
    link = folder / "python"
    link.symlink_to(sys.executable)
    return str(link)


@pytest.mark.skipif(python_38() is None, reason="no Python 3.8 interpreter here (pyenv 3.8.18)")
def test_the_agent_runs_under_python_38(tmp_path: Path) -> None:
    python = python_38()
    assert python is not None
    target = tmp_path / "worker.py"
    target.write_bytes(b"A = 1\n")
    with LocalTransport("py38") as transport:
        ops = HostOperations(transport, host_on(python, tmp_path / "state"))
        inspection = ops.inspect(path=str(target), timeout=60)
        assert inspection.facts.python_version.startswith("3.8.")
        assert inspection.file.content == b"A = 1\n"
        lock = ops.lock(run_id="r1", timeout=30)
        swapped = ops.swap(
            str(target),
            expected_sha256=sha(b"A = 1\n"),
            new_content=b"A = 2\n",
            lock_run_id="r1",
            timeout=60,
        )
        assert swapped.changed and target.read_bytes() == b"A = 2\n"
        with pytest.raises(PreimageMismatch):
            ops.swap(str(target), expected_sha256=sha(b"A = 1\n"), new_content=b"", timeout=60)
        restored = ops.restore(str(target), pre_sha256=sha(b"A = 1\n"), timeout=60)
        assert restored["source"] == "backup" and target.read_bytes() == b"A = 1\n"
        assert ops.unlock(run_id=lock["holder"].get("run_id") or "", timeout=30)["released"]


def test_nothing_is_imported_from_the_host_disk_under_the_agent_names(tmp_path: Path) -> None:
    """An `opspatch` installed on a host (any version) must not mix with the agent sent."""
    decoy = tmp_path / "site" / "opspatch" / "hosts" / "agent"
    decoy.mkdir(parents=True)
    for folder in (decoy.parent.parent, decoy.parent, decoy):
        (folder / "__init__.py").write_text("raise RuntimeError('imported from disk')\n")
    (decoy / "protocol.py").write_text("raise RuntimeError('imported from disk')\n")
    host = host_on(sys.executable, tmp_path / "state")
    host = Host(
        **{
            **host.__dict__,
            "engine": EngineSettings(
                python=sys.executable, env={"PYTHONPATH": str(decoy.parents[2])}
            ),
        }
    )
    with LocalTransport("h") as transport:
        facts = HostOperations(transport, host).facts(timeout=60)
    assert facts.python_executable == sys.executable


def test_each_operation_travels_with_only_the_modules_it_needs(tmp_path: Path) -> None:
    from opspatch.hosts.channel import modules_for

    swap = modules_for("swap")
    assert swap[-1] == f"{AGENT_PACKAGE}.dispatch"
    assert f"{AGENT_PACKAGE}.files" in swap
    for unneeded in ("diagnose", "engine", "provenance"):
        assert f"{AGENT_PACKAGE}.{unneeded}" not in swap
    # the modules sent really suffice: the real bootstrap runs each operation of the patch phase
    target = tmp_path / "worker.py"
    target.write_bytes(b"A = 1\n")
    with LocalTransport("local") as transport:
        ops = HostOperations(transport, host_on(agent_python(tmp_path), tmp_path / "state"))
        _, inspection = ops.begin(path=str(target), run_id="r1", timeout=60)
        ops.swap(
            str(target),
            expected_sha256=inspection.file.sha256,
            new_content=b"A = 2\n",
            lock_run_id="r1",
            release_lock=True,
            timeout=60,
        )
    assert target.read_bytes() == b"A = 2\n"


def test_versions_read_from_dist_info_folders_agree_with_importlib_metadata() -> None:
    from importlib import metadata

    from opspatch.hosts.agent.fsutil import dist_version

    for name in ("pip", "pytest", "PyYAML", "typing-extensions", "typing_extensions"):
        assert dist_version(name) == metadata.version(name), name
    assert dist_version("no-such-distribution-here") is None


# -- one exec, a list of operations ------------------------------------------------------------


def test_a_batch_stops_at_its_first_refusal_and_runs_nothing_after_it(tmp_path: Path) -> None:
    """The real bootstrap and agent: lock, a swap refused (wrong pre-image), then a swap that
    would write and an unlock. The refusal stops the exec: the later two are not run, so the
    file keeps its bytes and the lock stays."""
    import base64

    from opspatch.hosts.channel import operation_call

    target = tmp_path / "worker.py"
    target.write_bytes(b"A = 1\n")
    state = tmp_path / "state"

    def swap(expected: bytes) -> dict[str, object]:
        return {
            "path": str(target),
            "expected_sha256": sha(expected),
            "content_b64": base64.b64encode(b"A = 2\n").decode(),
            "state_dir": str(state),
            "lock_run_id": "r1",
        }

    with LocalTransport("local") as transport:
        ops = HostOperations(transport, host_on(agent_python(tmp_path), state))
        lock = {"state_dir": str(state), "owner": "t@ctl", "run_id": "r1", "ttl_seconds": 60.0}
        replies = ops.call_batch(
            [
                operation_call("lock", {**lock, "takeover_run": None}),
                operation_call("swap", swap(b"A = 0\n")),
                operation_call("swap", swap(b"A = 1\n")),
                operation_call("unlock", {"state_dir": str(state), "run_id": "r1", "force": False}),
            ],
            timeout=60,
            step="batch",
        )
        assert transport.exec_count == 1
    assert [r["status"] for r in replies] == ["done", "refused", "not-run", "not-run"]
    assert replies[1]["code"] == "preimage-mismatch"
    assert target.read_bytes() == b"A = 1\n"  # the second swap never ran
    assert not (state / "backups").exists()
    assert (state / "lock.json").exists()  # nor the unlock


def test_a_gate_whose_result_is_not_ok_stops_the_batch() -> None:
    """`gate` is how "smoke, then give the lock back" keeps the lock after a failed smoke."""
    from opspatch.hosts.agent.dispatch import run_batch
    from opspatch.hosts.agent.protocol import OperationReply
    from opspatch.hosts.channel import operation_call

    ran: list[str] = []

    def perform(op: str, args: dict[str, object]) -> OperationReply:
        ran.append(op)
        return {"status": "done", "result": {"ok": args["ok"]}}

    passed = run_batch(
        [operation_call("smoke", {"ok": True}, gate=True), operation_call("unlock", {"ok": True})],
        perform,
    )
    failed = run_batch(
        [operation_call("smoke", {"ok": False}, gate=True), operation_call("unlock", {"ok": True})],
        perform,
    )
    ungated = run_batch(
        [operation_call("smoke", {"ok": False}), operation_call("unlock", {"ok": True})], perform
    )
    assert [r["status"] for r in passed] == ["done", "done"]
    assert [r["status"] for r in failed] == ["done", "not-run"]
    assert failed[0]["result"] == {"ok": False}  # the failed smoke's result still comes back
    assert [r["status"] for r in ungated] == ["done", "done"]
    assert ran == ["smoke", "unlock", "smoke", "smoke", "unlock"]


def test_begin_is_one_exec_that_takes_the_lock_then_inspects(tmp_path: Path) -> None:
    from opspatch.errors import LockHeld

    target = tmp_path / "worker.py"
    target.write_bytes(b"A = 1\n")
    state = tmp_path / "state"
    with LocalTransport("local") as transport:
        ops = HostOperations(transport, host_on(agent_python(tmp_path), state))
        lock, inspection = ops.begin(path=str(target), run_id="r1", timeout=60)
        assert transport.exec_count == 1
        assert lock["holder"].get("run_id") == "r1" and (state / "lock.json").exists()
        assert inspection.file.content == b"A = 1\n"
        with pytest.raises(LockHeld):  # another run: refused at the lock, nothing inspected
            ops.begin(path=str(tmp_path / "missing.py"), run_id="r2", timeout=60)
        assert transport.exec_count == 2


def test_a_batch_travels_with_the_union_of_its_modules() -> None:
    from opspatch.hosts.channel import modules_for

    begin = modules_for("lock", "inspect")
    assert set(modules_for("lock")) | set(modules_for("inspect")) == set(begin)
    assert begin[-1] == f"{AGENT_PACKAGE}.dispatch"
    assert f"{AGENT_PACKAGE}.diagnose" not in begin


@pytest.mark.parametrize("top_has_init", [True, False], ids=["wheel-layout", "all-namespace"])
def test_a_module_under_packages_without_init_files_resolves_as_python_would_import_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, top_has_init: bool
) -> None:
    """Real SGLang wheels ship `sglang/__init__.py` but no `__init__.py` in `sglang/srt/` or
    below: the path finder's namespace lookup needs the parent imported (a KeyError without),
    and the agent must not import it, so it finds each portion itself."""
    from opspatch.hosts.agent.facts import resolve_module_file

    site = tmp_path / "site"
    worker = site / "sglang" / "srt" / "speculative" / "eagle_worker_v2.py"
    worker.parent.mkdir(parents=True)
    worker.write_text("A = 1\n")
    if top_has_init:
        (site / "sglang" / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    monkeypatch.syspath_prepend(str(site))
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    found = resolve_module_file("sglang.srt.speculative.eagle_worker_v2")
    assert found["realpath"] == str(worker)
    assert "sglang" not in sys.modules
