"""The sandbox's processes and ports, recognised for what they are, and its command lock."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

from opspatch.errors import InputError
from opspatch.sandbox.layout import SandboxLayout
from opspatch.sandbox.manifest import HostRecord

# ---------------------------------------------------------------------------------------------
# processes: recognising ours


def proc_text(pid: int, name: str) -> str | None:
    """`/proc/<pid>/<name>` as text (NULs as spaces), or None when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode("utf-8", errors="replace")


def is_running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not reaped, does not count)."""
    stat = proc_text(pid, "stat")
    if stat is None:
        return False
    state = stat[stat.rfind(")") + 2 :].split(" ", 1)[0]
    return state not in ("Z", "X")


def read_pid(pid_file: Path) -> int | None:
    """The pid a pid file holds, or None (no file, or not a number)."""
    try:
        text = pid_file.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return int(text) if text.isdigit() else None


def engine_pid(layout: SandboxLayout, name: str) -> int | None:
    """The pid of host `name`'s running engine, or None.

    The pid file's pid counts only while it runs `sglang.launch_server` in the host's folder:
    a pid recycled by an unrelated process is never taken for the engine.
    """
    pid = read_pid(layout.pid_file(name))
    if pid is None or not is_running(pid):
        return None
    cmdline = proc_text(pid, "cmdline") or ""
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None
    if "sglang.launch_server" not in cmdline or cwd != layout.host_dir(name).resolve():
        return None
    return pid


def server_pid(layout: SandboxLayout, name: str) -> int | None:
    """The pid of the engine's own Python process: the pid file holds the start command's
    `/bin/sh -c` wrapper, whose child runs `sglang.launch_server` (the pid `diagnose` shows);
    the wrapper's pid when no such child is found (an engine started without a wrapper)."""
    wrapper = engine_pid(layout, name)
    if wrapper is None:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = proc_text(int(entry.name), "stat") or ""
        # `pid (comm) state ppid ...`: comm may hold spaces, so split after its closing paren.
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(wrapper):
            cmdline = proc_text(int(entry.name), "cmdline") or ""
            if "sglang.launch_server" in cmdline and "-c" not in cmdline.split()[:2]:
                return int(entry.name)
    return wrapper


def sshd_pid(layout: SandboxLayout, record: HostRecord) -> int | None:
    """The pid of host `record`'s sshd if it still runs this sandbox's config, else None."""
    if record.ssh is None or record.ssh.pid is None or not is_running(record.ssh.pid):
        return None
    config = str(layout.sshd_dir(record.name) / "sshd_config")
    return record.ssh.pid if config in (proc_text(record.ssh.pid, "cmdline") or "") else None


def port_taken(address: str, port: int) -> bool:
    """Whether a server could not listen on `address:port` now (another process listens)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As servers bind: connections of a stopped engine lingering in TIME_WAIT do not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise InputError(
                    f"address {address} cannot be used on this machine ({exc.strerror})",
                    hint="the sandbox needs the loopback range 127.0.0.0/8",
                ) from None
            return True
    return False


LISTEN_PORTS = (20000, 32000)
"""Where the sandbox's listeners' ports are chosen: below the kernel's ephemeral range (Linux:
32768-60999 by default), so that no client socket or gloo's own listeners, which draw from that
range, can take a port between the moment it is chosen and the moment its server binds it (a
unit's rendezvous port recorded in the manifest is bound again at every restart)."""


def free_port(address: str, avoid: set[int]) -> int:
    """A TCP port in `LISTEN_PORTS` nothing listens on at `address` now, not in `avoid`."""
    low, high = LISTEN_PORTS
    for _ in range(200):
        port = random.randrange(low, high)
        if port in avoid:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, port))
            except OSError:
                continue
        return port
    raise InputError(f"no free TCP port found on {address} in {low}-{high}")


# ---------------------------------------------------------------------------------------------
# one sandbox command at a time


@contextlib.contextmanager
def sandbox_lock(layout: SandboxLayout) -> Iterator[None]:
    """Hold `<state>/sandbox/.lock` (one `up` or `down` at a time); the holder's pid is written
    in it for the message another command gets.

    Raises:
        InputError: another sandbox command holds the lock.
    """
    import fcntl

    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.lock_file, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise InputError(
                f"another `opspatch sandbox` command is working on {layout.root} (pid {holder})",
                hint="wait for it to finish, then run this again",
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                handle.truncate(0)
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
