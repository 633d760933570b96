"""The live-fix plugin's delivery path, in the test process: the rules its modules keep, where its
sockets are, the `opspatch_live` distribution, a socket's checks, and the scheduler's boundary
(a take queued on the entry rank, injected into what it pulls, answered after the barrier) driven
through fake SGLang classes shaped like 0.5.23's and 0.5.10's.
"""

from __future__ import annotations

import ast
import contextlib
import os
import select
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from opspatch.core.wheelrecord import record_hash
from opspatch.hosts import livedist
from opspatch.hosts.liveplugin import answers, boundary, hooks, listener, plugin, socket_paths, wire

pytestmark = pytest.mark.pure

TAKE = {
    "op": "take",
    "fix_id": "fix-1",
    "module": "m",
    "path": "/x/m.py",
    "sha256": "0" * 64,
    "definitions": [{"name": "C.a", "kind": "class-attribute"}],
}


# -- the package's rules ------------------------------------------------------------------------


def test_every_module_is_python_38_and_imports_the_standard_library_or_itself_only() -> None:
    sources = livedist.plugin_sources()
    assert "opspatch_live/plugin.py" in sources and "opspatch_live/boundary.py" in sources
    for name, data in sources.items():
        tree = ast.parse(data, filename=name, feature_version=(3, 8))
        assert any(
            isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in tree.body
        ), f"{name} needs `from __future__ import annotations` (hints stay strings on 3.8)"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = {(node.module or "").split(".")[0]}
            else:
                continue
            lazy = node not in tree.body  # inside a function: torch in a scheduler only
            for top in tops:
                assert top != "opspatch", f"{name} imports {top}: only relative imports"
                assert top in sys.stdlib_module_names or (lazy and top == "torch"), (
                    f"{name} imports {top}"
                )


# -- where the sockets are ---------------------------------------------------------------------


def test_the_socket_folder_is_the_environments_else_run_for_root_else_tmp_per_user() -> None:
    assert socket_paths.base_dir({"OPSPATCH_LIVE_DIR": "/srv/live"}, 1000) == "/srv/live"
    assert socket_paths.base_dir({}, 0) == "/run/opspatch-live"
    assert socket_paths.base_dir({}, 1000) == "/tmp/opspatch-live-1000"
    assert (
        socket_paths.socket_path({}, 0, 4242, "scheduler", 1)
        == "/run/opspatch-live/4242/scheduler-tp1.sock"
    )
    assert socket_paths.socket_name("main") == "main.sock"
    assert socket_paths.socket_name("detokenizer") == "detokenizer.sock"
    with pytest.raises(ValueError, match="TP rank"):
        socket_paths.socket_name("scheduler")
    with pytest.raises(ValueError, match="role"):
        socket_paths.socket_name("router")


def test_sglang_plugins_without_opspatch_live_is_said_not_ignored() -> None:
    said = socket_paths.plugins_filtered_out({"SGLANG_PLUGINS": "other, more"})
    assert said is not None
    assert "SGLANG_PLUGINS=other, more" in said and "add opspatch_live" in said
    assert socket_paths.plugins_filtered_out({"SGLANG_PLUGINS": "other,opspatch_live"}) is None
    assert socket_paths.plugins_filtered_out({"SGLANG_PLUGINS": " "}) is None
    assert socket_paths.plugins_filtered_out({}) is None


# -- the distribution ----------------------------------------------------------------------------


def test_the_distribution_records_every_file_and_declares_the_entry_point() -> None:
    files = livedist.live_distribution("0.1.0", livedist.plugin_sources())
    dist_info = "opspatch_live-0.1.0.dist-info"
    assert files[f"{dist_info}/entry_points.txt"] == (
        b"[sglang.srt.plugins]\nopspatch_live = opspatch_live.plugin:load\n"
    )
    assert livedist.PTH_FILE not in files
    rows = files[f"{dist_info}/RECORD"].decode().splitlines()
    assert rows[-1] == f"{dist_info}/RECORD,,"
    recorded = {row.split(",")[0]: row.split(",")[1:] for row in rows[:-1]}
    assert set(recorded) == set(files) - {f"{dist_info}/RECORD"}
    for path, (digest, size) in recorded.items():
        assert digest == record_hash(files[path]) and int(size) == len(files[path])


