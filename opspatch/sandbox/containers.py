"""`opspatch sandbox up --containers`: each stand-in engine in a real podman container."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from opspatch.core.host import ContainerRuntime, ContainerSettings
from opspatch.core.reasons import Reason
from opspatch.core.remedy import remedy_text
from opspatch.core.vocabulary import Command
from opspatch.errors import ContainerError, HostError, InputError
from opspatch.hosts.transport.container import ContainerIdentity, ContainerTransport
from opspatch.hosts.transport.local import LocalTransport
from opspatch.sandbox.checkout import editable_files, make_checkout
from opspatch.sandbox.dist import STANDIN_VERSION
from opspatch.sandbox.install import TORCH_PTH_NAME, controller_torch_dir
from opspatch.sandbox.layout import ENGINE_ENV, Progress, SandboxLayout, quiet

UP = remedy_text(Command.SANDBOX_UP)
"""The command that builds the sandbox, for hints."""

RUNTIME: ContainerRuntime = "podman"
WORKSPACE = "/sgl-workspace"
CHECKOUT = f"{WORKSPACE}/sglang"
SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
HOST_SITE = "/opt/host-site"
PYTHON = "/usr/bin/python3"
LOG_FILE = "/var/log/sglang/server.log"
PID_DIR = "/run/sglang"
PID_FILE = f"{PID_DIR}/server.pid"
STATE_DIR = "/var/tmp/opspatch"
STOP_TIMEOUT = 2.0
START_SCRIPT = "/usr/local/bin/opspatch-sandbox-engine"
PORT_VARIABLE = "SGLANG_PORT"
SANDBOX_LABEL = "org.opspatch.sandbox"

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "git")
BUILD_TIMEOUT = 900.0

CONTAINERS_CONF = """\
# Written by `opspatch sandbox up --containers`, passed to podman as CONTAINERS_CONF.
[engine]
# crun refuses cgroups in hybrid mode on this kind of machine
runtime = "runc"

[containers]
# podman's default limits exceed what such machines allow (setrlimit: Operation not permitted)
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
"""

_START_SCRIPT = f"""\
#!/bin/sh
# The stand-in engine as the container's main work, the container kept up when it exits (as
# images with a supervisor are), so that a file can still be restored inside by exec.
mkdir -p "$(dirname {LOG_FILE})" {PID_DIR}
cd {WORKSPACE}
{PYTHON} -m sglang.launch_server --host 127.0.0.1 --port "${PORT_VARIABLE}" \\
    --speculative-algorithm EAGLE3 >> {LOG_FILE} 2>&1 &
echo $! > {PID_FILE}
wait $!
echo "[opspatch sandbox] the engine exited with status $?" >> {LOG_FILE}
exec sleep infinity
"""


def _digest(*parts: bytes) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(len(part).to_bytes(8, "big"))
        hasher.update(part)
    return hasher.hexdigest()[:16]


def base_image_tag() -> str:
    """The base image's tag: a hash of its recipe (suite and packages)."""
    recipe = f"{DEBIAN_SUITE} minbase {' '.join(BASE_PACKAGES)}".encode()
    return f"localhost/opspatch-sandbox-base:{DEBIAN_SUITE}-{_digest(recipe)}"


def engine_context_files(version: str = STANDIN_VERSION) -> dict[str, bytes]:
    """The engine image's build context besides the checkout: the Containerfile, the
    site-packages files of the editable install, the torch `.pth` and the start script."""
    files = {f"site/{path}": data for path, data in editable_files(Path(CHECKOUT), version).items()}
    files[f"site/{TORCH_PTH_NAME}"] = f"{HOST_SITE}\n".encode()
    files["opspatch-sandbox-engine"] = _START_SCRIPT.encode()
    env = " ".join(f'{name}="{value}"' for name, value in sorted(ENGINE_ENV.items()))
    files["Containerfile"] = (
        f"FROM {base_image_tag()}\n"
        f"COPY sglang {CHECKOUT}\n"
        f"COPY site/ {SITE_PACKAGES}/\n"
        f"COPY opspatch-sandbox-engine {START_SCRIPT}\n"
        f"RUN chmod 0755 {START_SCRIPT}\n"
        f"ENV {env}\n"
        f"WORKDIR {WORKSPACE}\n"
        f'CMD ["{START_SCRIPT}"]\n'
    ).encode()
    return files


def engine_image_tag(version: str = STANDIN_VERSION) -> str:
    """The engine image's tag: a hash of the base and every file the build copies (the
    checkout's files as committed, with the context files)."""
    from opspatch.sandbox.checkout import checkout_files

    parts: list[bytes] = [base_image_tag().encode()]
    for group in (checkout_files(version), engine_context_files(version)):
        for path, data in sorted(group.items()):
            parts += [path.encode(), data]
    return f"localhost/opspatch-sandbox-engine:{_digest(*parts)}"


def container_name(layout: SandboxLayout, host: str) -> str:
    """The container of sandbox host `host`: named after the sandbox too, so two sandboxes on
    one machine never share a container."""
    return f"opspatch-{_digest(str(layout.root.resolve()).encode())[:8]}-{host}"


def container_settings(layout: SandboxLayout, host: str) -> ContainerSettings:
    return ContainerSettings(runtime=RUNTIME, name=container_name(layout, host))


# ---------------------------------------------------------------------------------------------
# effects: podman on this machine


def require_podman() -> str:
    """The `podman` executable.

    Raises:
        InputError: podman is not installed.
    """
    found = shutil.which(RUNTIME)
    if found is None:
        raise InputError(
            "`--containers` needs podman, which is not installed; nothing was started",
            hint=f"apt-get install podman runc (or run `{UP}` without --containers)",
        )
    return found


