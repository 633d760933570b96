"""Processes on the host: found through /proc, their start times, stopping a process tree."""

from __future__ import annotations

import contextlib
import os
import time
from typing import NamedTuple


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process from /proc, or None when it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else (fields[0], int(fields[1]))


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not count)."""
    stat_info = proc_stat(pid)
    if stat_info is not None:
        return stat_info[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants, found through parent pids (never by name)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat_info = proc_stat(int(entry))
            if stat_info is not None:
                children.setdefault(stat_info[1], []).append(int(entry))
    tree, queue = [], [root]
    while queue:
        pid = queue.pop()
        tree.append(pid)
        queue.extend(children.get(pid, []))
    return tree


def stop_process_tree(root: int, timeout: float) -> list[int]:
    """TERM the process tree of `root`, wait up to `timeout`, then KILL what is left."""
    import signal

    tree = [pid for pid in process_tree(root) if alive(pid)]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in tree):
        time.sleep(0.1)
    for pid in tree:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in tree):
        time.sleep(0.05)
    return tree


def boot_epoch() -> float | None:
    """When this boot began by the wall clock now (/proc/stat `btime`): a clock stepped forward
    (a paused VM resumed) moves it by the step."""
    try:
        with open("/proc/stat", encoding="utf-8") as handle:
            return next(float(line.split()[1]) for line in handle if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None


def process_start_epoch(pid: int, pid_file: str | None = None) -> float | None:
    """When `pid` started (seconds since the epoch), from /proc; None where that is unknown.
    Beside a pid file the agent wrote, by the boot's epoch as it was at that start: a clock
    stepped since then moves neither the start nor a file's mtime written before the step, so
    the two still compare."""
    fields = _stat_fields(pid)
    recorded = _recorded(pid_file) if pid_file else None
    boot = recorded.boot_epoch if recorded and recorded.this_boot else boot_epoch()
    if fields is None or boot is None:
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def process_identity(pid: int) -> str | None:
    """`BOOT_ID/TICKS`: the boot and the start in clock ticks since it, which no later process
    reusing the pid shares; read from no clock, so a wall clock that jumps cannot change it."""
    fields, boot_id = _stat_fields(pid), _boot_id()
    return None if fields is None or boot_id is None else f"{boot_id}/{fields[19]}"


def identity_file(pid_file: str) -> str:
    """Where the agent records the identity of the process it wrote `pid_file` for, and the
    boot's epoch then: `PID BOOT_ID/TICKS BOOT_EPOCH`."""
    return pid_file + ".identity"


def identity_record(pid: int) -> str | None:
    """The line `identity_file` holds for `pid`, None where /proc cannot say."""
    identity, boot = process_identity(pid), boot_epoch()
    return None if identity is None or boot is None else f"{pid} {identity} {boot:.0f}\n"


class Recorded(NamedTuple):
    """What `identity_file` says of the process the agent started."""

    pid: str
    identity: str
    boot_epoch: float
    this_boot: bool  # recorded in this boot: its epoch still dates this boot's processes


def _recorded(pid_file: str) -> Recorded | None:
    try:
        with open(identity_file(pid_file), encoding="ascii") as handle:
            pid, identity, boot = handle.read().split()
        return Recorded(pid, identity, float(boot), identity.split("/")[0] == _boot_id())
    except (OSError, ValueError):
        return None


def is_pid_files_process(pid: int, pid_file: str) -> bool:
    """Whether `pid` is the process the pid file was written for, not a later one that reused
    the number. The agent's own pid files carry an identity beside them (`identity_file`):
    compared exactly. Others: the process started before the file was written (by the wall
    clock, which a paused VM may shift). Where /proc cannot tell, the pid file is trusted."""
    recorded = _recorded(pid_file)
    if recorded is not None and recorded.pid == str(pid):
        now = process_identity(pid)
        return now is None or now == recorded.identity
    started = process_start_epoch(pid)
    try:
        written = os.stat(pid_file).st_mtime
    except OSError:
        return False
    return started is None or started <= written + 2.0


def read_pid_file(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def listening_pids(port: int) -> list[int]:
    """Processes with a listening TCP socket on `port` (any address, IPv4 or IPv6), from /proc.

    Sockets are matched by inode against each process's file descriptors, so processes of other
    users (whose descriptors cannot be read without privileges) are not found.
    """
    return pids_holding(listening_sockets(port))


def pids_holding(inodes: set[str]) -> list[int]:
    """Processes holding one of the sockets `inodes` (this user's, or all with privileges)."""
    if not inodes:
        return []
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            descriptors = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{descriptor}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                found.append(int(entry))
                break
    return sorted(found)


def listening_sockets(port: int) -> set[str]:
    """The inodes of the listening TCP sockets on `port` (any address, IPv4 or IPv6): whether
    anything listens there, whoever owns it (/proc/net/tcp is readable by every user)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # sl local_address rem_address st ... inode; state 0A is LISTEN
            listening = len(fields) > 9 and fields[3] == "0A"
            if listening and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def find_server_pid(pid: int | None, pid_file: str | None, port: int | None) -> int | None:
    """The engine's process: the pid its restart reported when known, else the one in its pid
    file, else whoever listens on its port; None when none of them says."""
    if pid is not None:
        return int(pid)
    if pid_file:
        from_file = read_pid_file(pid_file)
        if from_file is not None:
            return from_file
    if port is not None:
        listening = listening_pids(port)
        if listening:
            return listening[0]
    return None