def test_the_pth_start_replaces_the_entry_point_for_releases_without_the_framework() -> None:
    files = livedist.live_distribution("0.1.0", livedist.plugin_sources(), start="pth")
    assert files[livedist.PTH_FILE] == (
        b"import opspatch_live.plugin as _p; _p.start_at_interpreter_start()\n"
    )
    assert "opspatch_live-0.1.0.dist-info/entry_points.txt" not in files
    assert "opspatch_live.pth" in files["opspatch_live-0.1.0.dist-info/RECORD"].decode()


def test_a_bad_version_or_a_file_outside_the_package_is_refused() -> None:
    with pytest.raises(ValueError, match="version"):
        livedist.live_distribution("1.0/../x", {})
    with pytest.raises(ValueError, match="sglang/x.py"):
        livedist.live_distribution("1.0", {"sglang/x.py": b""})


# -- one process's socket ------------------------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a Unix socket path has at most 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="ol", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def listening(path: str, answer: Any) -> Iterator[listener.Listener]:
    live = listener.Listener(path, answer)
    live.start()
    try:
        yield live
    finally:
        live.close()


def test_a_socket_lives_in_a_private_folder_and_answers_one_line(short_dir: Path) -> None:
    env = {"OPSPATCH_LIVE_DIR": str(short_dir / "base")}
    path = listener.prepare_socket_path(env, 4242, "detokenizer", None)
    assert path == str(short_dir / "base" / "4242" / "detokenizer.sock")
    folder = os.stat(short_dir / "base" / "4242")
    assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.geteuid()

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "took": [], "echo": request}

    with listening(path, answer):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert wire.ask(path, {"op": "ping"})["echo"] == {"op": "ping"}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(path)
            raw.sendall(b"not json\n")
            reply = wire.read_document(raw.makefile("rb"))
        assert reply["ok"] is False and reply["refused"]["code"] == "bad-request"
    assert not os.path.exists(path)


def test_a_refused_peer_that_sends_late_still_reads_why(short_dir: Path) -> None:
    """A peer of another uid is refused whatever it asks; its request is read first, so one
    that sends only once the listener decided is not cut off with a broken pipe (seen under
    load: tests/test_live_delivery.py's peer run as nobody)."""
    path = str(short_dir / "s.sock")
    with listening(path, lambda request: {"ok": True}) as live:
        live.allowed_uids = frozenset({os.geteuid() + 1})  # this process is the foreign peer
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(path)
            # a listener that refused before reading sent its refusal unasked and closed: give
            # it 2 s to (the request read first, nothing comes, and the wait only costs time)
            if select.select([raw], [], [], 2.0)[0]:
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and any(
                    t.name == "opspatch-live-request" for t in threading.enumerate()
                ):
                    time.sleep(0.01)
            raw.sendall(b'{"op": "list"}\n')
            reply = wire.read_document(raw.makefile("rb"))
    assert reply["ok"] is False and reply["refused"]["code"] == "peer-not-allowed", reply


def test_a_folder_others_can_enter_or_a_symlink_leaves_live_fixes_off(short_dir: Path) -> None:
    base = short_dir / "base"
    (base / "4242").mkdir(parents=True)
    (base / "4242").chmod(0o755)
    with pytest.raises(listener.LiveDirError, match="mode 755; it must be 0700"):
        listener.prepare_socket_path({"OPSPATCH_LIVE_DIR": str(base)}, 4242, "main", None)
    (short_dir / "elsewhere").mkdir()
    (short_dir / "link").symlink_to(short_dir / "elsewhere")
    with pytest.raises(listener.LiveDirError, match="not a folder"):
        listener.prepare_socket_path(
            {"OPSPATCH_LIVE_DIR": str(short_dir / "link")}, 1, "main", None
        )
    with pytest.raises(listener.LiveDirError, match="set OPSPATCH_LIVE_DIR to a shorter"):
        listener.prepare_socket_path({"OPSPATCH_LIVE_DIR": "/tmp/" + "x" * 100}, 1, "main", None)


