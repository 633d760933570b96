"""The four ways of doing the same job, as commands the harness runs and measures.

a. `opspatch`: `opspatch apply eagle-init-guard --hosts bench-N --playbook incident --yes`
   (the patch phase adds `--restart never`, when opspatch has that option), its host agent
   resident (one process per host for the run, the default); `opspatch-per-exec`: the same
   with the inventory's `agent = "per-exec"` (a fresh interpreter per request: issue 44's
   before);
b. `ansible`: `ansible-playbook bench/ansible/eagle-init-guard.yml` with forks = N, pipelining
   and SSH ControlPersist (ansible.cfg written by the harness);
c. `pyinfra`: `pyinfra inventory_N.py bench/pyinfra/eagle_init_guard.py --parallel N -y`;
d. `sed`: the incident's workflow, host after host: `ssh host 'sed -i ...'`, `ssh host
   <restart>`, `ssh host 'until curl /health; ...; curl /generate'` (no backup, no validation,
   no rollback), as a bash script written per N.

Every tool reaches host `hNN` at `127.0.0.1:<relay port>` with the benchmark's user key and a
known_hosts file pinning each relay port to that host's sshd key: OpenSSH and paramiko both
look a non-22 port up as `[127.0.0.1]:PORT` (a hashed or plain entry), so one line per relay
port is all they need. The tools run with HOME set to a folder of the benchmark: nothing reads
or writes the user's ~/.ssh, ~/.ansible or ~/.config.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleet import BenchHost

TOOLS = ("opspatch", "opspatch-per-exec", "ansible", "pyinfra", "sed")
PER_EXEC = "opspatch-per-exec"
PROMPTS = ("The capital of France is", "def fibonacci(n):")
SED_SCRIPT = (
    r"/^class EAGLEWorkerV2(/a\    spec_disable_batch_threshold: int = 0",
    r"/^        self\.speculation_disabled = False$/a\        self.spec_disable_batch_threshold = 0",
)


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    env: dict[str, str]
    note: str = ""


@dataclass(frozen=True)
class Endpoint:
    """Where the tools reach one host: the relay's port on 127.0.0.1."""

    host: BenchHost
    port: int


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


