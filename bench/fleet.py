"""The benchmark's hosts: sandbox engines reached over real SSH, brought to one starting state.

Hosts come from `opspatch sandbox up --ssh` (driven through the CLI): each is a folder with its
own virtual environment, stand-in SGLang engine, pid file and log, and a private sshd. The
sandbox holds at most 16 hosts, so N hosts are made of ceil(N/16) sandboxes, each in its own
state folder (`<state>/fleet-1`, `<state>/fleet-2`, ...); the benchmark names them h01..hNN.

For counting, every host also gets an sshd of the benchmark's own: the sandbox's sshd_config
(same host key, same settings) with `LogLevel VERBOSE`, its own port, pid file and log, and an
authorized_keys holding one benchmark user key. At VERBOSE, sshd logs every authenticated
connection ("Accepted publickey") and every exec ("Starting session: command"), so connections
and exec round trips per host are counted from the log written during a run. The tools reach
that sshd through the latency relay (`relay.py`).

Starting state, restored before every tool run (outside the timing):
- the target file: the pristine `eagle_worker_v2.py` (its sha256 checked against the
  distribution's RECORD), written atomically, its bytecode cache removed;
- the full pipeline only: each engine restarted (stopped by its pid file's process group, started
  with the inventory's start command in its folder, pid file written) and waited for.

Processes the harness starts are ended by pid: its sshds, the engines (through
`opspatch sandbox down`, which stops them by pid file, and then any engine still running in a
bench host folder), and the tools' leftovers (measure.py).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

SANDBOX_MAX_HOSTS = 16  # opspatch.sandbox.fleet.MAX_HOSTS: `sandbox up --count` refuses more
TARGET_RELATIVE = "sglang/srt/speculative/eagle_worker_v2.py"
ENGINE_ENV = {"CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}

Log = Callable[[str], None]


@dataclass(frozen=True)
class BenchHost:
    """One host as the tools see it, and what the harness needs to reset it."""

    name: str  # h01, h02, ...
    sandbox_state: Path  # the OPSPATCH_STATE_DIR of its sandbox
    sandbox_name: str  # sandbox-01, ...
    host_dir: Path
    python: Path
    engine_port: int
    log_file: Path
    pid_file: Path
    start: str  # the inventory's start command (already quoted for a shell)
    stop_timeout: int
    state_dir: Path  # opspatch's host-side state (lock, backups)
    target_file: Path
    ssh_address: str
    host_key_file: Path
    host_public_key: str  # "ssh-ed25519 AAAA..."
    sandbox_sshd_config: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"

    def restart_script(self) -> str:
        """A POSIX shell script that restarts this engine as the sandbox does: stop the process
        group of the pid in the pid file (TERM, up to stop_timeout, KILL; `kill -s SIG -- -PGID`
        is the spelling dash accepts), then start the start
        command in the host folder with the engine's environment, in a new session, and write
        the pid file. The start is one simple command sent to the background (not a compound:
        bash would keep a subshell holding the SSH session's output open, and its pid would be
        the one written). Ansible, pyinfra and the sed loop all run this (inventory data, as an
        operator's inventory carries a restart command)."""
        env = " ".join(f"{k}={v}" for k, v in ENGINE_ENV.items())
        steps = self.stop_timeout * 10
        return (
            f"pid=$(cat {self.pid_file} 2>/dev/null || true); "
            'if [ -n "$pid" ] && kill -s 0 -- "-$pid" 2>/dev/null; then '
            'kill -s TERM -- "-$pid" 2>/dev/null; i=0; '
            f'while [ "$i" -lt {steps} ] && kill -s 0 -- "-$pid" 2>/dev/null; '
            "do sleep 0.1; i=$((i+1)); done; "
            'kill -s KILL -- "-$pid" 2>/dev/null; fi; '
            f"cd {self.host_dir} || exit 1; "
            f"{env} setsid {self.start} >> {self.log_file} 2>&1 < /dev/null & "
            f"echo $! > {self.pid_file}"
        )


@dataclass
class BenchSshd:
    """The benchmark's own sshd for one host (LogLevel VERBOSE)."""

    host: str
    address: str
    port: int
    pid: int
    log_file: Path
    config: Path


@dataclass(frozen=True)
class SshCounts:
    connections: int
    execs: int


def record_sha256(site_packages: Path, relative: str) -> str | None:
    """The hex sha256 the distribution's RECORD gives for `relative`, or None."""
    for record in site_packages.glob("*.dist-info/RECORD"):
        for line in record.read_text(encoding="utf-8").splitlines():
            path, _, rest = line.partition(",")
            if path == relative and rest.startswith("sha256="):
                digest = rest.split(",", 1)[0][len("sha256=") :]
                padded = digest + "=" * (-len(digest) % 4)
                return base64.urlsafe_b64decode(padded).hex()
    return None


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _parent(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rfind(")") + 2 :].split()[1])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def stop_group(pid: int, timeout: float) -> None:
    """TERM the process group led by `pid` (engines run in their own session), wait, KILL."""
    group = _pgid(pid)
    targets = [pid] if group is None else []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group is not None:
            os.killpg(group, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _group_alive(group, targets):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group is not None:
            os.killpg(group, signal.SIGKILL)
        elif _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _group_alive(group: int | None, pids: Sequence[int]) -> bool:
    if group is None:
        return any(_alive(p) for p in pids)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _pgid(int(entry)) == group and _alive(int(entry)):
            return True
    return False


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 - loopback
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


def decode(url: str, prompt: str, timeout: float = 60.0) -> dict[str, object]:
    """One greedy 16-token decode (the smoke every tool runs); the parsed JSON reply."""
    body = json.dumps(
        {"text": prompt, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
    ).encode()
    request = urllib.request.Request(
        url + "/generate", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 - loopback
        data: dict[str, object] = json.loads(reply.read())
        return data


class Fleet:
    """Sandboxes, the benchmark's sshds, pristine files and engine restarts."""

    def __init__(
        self,
        state_root: Path,
        opspatch: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        log: Log,
    ) -> None:
        self.state_root = state_root
        self.opspatch = list(opspatch)
        self.env = dict(env)
        self.cwd = cwd
        self.log = log
        self.hosts: list[BenchHost] = []
        self.sshds: list[BenchSshd] = []
        self.sandboxes: list[Path] = []
        self.pristine: bytes = b""
        self.user_key = state_root / "ssh" / "id_ed25519"
        self.engine_limit = 0

    # bring-up ------------------------------------------------------------------------------------

    def up(self, total: int, engine_limit: int, sandbox_size: int = SANDBOX_MAX_HOSTS) -> None:
        """Make `total` hosts over SSH in sandboxes of at most `sandbox_size`; leave engines
        running on the first `engine_limit` (the others are stopped as soon as they are up)."""
        self.engine_limit = engine_limit
        chunk = max(1, min(sandbox_size, SANDBOX_MAX_HOSTS, engine_limit or SANDBOX_MAX_HOSTS))
        remaining, index = total, 0
        while remaining > 0:
            size = min(chunk, remaining)
            state = self.state_root / f"fleet-{index + 1}"
            self.sandboxes.append(state)
            self._sandbox_up(state, size)
            self.hosts.extend(self._read_hosts(state, size, first_number=len(self.hosts) + 1))
            # Engines above the limit are not needed (patch phase only): stop them now, before
            # the next sandbox starts its own.
            for host in self.hosts[engine_limit:]:
                self.stop_engine(host)
            remaining -= size
            index += 1
        self._pristine_source()
        self._ensure_user_key()
        for host in self.hosts:
            self.sshds.append(self._start_sshd(host))

    def _opspatch_env(self, state: Path) -> dict[str, str]:
        env = dict(self.env)
        env["OPSPATCH_STATE_DIR"] = str(state)
        return env

    def _sandbox_up(self, state: Path, size: int) -> None:
        manifest = state / "sandbox" / "sandbox.json"
        existing = 0
        if manifest.exists():
            with contextlib.suppress(ValueError, KeyError):
                existing = len(json.loads(manifest.read_text())["hosts"])
        if existing > size:
            # `up` never shrinks a sandbox, and would start every engine it has: rebuild it.
            self.log(f"opspatch sandbox down --purge  ({state}: {existing} hosts, want {size})")
            subprocess.run(
                [*self.opspatch, "sandbox", "down", "--purge"],
                env=self._opspatch_env(state),
                cwd=self.cwd,
                capture_output=True,
                check=True,
            )
        self.log(f"opspatch sandbox up --ssh --count {size}  (OPSPATCH_STATE_DIR={state})")
        done = subprocess.run(
            [*self.opspatch, "sandbox", "up", "--ssh", "--count", str(size), "--json"],
            env=self._opspatch_env(state),
            cwd=self.cwd,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"opspatch sandbox up failed (exit {done.returncode}):\n{done.stdout[-3000:]}"
                f"\n{done.stderr[-3000:]}"
            )

    def _read_hosts(self, state: Path, size: int, first_number: int) -> list[BenchHost]:
        manifest = json.loads((state / "sandbox" / "sandbox.json").read_text())
        inventory = tomllib.loads((state / "inventories" / "sandbox-ssh.toml").read_text())
        hosts = []
        for offset, record in enumerate(manifest["hosts"][:size]):
            name = record["name"]
            entry = inventory["hosts"][name]
            engine = entry["engine"]
            restart = engine["restart"]
            python = Path(engine["python"])
            site = next(python.parent.parent.glob("lib/python*/site-packages"))
            ssh_dir = state / "sandbox" / "ssh" / name
            hosts.append(
                BenchHost(
                    name=f"h{first_number + offset:02d}",
                    sandbox_state=state,
                    sandbox_name=name,
                    host_dir=Path(restart["workdir"]),
                    python=python,
                    engine_port=int(record["port"]),
                    log_file=Path(engine["log_file"]),
                    pid_file=Path(restart["pid_file"]),
                    start=restart["start"],
                    stop_timeout=int(restart.get("stop_timeout", 10)),
                    state_dir=Path(entry["state_dir"]),
                    target_file=site / TARGET_RELATIVE,
                    ssh_address=record["ssh"]["address"],
                    host_key_file=ssh_dir / "ssh_host_ed25519_key",
                    host_public_key=record["ssh"]["host_public_key"],
                    sandbox_sshd_config=ssh_dir / "sshd_config",
                )
            )
        return hosts

    def _pristine_source(self) -> None:
        """The unpatched target file: a host's own copy or the stand-in's source, whichever
        matches the sha256 its distribution's RECORD lists."""
        host = self.hosts[0]
        site = host.target_file.parents[3]
        expected = record_sha256(site, TARGET_RELATIVE)
        repo_copy = self.cwd / "opspatch" / "sandbox" / "engine_src" / TARGET_RELATIVE
        for candidate in (host.target_file, repo_copy):
            with contextlib.suppress(OSError):
                data = candidate.read_bytes()
                if hashlib.sha256(data).hexdigest() == expected:
                    self.pristine = data
                    return
        raise RuntimeError(f"no copy of {TARGET_RELATIVE} matches its RECORD hash {expected}")

    def _ensure_user_key(self) -> None:
        if self.user_key.exists():
            return
        self.user_key.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "opspatch-bench",
             "-f", str(self.user_key)],
            check=True,
        )  # fmt: skip

    # the benchmark's sshds -------------------------------------------------------------------------

    def _start_sshd(self, host: BenchHost) -> BenchSshd:
        workdir = self.state_root / "sshd" / host.name
        workdir.mkdir(parents=True, exist_ok=True)
        authorized = workdir / "authorized_keys"
        authorized.write_text(Path(str(self.user_key) + ".pub").read_text())
        port = _free_port(host.ssh_address)
        config = workdir / "sshd_config"
        lines = []
        for line in host.sandbox_sshd_config.read_text().splitlines():
            key = line.split(" ", 1)[0]
            if key == "ListenAddress":
                line = f"ListenAddress {host.ssh_address}:{port}"
            elif key == "PidFile":
                line = f"PidFile {workdir / 'sshd.pid'}"
            elif key == "AuthorizedKeysFile":
                line = f"AuthorizedKeysFile {authorized}"
            elif key == "LogLevel":
                line = "LogLevel VERBOSE"
            lines.append(line)
        config.write_text("\n".join(lines) + "\n")
        log_file = workdir / "sshd.log"
        log_file.write_bytes(b"")
        with open(log_file, "ab") as log:
            process = subprocess.Popen(
                [*SUBREAPER, "/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        sshd = BenchSshd(host.name, host.ssh_address, port, process.pid, log_file, config)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"sshd for {host.name} exited: {log_file.read_text()[-2000:]}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection((host.ssh_address, port), timeout=0.5) as probe,
            ):
                if probe.recv(64).startswith(b"SSH-"):
                    return sshd
            time.sleep(0.05)
        raise RuntimeError(f"sshd for {host.name} did not answer on {host.ssh_address}:{port}")

    def log_offsets(self) -> list[int]:
        return [s.log_file.stat().st_size for s in self.sshds]

    def host_cpu(self, count: int) -> list[float]:
        """CPU seconds each of the first `count` hosts' sshd has used with everything it ran and
        reaped: its listener, the sessions and the commands they ran (the agent's execs), from
        /proc/PID/stat (utime + stime + cutime + cstime). The difference over a run is what the
        tool cost that host, whatever else the machine runs. A session still exiting is waited
        for first (up to 3 s), so its share is not missed; so is a command its session left
        running (a resident agent still ending when its connection closed): the listener is
        its subreaper (`SUBREAPER`), so it is reparented to it and reaped there."""
        listeners = {s.pid for s in self.sshds[:count]}
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(_parent(p) in listeners for p in _pids()):
            time.sleep(0.05)
        ticks = os.sysconf("SC_CLK_TCK")
        figures = []
        for sshd in self.sshds[:count]:
            raw = Path(f"/proc/{sshd.pid}/stat").read_text()
            fields = raw[raw.rfind(")") + 2 :].split()
            figures.append(sum(int(v) for v in fields[11:15]) / ticks)  # utime..cstime
        return figures

    def ssh_counts(self, offsets: Sequence[int], count: int) -> list[SshCounts]:
        """Connections and execs per host (the first `count`) logged since `offsets`."""
        counts = []
        for sshd, offset in zip(self.sshds[:count], offsets, strict=False):
            with open(sshd.log_file, "rb") as handle:
                handle.seek(offset)
                text = handle.read().decode(errors="replace")
            counts.append(
                SshCounts(
                    connections=len(re.findall(r"Accepted publickey for ", text)),
                    execs=len(re.findall(r"Starting session: (command|subsystem)", text)),
                )
            )
        return counts

    # the starting state ---------------------------------------------------------------------------

    def restore_pristine(self, hosts: Sequence[BenchHost]) -> None:
        """Put the unpatched file back on each host (atomically, mode kept) and drop its
        bytecode and any backup a tool left beside it."""
        for host in hosts:
            target = host.target_file
            mode = target.stat().st_mode & 0o7777
            temp = target.with_name(f".{target.name}.bench-tmp")
            temp.write_bytes(self.pristine)
            os.chmod(temp, mode)
            os.replace(temp, target)
            for stale in target.parent.glob(f"__pycache__/{target.stem}.*.pyc"):
                stale.unlink(missing_ok=True)
            for leftover in target.parent.glob(f"{target.name}.*"):
                leftover.unlink(missing_ok=True)

    def engine_pid(self, host: BenchHost) -> int | None:
        """The running engine of `host` (its pid file's pid, if that process is the engine)."""
        pid = _read_pid(host.pid_file)
        if pid is None or not _alive(pid) or "sglang.launch_server" not in _cmdline(pid):
            return None
        return pid

    def stop_engine(self, host: BenchHost) -> None:
        pid = self.engine_pid(host)
        if pid is not None:
            stop_group(pid, host.stop_timeout)

    def restart_engines(self, hosts: Sequence[BenchHost], timeout: float = 600.0) -> None:
        """Stop and start each engine as the sandbox does, all at once, then wait for /health.

        Each is started by a short-lived shell (the same script the tools run), so the engine
        is never the harness's child and init reaps it when a tool stops it."""
        for host in hosts:
            self.stop_engine(host)
        for host in hosts:
            subprocess.run(["/bin/sh", "-c", host.restart_script()], check=True)
        self.wait_ready(hosts, timeout)

    def wait_ready(self, hosts: Sequence[BenchHost], timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        pending = list(hosts)
        while pending:
            pending = [h for h in pending if http_status(h.url + "/health") != 200]
            if not pending:
                return
            if time.monotonic() > deadline:
                names = ", ".join(h.name for h in pending)
                raise RuntimeError(f"engines not ready after {timeout:.0f}s: {names}")
            time.sleep(0.1)

    def engine_cpu_s(self, host: BenchHost) -> float:
        """CPU seconds the engine's process group has used (right after a start: the cost of
        starting one engine, mostly importing torch)."""
        pid = self.engine_pid(host)
        if pid is None:
            return 0.0
        group = _pgid(pid)
        ticks = 0
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _pgid(int(entry)) == group:
                with contextlib.suppress(OSError):
                    raw = Path(f"/proc/{entry}/stat").read_text()
                    fields = raw[raw.rfind(")") + 2 :].split()
                    ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def engine_rss_mb(self, host: BenchHost) -> float:
        """Proportional set size of one engine's process tree (MB), from /proc."""
        pid = self.engine_pid(host)
        if pid is None:
            return 0.0
        group = _pgid(pid)
        total = 0
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _pgid(int(entry)) == group:
                with contextlib.suppress(OSError):
                    for line in Path(f"/proc/{entry}/smaps_rollup").read_text().splitlines():
                        if line.startswith("Pss:"):
                            total += int(line.split()[1])
        return total / 1024

    # teardown ---------------------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop every process this fleet started, by pid; return what was done."""
        notes = []
        for sshd in self.sshds:
            if _alive(sshd.pid) and str(sshd.config) in _cmdline(sshd.pid):
                stop_group(sshd.pid, 5)
                notes.append(f"stopped bench sshd {sshd.host} (pid {sshd.pid})")
            with contextlib.suppress(ChildProcessError):
                os.waitpid(sshd.pid, os.WNOHANG)
        self.sshds = []
        for state in self.sandboxes:
            done = subprocess.run(
                [*self.opspatch, "sandbox", "down"],
                env=self._opspatch_env(state),
                cwd=self.cwd,
                capture_output=True,
                text=True,
                check=False,
            )
            notes.append(f"opspatch sandbox down ({state.name}): exit {done.returncode}")
        for pid in self._stray_engines():
            stop_group(pid, 10)
            notes.append(f"stopped a stray engine (pid {pid})")
        return notes

    def _stray_engines(self) -> list[int]:
        """Engines still running in a bench host folder (e.g. started by a tool that was
        interrupted before it wrote the pid file)."""
        folders = {str(h.host_dir.resolve()) for h in self.hosts}
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if "sglang.launch_server" not in _cmdline(pid) or not _alive(pid):
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/cwd") in folders:
                    found.append(pid)
        return found


SUBREAPER = (
    "/usr/bin/python3",
    "-c",
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
    "os.execv(sys.argv[1], sys.argv[1:])",
)
"""How a benchmark sshd is started: as a child subreaper (PR_SET_CHILD_SUBREAPER, kept across
exec), so what a session leaves running ends below it and its CPU is counted there."""


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])
