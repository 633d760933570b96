"""`opspatch apply --live` at the command line, on the incident's TP=2 stand-in server (CUDA graph
capture failed, the worker kept half-built: its first decode would crash it), opspatch's plugin
loaded in every process, the host in an inventory with `live = true` and a `command` restart
(started by that command, as opspatch starts it).

The refusals first, each exit 2 and nothing changed (the file's bytes, every pid of the engine,
one clear message): a change whose free variables change (a new `super()`) and a change of a
restart-only module (the CUDA graph runner) are refused in preflight from their live form, never
restarted instead. Below the CLI, at the agent's `live` operation: an agent run as `nobody`
(neither root nor the engine's user) kept out by the sockets' folder and, the folder opened by
mistake, refused by every socket for its uid (the CLI refuses on that reply, exit 2:
test_live_apply_scripted.py; a fleet whose agent runs as such a user needs another user's
engine, which the test fleets do not build cheaply); and a take naming a sha256 the file does
not have, refused by every rank, nothing held after. They share the module's engine honestly:
each leaves it as it found it.

Then the issue's "a restart later keeps the fix through the file": eagle-init-guard taken live,
the engine restarted the operator's way (the inventory's restart command, not a rollback): a new
pid, the first decode passes, and `status` says applied with no live fix in memory and no drift.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opspatch.core.live import LiveDefinition
from opspatch.core.vocabulary import LiveKind
from opspatch.hosts.agent import live as agent_live
from opspatch.hosts.live import LiveEngineReply, LiveFix, ask_engine
from opspatch.hosts.liveplugin import socket_paths, wire
from opspatch.sandbox.dist import engine_source_dir
from tests.enginekit import HOST, LiveHost, running_live_host

pytestmark = pytest.mark.engine

THRESHOLD = "EAGLEWorkerV2.spec_disable_batch_threshold"
CUDA_GRAPH_RUNNER = "sglang.srt.model_executor.cuda_graph_runner"


def edit_patch(patch_id: str, module: str, scope: str, code: str) -> str:
    """A one-edit patch: `code` inserted at the start of `scope` in `module`."""
    return f'''
id = "{patch_id}"
summary = "A test change of {scope}"
preserves_output = true
rationale = "made by the test to be refused live"

[target]
module = "{module}"
distribution = "sglang"
versions = ">=0.5.4"
min_python = "3.10"

[[edits]]
kind = "insert"
scope = "{scope}"
position = "start"
code = """
{code}
"""
'''


@pytest.fixture(scope="module")
def live_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveHost]:
    with running_live_host(tmp_path_factory.mktemp("live-cli")) as made:
        yield made


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused_live(live_host: LiveHost, patch_id: str, text: str, module: str) -> dict[str, Any]:
    """`apply --live` of the patch `text`: exit 2, the module's file and every pid unchanged;
    the host's outcome."""
    (live_host.workspace / "patches" / f"{patch_id}.toml").write_text(text)
    target = live_host.standin.module_file(module)
    before, pids = sha(target), live_host.pids()
    run = live_host.opspatch("apply", patch_id, "--hosts", HOST, "--live", "--yes", "--json")
    assert run.code == 2, run.stdout + run.stderr
    assert sha(target) == before
    assert live_host.pids() == pids  # nothing restarted, nothing started
    doc = run.json()
    assert "cannot be taken live on gpu-01" in doc["halted"], doc["halted"]
    assert "apply without --live to apply it with a restart" in doc["halted"]
    (outcome,) = doc["hosts"]
    assert outcome["outcome"] == "skipped", outcome
    assert not {"backup", "swap", "restart"} & {s["step"] for s in outcome["steps"]}
    return outcome


def test_a_change_whose_free_variables_change_is_refused_live_and_nothing_changes(
    live_host: LiveHost,
) -> None:
    text = edit_patch(
        "eagle-super-test",
        "sglang.srt.speculative.eagle_worker_v2",
        "EAGLEWorkerV2.should_disable_speculation",
        "_ = super()  # a closure over __class__ where there was none",
    )
    outcome = refused_live(
        live_host, "eagle-super-test", text, "sglang.srt.speculative.eagle_worker_v2"
    )
    assert outcome["reason"] == "not-taken-live", outcome
    assert outcome["error"].startswith(
        "gpu-01: sglang.srt.speculative.eagle_worker_v2 cannot be taken live: free-variables: "
        "EAGLEWorkerV2.should_disable_speculation's free variables change from () to "
        "('__class__',)"
    ), outcome["error"]
    assert "apply eagle-super-test --hosts gpu-01" in outcome["error"]


