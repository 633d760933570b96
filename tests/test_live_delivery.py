"""The live-fix delivery path on real stand-in servers: `opspatch_live` installed into a host's
environment as its distribution (entry point of `sglang.srt.plugins`) is loaded by SGLang's plugin
framework in every process of a TP=2 server, each process listens on its own socket, and a take
sent to the entry rank's socket is applied by both scheduler ranks at one scheduling boundary
while the server keeps answering, no process restarted.

The fix runtime is the real one (`liveplugin/fixes.py`): the class default is taken from the
file the request names, its hash checked, and read back by `list` in every rank.
"""

from __future__ import annotations

import contextlib
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

from opspatch.hosts import livedist
from opspatch.hosts.liveplugin import socket_paths, wire
from opspatch.sandbox.dist import upstream_fixed
from tests.enginekit import (
    ALL_SOCKETS,
    children_of,
    comm,
    tree_of,
    wait_for_frozen_collectors,
    wait_for_sockets,
)
from tests.standin import StandinHost, make_host, running_engine

pytestmark = pytest.mark.engine

TP2 = ("--tp-size", "2")
HEALTHY = (*TP2, "--disable-cuda-graph")
EAGLE_MODULE = "sglang.srt.speculative.eagle_worker_v2"
THRESHOLD = "EAGLEWorkerV2.spec_disable_batch_threshold"
DECODE = {"text": "Hello", "sampling_params": {"max_new_tokens": 12, "temperature": 0}}


def host_with_plugin(folder: Path, start: livedist.LiveStart) -> StandinHost:
    """A host whose environment has the stand-in and `opspatch_live`."""
    made = make_host(folder)
    for relative, data in livedist.live_distribution(
        "0.1.0", livedist.plugin_sources(), start
    ).items():
        target = made.site_packages / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return made


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> StandinHost:
    return host_with_plugin(tmp_path_factory.mktemp("live-host"), "entry-point")


