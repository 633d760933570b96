"""The sandbox fleet: N stand-in SGLang hosts on this machine, started, inspected and stopped.

`opspatch sandbox up` builds hosts under `<state>/sandbox/hosts/sandbox-01..`, each a folder with
its own virtual environment and installed stand-in engine (`install.make_host_python`: like a
wheel, or with `--install editable` as a git checkout installed editable), its own
loopback port, log file, pid file and host-side state folder (the inventory's `state_dir`, where
the host agent keeps its lock and backups). It starts every engine through the same code a
rollout uses (`LocalTransport` -> `HostOperations` -> `EngineControl.restart` / `wait_ready` with
the `command` restart strategy), so the sandbox exercises the real restart logic, then writes the
`sandbox` inventory into `<state>/inventories/`, where `--hosts sandbox` finds it from any folder.
With `--ssh` every host also gets a private sshd on 127.0.0.2, 127.0.0.3, ... (`opspatch.sandbox.sshd`)
and a `sandbox-ssh` inventory reaching the same hosts over SSH.

Layout (everything is derived from the state directory; only ports and sshd pids are recorded):

```
<state>/sandbox/sandbox.json          the manifest: hosts, their ports, ssh endpoints, install shape
<state>/sandbox/hosts/sandbox-01/     venv/, server.log, server.pid, state/ (+ sglang/: editable)
<state>/sandbox/ssh/user/             id_ed25519 (+ .pub), known_hosts (pinned host keys)
<state>/sandbox/ssh/sandbox-01/       that host's sshd: config, host key, pid, log
<state>/inventories/sandbox.toml      transport local
<state>/inventories/sandbox-ssh.toml  transport ssh (only with --ssh)
```

Why things are the way they are:
- `up` is idempotent: a running engine (its pid-file pid alive, working in the host's folder and
  running `sglang.launch_server`) is left alone; a stopped one is started again on its recorded
  port; an installed engine is never reinstalled, so a patched file stays patched; the install
  shape is kept (the other one is refused: `down --purge` first).
- Engines are recognised by pid *and* by what the process is, so a recycled pid is never
  signalled. Stopping uses the host agent's own `stop_process_tree`, the code `restart` uses.
- Ports are chosen once and recorded before anything starts; a recorded port that something
  else now holds is refused up front (exit 2, nothing started).
- One sandbox command at a time: `up` and `down` hold `<state>/sandbox/.lock`.
- A restarted sshd gets a new host key (`opspatch.sandbox.sshd` generates one per start); `up` rewrites
  the pinned known_hosts each time, so the `sandbox-ssh` inventory always verifies keys strictly.
- Linux only, like the host agent's process handling: processes are recognised through /proc.

The code is split by concern: `layout` (paths, names, the start command), `manifest` (the manifest
and the inventories), `processes` (recognising ours, ports, the command lock), `up`, `status`,
`down`, `reinstall` (a reinstall or upgrade of one host, as pip does it), `load`; this module is
the front door and re-exports what callers use.
"""

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