def test_a_change_of_a_restart_only_module_is_refused_live_and_nothing_changes(
    live_host: LiveHost,
) -> None:
    text = edit_patch(
        "graph-runner-test",
        CUDA_GRAPH_RUNNER,
        "CudaGraphRunner.captured_batch_sizes",
        "_ = 0",
    )
    outcome = refused_live(live_host, "graph-runner-test", text, CUDA_GRAPH_RUNNER)
    assert outcome["reason"] == "not-taken-live", outcome
    assert outcome["error"].startswith(
        f"gpu-01: {CUDA_GRAPH_RUNNER} cannot be taken live: restart-only-module: "
        f"{CUDA_GRAPH_RUNNER} is restart-only"
    ), outcome["error"]


def diff_patch(live_host: LiveHost, patch_id: str, module: str, old: str, new: str) -> str:
    """A one-hunk `diff` patch of the stand-in's file of `module`: `old` replaced by `new`."""
    path = live_host.standin.module_file(module)
    text = path.read_text()
    assert text.count(old) == 1, old
    relative = module.replace(".", "/") + ".py"
    diff = "".join(
        difflib.unified_diff(
            text.splitlines(keepends=True),
            text.replace(old, new).splitlines(keepends=True),
            f"a/{relative}",
            f"b/{relative}",
        )
    )
    header = edit_patch(patch_id, module, "", "").split("[[edits]]")[0]
    return header + f"[[edits]]\nkind = \"diff\"\ndiff = '''\n{diff}'''\n"


def stand_in_line(module: str, text: str) -> int:
    """The 1-based line of `text` in the stand-in's source of `module` (the stand-in moves)."""
    source = (engine_source_dir() / (module.replace(".", "/") + ".py")).read_text().splitlines()
    return next(number for number, line in enumerate(source, 1) if text in line)


def engine_refusal(live_host: LiveHost, patch_id: str, text: str, module: str) -> str:
    """`apply --live` refused by what the engine's processes answer to the preflight's check
    (exit 2, nothing changed: `refused_live`); the host's error."""
    error = str(refused_live(live_host, patch_id, text, module)["error"])
    assert error.startswith(f"gpu-01: {module} cannot be taken live: "), error
    return error


def test_a_changed_init_of_the_scheduler_the_server_built_is_refused_live(
    live_host: LiveHost,
) -> None:
    """Issue 42, 1: the Scheduler is built once, at start; a change of its `__init__` would
    never reach it (before: taken and reported applied, the running object unchanged)."""
    text = edit_patch(
        "scheduler-init-test",
        "sglang.srt.managers.scheduler",
        "Scheduler.__init__",
        "self.limit_from_the_fix = 1",
    )
    error = engine_refusal(live_host, "scheduler-init-test", text, "sglang.srt.managers.scheduler")
    assert "built-objects: Scheduler.__init__ runs only while a Scheduler is built, and 1 " in error
    assert "(in scheduler-tp0 (pid " in error and "scheduler-tp1 (pid " in error, error


def test_a_constant_a_dataclass_field_read_at_import_is_refused_live(
    live_host: LiveHost,
) -> None:
    """Issue 42, 2: `max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS` in SamplingParams copied the
    old value when the module was imported (before: the constant taken everywhere, requests
    still built with 128)."""
    module = "sglang.srt.sampling.sampling_params"
    text = diff_patch(
        live_host,
        "max-new-tokens-test",
        module,
        "DEFAULT_MAX_NEW_TOKENS = 128",
        "DEFAULT_MAX_NEW_TOKENS = 64",
    )
    error = engine_refusal(live_host, "max-new-tokens-test", text, module)
    field_line = stand_in_line(module, "max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS")
    assert (
        f"captured-at-import: DEFAULT_MAX_NEW_TOKENS is read while {module} is imported "
        f"(line {field_line}, class SamplingParams's body)" in error
    ), error
    assert "the defaults of SamplingParams.from_request" in error, error


def test_a_change_of_the_scheduler_loop_whose_frame_never_returns_is_refused_live(
    live_host: LiveHost,
) -> None:
    """Issue 42, 3: `Scheduler.event_loop` runs in one frame for the server's life (before:
    its code swapped on every rank and reported applied; the new code never ran)."""
    text = edit_patch(
        "event-loop-test", "sglang.srt.managers.scheduler", "Scheduler.event_loop", "_ = 0"
    )
    error = engine_refusal(live_host, "event-loop-test", text, "sglang.srt.managers.scheduler")
    assert (
        "never-returns: Scheduler.event_loop runs in a frame that stayed on thread MainThread's "
        "stack across two scheduling boundaries" in error
    ), error
    assert "scheduler-tp0 (pid " in error and "scheduler-tp1 (pid " in error, error