@pytest.fixture
def live_dir() -> Iterator[Path]:
    """The engine's socket base (`OPSPATCH_LIVE_DIR`), short: a socket path has 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="ol", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def fixed_eagle_worker(host: StandinHost) -> Iterator[tuple[str, str]]:
    """The installed `eagle_worker_v2.py` swapped for a fixed release's (a class default of the
    threshold), as a run swaps the post-image in after the engine imported it: the fix runtime
    takes only from the file the module was loaded from. Its path and sha256; put back after."""
    installed = host.eagle_worker_file
    original = installed.read_bytes()
    fixed = upstream_fixed(original)
    installed.write_bytes(fixed)
    try:
        yield str(installed), hashlib.sha256(fixed).hexdigest()
    finally:
        installed.write_bytes(original)


def take_request(path: str, sha256: str) -> dict[str, Any]:
    return {
        "op": "take",
        "fix_id": "eagle-init-guard",
        "module": EAGLE_MODULE,
        "path": path,
        "sha256": sha256,
        "definitions": [{"name": THRESHOLD, "kind": "class-attribute"}],
    }


def test_every_process_of_a_tp2_server_loads_the_plugin_and_listens(
    host: StandinHost, live_dir: Path
) -> None:
    env = {socket_paths.LIVE_DIR_ENV: str(live_dir)}
    with running_engine(host, HEALTHY, env=env, log_name="loads.log") as engine:
        sockets = wait_for_sockets(live_dir, engine, ALL_SOCKETS)
        assert set(sockets) == ALL_SOCKETS
        folder = live_dir / str(engine.pid)
        assert oct(folder.stat().st_mode & 0o777) == "0o700"
        processes = {
            name: wire.ask(str(path), {"op": "ping"})["process"] for name, path in sockets.items()
        }
        assert processes["main.sock"] == {"role": "main", "rank": None, "pid": engine.pid}
        assert processes["scheduler-tp1.sock"]["role"] == "scheduler"
        assert processes["scheduler-tp1.sock"]["rank"] == 1
        assert processes["detokenizer.sock"]["role"] == "detokenizer"
        # one socket per process of the server, each answered by its own process (the other
        # child of the main process is multiprocessing's resource tracker)
        sglang = {pid for pid in children_of(engine.pid) if comm(pid).startswith("sglang::")}
        assert {p["pid"] for p in processes.values()} == {engine.pid, *sglang}
        # the entry point of group sglang.srt.plugins started it in every process (as on real
        # SGLang, load_plugins() runs before any log is set up: no log line can say so)
        assert {wire.ask(str(path), {"op": "ping"})["start"] for path in sockets.values()} == {
            "entry-point"
        }
        assert f"opspatch live: listening on {sockets['scheduler-tp0.sock']}" in engine.log_text()
        # every process froze its collector after the warm-up, as real SGLang's do
        assert all(wait_for_frozen_collectors(sockets).values())
    assert not folder.exists()  # a main process that exits (not killed) removes its folder


def test_the_pth_start_loads_it_in_every_process_without_the_entry_point(
    tmp_path: Path, live_dir: Path
) -> None:
    """What releases without the plugin framework get: the `.pth` line's finder loads the plugin
    as SGLang's modules are imported (here on the stand-in, which finds no entry point)."""
    pth_host = host_with_plugin(tmp_path / "pth-host", "pth")
    env = {socket_paths.LIVE_DIR_ENV: str(live_dir)}
    with running_engine(pth_host, HEALTHY, env=env, log_name="pth.log") as engine:
        sockets = wait_for_sockets(live_dir, engine, ALL_SOCKETS)
        assert {wire.ask(str(path), {"op": "ping"})["start"] for path in sockets.values()} == {
            "pth"
        }
        with fixed_eagle_worker(pth_host) as (path, sha256):
            reply = wire.ask(str(sockets["scheduler-tp0.sock"]), take_request(path, sha256))
        assert reply["ok"] is True and len(reply["ranks"]) == 2, reply
        assert engine.post("/generate", DECODE).status == 200


def test_a_take_sets_the_attribute_in_every_rank_at_one_boundary_while_the_server_serves(
    host: StandinHost, live_dir: Path
) -> None:
    env = {socket_paths.LIVE_DIR_ENV: str(live_dir)}
    with running_engine(host, HEALTHY, env=env, log_name="take.log") as engine:
        sockets = wait_for_sockets(live_dir, engine, ALL_SOCKETS)
        pids = set(tree_of(engine.pid))
        before = engine.post("/generate", DECODE)
        assert before.status == 200

        with fixed_eagle_worker(host) as (path, sha256):
            refused = wire.ask(str(sockets["scheduler-tp1.sock"]), take_request(path, sha256))
            assert refused["refused"]["code"] == "not-entry-rank"

            mismatch = wire.ask(str(sockets["scheduler-tp0.sock"]), take_request(path, "0" * 64))
            assert mismatch["refused"]["code"] == "hash-mismatch", mismatch
            assert all(r["refused"]["code"] == "hash-mismatch" for r in mismatch["ranks"])

            reply = wire.ask(str(sockets["scheduler-tp0.sock"]), take_request(path, sha256))
        assert reply["ok"] is True, reply
        ranks = reply["ranks"]
        assert [rank["process"]["rank"] for rank in ranks] == [0, 1]
        assert ranks[0]["process"]["boundary"] == ranks[1]["process"]["boundary"]
        assert len({rank["process"]["pid"] for rank in ranks}) == 2
        for name in ("scheduler-tp0.sock", "scheduler-tp1.sock"):
            listed = wire.ask(str(sockets[name]), {"op": "list"})
            assert listed["took"] == [
                {
                    "fix_id": "eagle-init-guard",
                    "module": EAGLE_MODULE,
                    "sha256": sha256,
                    "name": THRESHOLD,
                    "kind": "class-attribute",
                    "value": "0",
                }
            ], name
        assert wire.ask(str(sockets["main.sock"]), {"op": "list"})["took"] == []

        after = engine.post("/generate", DECODE)
        assert after.status == 200 and after.json()["text"] == before.json()["text"]
        assert set(tree_of(engine.pid)) == pids  # no process restarted