def podman_env(layout: SandboxLayout) -> dict[str, str]:
    """The environment podman runs in for the sandbox: its own containers.conf."""
    conf = layout.root / "containers.conf"
    if not conf.exists() or conf.read_text(encoding="utf-8") != CONTAINERS_CONF:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(CONTAINERS_CONF, encoding="utf-8")
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def _podman(
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    step: str,
    host: str = "sandbox",
    stdin: bytes | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[bytes]:
    try:
        done = subprocess.run(
            [RUNTIME, *args],
            input=stdin,
            env=dict(env),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostError(f"podman {args[0]} failed: {exc}", host=host, step=step) from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).decode("utf-8", errors="replace").strip()
        raise HostError(
            f"podman {' '.join(args[:2])} exited {done.returncode}: {said[-2000:]}",
            host=host,
            step=step,
        )
    return done


def _image_exists(tag: str, env: Mapping[str, str]) -> bool:
    done = subprocess.run(
        [RUNTIME, "image", "exists", tag], env=dict(env), capture_output=True, check=False
    )
    return done.returncode == 0


def ensure_base_image(env: Mapping[str, str], progress: Progress = quiet) -> str:
    """The base image, built with debootstrap and `podman import` unless podman has it.

    Raises:
        InputError: debootstrap is not installed, or this is not root (debootstrap needs it).
        HostError: debootstrap or the import failed.
    """
    tag = base_image_tag()
    if _image_exists(tag, env):
        return tag
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None or os.geteuid() != 0:
        raise InputError(
            f"building the sandbox's base image {tag} needs debootstrap, run as root",
            hint="apt-get install debootstrap, and run "
            f"`{remedy_text(Command.SANDBOX_UP, containers=True)}` as root",
        )
    progress(f"building the base image {tag} (debootstrap {DEBIAN_SUITE}, once per machine)")
    with tempfile.TemporaryDirectory(prefix="opspatch-rootfs-", dir="/var/tmp") as scratch:
        root = Path(scratch) / "root"
        try:
            done = subprocess.run(
                [
                    debootstrap,
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    DEBIAN_SUITE,
                    str(root),
                    DEBIAN_MIRROR,
                ],
                capture_output=True,
                timeout=BUILD_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise HostError(
                f"debootstrap did not finish in {BUILD_TIMEOUT:.0f}s", host="sandbox", step="image"
            ) from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode("utf-8", errors="replace").strip()
            raise HostError(
                f"debootstrap exited {done.returncode}: {said[-2000:]}",
                host="sandbox",
                step="image",
            )
        archive = Path(scratch) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "-cf", str(archive), "."], check=True)
        _podman(["import", str(archive), tag], env, step="image", timeout=BUILD_TIMEOUT)
    return tag


def ensure_engine_image(env: Mapping[str, str], progress: Progress = quiet) -> str:
    """The engine image, built on the base with `podman build` unless podman has it.

    Raises:
        InputError, HostError: as `ensure_base_image`; the build failed.
    """
    ensure_base_image(env, progress)
    tag = engine_image_tag()
    if _image_exists(tag, env):
        return tag
    progress(f"building the engine image {tag}")
    with tempfile.TemporaryDirectory(prefix="opspatch-image-") as scratch:
        context = Path(scratch)
        make_checkout(context, STANDIN_VERSION)  # <context>/sglang, one commit
        for relative, data in engine_context_files().items():
            target = context / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o644)
        _podman(
            [
                "build",
                "--network=none",
                "-t",
                tag,
                "-f",
                str(context / "Containerfile"),
                str(context),
            ],
            env,
            step="image",
            timeout=BUILD_TIMEOUT,
        )
    return tag


def inspect_container(layout: SandboxLayout, host: str) -> ContainerIdentity | None:
    """Host `host`'s container as podman sees it now, or None when there is none."""
    transport = ContainerTransport(LocalTransport(host), container_settings(layout, host))
    try:
        return transport.inspect()
    except ContainerError as exc:
        if exc.reason == Reason.CONTAINER_MISSING:
            return None
        raise


def run_container(
    layout: SandboxLayout, host: str, port: int, image: str, env: Mapping[str, str]
) -> None:
    """Create and start host `host`'s container from `image` (its engine on `port`)."""
    _podman(
        [
            "run",
            "--detach",
            "--name",
            container_name(layout, host),
            "--init",
            "--network=host",
            "--tmpfs",
            PID_DIR,
            "--volume",
            f"{controller_torch_dir()}:{HOST_SITE}:ro",
            "--env",
            f"{PORT_VARIABLE}={port}",
            "--label",
            f"{SANDBOX_LABEL}={layout.root}",
            image,
        ],
        env,
        step="container",
        host=host,
    )


def start_container(layout: SandboxLayout, host: str, env: Mapping[str, str]) -> None:
    """Start host `host`'s stopped container (its writable layer, and a patched file, kept)."""
    _podman(["start", container_name(layout, host)], env, step="container", host=host)


def restart_container(layout: SandboxLayout, host: str, env: Mapping[str, str]) -> None:
    """Restart host `host`'s running container (its engine exited; the layer is kept)."""
    _podman(
        ["restart", "--time", str(int(STOP_TIMEOUT)), container_name(layout, host)],
        env,
        step="container",
        host=host,
    )


def stop_container(layout: SandboxLayout, host: str, env: Mapping[str, str]) -> None:
    _podman(
        ["stop", "--time", str(int(STOP_TIMEOUT)), container_name(layout, host)],
        env,
        step="container",
        host=host,
    )


def remove_container(layout: SandboxLayout, host: str, env: Mapping[str, str]) -> None:
    """Remove host `host`'s container (whatever was patched inside goes with it)."""
    _podman(
        ["rm", "--force", "--time", "0", container_name(layout, host)],
        env,
        step="container",
        host=host,
    )
