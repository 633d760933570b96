"""The per-host lock (`<state_dir>/lock.json`): one run at a time may change a host."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from opspatch.hosts.agent.fsutil import (
    TEMP_SUFFIX,
    ensure_state_dir,
    fsync_directory,
    host_name,
    iso,
)
from opspatch.hosts.agent.protocol import OpFailure, operation, os_failure

try:  # POSIX hosts only
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import (
        LockHolderReply,
        LockReply,
        LockRequest,
        UnlockReply,
        UnlockRequest,
    )

LOCK_FILE = "lock.json"
LOCK_GUARD = "lock.guard"


@contextlib.contextmanager
def _lock_guard(state_dir: str, wait_seconds: float = 10.0) -> Iterator[None]:
    """Serialise lock decisions on this host (flock on a guard file next to the lock)."""
    fd = os.open(os.path.join(state_dir, LOCK_GUARD), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OpFailure(
                        "lock-busy", "another opspatch agent is deciding the lock; try again"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def read_lock(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
        modified = os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(raw.decode("utf-8"))
        if not isinstance(holder, dict):
            raise ValueError("not an object")
        float(holder["expires_at"])
        return holder
    except (ValueError, KeyError, TypeError):
        return {"owner": None, "run_id": None, "unreadable": True, "modified_at": modified}


def _is_idle(holder: dict[str, Any], now: float) -> bool:
    """Whether no exec of the lock's run can still be running here (a lock written before
    `busy_until` existed is busy until it expires)."""
    if holder.get("unreadable"):
        return False
    try:
        return float(holder.get("busy_until", holder["expires_at"])) < now
    except (TypeError, ValueError):
        return False


def _is_expired(holder: dict[str, Any], now: float, ttl: float) -> bool:
    if holder.get("unreadable"):
        return float(holder["modified_at"]) + ttl < now
    return float(holder["expires_at"]) < now


def _write_lock(path: str, holder: LockHolderReply, replace_existing: bool) -> None:
    directory = os.path.dirname(path)
    fd, temp = tempfile.mkstemp(prefix=".lock.", suffix=TEMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(holder, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        if replace_existing:
            os.replace(temp, path)
        else:
            os.link(temp, path)  # atomic create-if-absent with complete content
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    fsync_directory(directory)


def require_lock(state_dir: str, run_id: str) -> None:
    holder = read_lock(os.path.join(state_dir, LOCK_FILE))
    if holder is None or holder.get("run_id") != run_id:
        raise OpFailure(
            "lock-lost",
            f"this run ({run_id}) no longer holds the host's lock",
            {"holder": holder},
        )


@operation("lock")
def op_lock(args: LockRequest) -> LockReply:
    """Take (or refresh) the host's lock for a run; take over an expired one.

    Refuses with `lock-held` (owner, run id, expiry in data) while another run holds it. With
    `refresh_only` (every exec of a run that holds the lock re-asserts it this way) only a lock
    that is still this run's is refreshed, expired or not: one another run took over is
    `lock-held`, one that is gone `lock-lost`.

    The lock says until when it keeps other runs off (`expires_at`, `ttl_seconds` from now)
    and until when an exec of its run may still be running here (`busy_until`, `busy_seconds`
    from now). `takeover_run` takes that run's lock over at once (a run known to be over);
    with `takeover_idle` only once it is not busy (a run whose controller may be alive).
    """
    state_dir = ensure_state_dir(str(args["state_dir"]))
    owner = str(args["owner"])
    run_id = str(args["run_id"])
    ttl = float(args["ttl_seconds"])
    busy = min(float(args.get("busy_seconds", ttl)), ttl)
    path = os.path.join(state_dir, LOCK_FILE)
    with _lock_guard(state_dir):
        now = time.time()
        current = read_lock(path)
        refreshed = current is not None and current.get("run_id") == run_id
        if args.get("refresh_only") and not refreshed:
            # the run held this lock: gone or another's now, it was taken over (or removed)
            raise OpFailure(
                "lock-held" if current is not None else "lock-lost",
                "locked by {} (run {}) until {}".format(
                    current.get("owner"), current.get("run_id"), iso(float(current["expires_at"]))
                )
                if current is not None and not current.get("unreadable")
                else f"the lock of run {run_id} is gone from {path}",
                dict(current, path=path) if current is not None else {"path": path},
            )
        # `opspatch recover` takes over the lock of the run it recovers, by run id: at once
        # from a run known to be over, once idle from one that may be alive elsewhere.
        taken_from_run = (
            current is not None
            and args.get("takeover_run") is not None
            and (current.get("run_id") == args.get("takeover_run"))
            and (not args.get("takeover_idle") or _is_idle(current, now))
        )
        if (
            current is not None
            and not refreshed
            and not taken_from_run
            and not _is_expired(current, now, ttl)
        ):
            raise OpFailure(
                "lock-held",
                "locked by {} (run {}) until {}".format(
                    current.get("owner"), current.get("run_id"), iso(float(current["expires_at"]))
                )
                if not current.get("unreadable")
                else f"an unreadable lock file {path} is younger than {ttl:g}s",
                dict(current, path=path),
            )
        acquired = float(current["acquired_at"]) if refreshed and current else now
        holder: LockHolderReply = {
            "owner": owner,
            "run_id": run_id,
            "acquired_at": acquired,
            "expires_at": now + ttl,
            "busy_until": now + busy,
            "acquired_at_iso": iso(acquired),
            "expires_at_iso": iso(now + ttl),
            "busy_until_iso": iso(now + busy),
            "hostname": host_name(),
        }
        try:
            _write_lock(path, holder, replace_existing=current is not None)
        except OSError as exc:
            raise os_failure("lock-failed", f"cannot write {path}", exc) from None
    return {
        "holder": holder,
        "refreshed": refreshed,
        "previous": None if refreshed else cast("LockHolderReply | None", current),
    }


@operation("unlock")
def op_unlock(args: UnlockRequest) -> UnlockReply:
    """Release the host's lock; only the run that holds it may (unless `force`)."""
    state_dir = str(args["state_dir"])
    run_id = str(args["run_id"])
    path = os.path.join(state_dir, LOCK_FILE)
    if not os.path.isdir(state_dir):
        return {"released": False, "reason": "not-held", "previous": None}
    with _lock_guard(state_dir):
        current = read_lock(path)
        if current is None:
            return {"released": False, "reason": "not-held", "previous": None}
        if current.get("run_id") != run_id and not args.get("force"):
            raise OpFailure(
                "lock-not-ours",
                "the lock is held by {} (run {}), not by run {}".format(
                    current.get("owner"), current.get("run_id"), run_id
                ),
                dict(current, path=path),
            )
        os.unlink(path)
        fsync_directory(state_dir)
    return {"released": True, "reason": "released", "previous": cast("LockHolderReply", current)}
