"""What a host runs (its Python, SGLang, torch, GPUs, machine id), as its agent's `facts` reply
reports it and as a run records it in the ledger (`Ledger.record_facts`), so it lives below both
(`opspatch.hosts.results` re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass

from opspatch.core.codec import Record


@dataclass(frozen=True, kw_only=True)
class HostFacts(Record):
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
    # an agent leaves out what it could not probe: the defaults say unknown
    sglang_version: str | None = None
    torch_version: str | None = None
    cuda_available: bool | None = None
    cuda_version: str | None = None
    cuda_device_count: int | None = None
    gpu_names: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    driver_version: str | None = None
    gpu_memory_mib: tuple[int, ...] = ()
    machine_id: str | None = None
    """/etc/machine-id: which machine this is, however it was reached (the ledger matches a
    host's file history by it, with the file's path, across inventories)."""