def test_a_socket_left_by_a_gone_process_is_replaced_and_a_live_one_is_not(
    short_dir: Path,
) -> None:
    path = str(short_dir / "main.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # bound, never listening: what a killed process leaves
    with listening(path, lambda request: {"ok": True, "took": []}):
        assert wire.ask(path, {"op": "ping"})["ok"] is True
        with pytest.raises(listener.LiveDirError, match="another process listens"):
            listener.Listener(path, lambda request: {}).start()


def _socket_file(path: Path) -> None:
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(path))
    left.close()


def test_the_folders_of_servers_that_are_gone_are_removed_and_no_other(short_dir: Path) -> None:
    """Real SGLang 0.5.23 stopped by a signal kills its own main process (no exit handler runs),
    leaving its socket folder: the next server's main removes those of pids no process has."""
    no_process = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids stay below it
    gone, running, mine = (
        short_dir / str(no_process),
        short_dir / str(os.getppid()),
        short_dir / "7",
    )
    for folder in (gone, running, mine):
        folder.mkdir(mode=0o700)
        _socket_file(folder / "main.sock")
    _socket_file(gone / "scheduler-tp1.sock")
    other = (
        short_dir / str(no_process - 1) if not Path(f"/proc/{no_process - 1}").exists() else None
    )
    if other is not None:  # a gone pid's folder that holds more than sockets is not ours to clear
        other.mkdir(mode=0o700)
        (other / "notes.txt").write_text("kept")
    (short_dir / "not-a-pid").mkdir()

    removed = listener.remove_dead_servers(str(short_dir), keep=7)

    assert removed == [str(gone)] and not gone.exists()
    assert (running / "main.sock").exists() and (mine / "main.sock").exists()
    assert other is None or (other / "notes.txt").exists()
    assert (short_dir / "not-a-pid").is_dir()
    assert listener.remove_dead_servers(str(short_dir / "absent"), keep=7) == []


# -- what a process answers ------------------------------------------------------------------------


class StubFixes(types.ModuleType):
    """The fix runtime's interface (`take`, `revert`, `list`), recording what it was given."""

    def __init__(self) -> None:
        super().__init__("opspatch.hosts.liveplugin.fixes")
        self.took: dict[str, Any] = {}

    def take(self, request: dict[str, Any]) -> dict[str, Any]:
        self.took[request["fix_id"]] = request["definitions"]
        return {"ok": True, "took": [{"fix_id": request["fix_id"]}]}

    def revert(self, fix_id: str) -> dict[str, Any]:
        self.took.pop(fix_id, None)
        return {"ok": True, "took": []}

    def list(self) -> dict[str, Any]:
        return {"ok": True, "took": [{"fix_id": fix_id} for fix_id in self.took]}


@pytest.fixture
def fixes(monkeypatch: pytest.MonkeyPatch) -> StubFixes:
    stub = StubFixes()
    monkeypatch.setitem(sys.modules, "opspatch.hosts.liveplugin.fixes", stub)
    return stub


def test_ping_says_whether_the_entry_point_or_the_pth_line_started_the_plugin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On real SGLang `load_plugins()` runs before any log is set up, so no log line says which
    start loaded the plugin: each process's `ping` does."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(answers, "started_by", answers.START_ENTRY_POINT)
    pong = answers.apply_here({"op": "ping"})
    assert pong == {"ok": True, "took": [], "start": "entry-point", "gc_frozen": 0}
    plugin.start_at_interpreter_start()
    assert answers.apply_here({"op": "ping"})["start"] == "pth"


