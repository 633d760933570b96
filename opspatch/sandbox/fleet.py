"""The sandbox fleet: N stand-in SGLang hosts on this machine, started, inspected and stopped."""

from __future__ import annotations

from opspatch.sandbox.down import DownReport, HostDown, sandbox_down
from opspatch.sandbox.layout import (
    DEFAULT_HOSTS,
    ENGINE_ADDRESS,
    ENGINE_ENV,
    SANDBOX_INVENTORY,
    SANDBOX_PLAYBOOK,
    SANDBOX_SSH_INVENTORY,
    Progress,
    SandboxLayout,
    check_host_count,
    engine_url,
    host_name,
    ssh_address,
    start_command,
)
from opspatch.sandbox.manifest import (
    HostRecord,
    Manifest,
    SshEndpoint,
    load_manifest,
    render_inventory,
    sandbox_inventory,
    save_manifest,
)
from opspatch.sandbox.processes import engine_pid, sshd_pid
from opspatch.sandbox.status import HostStatus, PatchState, StatusReport, health_of, sandbox_status
from opspatch.sandbox.up import HostUp, HostUpOutcome, UpReport, sandbox_up

__all__ = [
    "DEFAULT_HOSTS",
    "ENGINE_ADDRESS",
    "ENGINE_ENV",
    "SANDBOX_INVENTORY",
    "SANDBOX_PLAYBOOK",
    "SANDBOX_SSH_INVENTORY",
    "DownReport",
    "HostDown",
    "HostRecord",
    "HostStatus",
    "HostUp",
    "HostUpOutcome",
    "Manifest",
    "PatchState",
    "Progress",
    "SandboxLayout",
    "SshEndpoint",
    "StatusReport",
    "UpReport",
    "check_host_count",
    "engine_pid",
    "engine_url",
    "health_of",
    "host_name",
    "load_manifest",
    "render_inventory",
    "sandbox_down",
    "sandbox_inventory",
    "sandbox_status",
    "sandbox_up",
    "save_manifest",
    "ssh_address",
    "sshd_pid",
    "start_command",
]
