"""Who began a run, and is that process still alive? (What tells `running` from `interrupted`.)"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from opspatch.core.codec import Record


def operator_identity() -> str:
    """`user@controller-hostname`: who ran a command, as the ledger records it.

    Falls back to `uid<N>` when the user has no name (containers without a passwd entry).
    """
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class ControllerProcess(Record):
    """The process that began a run: controller hostname, pid, and a start-time token.

    `start_token` is `<boot id>/<start time in clock ticks>` from /proc on Linux (None elsewhere):
    a pid alone can be reused after the process dies; pid + boot + start time cannot.
    """

    hostname: str
    pid: int
    start_token: str | None

    @classmethod
    def current(cls) -> ControllerProcess:
        """This process."""
        return cls(socket.gethostname(), os.getpid(), process_start_token(os.getpid()))

    def is_alive(self) -> bool | None:
        """True if this process still runs, False if it is gone, None if it ran elsewhere."""
        if self.hostname != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # it exists but belongs to someone else
        if process_is_zombie(self.pid):
            return False
        if self.start_token is None:
            return True
        return process_start_token(self.pid) == self.start_token


def _read_proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first); None if unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    return text[text.rfind(")") + 1 :].split()


def process_is_zombie(pid: int) -> bool:
    """Whether `pid` is a zombie: killed, not yet reaped, still answering `kill(pid, 0)`."""
    fields = _read_proc_stat(pid)
    return fields is not None and len(fields) > 0 and fields[0] in ("Z", "X")


def process_start_token(pid: int) -> str | None:
    """`<boot id>/<start time in clock ticks>` of `pid`, or None where /proc cannot tell."""
    fields = _read_proc_stat(pid)
    if not fields or len(fields) < 20:
        return None
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        boot_id = "unknown-boot"
    return f"{boot_id}/{fields[19]}"  # field 22 of stat: start time in clock ticks since boot