def test_a_module_no_process_imported_is_refused_live_before_any_swap(
    live_host: LiveHost,
) -> None:
    """Issue 42, 4: the standalone worker is imported only for STANDALONE speculation (before:
    swapped, every process answered module-not-loaded, rolled back, exit 1)."""
    module = "sglang.srt.speculative.standalone_worker_v2"
    text = edit_patch("standalone-test", module, "StandaloneWorkerV2.__init__", "_ = 0")
    error = engine_refusal(live_host, "standalone-test", text, module)
    assert f"not-imported: no process of the engine has imported {module} (main" in error, error


AGENT_AS_OTHER_USER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import opspatch.hosts.agent.live as live
assert live.__file__.startswith(sys.argv[1]), live.__file__  # the copy, nothing else
print(json.dumps(live.op_live(json.loads(sys.argv[2]))))
"""


def agent_live_as_nobody(live_host: LiveHost, folder: Path) -> LiveEngineReply:
    """The agent's `live` operation (a `list`) run as `nobody`, neither root nor the engine's
    user, from a copy of the agent package (only it travels to a host) with the system's
    interpreter (nobody cannot enter root's home, where this one may live)."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 for the agent run as nobody")
    agent = folder / "opspatch" / "hosts" / "agent"
    shutil.copytree(
        Path(agent_live.__file__).parent, agent, ignore=shutil.ignore_patterns("__pycache__")
    )
    for package in (folder / "opspatch", folder / "opspatch" / "hosts"):
        (package / "__init__.py").write_text("")
    for path in (folder, *folder.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    closed = [p for p in folder.parents if not p.stat().st_mode & 0o001]
    assert not closed, f"nobody cannot reach the agent's copy: {closed[0]} is not searchable"
    request = {
        "fix": {"op": "list"},
        "pid": live_host.pid(),
        "pid_file": None,
        "url": "",
        "env": {socket_paths.LIVE_DIR_ENV: str(live_host.live_dir)},
        "timeout": 30,
    }
    done = subprocess.run(
        # -I -S: the copy alone, never an opspatch the environment or site-packages offer
        [python, "-I", "-S", "-c", AGENT_AS_OTHER_USER, str(folder), json.dumps(request)],
        user="nobody",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return LiveEngineReply.from_json(json.loads(done.stdout))


@pytest.mark.root
def test_an_agent_of_another_uid_is_refused_by_the_folder_and_by_every_socket(
    live_host: LiveHost,
) -> None:
    """The proof at the agent's operation (a host's agent run as a user that is neither root
    nor the engine's is what the refusal needs; the CLI's preflight refuses the run on the
    reply it gives, `test_live_apply_scripted`). The sockets' folder keeps it out; opened to
    everyone by mistake, each process's socket refuses it for its uid (SO_PEERCRED)."""
    if os.geteuid() != 0:
        pytest.skip("running the agent as another user needs root")
    folder = Path(tempfile.mkdtemp(prefix="opspatch-agent-", dir="/tmp"))
    folder.chmod(0o755)  # mkdtemp's 0700 would keep nobody out of the copies below it
    (server,) = [d for d in live_host.live_dir.iterdir() if d.is_dir()]  # the server's main pid
    sockets = sorted(server.glob("*.sock"))
    modes = {path: path.stat().st_mode & 0o777 for path in (live_host.live_dir, server, *sockets)}
    try:
        kept_out = agent_live_as_nobody(live_host, folder / "closed")
        assert kept_out.answers == () and kept_out.missing is not None
        said = kept_out.missing
        assert "runs as uid 0 and this agent as uid 65534" in said, said
        assert "live sockets admit only root and the engine's user" in said, said
        for path in modes:  # opened to everyone by mistake: the agent still does not ask (the
            path.chmod(0o666 if path in sockets else 0o755)  # sockets' own refusal of such a
        refused = agent_live_as_nobody(live_host, folder / "open")  # peer: test_live_delivery)
        assert refused.answers == () and refused.unread, refused
        assert "runs as uid 0 and this agent as uid 65534" in (refused.missing or "")
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
        shutil.rmtree(folder, ignore_errors=True)
    assert wire.ask(str(sockets[0]), {"op": "list"})["ok"] is True  # root still is


def test_a_take_whose_sha256_is_not_the_files_is_refused_and_nothing_is_held(
    live_host: LiveHost,
) -> None:
    """Through the agent's `live` operation, as a run sends it: the file on disk is not the
    bytes the request names, so every process refuses and none holds anything after."""
    module = "sglang.srt.speculative.eagle_worker_v2"
    path = live_host.standin.module_file(module)
    control = live_host.engine()
    wrong = LiveFix(
        "take",
        fix_id="eagle-init-guard",
        module=module,
        path=str(path),
        sha256=hashlib.sha256(path.read_bytes() + b"# not on disk").hexdigest(),
        definitions=(LiveDefinition(THRESHOLD, LiveKind.CLASS_ATTRIBUTE),),
    )
    reply = ask_engine(control.ops, wrong, timeout=30)
    ranks = [p for p in reply.processes() if p.process.startswith("scheduler-")]
    assert [p.process for p in ranks] == ["scheduler-tp0", "scheduler-tp1"], reply
    assert all(p.code == "hash-mismatch" and not p.ok for p in ranks), ranks
    others = [p for p in reply.processes() if p not in ranks]
    assert all(not p.ok for p in others), others  # never imported it: nothing taken there
    listed = ask_engine(control.ops, LiveFix("list"), timeout=30).processes()
    assert len(listed) == 4 and all(p.ok and p.took == () for p in listed), listed


def test_a_restart_later_keeps_the_live_fix_through_the_file(live_host: LiveHost) -> None:
    """Last in the module: it changes the shared engine (the fix taken, then a restart)."""
    shutil.copy(
        Path(__file__).resolve().parent.parent / "patches" / "eagle-init-guard.toml",
        live_host.workspace / "patches",
    )
    failed = live_host.log().count("CUDA graph capture failed")
    assert failed >= 1  # the incident's half-built worker
    pid = live_host.pid()
    run = live_host.opspatch(
        "apply", "eagle-init-guard", "--hosts", HOST, "--live", "--yes", "--json"
    )
    assert run.code == 0, run.stdout + run.stderr
    assert live_host.pid() == pid
    held = status_row(live_host)
    assert held["state"] == "applied" and held["live"], held  # in memory, and in the file
    module = "sglang.srt.speculative.eagle_worker_v2"  # issue 42, 4: another fix of what this
    again = edit_patch("eagle-again-test", module, "EAGLEWorkerV2.__init__", "_ = 0")  # holds
    error = engine_refusal(live_host, "eagle-again-test", again, module)  # before: swapped,
    assert (  # refused at the take, rolled back (exit 1)
        f"already-held: {module}.EAGLEWorkerV2.__init__ is held by live fix eagle-init-guard"
        in error
    ), error
    diagnose_after_the_live_fix(live_host)
    live_host.restart()  # the operator's restart: the inventory's command, not a rollback
    assert live_host.pid() != pid
    assert live_host.log().count("CUDA graph capture failed") > failed  # half-built again
    assert live_host.decode() == 200  # the first decode of the new engine: the file's fix
    row = status_row(live_host)
    assert row["state"] == "applied", row
    assert "live" not in row, row  # no live fix in memory: the new processes run the file
    assert "drift" not in json.dumps(row), row
    assert "could not be listed" not in row["detail"], row  # its engine was asked


def status_row(live_host: LiveHost) -> dict[str, Any]:
    """eagle-init-guard's row of `status --json` on the host."""
    status = live_host.opspatch("status", "--hosts", HOST, "--patch", "eagle-init-guard", "--json")
    assert status.code == 0, status.stdout + status.stderr
    (row,) = status.json()["status"]
    return row  # type: ignore[no-any-return]


def diagnose_after_the_live_fix(live_host: LiveHost) -> None:
    """Issue 42, 6: the server started before the file changed but runs its change live, which
    `diagnose` says (naming the fix and the processes) as `status` says applied, where it said
    "it still runs the old code" (exit 1). With the patch given by path (no workspace patch
    names the module) the fix's file is still read and its drift said."""
    module = "sglang.srt.speculative.eagle_worker_v2"
    run = live_host.opspatch("diagnose", "--hosts", HOST, "--json")
    findings = {f["kind"]: f for f in run.json()["hosts"][0]["findings"]}
    assert "server-runs-old-code" not in findings, findings
    assert run.code == 0, findings  # was 1: a problem the server does not have
    assert findings["live-fix"]["text"] == (
        f"the server started before {module} last changed and runs it live as eagle-init-guard "
        "in scheduler-tp0, scheduler-tp1"
    ), findings["live-fix"]
    text = live_host.opspatch("diagnose", "--hosts", HOST).stdout
    assert "runs it live as eagle-init-guard in scheduler-tp0, scheduler-tp1" in text, text
    patch = live_host.workspace / "patches" / "eagle-init-guard.toml"
    elsewhere = live_host.root / "eagle-init-guard.toml"
    target = live_host.standin.module_file(module)
    taken = target.read_bytes()
    patch.rename(elsewhere)  # applied by its path: no workspace patch names the module
    target.write_bytes(taken + b"# changed since the fix was taken\n")
    try:
        run = live_host.opspatch("diagnose", "--hosts", HOST, "--json")
        kinds = [f["kind"] for f in run.json()["hosts"][0]["findings"]]
        assert "live-fix-drift" in kinds, kinds
    finally:
        target.write_bytes(taken)
        elsewhere.rename(patch)
