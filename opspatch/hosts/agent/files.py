"""Reading, swapping and restoring a file, with the pre-image kept and stale bytecode removed."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import stat
from typing import TYPE_CHECKING, cast

from opspatch.hosts.agent.fsutil import (
    b64,
    ensure_state_dir,
    group_name,
    python_version,
    read_bytes,
    sha256_hex,
    unb64,
    user_name,
    write_atomically,
)
from opspatch.hosts.agent.locks import require_lock
from opspatch.hosts.agent.protocol import OpFailure, operation, os_failure

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import (
        FileReply,
        ReadRequest,
        RestoreReply,
        RestoreRequest,
        Result,
        SwapReply,
        SwapRequest,
    )

BACKUPS = "backups"


def read_file(path: str) -> FileReply:
    """The file's bytes and metadata; a symlink is followed (the link target is reported)."""
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        raise OpFailure("not-found", f"{path} does not exist", {"path": path}) from None
    except OSError as exc:
        raise os_failure("permission-denied", f"cannot stat {path}", exc) from None
    symlink_target = os.readlink(path) if stat.S_ISLNK(link.st_mode) else None
    realpath = os.path.realpath(path)
    try:
        info = os.stat(realpath)
    except FileNotFoundError:
        raise OpFailure("not-found", f"{path} is a dangling symlink to {symlink_target}") from None
    if not stat.S_ISREG(info.st_mode):
        raise OpFailure("not-a-file", f"{realpath} is not a regular file", {"path": path})
    content = read_bytes(realpath)
    return {
        "path": path,
        "realpath": realpath,
        "symlink_target": symlink_target,
        "content_b64": b64(content),
        "sha256": sha256_hex(content),
        "size": len(content),
        "mode": stat.S_IMODE(info.st_mode),
        "uid": info.st_uid,
        "gid": info.st_gid,
        "owner": user_name(info.st_uid),
        "group": group_name(info.st_gid),
        "mtime_ns": info.st_mtime_ns,
        "nlink": info.st_nlink,
    }


@operation("read")
def op_read(args: ReadRequest) -> FileReply:
    return read_file(str(args["path"]))


def store_backup(state_dir: str, content: bytes) -> str:
    """Keep `content` under `<state_dir>/backups/<sha256>` (content-addressed, never deleted)."""
    digest = sha256_hex(content)
    folder = os.path.join(ensure_state_dir(state_dir), BACKUPS)
    target = os.path.join(folder, digest)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if os.path.isfile(target) and sha256_hex(read_bytes(target)) == digest:
            return target
        write_atomically(target, content, 0o600, os.getuid(), os.getgid())
    except OSError as exc:
        raise os_failure("backup-failed", f"cannot keep a backup in {folder}", exc) from None
    except OpFailure as failure:
        raise OpFailure("backup-failed", failure.message, failure.data) from None
    return target


def _bytecode_pattern(stem: str) -> re.Pattern[str]:
    # <stem>.<cache tag>[.opt-N].pyc, e.g. eagle_worker_v2.cpython-311.opt-1.pyc
    return re.compile(re.escape(stem) + r"\.[A-Za-z0-9_-]+(\.opt-[0-9]+)?\.pyc\Z")


