"""Installing and removing opspatch's live plugin in the engine's environment, on the host."""

from __future__ import annotations

import os
import re
import sysconfig
from typing import TYPE_CHECKING

from opspatch.hosts.agent.files import purge_stale_bytecode
from opspatch.hosts.agent.fsutil import read_bytes, sha256_hex, unb64, write_atomically
from opspatch.hosts.agent.live import plugins_filtered_out, process_environ
from opspatch.hosts.agent.locks import require_lock
from opspatch.hosts.agent.processes import alive, find_server_pid
from opspatch.hosts.agent.protocol import OpFailure, operation, os_failure

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import (
        FileHashesReply,
        FileHashesRequest,
        InstallFilesReply,
        InstallFilesRequest,
        LiveInstalled,
        LiveSiteReply,
        LiveSiteRequest,
        RemoveFilesReply,
        RemoveFilesRequest,
    )

DIST_NAME = "opspatch_live"
FILE_MODE = 0o644


def plugin_framework() -> tuple[str | None, bool]:
    """The folder of this interpreter's `sglang` package (None: not importable) and whether it
    has SGLang's plugin framework (`sglang/srt/plugins/__init__.py`). The top-level spec only:
    finding `sglang.srt.plugins` itself would import SGLang."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None, False
    for folder in list(getattr(spec, "submodule_search_locations", None) or []):
        if os.path.isfile(os.path.join(folder, "srt", "plugins", "__init__.py")):
            return folder, True
    folders = list(getattr(spec, "submodule_search_locations", None) or [])
    return (folders[0] if folders else None), False


def installed(purelib: str) -> list[LiveInstalled]:
    """Every `opspatch_live-<version>.dist-info` in `purelib`, with its RECORD's text."""
    try:
        names = sorted(os.listdir(purelib))
    except OSError:
        return []
    found: list[LiveInstalled] = []
    for name in names:
        if not re.match(r"^" + DIST_NAME + r"-[^/]+\.dist-info$", name):
            continue
        record = os.path.join(purelib, name, "RECORD")
        try:
            text = read_bytes(record).decode("utf-8")
        except (OpFailure, UnicodeDecodeError):
            text = None
        found.append({"dist_info": name, "record": text})
    return found


@operation("live_site")
def op_live_site(args: LiveSiteRequest) -> LiveSiteReply:
    """Where and how the plugin would be installed, and what is installed already."""
    purelib = sysconfig.get_paths()["purelib"]
    sglang_dir, framework = plugin_framework()
    url = str(args.get("url") or "")
    match = re.match(r"^[a-z]+://[^/:]+:(\d+)", url)
    pid = find_server_pid(None, args.get("pid_file"), int(match.group(1)) if match else None)
    environ = process_environ(pid) if pid is not None and alive(pid) else None
    source = "the running engine's environment" if environ is not None else "the inventory"
    filtered = plugins_filtered_out(environ if environ is not None else dict(args["env"]))
    return {
        "purelib": purelib,
        "sglang_dir": sglang_dir,
        "plugin_framework": framework,
        "installed": installed(purelib),
        "filtered": f"{filtered} (read from {source})" if filtered else None,
    }


def _inside(root: str, relative: str) -> str:
    path = os.path.normpath(os.path.join(root, relative))
    if os.path.isabs(relative) or not path.startswith(os.path.normpath(root) + os.sep):
        raise OpFailure("bad-request", f"{relative!r} is not a path inside {root}")
    return path


@operation("install_files")
def op_install_files(args: InstallFilesRequest) -> InstallFilesReply:
    """Write `files` (relative path -> base64) under `root`: refused (`file-exists`, naming the
    first) when one is there with other bytes, before anything is written; a file already those
    bytes is left as it is (`already`)."""
    root = str(args["root"])
    if args.get("lock_run_id"):
        require_lock(str(args["state_dir"]), str(args["lock_run_id"]))
    planned: list[tuple[str, str, bytes]] = []
    already: list[str] = []
    for relative, encoded in sorted(args["files"].items()):
        path, content = _inside(root, relative), unb64(encoded)
        if os.path.lexists(path):
            if os.path.isfile(path) and sha256_hex(read_bytes(path)) == sha256_hex(content):
                already.append(relative)
                continue
            raise OpFailure(
                "file-exists",
                f"{path} is already there with other bytes: not written by this install",
                {"path": path},
            )
        planned.append((relative, path, content))
    info = os.stat(root)
    written: list[str] = []
    for relative, path, content in planned:
        try:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        except OSError as exc:
            raise os_failure(
                "write-failed", f"cannot create {os.path.dirname(path)}", exc
            ) from None
        write_atomically(path, content, FILE_MODE, info.st_uid, info.st_gid)
        written.append(relative)
    return {"root": root, "written": written, "already": already}


@operation("remove_files")
def op_remove_files(args: RemoveFilesRequest) -> RemoveFilesReply:
    """Remove `files` (relative path -> the sha256 they were written with) under `root`: refused
    (`file-changed`, naming the first) when one holds other bytes, before anything is removed;
    a file already gone is `absent`. Their bytecode and the folders left empty go too."""
    root = str(args["root"])
    if args.get("lock_run_id"):
        require_lock(str(args["state_dir"]), str(args["lock_run_id"]))
    present: list[tuple[str, str]] = []
    absent: list[str] = []
    for relative, expected in sorted(args["files"].items()):
        path = _inside(root, relative)
        if not os.path.lexists(path):
            absent.append(relative)
            continue
        actual = sha256_hex(read_bytes(path)) if os.path.isfile(path) else "not a file"
        if actual != expected:
            raise OpFailure(
                "file-changed",
                f"{path} changed since it was installed (sha256 {actual[:12]}, installed "
                f"{expected[:12]}): nothing was removed",
                {"path": path, "expected": expected, "actual": actual},
            )
        present.append((relative, path))
    removed: list[str] = []
    purged: list[str] = []
    for relative, path in present:
        try:
            os.unlink(path)
        except OSError as exc:
            raise os_failure("remove-failed", f"cannot remove {path}", exc) from None
        removed.append(relative)
        if path.endswith(".py"):
            purged.extend(purge_stale_bytecode(path)[0])
    _remove_empty_folders(root, [path for _, path in present] + purged)
    return {"root": root, "removed": removed, "absent": absent, "purged_bytecode": purged}


@operation("file_hashes")
def op_file_hashes(args: FileHashesRequest) -> FileHashesReply:
    """Each of `paths` under `root`: its sha256, None when nothing is there (a folder or a link
    in its place reads as a hash no file has, so it matches nothing)."""
    root = str(args["root"])
    found: dict[str, str | None] = {}
    for relative in args["paths"]:
        path = _inside(root, relative)
        if not os.path.lexists(path):
            found[relative] = None
        else:
            found[relative] = sha256_hex(read_bytes(path)) if os.path.isfile(path) else "not a file"
    return {"root": root, "sha256": found}


def _remove_empty_folders(root: str, paths: list[str]) -> None:
    """Each folder of `paths` under `root`, deepest first, removed when empty."""
    top = os.path.normpath(root)
    folders = {os.path.dirname(path) for path in paths}
    for folder in sorted(folders, key=len, reverse=True):
        while folder.startswith(top + os.sep):
            try:
                os.rmdir(folder)
            except OSError:
                break
            folder = os.path.dirname(folder)
