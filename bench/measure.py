"""Measuring one tool run: wall time, controller CPU time and memory of its whole process tree.

A tool is started as a child process in its own session with a tag in its environment
(`OPSPATCH_BENCH_TAG=<unique>`). Every process it starts inherits the tag, including those that
leave its tree: the SSH ControlPersist masters Ansible's ssh starts daemonise themselves and are
no longer anyone's child. Processes on the "host" side (sshd sessions, engines) do not inherit
it: sshd builds their environment afresh.

OpenSSH's masters rename themselves (`ssh: <ControlPath> [mux]`), which overwrites the memory
/proc/PID/environ shows, so a process is also the tool's when its command line contains a
marker the harness gives (the benchmark's own ControlPath folder).

- wall time: from start to exit of the tool's process;
- CPU time: `os.wait4` on the tool gives user + system time of the tool and every descendant
  it waited for (Ansible's workers and their ssh clients, pyinfra's and opspatch's threads); the
  tagged processes still alive when the tool exits (ControlPersist masters) are read from /proc
  and added, then ended by pid (`end_leftovers`);
- memory: `ru_maxrss` of `wait4` is the largest single process; the tree's peak is sampled every
  100 ms as the sum of the RSS of all live tagged processes (shared pages are counted in each
  process, so a forking tool's sum over-states what it really uses).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TAG_VARIABLE = "OPSPATCH_BENCH_TAG"
SAMPLE_INTERVAL = 0.1
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ToolRun:
    """One measured run of a command."""

    argv: tuple[str, ...]
    returncode: int
    wall_s: float
    cpu_s: float  # user + system of the tool's tree
    leftover_cpu_s: float  # part of cpu_s spent in processes that outlived the tool
    max_rss_mb: float  # largest single process (wait4's ru_maxrss)
    peak_tree_rss_mb: float  # largest sampled sum over the tree
    processes_seen: int
    stdout: str
    stderr: str
    interrupted: bool = False
    machine_busy_s: float = 0.0  # CPU seconds all cores of the machine were busy meanwhile


def machine_busy_seconds() -> float:
    """CPU seconds this machine's cores have been busy since boot (/proc/stat: everything but
    idle and iowait). On one machine the hosts' sshd, agents and engines share the controller's
    cores, so the difference over a run says how much of the wall time the machine was saturated:
    the part a real fleet, with a machine per host, would not pay."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle, iowait = fields[3], fields[4]
    # guest time is already counted in user and nice
    return (sum(fields[:8]) - idle - iowait) / _CLOCK_TICKS


@dataclass
class _Sampler:
    tag: bytes
    root: int
    marker: bytes | None = None
    seen: set[int] = field(default_factory=set)
    checked: set[int] = field(default_factory=set)
    peak_rss: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        total = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if pid not in self.checked:
                self.checked.add(pid)
                if pid == self.root or _is_ours(pid, self.tag, self.marker):
                    self.seen.add(pid)
            if pid in self.seen:
                total += _rss_bytes(pid)
        self.peak_rss = max(self.peak_rss, total)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(SAMPLE_INTERVAL)


def _has_tag(pid: int, tag: bytes) -> bool:
    try:
        return tag in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _is_ours(pid: int, tag: bytes, marker: bytes | None) -> bool:
    return _has_tag(pid, tag) or (marker is not None and _has_marker(pid, marker))


def _rss_bytes(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return 0
    return int(fields[1]) * _PAGE if len(fields) > 1 else 0


def _cpu_seconds(pid: int) -> float:
    """User + system time of a live process (its own, not its children's)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def tagged_processes(tag: str, marker: str | None = None) -> list[int]:
    """Live processes carrying `tag` in their environment (or `marker` in their command line)."""
    needle = f"{TAG_VARIABLE}={tag}".encode()
    mark = marker.encode() if marker else None
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _alive(int(entry)) and _is_ours(int(entry), needle, mark):
            found.append(int(entry))
    return found


def end_processes(pids: Sequence[int], timeout: float = 5.0) -> None:
    """TERM these pids, wait up to `timeout`, KILL what is left (pids the harness's tools
    started; each is checked to be alive first, never found by name)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].split()[0] not in ("Z", "X")


class Runner:
    """Runs tools one at a time; remembers the running one so Ctrl-C can end it."""

    def __init__(self, marker: str | None = None) -> None:
        self.marker = marker
        self.current: subprocess.Popen[bytes] | None = None
        self.current_tag: str | None = None

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        timeout: float,
        log_dir: Path,
        label: str,
    ) -> ToolRun:
        """Run `argv` to completion (or `timeout`), measured. Output goes to files in
        `log_dir` (never a pipe the harness must drain) and is returned as text."""
        tag = uuid.uuid4().hex
        full_env = dict(env)
        full_env[TAG_VARIABLE] = tag
        log_dir.mkdir(parents=True, exist_ok=True)
        out_path, err_path = log_dir / f"{label}.out", log_dir / f"{label}.err"
        interrupted = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            busy_before = machine_busy_seconds()
            started = time.perf_counter()
            process = subprocess.Popen(
                list(argv),
                env=full_env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            self.current, self.current_tag = process, tag
            marker = self.marker.encode() if self.marker else None
            sampler = _Sampler(f"{TAG_VARIABLE}={tag}".encode(), process.pid, marker)
            thread = threading.Thread(target=sampler.run, daemon=True)
            thread.start()
            deadline = started + timeout
            status, usage = 0, None
            try:
                while True:
                    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                    if pid == process.pid:
                        break
                    if time.perf_counter() > deadline:
                        interrupted = True
                        self.kill_current()
                        _, status, usage = os.wait4(process.pid, 0)
                        break
                    time.sleep(0.02)
            finally:
                wall = time.perf_counter() - started
                busy = machine_busy_seconds() - busy_before
                sampler.stop.set()
                thread.join()
            process.returncode = os.waitstatus_to_exitcode(status)
        leftovers = [p for p in tagged_processes(tag, self.marker) if p != process.pid]
        leftover_cpu = sum(_cpu_seconds(p) for p in leftovers)
        end_processes(leftovers)
        self.current, self.current_tag = None, None
        assert usage is not None
        return ToolRun(
            argv=tuple(argv),
            returncode=process.returncode,
            wall_s=wall,
            cpu_s=usage.ru_utime + usage.ru_stime + leftover_cpu,
            leftover_cpu_s=leftover_cpu,
            max_rss_mb=usage.ru_maxrss / 1024,
            peak_tree_rss_mb=sampler.peak_rss / 2**20,
            processes_seen=len(sampler.seen),
            stdout=out_path.read_text(errors="replace"),
            stderr=err_path.read_text(errors="replace"),
            interrupted=interrupted,
            machine_busy_s=busy,
        )

    def kill_current(self) -> None:
        """End the running tool's session (its process group) and its tagged processes."""
        process, tag = self.current, self.current_tag
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(process.pid):
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        if tag is not None:
            end_processes([p for p in tagged_processes(tag, self.marker) if p != process.pid])