def purge_stale_bytecode(*sources: str) -> tuple[list[str], list[str]]:
    """Remove cached bytecode for each source path (the path imported and its real file).

    Timestamp pycs are checked only by whole-second mtime and size, so a patched file of the same
    size written within the same second would keep running the old code. The cache folder is
    where this interpreter puts it (`__pycache__`, or under PYTHONPYCACHEPREFIX).
    Returns (removed files, failures).
    """
    removed: list[str] = []
    failed: list[str] = []
    seen: set[tuple[str, str]] = set()
    for source in sources:
        source = os.path.abspath(source)
        stem = os.path.basename(source)
        stem = stem[:-3] if stem.endswith(".py") else os.path.splitext(stem)[0]
        try:
            cache_dir = os.path.dirname(importlib.util.cache_from_source(source))
        except (NotImplementedError, ValueError):
            continue
        if (cache_dir, stem) in seen:
            continue
        seen.add((cache_dir, stem))
        try:
            entries = os.listdir(cache_dir)
        except OSError:
            continue
        pattern = _bytecode_pattern(stem)
        for entry in sorted(entries):
            if pattern.match(entry):
                path = os.path.join(cache_dir, entry)
                try:
                    os.unlink(path)
                    removed.append(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    failed.append(f"{path}: {exc.strerror}")
    return removed, failed


def check_compiles(content: bytes, filename: str) -> None:
    """Compile the text with this (the host's) interpreter; refuse what it cannot compile."""
    try:
        compile(content, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise OpFailure(
            "compile-failed",
            f"the new text does not compile under Python {python_version()}: {exc.msg} (line {exc.lineno})",
            {
                "lineno": exc.lineno,
                "offset": exc.offset,
                "text": (exc.text or "").rstrip("\n"),
                "msg": exc.msg,
                "python": python_version(),
            },
        ) from None
    except ValueError as exc:  # e.g. null bytes (a SyntaxError from Python 3.12)
        raise OpFailure(
            "compile-failed", f"the new text does not compile: {exc}", {"msg": str(exc)}
        ) from None


@operation("swap")
def op_swap(args: SwapRequest) -> SwapReply:
    """Replace a file whose current sha256 is `expected_sha256` by new bytes, atomically.

    Order: pre-image check, compile check, backup of the pre-image, atomic write, bytecode purge.
    Nothing is written unless the first three pass.
    """
    path = str(args["path"])
    state_dir = str(args["state_dir"])
    expected = str(args["expected_sha256"])
    new = unb64(str(args["content_b64"]))
    if args.get("lock_run_id"):
        require_lock(state_dir, str(args["lock_run_id"]))
    realpath = os.path.realpath(path)
    current = read_bytes(realpath)
    before = sha256_hex(current)
    if before != expected:
        raise OpFailure(
            "preimage-mismatch",
            f"{realpath} changed since it was read: sha256 {before[:12]} is not the expected {expected[:12]}",
            {"path": path, "realpath": realpath, "expected": expected, "actual": before},
        )
    after = sha256_hex(new)
    check_compiles(new, realpath)
    info = os.stat(realpath)
    result: SwapReply = {
        "path": path,
        "realpath": realpath,
        "sha256_before": before,
        "sha256_after": after,
        "mode": stat.S_IMODE(info.st_mode),
        "uid": info.st_uid,
        "gid": info.st_gid,
        "changed": after != before,
        "backup_path": None,
    }
    if after != before:
        result["backup_path"] = store_backup(state_dir, current)
        write_atomically(realpath, new, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
    result["purged_bytecode"], result["purge_failures"] = purge_stale_bytecode(path, realpath)
    return result


def _restore_source(state_dir: str, pre_sha256: str, given: bytes | None) -> tuple[bytes, str]:
    backup = os.path.join(state_dir, BACKUPS, pre_sha256)
    backup_sha = None
    if os.path.isfile(backup):
        content = read_bytes(backup)
        backup_sha = sha256_hex(content)
        if backup_sha == pre_sha256:
            return content, "backup"
    if given is not None:
        given_sha = sha256_hex(given)
        if given_sha == pre_sha256:
            return given, "given"
        raise OpFailure(
            "backup-hash-mismatch",
            f"the bytes to restore hash to {given_sha[:12]}, not the pre-image {pre_sha256[:12]}",
            {"expected": pre_sha256, "given_sha256": given_sha, "backup_sha256": backup_sha},
        )
    if backup_sha is not None:
        raise OpFailure(
            "backup-hash-mismatch",
            f"the backup {backup} hashes to {backup_sha[:12]}, not {pre_sha256[:12]}",
            {"expected": pre_sha256, "backup_sha256": backup_sha},
        )
    raise OpFailure(
        "backup-missing",
        f"no backup {backup} on the host and no bytes were sent",
        {"expected": pre_sha256},
    )


@operation("restore")
def op_restore(args: RestoreRequest) -> RestoreReply:
    """Put a file back to its pre-image (from the host's backup, else from the bytes sent).

    Refuses (`not-our-file`) when the file is neither the pre-image nor `current_sha256` (the
    post-image this run wrote) unless `force`: someone else changed it since.
    """
    path = str(args["path"])
    state_dir = str(args["state_dir"])
    pre = str(args["pre_sha256"])
    expected_current = args.get("current_sha256")
    given = unb64(str(args["content_b64"])) if args.get("content_b64") is not None else None
    realpath = os.path.realpath(path)
    current = read_bytes(realpath)
    before = sha256_hex(current)
    result: Result = {
        "path": path,
        "realpath": realpath,
        "sha256_before": before,
        "sha256_after": pre,
        "changed": before != pre,
        "source": "already",
        "kept_copy": None,
    }
    if before != pre:
        if expected_current and before != expected_current and not args.get("force"):
            raise OpFailure(
                "not-our-file",
                f"{realpath} is neither the pre-image nor the file this run wrote (sha256 {before[:12]})",
                {"actual": before, "expected": expected_current, "pre_sha256": pre},
            )
        content, result["source"] = _restore_source(state_dir, pre, given)
        info = os.stat(realpath)
        with contextlib.suppress(OpFailure):  # keeping what we overwrite is a courtesy here
            result["kept_copy"] = store_backup(state_dir, current)
        write_atomically(realpath, content, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
    result["purged_bytecode"], result["purge_failures"] = purge_stale_bytecode(path, realpath)
    return cast("RestoreReply", result)