def test_the_incidents_server_decodes_once_the_fix_is_taken_live(
    host: StandinHost, live_dir: Path
) -> None:
    """CUDA graph capture fails, the worker is kept half-built: the first decode would crash the
    server. The class default taken live in both ranks lets it decode, no pid changed."""
    env = {socket_paths.LIVE_DIR_ENV: str(live_dir)}
    with running_engine(host, TP2, env=env, log_name="incident.log") as engine:
        assert "CUDA graph capture failed" in engine.log_text()
        sockets = wait_for_sockets(live_dir, engine, ALL_SOCKETS)
        pids = set(tree_of(engine.pid))
        with fixed_eagle_worker(host) as (path, sha256):
            reply = wire.ask(str(sockets["scheduler-tp0.sock"]), take_request(path, sha256))
        assert reply["ok"] is True, reply
        decoded = engine.post("/generate", DECODE)
        assert decoded.status == 200 and decoded.json()["meta_info"]["completion_tokens"] == 12
        assert set(tree_of(engine.pid)) == pids
        assert "Scheduler hit an exception" not in engine.log_text()


def test_sglang_plugins_without_opspatch_live_loads_no_plugin_and_says_so(
    host: StandinHost, live_dir: Path
) -> None:
    env = {socket_paths.LIVE_DIR_ENV: str(live_dir), "SGLANG_PLUGINS": "someone_else"}
    with running_engine(host, HEALTHY, env=env, log_name="filtered.log") as engine:
        assert engine.post("/generate", DECODE).status == 200
        # no process listens (SGLang logs its skip before any log is set up: nowhere)
        assert not (live_dir / str(engine.pid)).exists()
        environ = dict(
            line.split("=", 1)
            for line in Path(f"/proc/{engine.pid}/environ").read_text().split("\0")
            if "=" in line
        )
        said = socket_paths.plugins_filtered_out(environ)
        assert said is not None and "SGLANG_PLUGINS=someone_else" in said


ASK_AS_NOBODY = """
import json, socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    try:
        s.connect(sys.argv[1])
    except PermissionError:
        print("EACCES")
        sys.exit(0)
    s.sendall(b'{"op": "list"}\\n')
    print(s.makefile("rb").readline().decode().strip())
"""


@pytest.mark.root
def test_a_peer_with_another_uid_is_refused(host: StandinHost, live_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("running a client as another user needs root")
    # nobody cannot enter root's home, where this interpreter may live: the system's
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 for the client run as nobody")
    env = {socket_paths.LIVE_DIR_ENV: str(live_dir)}
    with running_engine(host, HEALTHY, env=env, log_name="peer.log") as engine:
        sockets = wait_for_sockets(live_dir, engine, ALL_SOCKETS)
        target = str(sockets["scheduler-tp0.sock"])

        def as_nobody() -> str:
            done = subprocess.run(
                [python, "-c", ASK_AS_NOBODY, target],
                user="nobody",
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            return done.stdout.strip()

        assert as_nobody() == "EACCES"  # the server's folder is root's, mode 0700
        # a folder and socket opened to everyone by mistake: the peer's uid still decides
        live_dir.chmod(0o755)
        (live_dir / str(engine.pid)).chmod(0o755)
        os.chmod(target, 0o666)
        reply = json.loads(as_nobody())
        assert reply["ok"] is False and reply["refused"]["code"] == "peer-not-allowed"
        assert "only root and the engine's user" in reply["refused"]["message"]
        assert wire.ask(target, {"op": "list"})["ok"] is True  # root still is
