"""Fault injection on the sandbox fleet over SSH, and the invariant checked from outside.

`FaultFleet` is a `SandboxFleet` (`opspatch sandbox up --ssh`) prepared for fault tests:

- every host first gets `eagle-init-guard` (so every engine decodes), and the patch under fault
  is `fault-marker`, a harmless module-level addition to the same file that leaves the greedy
  output unchanged and, when the engine imports it, writes a marker file naming the process.
  The markers tell, from outside, which code the running engine really runs;
- the inventory `faults` is the sandbox's `sandbox-ssh` with the canary's engine interpreter
  replaced by a wrapper (`WRAPPER`) with a fault switch: every host operation reaches it as a
  request (a resident agent's line, or `<engine python> -c BOOTSTRAP`'s stdin per exec), so the
  wrapper sees which operation it is and can hold it (the test then kills the controller at exactly that step), or run it and
  then kill the SSH connection or the whole sshd before the reply goes back. Nothing in opspatch
  knows about it: it is an interpreter path in an inventory, as an operator could write one.

`check_invariant` is issue 9's invariant, read from the files and processes themselves: each
host's file is byte-identical to its pre-image or to the patched text, its engine is alive and
answers a greedy decode with the same text as before any fault, the engine runs the code on disk
(markers), no temp file lies beside the target, no host lock is left, the ledger verifies and
`status` says what the file says.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch
from opspatch.errors import OpspatchError
from opspatch.hosts.channel import BOOTSTRAP, RESIDENT
from opspatch.ledger.store import Ledger
from tests.clirunner import Run, opspatch
from tests.fleetkit import SandboxFleet, Slot, alive, wait_until

PATCH_ID = "fault-marker"
INVENTORY = "faults"
TEMP_SUFFIX = ".opspatch-tmp"
LOCK_FILE = "lock.json"

# Seconds a command may take before the test calls it a hang. Generous: a recover of two hosts
# takes a few seconds here; these only turn "no command hangs" into an assertion.
COMMAND_LIMIT = 240

WRAPPER = '''#!{python}
"""The engine interpreter of one sandbox host, with a fault switch (tests/faultkit.py).

Runs the real interpreter on each request unchanged, unless {control}/fault.json names one of
the request's operations (a request is a list of operations, run in order): the first such
request (after "skip" of them) claims the fault (a rename: exactly once) and the fault fires at that operation. The
operations before it run first, as their own exec (a refusal there ends the request as the agent
would: the rest not run), then
- at "before": says so in reached.json and waits for a release file, then drops the operation
  and all after it ("then": "drop", as if the rest never arrived: no reply) or runs them ("then":
  "run");
- at "after": runs it, then either holds (reached.json, wait for release) before the operations
  after it run and the reply goes back, or cuts ("cut": "connection" kills the sshd session
  serving this request; "sshd" kills the sshd listener too), so nothing after it runs and the
  reply never goes back.