def test_a_request_is_applied_here_by_the_fix_runtime_and_a_failure_is_a_refusal(
    fixes: StubFixes, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert answers.apply_here(TAKE)["took"] == [{"fix_id": "fix-1"}]
    assert answers.apply_here({"op": "list"})["took"] == [{"fix_id": "fix-1"}]
    assert answers.apply_here({"op": "revert", "fix_id": "fix-1"})["ok"] is True
    assert answers.apply_here({"op": "list"})["took"] == []
    unknown = answers.apply_here({"op": "exec"})
    assert (
        unknown["refused"]["code"] == "bad-request"
        and "take, revert, list, check, ping" in (unknown["refused"]["message"])
    )

    def broken(request: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("path")

    monkeypatch.setattr(fixes, "take", broken)
    assert answers.apply_here(TAKE)["refused"] == {
        "code": "plugin-error",
        "message": "KeyError: 'path'",
    }


# -- the scheduler's boundary ----------------------------------------------------------------------


@dataclass
class RpcReqInput:
    method: str
    parameters: dict[str, Any] | None = None


@dataclass
class Group:
    rank_in_group: int
    world_size: int = 1


class Receiver:
    """0.5.23's `SchedulerRequestReceiver`: the entry rank pulls a list, the others None."""

    def __init__(self, entry: bool) -> None:
        self.entry = entry

    def _pull_raw_reqs(self) -> list[Any] | None:
        return [] if self.entry else None


class Scheduler:
    """0.5.23's `handle_rpc_request`: the method by name, then the barrier, then an output."""

    barriers = 0

    def __init__(self, rank: int = 0) -> None:
        self.tp_group = Group(rank)
        self.recv_from_tokenizer = object() if rank == 0 else None

    def handle_rpc_request(self, recv_req: RpcReqInput) -> str:
        getattr(self, recv_req.method)(**(recv_req.parameters or {}))
        Scheduler.barriers += 1
        return "output for the RPC caller"

    def plain(self) -> None:
        pass


def fake_sglang(monkeypatch: pytest.MonkeyPatch, **classes: type) -> None:
    """Fake SGLang modules in sys.modules, as a scheduler process has them loaded."""
    places = {
        "Scheduler": boundary.SCHEDULER_MODULE,
        "SchedulerRequestReceiver": boundary.RECEIVER_MODULE,
        "RpcReqInput": boundary.IO_STRUCT_MODULE,
    }
    for name, cls in classes.items():
        module = types.ModuleType(places[name])
        setattr(module, name, cls)
        monkeypatch.setitem(sys.modules, places[name], module)


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch) -> boundary.SchedulerBoundary:
    fresh = boundary.SchedulerBoundary()
    monkeypatch.setattr(boundary, "STATE", fresh)
    return fresh


def fresh_classes() -> tuple[type[Scheduler], type[Receiver]]:
    """Subclasses of their own, so the hooks one test sets stay on its classes."""
    return type("Scheduler", (Scheduler,), {}), type("Receiver", (Receiver,), {})


def submit_in_thread(state: boundary.SchedulerBoundary, timeout: float) -> dict[str, Any]:
    replies: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: replies.update(state.submit(TAKE, timeout)))
    thread.start()
    return {"thread": thread, "replies": replies}


def test_a_take_rides_the_next_pull_and_is_answered_after_the_barrier(
    monkeypatch: pytest.MonkeyPatch, state: boundary.SchedulerBoundary, fixes: StubFixes
) -> None:
    scheduler_class, receiver_class = fresh_classes()
    fake_sglang(
        monkeypatch,
        Scheduler=scheduler_class,
        SchedulerRequestReceiver=receiver_class,
        RpcReqInput=RpcReqInput,
    )
    listened: list[int | None] = []
    assert boundary.install(listened.append)
    scheduler, receiver = scheduler_class(), receiver_class(entry=True)
    assert listened == [0] and state.entry

    assert receiver._pull_raw_reqs() == []  # nothing queued: the boundary passes as it was
    pending = submit_in_thread(state, timeout=60)
    while not state._queued:
        threading.Event().wait(0.01)
    pulled = receiver._pull_raw_reqs()
    assert [message.method for message in pulled] == ["opspatch_live"]
    assert fixes.took == {}  # queued and pulled, applied only when dispatched

    barriers = Scheduler.barriers
    assert scheduler.handle_rpc_request(pulled[0]) is None  # nothing for the RPC caller
    assert Scheduler.barriers == barriers + 1
    pending["thread"].join(10)
    reply = pending["replies"]
    assert reply["ok"] is True and fixes.took == {"fix-1": TAKE["definitions"]}
    assert [rank["process"]["rank"] for rank in reply["ranks"]] == [0]
    assert reply["ranks"][0]["process"]["boundary"] == 2  # the second pull

    assert scheduler.handle_rpc_request(RpcReqInput("plain")) == "output for the RPC caller"