class Workloads:
    """Writes every tool's inventory and configuration, and builds its command per N."""

    def __init__(
        self,
        *,
        repo: Path,
        work: Path,
        controller_state: Path,
        home: Path,
        venv: Path,
        opspatch: Sequence[str],
        user_key: Path,
        base_env: Mapping[str, str],
        poll_delay: float,
    ) -> None:
        self.repo = repo
        self.work = work
        self.controller_state = controller_state
        self.home = home
        self.venv = venv
        self.opspatch = list(opspatch)
        self.user_key = user_key
        self.base_env = dict(base_env)
        self.poll_delay = poll_delay
        self.known_hosts = work / "known_hosts"
        self.control_dir = Path("/tmp") / f"obench-cp-{os.getpid()}"  # short: a socket path
        for folder in (work, home, controller_state / "inventories", self.control_dir):
            folder.mkdir(parents=True, exist_ok=True)

    # shared -------------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = dict(self.base_env)
        env["HOME"] = str(self.home)
        env["OPSPATCH_STATE_DIR"] = str(self.controller_state)
        env["PATH"] = f"{self.venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        env["ANSIBLE_CONFIG"] = str(self.work / "ansible.cfg")
        env["ANSIBLE_LOCAL_TEMP"] = str(self.home / ".ansible" / "tmp")
        env["ANSIBLE_NOCOLOR"] = "1"
        env["PYINFRA_PROGRESS"] = "off"
        env["NO_COLOR"] = "1"
        return env

    def write_known_hosts(self, endpoints: Sequence[Endpoint]) -> None:
        lines = [f"[127.0.0.1]:{e.port} {e.host.host_public_key}\n" for e in endpoints]
        self.known_hosts.write_text("".join(lines))

    def write_all(self, endpoints: Sequence[Endpoint], counts: Sequence[int]) -> None:
        self.write_known_hosts(endpoints)
        self._write_ansible_cfg()
        for count in counts:
            chosen = endpoints[:count]
            self._write_opspatch_inventory(chosen)
            self._write_ansible_inventory(chosen)
            self._write_pyinfra_inventory(chosen)
            self._write_sed_script(chosen, "full")
            self._write_sed_script(chosen, "patch")

    # a. opspatch ---------------------------------------------------------------------------------

    def opspatch_inventory_name(self, count: int, tool: str = "opspatch") -> str:
        return f"bench-{count}" + ("-per-exec" if tool == PER_EXEC else "")

    def _write_opspatch_inventory(self, endpoints: Sequence[Endpoint]) -> None:
        for tool in ("opspatch", PER_EXEC):
            self._write_opspatch_inventory_for(endpoints, tool)

    def _write_opspatch_inventory_for(self, endpoints: Sequence[Endpoint], tool: str) -> None:
        lines = [
            "# Written by bench/rollout.py: the benchmark's hosts, reached through its relays.",
            'description = "opspatch benchmark hosts"',
            "",
            "[defaults]",
            f'agent = "{"per-exec" if tool == PER_EXEC else "resident"}"',
            'transport = "ssh"',
            'user = "root"',
            f"identity_file = {_toml(str(self.user_key))}",
            f"known_hosts = {_toml(str(self.known_hosts))}",
            "",
            "[defaults.engine]",
            "speculative = true",
            'env = { CUDA_VISIBLE_DEVICES = "", PYTHONUNBUFFERED = "1" }',
        ]
        for endpoint in endpoints:
            host = endpoint.host
            restart = {
                "kind": "command",
                "start": host.start,
                "pid_file": str(host.pid_file),
                "workdir": str(host.host_dir),
                "stop_timeout": host.stop_timeout,
            }
            lines += [
                "",
                f"[hosts.{host.name}]",
                'address = "127.0.0.1"',
                f"port = {endpoint.port}",
                f"state_dir = {_toml(str(host.state_dir))}",
                f"[hosts.{host.name}.engine]",
                f"python = {_toml(str(host.python))}",
                f"url = {_toml(host.url)}",
                f"log_file = {_toml(str(host.log_file))}",
                f"restart = {_toml(restart)}",
            ]
        name = self.opspatch_inventory_name(len(endpoints), tool)
        path = self.controller_state / "inventories" / f"{name}.toml"
        path.write_text("\n".join(lines) + "\n")

    def opspatch_supports_restart_never(self) -> bool:
        done = subprocess.run(
            [*self.opspatch, "apply", "--help"],
            env=self.env(),
            cwd=self.repo,
            capture_output=True,
            text=True,
            check=False,
        )
        return re.search(r"--restart[\s=\[]", done.stdout) is not None

    def opspatch_command(self, count: int, phase: str, tool: str = "opspatch") -> Command:
        argv = [
            *self.opspatch,
            "apply",
            "eagle-init-guard",
            "--hosts",
            self.opspatch_inventory_name(count, tool),
            "--playbook",
            "incident",
            "--yes",
            "--json",
        ]
        if phase == "patch":
            argv += ["--restart", "never"]
        return Command(tuple(argv), self.env())

    def opspatch_plan_command(self, count: int, tool: str = "opspatch") -> Command:
        """`opspatch plan --hosts`: the warm-up for opspatch while it cannot skip the restart
        (the same imports and SSH connections as an apply, changing nothing)."""
        argv = [
            *self.opspatch,
            "plan",
            "eagle-init-guard",
            "--hosts",
            self.opspatch_inventory_name(count, tool),
        ]
        return Command(tuple(argv), self.env())

    # b. ansible ----------------------------------------------------------------------------------

    def _write_ansible_cfg(self) -> None:
        ssh_args = (
            "-C -o ControlMaster=auto -o ControlPersist=60s -F none "
            f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes "
            "-o BatchMode=yes"
        )
        (self.work / "ansible.cfg").write_text(
            "\n".join(
                [
                    "# Written by bench/rollout.py: Ansible as its users tune it for speed.",
                    "[defaults]",
                    "host_key_checking = True",
                    "interpreter_python = /usr/bin/python3",
                    "retry_files_enabled = False",
                    "stdout_callback = default",
                    f"local_tmp = {self.home / '.ansible' / 'tmp'}",
                    "",
                    "[ssh_connection]",
                    "pipelining = True",
                    f"ssh_args = {ssh_args}",
                    f"control_path_dir = {self.control_dir}",
                    "control_path = %(directory)s/%%C",
                    "",
                ]
            )
        )

    def _ansible_inventory_path(self, count: int) -> Path:
        return self.work / "ansible" / f"inventory-{count}.yml"

    def _write_ansible_inventory(self, endpoints: Sequence[Endpoint]) -> None:
        hosts = {}
        for endpoint in endpoints:
            host = endpoint.host
            hosts[host.name] = {
                "ansible_host": "127.0.0.1",
                "ansible_port": endpoint.port,
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(self.user_key),
                "target_file": str(host.target_file),
                "engine_python": str(host.python),
                "engine_port": host.engine_port,
                "restart_script": host.restart_script(),
            }
        document = {"all": {"children": {"fleet": {"hosts": hosts}}}}
        path = self._ansible_inventory_path(len(endpoints))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2) + "\n")  # JSON is YAML

    def ansible_command(self, count: int, phase: str) -> Command:
        argv = [
            str(self.venv / "bin" / "ansible-playbook"),
            "-i",
            str(self._ansible_inventory_path(count)),
            "-f",
            str(count),
            "-e",
            f"phase={phase}",
            "-e",
            f"poll_delay={self.poll_delay:g}",
            str(self.repo / "bench" / "ansible" / "eagle-init-guard.yml"),
        ]
        return Command(tuple(argv), self.env())

    def ansible_check_diff_command(self, count: int) -> Command:
        argv = [
            str(self.venv / "bin" / "ansible-playbook"),
            "-i",
            str(self._ansible_inventory_path(count)),
            "-f",
            str(count),
            "--check",
            "--diff",
            "-e",
            "phase=patch",
            str(self.repo / "bench" / "ansible" / "eagle-init-guard.yml"),
        ]
        return Command(tuple(argv), self.env())

    # c. pyinfra ----------------------------------------------------------------------------------

    def _pyinfra_inventory_path(self, count: int) -> Path:
        return self.work / "pyinfra" / f"inventory_{count}.py"

    def _write_pyinfra_inventory(self, endpoints: Sequence[Endpoint]) -> None:
        entries = []
        for endpoint in endpoints:
            host = endpoint.host
            data = {
                "ssh_hostname": "127.0.0.1",
                "ssh_port": endpoint.port,
                "ssh_user": "root",
                "ssh_key": str(self.user_key),
                "ssh_known_hosts_file": str(self.known_hosts),
                "ssh_strict_host_key_checking": "yes",
                "target_file": str(host.target_file),
                "engine_python": str(host.python),
                "engine_port": host.engine_port,
                "restart_script": host.restart_script(),
            }
            entries.append(f"    ({host.name!r}, {data!r}),")
        text = (
            "# Written by bench/rollout.py: the benchmark's hosts, reached through its relays.\n"
            "fleet = [\n" + "\n".join(entries) + "\n]\n"
        )
        path = self._pyinfra_inventory_path(len(endpoints))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def pyinfra_command(self, count: int, phase: str) -> Command:
        argv = [
            str(self.venv / "bin" / "pyinfra"),
            str(self._pyinfra_inventory_path(count)),
            str(self.repo / "bench" / "pyinfra" / "eagle_init_guard.py"),
            "-y",
            "--parallel",
            str(count),
            "--data",
            f"phase={phase}",
            "--data",
            f"poll_delay={self.poll_delay:g}",
        ]
        return Command(tuple(argv), self.env())

    # d. the incident's sed loop ----------------------------------------------------------------

    def _sed_script_path(self, count: int, phase: str) -> Path:
        return self.work / "sed" / f"{phase}-{count}.sh"

    def _write_sed_script(self, endpoints: Sequence[Endpoint], phase: str) -> None:
        ssh = (
            f"ssh -F none -o BatchMode=yes -o StrictHostKeyChecking=yes "
            f"-o UserKnownHostsFile={self.known_hosts} -i {self.user_key} -l root"
        )
        sed = "sed -i " + " ".join(f"-e {shlex.quote(e)}" for e in SED_SCRIPT)
        lines = [
            "#!/bin/bash",
            "# Written by bench/rollout.py: the incident's workflow, host after host,",
            "# no backup, no validation, no rollback.",
            "rc=0",
        ]
        for endpoint in endpoints:
            host = endpoint.host
            target = f"{ssh} -p {endpoint.port} 127.0.0.1"
            lines.append(f"# {host.name}")
            lines.append(
                f"{target} {shlex.quote(f'{sed} {shlex.quote(str(host.target_file))}')} || rc=1"
            )
            if phase == "full":
                lines.append(f"{target} {shlex.quote(host.restart_script())} || rc=1")
                wait = (
                    f"until curl -sf -o /dev/null {host.url}/health; "
                    f"do sleep {self.poll_delay:g}; done"
                )
                smoke = "; ".join(
                    "curl -sf -X POST -H 'Content-Type: application/json' -d "
                    + shlex.quote(
                        json.dumps(
                            {
                                "text": prompt,
                                "sampling_params": {"max_new_tokens": 16, "temperature": 0},
                            }
                        )
                    )
                    + f" {host.url}/generate && echo"
                    for prompt in PROMPTS
                )
                lines.append(f"{target} {shlex.quote(f'{wait}; {smoke}')} || rc=1")
        lines.append("exit $rc")
        path = self._sed_script_path(len(endpoints), phase)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")

    def sed_command(self, count: int, phase: str) -> Command:
        return Command(("/bin/bash", str(self._sed_script_path(count, phase))), self.env())

    # -----------------------------------------------------------------------------------------------

    def command(self, tool: str, count: int, phase: str) -> Command:
        if tool in ("opspatch", PER_EXEC):
            return self.opspatch_command(count, phase, tool)
        if tool == "ansible":
            return self.ansible_command(count, phase)
        if tool == "pyinfra":
            return self.pyinfra_command(count, phase)
        if tool == "sed":
            return self.sed_command(count, phase)
        raise ValueError(f"unknown tool {tool!r}")
