"""What a host runs, and which file its engine imports: facts, resolve, inspect."""

from __future__ import annotations

import base64
import importlib.machinery
import importlib.util
import os
import re
import shutil
import sys
from typing import TYPE_CHECKING, cast

from opspatch.hosts.agent.files import read_file
from opspatch.hosts.agent.fsutil import dist_version, host_name, python_version
from opspatch.hosts.agent.processes import (
    alive,
    find_server_pid,
    listening_sockets,
    pids_holding,
    process_start_epoch,
)
from opspatch.hosts.agent.protocol import OpFailure, operation

if TYPE_CHECKING:
    from opspatch.hosts.agent.protocol import (
        FactsReply,
        InspectReply,
        InspectRequest,
        NoArgs,
        ResolveReply,
        ResolveRequest,
        Result,
        ServerHint,
        ServerReply,
    )


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
    import subprocess  # only here: an inspect on a host with NVML starts no process

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


MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
"""Where systemd and D-Bus keep the machine's identity (stable across reboots and inventories)."""


def machine_id() -> str | None:
    """What the machine is, whatever inventory reached it; None where no id file is readable."""
    for path in MACHINE_ID_FILES:
        try:
            with open(path, encoding="ascii") as handle:
                found = handle.read().strip()
        except (OSError, ValueError):
            continue
        if found:
            return found
    return None


IMPLEMENTATIONS = {"cpython": "CPython", "pypy": "PyPy", "graalpy": "GraalVM"}
"""`sys.implementation.name` as `platform.python_implementation()` spells it."""


def platform_name() -> str:
    """`Linux-6.1.0-x86_64-with-glibc2.36`, as `platform.platform()` says it on Linux, from the
    kernel and the C library's own answers: `platform` compiles a dozen patterns at import and
    reads the interpreter's binary to guess the C library."""
    uname = os.uname()
    parts = [uname.sysname, uname.release, uname.machine]
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"; None or an error elsewhere
    except (ValueError, OSError):
        libc = None
    if libc:
        parts.append("with-" + libc.replace(" ", ""))
    return "-".join(parts)


def collect_facts() -> Result:
    """What the host runs: Python, the engine's package versions (from distribution metadata,
    nothing imported) and what the GPU driver reports. Cheap: no torch, no CUDA context."""
    facts: Result = {
        "python_version": python_version(),
        "python_executable": sys.executable,
        "python_implementation": IMPLEMENTATIONS.get(
            sys.implementation.name, sys.implementation.name
        ),
        "hostname": host_name(),
        "machine_id": machine_id(),
        "platform": platform_name(),
        "machine": os.uname().machine,
        "sglang_version": dist_version("sglang"),
        "torch_version": dist_version("torch"),
    }
    facts.update(gpu_facts())
    return facts


@operation("facts")
def op_facts(args: NoArgs) -> FactsReply:
    return cast("FactsReply", collect_facts())


def _search_locations(spec: importlib.machinery.ModuleSpec) -> list[str] | None:
    locations = spec.submodule_search_locations
    if locations is None:
        return None
    try:
        return list(locations)
    except Exception:  # a namespace package's path recomputes from its (unimported) parent
        return list(getattr(locations, "_path", []))


_FILE_LOADERS = (
    (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
    (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
    (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
)
"""The path finder's own loaders, in its order (extension, source, bytecode)."""


def _find_in_package(fullname: str, locations: list[str]) -> importlib.machinery.ModuleSpec | None:
    """`fullname`'s spec among its package's `locations`, as the path finder finds it, without
    importing the parent. `PathFinder.find_spec` builds a namespace package's path from its
    parent in `sys.modules` (a KeyError while the parent is not imported), and real SGLang
    wheels ship `sglang/srt/` and its subpackages without an `__init__.py`."""
    portions: list[str] = []
    for entry in locations:
        if not os.path.isdir(entry):
            continue
        spec = importlib.machinery.FileFinder(entry, *_FILE_LOADERS).find_spec(fullname)
        if spec is None:
            continue
        if spec.loader is not None:
            return spec
        portions.extend(spec.submodule_search_locations or [])  # a namespace portion
    if not portions:
        return None
    namespace = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
    namespace.submodule_search_locations = portions
    return namespace


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
        spec = _find_in_package(".".join(parts[: index + 1]), locations)
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
def op_resolve(args: ResolveRequest) -> ResolveReply:
    return cast("ResolveReply", resolve_module_file(str(args["module"])))


@operation("inspect")
def op_inspect(args: InspectRequest) -> InspectReply:
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
    reply = {
        "facts": facts,
        "resolved": resolved,
        "file": read_file(str(path)),
        "server": running_server(args.get("server")),
    }
    return cast("InspectReply", reply)


def running_server(where: ServerHint | None) -> ServerReply | None:
    """The engine's running process, when the request says where to look (`pid_file`, `url`):
    its pid and when it started (seconds since the epoch). A server that started before its
    file last changed still runs the old code (`status` says `staged`). None: no live process
    in the pid file and nothing listening on the port (the server is not running); a listener
    whose process this user cannot see is a server of unknown pid."""
    if not where:
        return None
    url = str(where.get("url") or "")
    port = None
    match = re.match(r"^[a-z]+://[^/:]+:(\d+)", url)
    if match:
        port = int(match.group(1))
    pid = find_server_pid(None, where.get("pid_file"), None)
    inodes = None  # the socket table is read once: reading it is the kernel's slowest part here
    if pid is None and port is not None:
        inodes = listening_sockets(port)
        holders = pids_holding(inodes)
        pid = holders[0] if holders else None
    if pid is None or not alive(pid):
        if port is not None and (listening_sockets(port) if inodes is None else inodes):
            return {"pid": None, "started_at": None}  # another user's process: not ours to see
        return None
    return {"pid": pid, "started_at": process_start_epoch(pid, where.get("pid_file"))}
