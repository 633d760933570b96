"""The opspatch host agent: the code that runs ON a host, under the engine's own interpreter.

The controller never installs anything on a host. For each operation it runs ONE command,
`<engine python> -c BOOTSTRAP` (see `opspatch.hosts.operations`), and sends on stdin one JSON request that
carries this file's source text, the operation's name and its arguments (bytes as base64). The
bootstrap executes this source as a module and calls `main(request)`, which prints exactly one
JSON line on the original stdout:

    {"ok": true, "result": {...}}
    {"ok": false, "code": "preimage-mismatch", "message": "...", "data": {...}}

Anything else the process prints (an import warning, a library's banner) is sent to stderr, so
the reply line cannot be corrupted.

Rules for this file, because it runs on hosts we do not control:
- Python 3.8+ and the standard library only (`from __future__ import annotations` keeps the type
  hints as strings, so the modern spelling costs nothing at run time).
- Never import the engine (sglang may need GPUs and minutes to import): versions come from
  distribution metadata, module files from the import system's finders, not from imports.
- Every write is atomic (temp file in the same directory, fsync, rename), keeps mode and owner,
  and removes its temp file on any failure.

Adding an operation: write `def op_name(args) -> dict`, decorate it with `@operation("name")`,
raise `OpFailure(code, message, data)` for expected refusals. That is the whole pattern.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

try:  # POSIX hosts only; the agent is never run elsewhere, but importing it must not fail
    import fcntl
    import grp
    import pwd
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]
    grp = None  # type: ignore[assignment]
    pwd = None  # type: ignore[assignment]

if TYPE_CHECKING:  # aliases for the checker only: `dict[...]` cannot be evaluated on Python 3.8
    Args = dict[str, Any]
    Result = dict[str, Any]

OPERATIONS: dict[str, Callable[[Args], Result]] = {}

LOCK_FILE = "lock.json"
LOCK_GUARD = "lock.guard"
BACKUPS = "backups"
TEMP_SUFFIX = ".opspatch-tmp"


class OpFailure(Exception):
    """An expected refusal or failure; `code` is stable and machine-readable."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data or {}


def operation(name: str) -> Callable[[Callable[[Args], Result]], Callable[[Args], Result]]:
    """Register a function as the operation `name`."""

    def register(function: Callable[[Args], Result]) -> Callable[[Args], Result]:
        OPERATIONS[name] = function
        return function

    return register


# ---------------------------------------------------------------------------------------------
# Entry point


def _reply_stream() -> IO[str]:
    """Keep the real stdout for the reply and send everything else printed to stderr."""
    sys.stdout.flush()
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(reply_fd, "w")


def _enter_engine_workdir(cwd: str | None) -> None:
    """Import from where the server imports. `python -c` puts the current folder first on
    sys.path, as `python -m sglang.launch_server` does in the server's folder; over SSH the
    current folder is the login's home, which the server never sees. So: work in the server's
    folder when the inventory names one, else drop the current folder from sys.path."""
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            raise OpFailure("bad-workdir", f"cannot enter {cwd}: {exc.strerror}") from None
    else:
        sys.path[:] = [entry for entry in sys.path if entry not in ("", ".")]


def main(request: dict[str, Any]) -> int:
    """Run one operation and print its reply as one JSON line; the exit status is 0 even for
    refusals (the reply says what happened), non-zero only if no reply could be written."""
    reply_to = _reply_stream()
    try:
        name = request.get("op")
        handler = OPERATIONS.get(str(name))
        if handler is None:
            raise OpFailure(
                "unknown-operation",
                f"this agent has no operation {name!r}",
                {"known": sorted(OPERATIONS)},
            )
        _enter_engine_workdir(request.get("cwd"))
        reply: dict[str, Any] = {"ok": True, "result": handler(request.get("args") or {})}
    except OpFailure as failure:
        reply = {
            "ok": False,
            "code": failure.code,
            "message": failure.message,
            "data": failure.data,
        }
    except Exception as exc:  # a bug or an unexpected host state: report it, do not hide it
        reply = {
            "ok": False,
            "code": "agent-error",
            "message": f"{type(exc).__name__}: {exc}",
            "data": {"traceback": traceback.format_exc()[-4000:]},
        }
    reply_to.write(json.dumps(reply, sort_keys=True) + "\n")
    reply_to.flush()
    return 0


