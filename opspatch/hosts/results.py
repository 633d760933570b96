"""What host operations return: frozen values built from the host agent's replies.

`HostOperations` (`opspatch.hosts.operations`) builds them; runs, status and the CLI read them.
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class HostFacts:
    """What a host runs. `None` means unknown or not installed; `notes` say why a probe failed.

    Package versions come from distribution metadata; the GPU fields come from the NVIDIA driver
    (NVML or nvidia-smi), never from torch: `cuda_available` is whether the driver sees a GPU,
    `cuda_version` the newest CUDA it supports; all are `None` on a host without the driver.
    """

    python_version: str
    python_executable: str
    python_implementation: str
    hostname: str
    platform: str
    machine: str
    sglang_version: str | None
    torch_version: str | None
    cuda_available: bool | None
    cuda_version: str | None
    cuda_device_count: int | None
    gpu_names: tuple[str, ...]
    notes: tuple[str, ...]
    driver_version: str | None = None
    gpu_memory_mib: tuple[int, ...] = ()
    machine_id: str | None = None
    """/etc/machine-id: which machine this is, however it was reached (the ledger matches a
    host's file history by it, with the file's path, across inventories)."""

    @classmethod
    def from_reply(cls, data: dict[str, Any]) -> HostFacts:
        return cls(
            python_version=str(data["python_version"]),
            python_executable=str(data["python_executable"]),
            python_implementation=str(data["python_implementation"]),
            hostname=str(data["hostname"]),
            platform=str(data["platform"]),
            machine=str(data["machine"]),
            sglang_version=data.get("sglang_version"),
            torch_version=data.get("torch_version"),
            cuda_available=data.get("cuda_available"),
            cuda_version=data.get("cuda_version"),
            cuda_device_count=data.get("cuda_device_count"),
            gpu_names=tuple(data.get("gpu_names") or ()),
            notes=tuple(data.get("notes") or ()),
            driver_version=data.get("driver_version"),
            gpu_memory_mib=tuple(int(m) for m in data.get("gpu_memory_mib") or ()),
            machine_id=data.get("machine_id"),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ResolvedModule:
    """The file the engine imports for `module`. `record_sha256` is the hash pip recorded for
    it in the distribution's RECORD (an edit made outside any tool shows up as a difference)."""

    module: str
    origin: str
    realpath: str
    is_symlink: bool
    is_package: bool
    distribution: str | None
    distribution_version: str | None
    record_sha256: str | None

    @classmethod
    def from_reply(cls, data: dict[str, Any]) -> ResolvedModule:
        return cls(
            module=str(data["module"]),
            origin=str(data["origin"]),
            realpath=str(data["realpath"]),
            is_symlink=bool(data["is_symlink"]),
            is_package=bool(data["is_package"]),
            distribution=data.get("distribution"),
            distribution_version=data.get("distribution_version"),
            record_sha256=data.get("record_sha256"),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RemoteFile:
    """A file as read on the host: its exact bytes and what must be kept when it is replaced.

    `path` is what was asked for; `realpath` is the file really read (and later written) when
    `path` is a symlink, whose `symlink_target` is kept as it is.
    """

    path: str
    realpath: str
    symlink_target: str | None
    content: bytes
    sha256: str
    size: int
    mode: int
    uid: int
    gid: int
    owner: str | None
    group: str | None
    mtime_ns: int
    nlink: int

    def to_json(self, *, include_content: bool = False) -> dict[str, Any]:
        data = asdict(self)
        data.pop("content")
        if include_content:
            data["content_b64"] = base64.b64encode(self.content).decode("ascii")
        return data


@dataclass(frozen=True)
class ServerProcess:
    """The engine's running process as the host sees it: pid and start time (epoch seconds).
    An inspection without one (`HostInspection.server` None) found no server running."""

    pid: int | None
    """None: something listens on the engine's port, but its process is not visible to the
    login user (another user's)."""
    started_at: float | None

    @classmethod
    def from_reply(cls, data: dict[str, Any] | None) -> ServerProcess | None:
        if not data:
            return None
        pid, started = data.get("pid"), data.get("started_at")
        return cls(
            pid=int(pid) if pid is not None else None,
            started_at=float(started) if started is not None else None,
        )

    def predates(self, file: RemoteFile) -> bool:
        """Whether the server started before `file` last changed (so it runs older code)."""
        # /proc start times are whole boot-clock seconds plus ticks: up to ~1 s early; 2 s slack
        return self.started_at is not None and self.started_at < file.mtime_ns / 1e9 - 2.0


@dataclass(frozen=True)
class HostInspection:
    """Everything `plan` needs from one host, from one exec (and the running server, when the
    host's engine says where to find it)."""

    facts: HostFacts
    module: ResolvedModule | None
    file: RemoteFile
    server: ServerProcess | None = None


@dataclass(frozen=True)
class SwapResult:
    """A completed swap: the hashes before and after, where the pre-image backup is, and which
    cached bytecode files were removed. `changed` is False when the new bytes equal the old."""

    path: str
    realpath: str
    sha256_before: str
    sha256_after: str
    changed: bool
    backup_path: str | None
    purged_bytecode: tuple[str, ...]
    purge_failures: tuple[str, ...]
    mode: int
    uid: int
    gid: int
    lock_released: bool = False


@dataclass(frozen=True)
class RestoreResult:
    """A completed restore. `source` says where the bytes came from: the host's `backup`, the
    `given` bytes, or `already` (the file was the pre-image; nothing written). `kept_copy` is a
    backup of what the restore overwrote."""

    path: str
    realpath: str
    sha256_before: str
    sha256_after: str
    changed: bool
    source: Literal["backup", "given", "already"]
    kept_copy: str | None
    purged_bytecode: tuple[str, ...]
    purge_failures: tuple[str, ...]


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or held) a host's lock; times are the host's clock, seconds since the epoch."""

    owner: str | None
    run_id: str | None
    acquired_at: float | None
    expires_at: float | None

    @classmethod
    def from_reply(cls, data: dict[str, Any] | None) -> LockHolder | None:
        if not data:
            return None
        return cls(
            owner=data.get("owner"),
            run_id=data.get("run_id"),
            acquired_at=_optional_float(data.get("acquired_at")),
            expires_at=_optional_float(data.get("expires_at")),
        )


@dataclass(frozen=True)
class LockInfo:
    """The lock this run now holds. `took_over_from` is the expired holder it replaced, if any;
    `refreshed` is True when this run already held it (the expiry was extended)."""

    holder: LockHolder
    refreshed: bool
    took_over_from: LockHolder | None


@dataclass(frozen=True)
class UnlockResult:
    """`released` is False when there was no lock to release (`reason` = `not-held`)."""

    released: bool
    reason: str
    previous: LockHolder | None


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