Started as the resident agent (`-c RESIDENT`), it speaks that agent's protocol (a receipt line,
then the reply) and runs each request as one exec of the real interpreter, in a fork of its own
(the process a held request names): a request that ends without a reply ends it, as it ends the
real resident agent.
"""
import base64, json, os, signal, subprocess, sys, time, zlib

REAL = {real!r}
CONTROL = {control!r}
ARGV = sys.argv[1:]


def write_json(name, value):
    temp = os.path.join(CONTROL, name + ".tmp")
    with open(temp, "w") as handle:
        json.dump(value, handle)
    os.replace(temp, os.path.join(CONTROL, name))


def claim(ops):
    """(the index of the faulted operation, the fault), once; None if no fault is for these."""
    path = os.path.join(CONTROL, "fault.json")
    try:
        with open(path) as handle:
            fault = json.load(handle)
    except (OSError, ValueError):
        return None
    if fault.get("op") not in ops:
        return None
    if fault.get("skip"):  # let this many requests of the op pass first (a set's second swap)
        fault["skip"] -= 1
        write_json("fault.json", fault)
        return None
    try:
        os.rename(path, os.path.join(CONTROL, "claimed.json"))
    except OSError:
        return None
    return ops.index(fault["op"]), fault


def unclaim():
    os.rename(os.path.join(CONTROL, "claimed.json"), os.path.join(CONTROL, "fault.json"))


def hold(fault, op):
    write_json("reached.json", {{"op": op, "at": fault["at"], "pid": os.getpid()}})
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(CONTROL, "release")):
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)


def sshd_ancestors():
    """This request's sshd processes, nearest first: session process(es), then the listener."""
    found, pid = [], os.getppid()
    while pid > 1:
        try:
            with open("/proc/%d/stat" % pid) as handle:
                stat = handle.read()
        except OSError:
            break
        if stat[stat.index("(") + 1 : stat.rindex(")")].startswith("sshd"):
            found.append(pid)
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def cut(kind, op):
    chain = sshd_ancestors()
    sessions, listener = chain[:-1], chain[-1:]
    write_json("reached.json", {{"op": op, "at": "after", "pid": os.getpid(), "cut": kind,
                                 "sessions": sessions, "listener": listener}})
    for pid in (listener if kind == "sshd" else []) + sessions:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def run(head, request, calls):
    """`calls` of the request as one exec of the real interpreter: (its replies or None, the
    process as it ended)."""
    line = json.dumps(dict(request, ops=calls)).encode("utf-8")
    done = subprocess.run([REAL] + ARGV, input=head + line + b"\\n", capture_output=True)
    for out in reversed(done.stdout.splitlines()):
        if out.strip():
            try:
                return json.loads(out), done
            except ValueError:
                break
    return None, done


def stopped(calls, reply):
    """Whether the agent stopped after these calls (a refusal, or a gate that did not pass)."""
    for call, answer in zip(calls, reply["replies"]):
        result = answer.get("result")
        passed = isinstance(result, dict) and result.get("ok") is True
        if answer.get("status") != "done" or (call.get("gate") and not passed):
            return True
    return False


def main(data):
    head, _, last = data.rstrip(b"\\n").rpartition(b"\\n")
    head = head + b"\\n" if head else b""
    try:
        request = json.loads(last.decode("utf-8"))
        calls = list(request["ops"])
        ops = [call["op"] for call in calls]
    except (ValueError, KeyError, TypeError):
        request, calls, ops = None, [], []
    claimed = claim(ops) if request is not None else None
    if claimed is None:
        sys.exit(subprocess.run([REAL] + ARGV, input=data).returncode)
    index, fault = claimed
    op = ops[index]
    upto = index if fault["at"] == "before" else index + 1
    replies, identity = [], None
    if upto:
        reply, done = run(head, request, calls[:upto])
        if reply is None:  # no reply from the operations before the fault: the exec's own end
            sys.stdout.buffer.write(done.stdout)
            sys.exit(done.returncode)
        replies, identity = reply["replies"], reply.get("identity")
        if stopped(calls[:upto], reply):  # the agent stops there: nothing after it would run
            replies += [{{"status": "not-run"}} for _ in ops[upto:]]
            if replies[index].get("status") in (None, "not-run"):  # nor the faulted one:
                unclaim()  # the fault is not reached: armed again for the next request
                reply_with(replies, identity)
    if fault["at"] == "before":
        hold(fault, op)
        if fault.get("then") == "drop":
            sys.exit(75)
    elif fault.get("cut"):
        cut(fault["cut"], op)
        sys.exit(0)  # the reply has no way back, and nothing after the faulted operation runs
    else:
        hold(fault, op)
    if len(replies) < len(ops):  # the operations from the fault on (before) or after it
        reply, done = run(head, request, calls[len(replies):])
        if reply is None:
            sys.stdout.buffer.write(done.stdout)
            sys.exit(done.returncode)
        replies += reply["replies"]
        identity = identity or reply.get("identity")
    reply_with(replies, identity)


def reply_with(replies, identity):
    """The one reply line, as the agent prints it, and the end of this exec."""
    try:
        sys.stdout.buffer.write(json.dumps({{"replies": replies, "identity": identity}}).encode())
        sys.stdout.buffer.write(b"\\n")
        sys.stdout.flush()
    except OSError:
        pass
    sys.exit(0)