# ---------------------------------------------------------------------------------------------
# Small helpers


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def _iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def _os_failure(code: str, what: str, exc: OSError) -> OpFailure:
    name = errno.errorcode.get(exc.errno or 0, "") if exc.errno else ""
    return OpFailure(
        code,
        f"{what}: {exc.strerror or exc}",
        {"errno": name, "filename": exc.filename},
    )


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise OpFailure("not-found", f"{path} does not exist", {"path": path}) from None
    except IsADirectoryError:
        raise OpFailure("not-a-file", f"{path} is a directory", {"path": path}) from None
    except PermissionError as exc:
        raise _os_failure("permission-denied", f"cannot read {path}", exc) from None


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name if pwd else None
    except KeyError:
        return None


def _group_name(gid: int) -> str | None:
    try:
        return grp.getgrgid(gid).gr_name if grp else None
    except KeyError:
        return None


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _ensure_state_dir(state_dir: str) -> str:
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise _os_failure(
            "state-dir-unwritable", f"cannot create the state folder {state_dir}", exc
        ) from None
    return state_dir


# ---------------------------------------------------------------------------------------------
# facts

_GPU_PROBE_SECONDS = 5.0
"""How long the driver may take to describe the GPUs; past it the GPU facts are skipped."""


def _nvml_gpus(timeout: float) -> Result | None:
    """GPU facts from NVML (libnvidia-ml, the driver's own library), via ctypes.

    NVML talks to the driver only: no CUDA context is created and no GPU memory is taken, so it is
    safe beside a running server. None when the library is not installed (or cannot be loaded).
    The calls run in a daemon thread so a wedged driver costs at most `timeout` seconds.
    """
    import ctypes
    import threading

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None

    class Memory(ctypes.Structure):
        _fields_ = [
            ("total", ctypes.c_ulonglong),
            ("free", ctypes.c_ulonglong),
            ("used", ctypes.c_ulonglong),
        ]

    found: Result = {}

    def query() -> None:
        status = nvml.nvmlInit_v2()
        if status != 0:
            found["error"] = f"NVML could not start (nvmlReturn {status})"
            return
        try:
            text = ctypes.create_string_buffer(96)
            found["driver_version"] = (
                text.value.decode(errors="replace")
                if nvml.nvmlSystemGetDriverVersion(text, 96) == 0
                else None
            )
            cuda = ctypes.c_int()
            found["cuda_version"] = (
                f"{cuda.value // 1000}.{cuda.value % 1000 // 10}"
                if nvml.nvmlSystemGetCudaDriverVersion(ctypes.byref(cuda)) == 0 and cuda.value
                else None
            )
            count = ctypes.c_uint()
            if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                found["error"] = "NVML could not count the GPUs"
                return
            names: list[str] = []
            memory: list[int] = []
            for index in range(count.value):
                handle = ctypes.c_void_p()
                if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                    continue
                name = ctypes.create_string_buffer(96)
                if nvml.nvmlDeviceGetName(handle, name, 96) == 0:
                    names.append(name.value.decode(errors="replace"))
                info = Memory()
                if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(info)) == 0:
                    memory.append(int(info.total // (1024 * 1024)))
            found.update(names=names, memory_mib=memory, count=count.value)
        finally:
            nvml.nvmlShutdown()

    worker = threading.Thread(target=query, name="opspatch-nvml", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return {"error": f"NVML did not answer within {timeout:g}s"}
    return found


def parse_nvidia_smi(text: str) -> Result:
    """The rows of `nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader`:
    names, driver version and memory (MiB), e.g. `NVIDIA H200, 550.54.15, 143771 MiB`."""
    names: list[str] = []
    memory: list[int] = []
    driver = None
    for line in text.splitlines():
        fields = [field.strip() for field in line.rsplit(",", 2)]
        if len(fields) != 3 or not fields[0]:
            continue
        names.append(fields[0])
        driver = driver or fields[1] or None
        amount = fields[2].split()[0] if fields[2] else ""
        if amount.isdigit():
            memory.append(int(amount))
    return {"names": names, "memory_mib": memory, "count": len(names), "driver_version": driver}


def _nvidia_smi_gpus(timeout: float) -> Result | None:
    """GPU facts from `nvidia-smi` (the driver's tool; no CUDA context). None when absent."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"nvidia-smi failed: {exc}"}
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip()[-300:]
        return {"error": f"nvidia-smi exited {done.returncode}: {message}"}
    return parse_nvidia_smi(done.stdout.decode(errors="replace"))


def gpu_facts(timeout: float = _GPU_PROBE_SECONDS) -> Result:
    """What the NVIDIA driver says about the GPUs: NVML where its library is installed, else
    `nvidia-smi`; every field null (and no note) on a host without the driver.

    `cuda_version` is the newest CUDA the driver supports (NVML only); `cuda_available` is
    whether the driver sees a GPU. Never torch: importing it beside a running server takes
    seconds, and creating a CUDA context takes GPU memory the server owns.
    """
    facts: Result = {
        "cuda_available": None,
        "cuda_version": None,
        "cuda_device_count": None,
        "driver_version": None,
        "gpu_names": [],
        "gpu_memory_mib": [],
    }
    notes: list[str] = []
    found = _nvml_gpus(timeout)
    if found is None or "error" in found:
        if found is not None:
            notes.append(str(found["error"]))
        found = _nvidia_smi_gpus(timeout)
    if found is not None and "error" in found:
        notes.append(str(found["error"]))
    elif found is not None:
        facts.update(
            cuda_available=found["count"] > 0,
            cuda_version=found.get("cuda_version"),
            cuda_device_count=found["count"],
            driver_version=found.get("driver_version"),
            gpu_names=found["names"],
            gpu_memory_mib=found["memory_mib"],
        )
    facts["notes"] = notes
    return facts


def collect_facts() -> Result:
    """What the host runs: Python, the engine's package versions (from distribution metadata,
    nothing imported) and what the GPU driver reports. Cheap: no torch, no CUDA context."""
    facts: Result = {
        "python_version": platform.python_version(),
        "python_executable": sys.executable,
        "python_implementation": platform.python_implementation(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "sglang_version": _dist_version("sglang"),
        "torch_version": _dist_version("torch"),
    }
    facts.update(gpu_facts())
    return facts


@operation("facts")
def op_facts(args: Args) -> Result:
    return collect_facts()


# ---------------------------------------------------------------------------------------------
# resolve: which file the engine's interpreter would import for a module, importing nothing


def _search_locations(spec: importlib.machinery.ModuleSpec) -> list[str] | None:
    locations = spec.submodule_search_locations
    if locations is None:
        return None
    try:
        return list(locations)
    except Exception:  # a namespace package's path recomputes from its (unimported) parent
        return list(getattr(locations, "_path", []))


def _record_entry(top: str, realpath: str) -> Result | None:
    """The distribution RECORD entry for the file (its pip-installed sha256), if any."""
    from importlib import metadata

    for name in dict.fromkeys((top, top.replace("_", "-"))):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        basename = os.path.basename(realpath)
        for entry in dist.files or []:
            if not str(entry).endswith(basename):
                continue
            if os.path.realpath(str(entry.locate())) != realpath:
                continue
            recorded = None
            if entry.hash is not None and entry.hash.mode == "sha256":
                value = entry.hash.value
                recorded = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
            return {
                "distribution": dist.metadata["Name"],
                "version": dist.version,
                "record_sha256": recorded,
            }
    return None


def resolve_module_file(module: str) -> Result:
    """Find the source file `module` imports from, walking the finders without importing.

    `importlib.util.find_spec("a.b.c")` imports `a` and `a.b` first (running their `__init__`),
    which for sglang can mean CUDA initialisation. Instead: find the top-level package's spec,
    then look up each next part in the previous package's `submodule_search_locations`.
    """
    parts = module.split(".")
    if not module or not all(part.isidentifier() for part in parts):
        raise OpFailure("bad-module", f"{module!r} is not a dotted module name")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError) as exc:
        spec = None
        error = str(exc)
    else:
        error = ""
    for index in range(1, len(parts) + 1):
        name = ".".join(parts[:index])
        if spec is None:
            raise OpFailure(
                "module-not-found",
                "no module named {!r}{}".format(name, f" ({error})" if error else ""),
                {"module": module, "missing": name, "sys_path": sys.path},
            )
        if index == len(parts):
            break
        locations = _search_locations(spec)
        if locations is None:
            raise OpFailure(
                "module-not-found",
                f"{name!r} is a module, not a package, so it has no {parts[index]!r}",
                {"module": module, "missing": ".".join(parts[: index + 1])},
            )
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: index + 1]), locations)
    assert spec is not None
    origin = spec.origin
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        raise OpFailure(
            "module-not-source",
            f"{module} is not loaded from a .py source file (origin: {origin})",
            {"module": module, "origin": origin},
        )
    realpath = os.path.realpath(origin)
    record = _record_entry(parts[0], realpath)
    return {
        "module": module,
        "origin": origin,
        "realpath": realpath,
        "is_symlink": os.path.islink(origin),
        "is_package": spec.submodule_search_locations is not None,
        "distribution": record["distribution"] if record else None,
        "distribution_version": record["version"] if record else None,
        "record_sha256": record["record_sha256"] if record else None,
    }


@operation("resolve")
def op_resolve(args: Args) -> Result:
    return resolve_module_file(str(args["module"]))


# ---------------------------------------------------------------------------------------------
# read


def read_file(path: str) -> Result:
    """The file's bytes and metadata; a symlink is followed (the link target is reported)."""
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        raise OpFailure("not-found", f"{path} does not exist", {"path": path}) from None
    except OSError as exc:
        raise _os_failure("permission-denied", f"cannot stat {path}", exc) from None
    symlink_target = os.readlink(path) if stat.S_ISLNK(link.st_mode) else None
    realpath = os.path.realpath(path)
    try:
        info = os.stat(realpath)
    except FileNotFoundError:
        raise OpFailure("not-found", f"{path} is a dangling symlink to {symlink_target}") from None
    if not stat.S_ISREG(info.st_mode):
        raise OpFailure("not-a-file", f"{realpath} is not a regular file", {"path": path})
    content = _read_bytes(realpath)
    return {
        "path": path,
        "realpath": realpath,
        "symlink_target": symlink_target,
        "content_b64": _b64(content),
        "sha256": sha256_hex(content),
        "size": len(content),
        "mode": stat.S_IMODE(info.st_mode),
        "uid": info.st_uid,
        "gid": info.st_gid,
        "owner": _user_name(info.st_uid),
        "group": _group_name(info.st_gid),
        "mtime_ns": info.st_mtime_ns,
        "nlink": info.st_nlink,
    }


@operation("read")
def op_read(args: Args) -> Result:
    return read_file(str(args["path"]))


@operation("inspect")
def op_inspect(args: Args) -> Result:
    """facts + resolve + read in one exec: everything `plan` needs from a host."""
    facts = collect_facts()
    resolved = None
    path = args.get("path")
    if args.get("module"):
        try:
            resolved = resolve_module_file(str(args["module"]))
        except OpFailure as failure:
            failure.data["facts"] = facts
            raise
        path = resolved["origin"]
    if not path:
        raise OpFailure("bad-request", "inspect needs a module or a path")
    return {"facts": facts, "resolved": resolved, "file": read_file(str(path))}


@operation("begin")
def op_begin(args: Args) -> Result:
    """lock + inspect in one exec: how a rollout starts on a host. The lock is kept even if the
    inspection fails (the controller releases it), so no other run slips in between."""
    locked = op_lock(args)
    try:
        inspected = op_inspect(args)
    except OpFailure as failure:
        failure.data["lock"] = locked
        raise
    return dict(inspected, lock=locked)


# ---------------------------------------------------------------------------------------------
# Atomic writes, backups, bytecode


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems cannot fsync a directory; the rename still stands
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_atomically(target: str, content: bytes, mode: int, uid: int, gid: int) -> None:
    """Replace `target` by `content` atomically, with the given mode and owner.

    A temp file is written in the target's own directory (so the rename cannot cross
    filesystems), fsynced, given mode and owner, renamed over the target, then the directory is
    fsynced. On any failure the temp file is removed and the target is untouched.

    Raises:
        OpFailure("write-failed"): the directory is read-only, the disk is full, the owner
            cannot be kept, or the rename failed.
    """
    directory, name = os.path.split(target)
    try:
        fd, temp = tempfile.mkstemp(prefix="." + name + ".", suffix=TEMP_SUFFIX, dir=directory)
    except OSError as exc:
        raise _os_failure(
            "write-failed", f"cannot create a temp file in {directory}", exc
        ) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
            info = os.fstat(handle.fileno())
            if (info.st_uid, info.st_gid) != (uid, gid):
                os.fchown(handle.fileno(), uid, gid)
            os.fchmod(handle.fileno(), mode)  # after chown, which may clear set-id bits
        os.replace(temp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise _os_failure("write-failed", f"cannot write {target}", exc) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_directory(directory)


def store_backup(state_dir: str, content: bytes) -> str:
    """Keep `content` under `<state_dir>/backups/<sha256>` (content-addressed, never deleted)."""
    digest = sha256_hex(content)
    folder = os.path.join(_ensure_state_dir(state_dir), BACKUPS)
    target = os.path.join(folder, digest)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if os.path.isfile(target) and sha256_hex(_read_bytes(target)) == digest:
            return target
        write_atomically(target, content, 0o600, os.getuid(), os.getgid())
    except OSError as exc:
        raise _os_failure("backup-failed", f"cannot keep a backup in {folder}", exc) from None
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
            f"the new text does not compile under Python {platform.python_version()}: {exc.msg} (line {exc.lineno})",
            {
                "lineno": exc.lineno,
                "offset": exc.offset,
                "text": (exc.text or "").rstrip("\n"),
                "msg": exc.msg,
                "python": platform.python_version(),
            },
        ) from None
    except ValueError as exc:  # e.g. null bytes (a SyntaxError from Python 3.12)
        raise OpFailure(
            "compile-failed", f"the new text does not compile: {exc}", {"msg": str(exc)}
        ) from None


# ---------------------------------------------------------------------------------------------
# swap and restore


def _require_lock(state_dir: str, run_id: str) -> None:
    holder = _read_lock(os.path.join(state_dir, LOCK_FILE))
    if holder is None or holder.get("run_id") != run_id:
        raise OpFailure(
            "lock-lost",
            f"this run ({run_id}) no longer holds the host's lock",
            {"holder": holder},
        )


@operation("swap")
def op_swap(args: Args) -> Result:
    """Replace a file whose current sha256 is `expected_sha256` by new bytes, atomically.

    Order: pre-image check, compile check, backup of the pre-image, atomic write, bytecode purge.
    Nothing is written unless the first three pass.
    """
    path = str(args["path"])
    state_dir = str(args["state_dir"])
    expected = str(args["expected_sha256"])
    new = _unb64(str(args["content_b64"]))
    if args.get("lock_run_id"):
        _require_lock(state_dir, str(args["lock_run_id"]))
    realpath = os.path.realpath(path)
    current = _read_bytes(realpath)
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
    result: Result = {
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
        content = _read_bytes(backup)
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
def op_restore(args: Args) -> Result:
    """Put a file back to its pre-image (from the host's backup, else from the bytes sent).

    Refuses (`not-our-file`) when the file is neither the pre-image nor `current_sha256` (the
    post-image this run wrote) unless `force`: someone else changed it since.
    """
    path = str(args["path"])
    state_dir = str(args["state_dir"])
    pre = str(args["pre_sha256"])
    expected_current = args.get("current_sha256")
    given = _unb64(str(args["content_b64"])) if args.get("content_b64") is not None else None
    realpath = os.path.realpath(path)
    current = _read_bytes(realpath)
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
    return result


# ---------------------------------------------------------------------------------------------
# The per-host lock


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


def _read_lock(path: str) -> dict[str, Any] | None:
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


def _is_expired(holder: dict[str, Any], now: float, ttl: float) -> bool:
    if holder.get("unreadable"):
        return float(holder["modified_at"]) + ttl < now
    return float(holder["expires_at"]) < now


def _write_lock(path: str, holder: dict[str, Any], replace_existing: bool) -> None:
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
    _fsync_directory(directory)


@operation("lock")
def op_lock(args: Args) -> Result:
    """Take (or refresh) the host's lock for a run; take over an expired one.

    Refuses with `lock-held` (owner, run id, expiry in data) while another run holds it.
    """
    state_dir = _ensure_state_dir(str(args["state_dir"]))
    owner = str(args["owner"])
    run_id = str(args["run_id"])
    ttl = float(args["ttl_seconds"])
    path = os.path.join(state_dir, LOCK_FILE)
    with _lock_guard(state_dir):
        now = time.time()
        current = _read_lock(path)
        refreshed = current is not None and current.get("run_id") == run_id
        # `opspatch recover` takes over the lock of the interrupted run it recovers, by run id.
        taken_from_run = (
            current is not None
            and args.get("takeover_run") is not None
            and (current.get("run_id") == args.get("takeover_run"))
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
                    current.get("owner"), current.get("run_id"), _iso(float(current["expires_at"]))
                )
                if not current.get("unreadable")
                else f"an unreadable lock file {path} is younger than {ttl:g}s",
                dict(current, path=path),
            )
        acquired = float(current["acquired_at"]) if refreshed and current else now
        holder = {
            "owner": owner,
            "run_id": run_id,
            "acquired_at": acquired,
            "expires_at": now + ttl,
            "acquired_at_iso": _iso(acquired),
            "expires_at_iso": _iso(now + ttl),
            "hostname": socket.gethostname(),
        }
        try:
            _write_lock(path, holder, replace_existing=current is not None)
        except OSError as exc:
            raise _os_failure("lock-failed", f"cannot write {path}", exc) from None
    return {
        "holder": holder,
        "refreshed": refreshed,
        "previous": None if refreshed else current,
    }


@operation("unlock")
def op_unlock(args: Args) -> Result:
    """Release the host's lock; only the run that holds it may (unless `force`)."""
    state_dir = str(args["state_dir"])
    run_id = str(args["run_id"])
    path = os.path.join(state_dir, LOCK_FILE)
    if not os.path.isdir(state_dir):
        return {"released": False, "reason": "not-held", "previous": None}
    with _lock_guard(state_dir):
        current = _read_lock(path)
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
        _fsync_directory(state_dir)
    return {"released": True, "reason": "released", "previous": current}


# ---------------------------------------------------------------------------------------------
# the engine: restart, readiness, smoke decode, log scan
#
# These run on the host because the server usually listens on the host's loopback only.


class _Dropped(Exception):
    """The server closed the connection without an answer (it crashed, as SGLang does)."""


def _http(method: str, url: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, bytes]:
    """One HTTP request; (status, body). A refused or dropped connection raises `_Dropped`."""
    import http.client
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode("utf-8") if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback URL from the inventory
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _Dropped(f"{type(reason).__name__}: {reason}") from None


def _file_size(path: str | None) -> int | None:
    if not path:
        return None
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _log_since(path: str | None, offset: int | None, limit: int = 4_000_000) -> str:
    """The log written since `offset` (the whole log if it shrank: it was rotated)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = offset if offset is not None and offset <= size else 0
            handle.seek(max(start, size - limit))
            return handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not count)."""
    stat_info = _proc_stat(pid)
    if stat_info is not None:
        return stat_info[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _process_tree(root: int) -> list[int]:
    """`root` and all its descendants, found through parent pids (never by name)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat_info = _proc_stat(int(entry))
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

    tree = [pid for pid in _process_tree(root) if _alive(pid)]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in tree):
        time.sleep(0.1)
    for pid in tree:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in tree):
        time.sleep(0.05)
    return tree


def _process_start_epoch(pid: int) -> float | None:
    """When `pid` started (seconds since the epoch), from /proc; None where that is unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode("utf-8", errors="replace")
        with open("/proc/stat", encoding="utf-8") as handle:
            boot = next(float(line.split()[1]) for line in handle if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None
    ticks = int(raw[raw.rfind(")") + 2 :].split()[19])
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _started_before(pid: int, pid_file: str) -> bool:
    """Whether `pid` is the process the pid file was written for, not a later one that reused
    the number: the engine started before its pid file was written (a reused pid started
    after). Where /proc cannot tell, the pid file is trusted."""
    started = _process_start_epoch(pid)
    try:
        written = os.stat(pid_file).st_mtime
    except OSError:
        return False
    return started is None or started <= written + 2.0


def _read_pid_file(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def _run_tool(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise OpFailure(
            "restart-tool-missing", f"{argv[0]} is not installed on this host"
        ) from None
    except subprocess.TimeoutExpired:
        raise OpFailure(
            "restart-timeout", f"{' '.join(argv)} did not finish in {timeout:.0f}s"
        ) from None


def _restart_command(
    settings: dict[str, Any], env: dict[str, str], log_file: str | None, timeout: float
) -> Result:
    pid_file = settings["pid_file"]
    stopped: list[int] = []
    old = _read_pid_file(pid_file)
    if old is not None and _alive(old) and _started_before(old, pid_file):
        stopped = stop_process_tree(old, float(settings.get("stop_timeout") or 30.0))
    log_path = log_file or os.devnull
    if log_file:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
    offset = _file_size(log_file)
    full_env = dict(os.environ)
    full_env.update(env)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(  # noqa: S602 - the operator's start command, as systemd's ExecStart
            settings["start"],
            shell=True,
            cwd=settings.get("workdir") or None,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this agent and the SSH session that started it
            close_fds=True,
        )
    pid_dir = os.path.dirname(os.path.abspath(pid_file))
    os.makedirs(pid_dir, exist_ok=True)
    stat_dir = os.stat(pid_dir)
    write_atomically(pid_file, f"{process.pid}\n".encode(), 0o644, stat_dir.st_uid, stat_dir.st_gid)
    time.sleep(0.2)
    if process.poll() is not None:
        raise OpFailure(
            "start-failed",
            f"the start command exited at once with status {process.returncode}",
            {"log_tail": _tail(_log_since(log_file, offset))},
        )
    return {"strategy": "command", "pid": process.pid, "log_offset": offset, "stopped": stopped}


@operation("restart")
def op_restart(args: Args) -> Result:
    """Restart the engine with the inventory's strategy; return its pid and the log offset."""
    settings = dict(args.get("restart") or {})
    log_file = args.get("log_file")
    timeout = float(args.get("timeout") or 180.0)
    env = {str(k): str(v) for k, v in (args.get("env") or {}).items()}
    kind = settings.get("kind")
    if kind == "command":
        return _restart_command(settings, env, log_file, timeout)
    offset = _file_size(log_file)
    if kind == "systemd":
        unit = settings["unit"]
        done = _run_tool(["systemctl", "restart", unit], timeout)
        if done.returncode != 0:
            raise OpFailure("restart-failed", f"systemctl restart {unit}: {done.stderr.strip()}")
        state = _run_tool(["systemctl", "is-active", unit], 30).stdout.strip()
        if state not in ("active", "activating", "reloading"):
            raise OpFailure("restart-failed", f"{unit} is {state or 'unknown'} after restart")
        main_pid = _run_tool(
            ["systemctl", "show", "-p", "MainPID", "--value", unit], 30
        ).stdout.strip()
        pid = int(main_pid) if main_pid.isdigit() and main_pid != "0" else None
        return {"strategy": "systemd", "pid": pid, "log_offset": offset, "detail": state}
    if kind == "supervisor":
        program = settings["program"]
        ctl = ["supervisorctl"] + (["-c", settings["config"]] if settings.get("config") else [])
        done = _run_tool(ctl + ["restart", program], timeout)
        output = (done.stdout + done.stderr).strip()
        if done.returncode != 0 or "started" not in output:
            raise OpFailure("restart-failed", f"supervisorctl restart {program}: {output}")
        found = _run_tool(ctl + ["pid", program], 30).stdout.strip()
        pid = int(found) if found.isdigit() and found != "0" else None
        return {"strategy": "supervisor", "pid": pid, "log_offset": offset, "detail": output}
    raise OpFailure("bad-restart", f"unknown restart strategy {kind!r}")


@operation("wait_ready")
def op_wait_ready(args: Args) -> Result:
    """Poll `<url>/health` until it answers 200, with backoff, until the deadline.

    Fails fast when the process started by the restart (its pid) has exited.
    """
    url = str(args["url"]).rstrip("/")
    timeout = float(args.get("timeout") or 600.0)
    pid = args.get("pid")
    log_file = args.get("log_file")
    offset = args.get("log_offset")
    started = time.monotonic()
    deadline = started + timeout
    polls = 0
    delay = 0.1
    last = "no answer yet"
    while True:
        polls += 1
        try:
            status, _ = _http("GET", url + "/health", None, timeout=min(20.0, max(1.0, timeout)))
            if status == 200:
                return {"seconds": round(time.monotonic() - started, 3), "polls": polls}
            last = f"/health answered {status}"
        except _Dropped as exc:
            last = f"/health: {exc}"
        if pid is not None and not _alive(int(pid)):
            raise OpFailure(
                "engine-exited",
                f"the engine (pid {pid}) exited before it was ready",
                {"log_tail": _tail(_log_since(log_file, offset))},
            )
        if time.monotonic() + delay > deadline:
            raise OpFailure(
                "not-ready",
                f"not ready after {timeout:.0f}s ({last})",
                {"log_tail": _tail(_log_since(log_file, offset))},
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)


@operation("smoke")
def op_smoke(args: Args) -> Result:
    """Greedy decodes of the playbook's prompts, checked; then a scan of the log since restart.

    Every failed check is reported in the result (not raised): the controller decides.
    """
    url = str(args["url"]).rstrip("/")
    prompts = args.get("prompts") or []
    max_new_tokens = int(args.get("max_new_tokens") or 16)
    require_spec_verify = bool(args.get("require_spec_verify"))
    baseline = args.get("baseline")
    checks = args.get("checks", True)
    timeout = float(args.get("timeout") or 180.0)
    log_file = args.get("log_file")
    offset = args.get("log_offset")
    if offset is None:
        offset = _file_size(log_file)
    deadline = time.monotonic() + timeout
    results: list[Result] = []
    failures: list[str] = []
    for index, prompt in enumerate(prompts):
        text = str(prompt.get("text", ""))
        result: Result = {
            "prompt": text,
            "ok": False,
            "text": None,
            "completion_tokens": None,
            "spec_verify_ct": None,
            "problem": None,
        }
        results.append(result)
        body = {
            "text": text,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
        }
        try:
            status, raw = _http(
                "POST", url + "/generate", body, timeout=max(1.0, deadline - time.monotonic())
            )
        except _Dropped as exc:
            result["problem"] = f"connection dropped ({exc}): the server may have crashed"
        else:
            try:
                data = json.loads(raw.decode("utf-8"))
            except ValueError:
                data = {}
            meta = data.get("meta_info") or {} if isinstance(data, dict) else {}
            result["text"] = data.get("text") if isinstance(data, dict) else None
            result["completion_tokens"] = meta.get("completion_tokens")
            result["spec_verify_ct"] = meta.get("spec_verify_ct")
            if status != 200:
                result["problem"] = f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}"
            elif not checks:
                pass
            elif not result["completion_tokens"]:
                result["problem"] = "no completion tokens"
            elif require_spec_verify and not result["spec_verify_ct"]:
                result["problem"] = (
                    "no spec_verify_ct: speculative decoding did not verify any draft"
                )
            elif prompt.get("expect") and not re.search(str(prompt["expect"]), str(result["text"])):
                result["problem"] = f"text {result['text']!r} does not match {prompt['expect']!r}"
            elif (
                baseline is not None
                and index < len(baseline)
                and baseline[index] is not None
                and result["text"] != baseline[index]
            ):
                result["problem"] = (
                    f"text {result['text']!r} differs from the pre-patch baseline {baseline[index]!r}"
                )
        if result["problem"]:
            failures.append(f"prompt {index + 1}: {result['problem']}")
        else:
            result["ok"] = True
    log_hits: list[str] = []
    if checks and log_file:
        patterns = [re.compile(p) for p in (args.get("fail_patterns") or [])]
        for line in _log_since(log_file, offset).splitlines():
            if any(p.search(line) for p in patterns):
                log_hits.append(line.strip()[:300])
        if log_hits:
            failures.append(f"server log: {log_hits[0]}")
    return {
        "ok": not failures,
        "results": results,
        "failures": failures,
        "log_hits": log_hits[:20],
        "log_offset": offset,
    }