def test_a_take_no_boundary_reaches_is_withdrawn_and_applied_nowhere(
    monkeypatch: pytest.MonkeyPatch, state: boundary.SchedulerBoundary, fixes: StubFixes
) -> None:
    scheduler_class, receiver_class = fresh_classes()
    fake_sglang(
        monkeypatch,
        Scheduler=scheduler_class,
        SchedulerRequestReceiver=receiver_class,
        RpcReqInput=RpcReqInput,
    )
    boundary.install(lambda rank: None)
    scheduler_class()
    reply = state.submit(TAKE, timeout=0.05)
    assert reply["refused"]["code"] == "no-boundary"
    assert "nothing was applied" in reply["refused"]["message"]
    assert receiver_class(entry=True)._pull_raw_reqs() == [] and fixes.took == {}


def test_take_and_revert_go_to_the_entry_rank_only(
    monkeypatch: pytest.MonkeyPatch, state: boundary.SchedulerBoundary
) -> None:
    scheduler_class, receiver_class = fresh_classes()
    fake_sglang(
        monkeypatch,
        Scheduler=scheduler_class,
        SchedulerRequestReceiver=receiver_class,
        RpcReqInput=RpcReqInput,
    )
    boundary.install(lambda rank: None)
    scheduler_class(rank=1)
    refused = state.submit(TAKE)["refused"]
    assert refused["code"] == "not-entry-rank" and "scheduler-tp0" in refused["message"]
    assert receiver_class(entry=False)._pull_raw_reqs() is None


class OldScheduler(Scheduler):
    """0.5.10's shape: no receiver; `recv_requests` pulls `recv_pyobj` until the socket is dry."""

    def __init__(self, rank: int = 0) -> None:
        super().__init__(rank)
        self.recv_from_tokenizer = DrySocket()

    def recv_requests(self) -> list[Any]:
        pulled = []
        while True:
            try:
                pulled.append(self.recv_from_tokenizer.recv_pyobj(1))
            except BlockingIOError:
                return pulled


class DrySocket:
    def recv_pyobj(self, flags: int) -> Any:
        raise BlockingIOError


def test_releases_without_a_receiver_read_the_take_from_the_entry_ranks_socket(
    monkeypatch: pytest.MonkeyPatch, state: boundary.SchedulerBoundary, fixes: StubFixes
) -> None:
    scheduler_class = type("OldScheduler", (OldScheduler,), {})
    fake_sglang(monkeypatch, Scheduler=scheduler_class, RpcReqInput=RpcReqInput)
    monkeypatch.delitem(sys.modules, boundary.RECEIVER_MODULE, raising=False)
    boundary.install(lambda rank: None)
    scheduler = scheduler_class()
    pending = submit_in_thread(state, timeout=60)
    while not state._queued:
        threading.Event().wait(0.01)
    pulled = scheduler.recv_requests()
    assert [message.method for message in pulled] == ["opspatch_live"]
    assert isinstance(scheduler.recv_from_tokenizer, DrySocket)  # the real one back in place
    scheduler.handle_rpc_request(pulled[0])
    pending["thread"].join(10)
    assert pending["replies"]["ok"] is True and "fix-1" in fixes.took


def test_one_rank_refusing_makes_the_whole_reply_a_refusal_naming_it() -> None:
    took = {"ok": True, "took": [{"fix_id": "f"}], "process": {"rank": 0}}
    refused = {
        "ok": False,
        "took": [],
        "refused": {"code": "hash-mismatch", "message": "the file changed"},
        "process": {"rank": 1},
    }
    combined = boundary.every_rank([took, refused])
    assert combined["ok"] is False and combined["took"] == [{"fix_id": "f"}]
    assert combined["refused"] == {
        "code": "hash-mismatch",
        "message": "TP rank 1: the file changed",
    }
    assert combined["ranks"] == [took, refused]


def test_a_method_is_wrapped_once_however_often_the_plugin_loads() -> None:
    class Target:
        def step(self, value: int) -> int:
            return value + 1

    calls: list[int] = []

    def hook(original: Any, instance: Any, value: int) -> int:
        calls.append(value)
        return int(original(instance, value)) * 10

    assert hooks.around(Target, "step", hook) and hooks.around(Target, "step", hook)
    assert Target().step(1) == 20 and calls == [1]
    assert not hooks.around(Target, "missing", hook)