def serve():
    """The resident agent's protocol, each request one exec of the real interpreter (with the
    agent modules received so far), in a fork."""
    global ARGV
    ARGV = ["-c", {bootstrap!r}]
    modules = []
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            sys.exit(0)
        request = json.loads(line)
        packed = request.pop("agent", None)
        if packed:  # in the order received, `dispatch` (whose `main` the bootstrap calls) last
            modules += json.loads(zlib.decompress(base64.b64decode(packed)))
            modules.sort(key=lambda pair: pair[0].endswith(".dispatch"))
        sys.stdout.buffer.write(json.dumps({{"taken": request.get("seq", 0)}}).encode() + b"\\n")
        sys.stdout.flush()
        request["agent"] = base64.b64encode(zlib.compress(json.dumps(modules).encode())).decode()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                main(json.dumps(request).encode() + b"\\n")
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            sys.stdout.flush()
            os._exit(code)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code != 0:
            sys.exit(code)


if sys.argv[1:] == ["-c", {resident!r}]:
    serve()
else:
    main(sys.stdin.buffer.read())
'''

FAULT_PATCH = '''
id = "{patch_id}"
summary = "A harmless addition that records, when imported, which process runs it"
rationale = "fault-injection tests: tells from outside whether the engine runs the patched code"
[target]
module = "sglang.srt.speculative.eagle_worker_v2"
versions = ">=0.5.4"
[[edits]]
kind = "insert"
scope = "<module>"
position = "end"
code = """
{code}
"""
'''

MARKER_CODE = """
def _opspatch_fault_marker():
    import os
    with open("/proc/self/stat") as stat:
        started = stat.read().rsplit(")", 1)[1].split()[19]
    with open(os.path.join({markers!r}, str(os.getpid())), "w") as marker:
        marker.write(str(os.getppid()) + " " + started)


_opspatch_fault_marker()
"""


def install_wrapper(control: Path, real: str) -> Path:
    """`control/python`: the interpreter `real` with the fault switch kept in `control`."""
    wrapper = control / "python"
    wrapper.write_text(
        WRAPPER.format(
            python=sys.executable,
            real=real,
            control=str(control),
            bootstrap=BOOTSTRAP,
            resident=RESIDENT,
        )
    )
    wrapper.chmod(0o755)
    return wrapper


def arm_switch(
    control: Path,
    op: str,
    *,
    at: str = "after",
    then: str = "drop",
    cut: str | None = None,
    skip: int = 0,
) -> None:
    """The wrapper's next request holding `op` (after `skip` of them) meets the fault at that
    operation (`WRAPPER`)."""
    for name in ("reached.json", "claimed.json", "release"):
        (control / name).unlink(missing_ok=True)
    fault: dict[str, Any] = {"op": op, "at": at, "then": then, "skip": skip}
    if cut is not None:
        fault["cut"] = cut
    temp = control / "fault.json.tmp"
    temp.write_text(json.dumps(fault))
    temp.replace(control / "fault.json")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state is [0], ppid [1])."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[19] if fields else None


def _ancestors(pid: int) -> list[int]:
    """The live process `pid` and its ancestors up to init."""
    chain = [pid]
    while chain[-1] > 1 and len(chain) < 64:
        fields = _stat_fields(chain[-1])
        if fields is None:
            break
        chain.append(int(fields[1]))
    return chain


@dataclass
class FaultFleet:
    """A sandbox fleet over SSH with the fault switch on its canary; see the module docstring."""

    fleet: SandboxFleet
    pre: dict[str, str] = field(default_factory=dict)
    post: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)

    # -- setting up ----------------------------------------------------------------------------

    @classmethod
    def up(cls, root: Path, size: int = 2) -> FaultFleet:
        fleet = SandboxFleet(root, size, ssh=True).up()
        self = cls(fleet)
        try:
            self._prepare()
        except BaseException:
            fleet.close()
            raise
        return self

    def _prepare(self) -> None:
        guard = self.cli("apply", "eagle-init-guard", "--hosts", "sandbox-ssh", "--yes")
        assert guard.code == 0, guard.stdout + guard.stderr
        self.control.mkdir(parents=True, exist_ok=True)
        self.markers.mkdir(parents=True, exist_ok=True)
        code = MARKER_CODE.format(markers=str(self.markers)).strip()
        path = self.fleet.write_patch(PATCH_ID, FAULT_PATCH.format(patch_id=PATCH_ID, code=code))
        spec = load_patch(path).spec
        install_wrapper(self.control, self.fleet.hosts[self.canary].engine.python)
        self.write_inventory()
        for name in self.names:
            plan = apply_patch(self.fleet.file(name).read_bytes(), spec)
            assert isinstance(plan, Applied), plan
            self.pre[name], self.post[name] = plan.sha256_before, plan.sha256_after
            out = self.fleet.generate(name)
            assert out is not None and out["meta_info"]["spec_verify_ct"] > 0, out
            self.texts[name] = out["text"]

    def write_inventory(self) -> None:
        """`faults`: the `sandbox-ssh` inventory with the canary's interpreter wrapped (written
        again after `sandbox up`, which rewrites `sandbox-ssh`)."""
        text = (self.fleet.state / "inventories" / "sandbox-ssh.toml").read_text()
        real = self.fleet.hosts[self.canary].engine.python
        line = f"python = {json.dumps(real)}"
        assert text.count(line) == 1, line
        wrapped = text.replace(line, f"python = {json.dumps(str(self.control / 'python'))}")
        folder = self.fleet.workspace / "inventories"
        folder.mkdir(exist_ok=True)
        (folder / f"{INVENTORY}.toml").write_text(wrapped)

    def close(self) -> None:
        self.release()
        self.fleet.close()
        end_leftovers(self.fleet.root)

    # -- names -----------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return self.fleet.names

    @property
    def canary(self) -> str:
        return self.fleet.names[0]

    @property
    def others(self) -> list[str]:
        return self.fleet.names[1:]

    @property
    def control(self) -> Path:
        return self.fleet.root / "fault"

    @property
    def markers(self) -> Path:
        return self.fleet.root / "markers"

    # -- driving opspatch ------------------------------------------------------------------------

    def cli(self, *args: str, env: Mapping[str, str] | None = None) -> Run:
        """The console script, as an operator runs it; a command that hangs fails the test."""
        return opspatch(
            *args,
            cwd=self.fleet.workspace,
            env={**self.fleet.env, **(env or {})},
            timeout=COMMAND_LIMIT,
        )

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        return self.fleet.spawn(*args)

    @staticmethod
    def finish(controller: subprocess.Popen[str]) -> tuple[str, str]:
        """A background command's output once it exits; one that hangs is killed and fails."""
        try:
            return controller.communicate(timeout=COMMAND_LIMIT)
        except subprocess.TimeoutExpired:
            controller.kill()
            out, err = controller.communicate(timeout=30)
            raise AssertionError(f"{controller.args} hung: {out}{err}") from None

    def apply(self, *hosts: str) -> subprocess.Popen[str]:
        """`opspatch apply fault-marker` on `hosts` (default: the whole `faults` inventory), in
        the background."""
        return self.spawn(
            "apply", PATCH_ID, "--hosts", ",".join(hosts) or INVENTORY, "--yes", "--json"
        )

    # -- the fault switch ------------------------------------------------------------------------

    def arm(
        self,
        op: str,
        *,
        at: str = "after",
        then: str = "drop",
        cut: str | None = None,
        skip: int = 0,
    ) -> None:
        """The canary's next `op` request (after `skip` of them) meets the fault (`WRAPPER`)."""
        self.release()
        arm_switch(self.control, op, at=at, then=then, cut=cut, skip=skip)

    def reached(self, timeout: float = 120) -> dict[str, Any]:
        """Wait until the armed request met its fault; what the wrapper said."""
        path = self.control / "reached.json"
        assert wait_until(path.exists, timeout, 0.02), "the armed operation never came"
        found: dict[str, Any] = json.loads(path.read_text())
        return found

    def release(self) -> None:
        """Let a held request go, and wait until its wrapper process is gone."""
        (self.control / "release").touch()
        path = self.control / "reached.json"
        if path.exists():
            pid = int(json.loads(path.read_text())["pid"])
            assert wait_until(lambda: not alive(pid), 60), f"wrapper {pid} did not exit"
        (self.control / "fault.json").unlink(missing_ok=True)

    def kill_when_held(self, controller: subprocess.Popen[str]) -> None:
        """SIGKILL the controller while the canary's armed request is held, then let it go."""
        try:
            self.reached()
        except AssertionError:
            controller.kill()
            out, err = controller.communicate(30)
            raise AssertionError(f"the fault was never reached: {out}{err}") from None
        os.kill(controller.pid, signal.SIGKILL)
        controller.communicate(30)
        self.release()

    # -- looking at the hosts directly -----------------------------------------------------------

    def lock_file(self, name: str) -> Path:
        return Path(self.fleet.hosts[name].state_dir) / LOCK_FILE

    def temp_files(self, name: str) -> list[Path]:
        """Temp files beside the target or in the host's state folder (there should be none)."""
        folders = [self.fleet.file(name).parent, Path(self.fleet.hosts[name].state_dir)]
        return [p for folder in folders for p in folder.glob(f"*{TEMP_SUFFIX}")]

    def runs_patch(self, name: str) -> bool:
        """Whether the engine serving `name` now imported the patched code (a marker written by
        a live process of that engine's tree, checked by its start time: the scheduler process
        that imports the worker is spawned below the server's main process)."""
        engine = self.fleet.pid(name)
        assert engine is not None, f"{name}: no engine running"
        for marker in self.markers.iterdir():
            writer = int(marker.name)
            _parent, started = marker.read_text().split()
            if _start_time(writer) != started:
                continue  # not the process that wrote it (gone, or its pid reused)
            if engine in _ancestors(writer):
                return True
        return False

    def state(self, name: str) -> str:
        """`patched` or `pre-image`, from the file's bytes (anything else fails)."""
        sha = self.fleet.sha(name)
        assert sha in (self.pre[name], self.post[name]), (
            f"{name}: {sha[:12]} is neither the pre-image {self.pre[name][:12]} nor the patched "
            f"text {self.post[name][:12]}"
        )
        return "patched" if sha == self.post[name] else "pre-image"

    def decodes_as_before(self, name: str) -> None:
        out = self.fleet.generate(name)
        assert out is not None, f"{name}: the engine did not answer a decode"
        assert out.get("text") == self.texts[name], (name, out)
        assert out["meta_info"]["spec_verify_ct"] > 0, (name, out)

    def status(self, ledger: Path | str | None = None) -> dict[str, dict[str, Any]]:
        run = self.cli(
            *_ledger(ledger), "status", "--hosts", INVENTORY, "--patch", PATCH_ID, "--json"
        )
        assert run.code == 0, run.stdout + run.stderr
        return {s["host"]: s for s in run.json()["status"]}

    def run_status(self, run_id: str) -> dict[str, Any]:
        runs = self.cli("ledger", "list", "--json").json()["runs"]
        found: dict[str, Any] = next(r for r in runs if r["run_id"] == run_id)
        return found

    def run_record(self, run_id: str) -> dict[str, dict[str, Any]]:
        """`ledger show RUN --json`: each host's record."""
        shown = self.cli("ledger", "show", run_id, "--json")
        assert shown.code == 0, shown.stdout + shown.stderr
        return {h["host"]: h for h in shown.json()["host_records"]}

    def newest_run(self) -> str:
        run_id: str = self.cli("ledger", "list", "--json").json()["runs"][0]["run_id"]
        return run_id

    def check_invariant(
        self, outcomes: Mapping[str, str] | None = None, *, ledger: Path | str | None = None
    ) -> dict[str, str]:
        """Issue 9's invariant on every host, read from outside; each host's state.

        `outcomes` (host -> outcome a command reported) must agree with the file: `applied`
        only on the patched text, `restored` / `rolled-back` / `failed` only on the pre-image.
        """
        states = {name: self.state(name) for name in self.names}
        for name, state in states.items():
            assert self.runs_patch(name) == (state == "patched"), (
                f"{name}: the file is {state} but the engine runs the "
                + ("unpatched" if state == "patched" else "patched")
                + " code"
            )
            self.decodes_as_before(name)
            assert not self.temp_files(name), self.temp_files(name)
            assert not self.lock_file(name).exists(), self.lock_file(name).read_text()
            if outcomes is not None and name in outcomes:
                expected = "patched" if outcomes[name] == "applied" else "pre-image"
                if outcomes[name] in ("applied", "restored", "rolled-back", "failed"):
                    assert state == expected, (name, outcomes[name], state)
        verify = self.cli(*_ledger(ledger), "ledger", "verify")
        assert verify.code == 0, verify.stdout + verify.stderr
        said = self.status(ledger)
        for name, state in states.items():
            expected = "applied" if state == "patched" else "not-applied"
            assert said[name]["state"] == expected, (name, state, said[name])
        return states

    def at_baseline(self) -> bool:
        """Whether the fleet is as `up` left it (read directly; nothing is changed)."""
        try:
            for name in self.names:
                host = self.fleet.hosts[name]
                with socket.create_connection((host.address, int(host.port or 22)), timeout=5):
                    pass
                if self.fleet.sha(name) != self.pre[name] or self.runs_patch(name):
                    return False
                if self.lock_file(name).exists() or self.temp_files(name):
                    return False
            if (self.control / "fault.json").exists():
                return False
            with Ledger.open(self.fleet.ledger_path) as ledger:
                return all(r.status not in ("running", "interrupted") for r in ledger.list_runs())
        except (OSError, AssertionError, OpspatchError):
            return False

    def reset(self, ledger: Path | None = None) -> None:
        """Back to the pre-image everywhere with a plain rollback, which must not be refused
        (no lock left behind) and must leave every host at its pre-image."""
        back = self.cli(
            *_ledger(ledger), "rollback", PATCH_ID, "--hosts", INVENTORY, "--yes", "--json"
        )
        assert back.code == 0, back.stdout + back.stderr
        assert {n: self.state(n) for n in self.names} == dict.fromkeys(self.names, "pre-image")
        for marker in self.markers.iterdir():
            if _start_time(int(marker.name)) is None:
                marker.unlink()


class FleetSlot(Slot[FaultFleet]):
    """One fault fleet shared by the cases of a scenario family (`Slot`)."""

    def __init__(self, folders: pytest.TempPathFactory, name: str) -> None:
        super().__init__(folders, name, FaultFleet.up)


def end_leftovers(root: Path) -> None:
    """End, by pid, what this fleet's commands left running on its hosts: a host operation whose
    controller was killed goes on by itself (a readiness wait would poll a stopped engine until
    its deadline). Only processes whose command line names this fleet's own folder."""
    mine = str(root).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if mine in command and BOOTSTRAP.encode().splitlines()[0] in command:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def _ledger(path: Path | str | None) -> tuple[str, ...]:
    return ("--ledger", str(path)) if path is not None else ()


def outcomes_of(run: Run) -> dict[str, str]:
    assert run.stdout.strip(), run.stderr
    return {h["host"]: h["outcome"] for h in run.json()["hosts"]}


@contextlib.contextmanager
def isolated_home(folder: Path) -> Iterator[None]:
    """A HOME (and XDG folders) of a test module's own, with opspatch's variables unset: a fleet
    shared by the module outlives each test's own HOME (conftest), and its last `sandbox down`
    must not get the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(folder))
        patch.setenv("XDG_STATE_HOME", str(folder / ".local" / "state"))
        patch.setenv("XDG_CONFIG_HOME", str(folder / ".config"))
        for name in ("OPSPATCH_STATE_DIR", "OPSPATCH_LEDGER", "OPSPATCH_HOME", "SSH_AUTH_SOCK"):
            patch.delenv(name, raising=False)
        yield
