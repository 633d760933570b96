"""Real podman for the container tests: whether it can run here, and a sandbox fleet whose
engines run in podman containers (`opspatch sandbox up --containers`).

The images are tagged by content (`opspatch.sandbox.containers`), so the first fleet of a run
builds them (debootstrap, ~1.5 min) and every later one reuses them: built once per CI run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fleetkit import EAGLE_RELPATH, SandboxFleet

CONTAINER_EAGLE = f"/sgl-workspace/sglang/python/{EAGLE_RELPATH}"


@functools.cache
def podman_unavailable() -> str | None:
    """Why real podman cannot run containers here, or None when it can."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman runc; .ci/run does)"
    if os.geteuid() != 0:
        return "the container tests use rootful podman and debootstrap: run them as root"
    if shutil.which("runc") is None:
        return "runc is not installed (apt-get install runc)"
    if shutil.which("catatonit") is None:
        return "catatonit (podman run --init) is not installed (apt-get install catatonit)"
    done = subprocess.run(["podman", "info"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"podman cannot run here: {(done.stderr or done.stdout).strip()[-300:]}"
    from opspatch.sandbox.containers import base_image_tag

    exists = subprocess.run(["podman", "image", "exists", base_image_tag()], check=False)
    if exists.returncode != 0 and shutil.which("debootstrap") is None:
        return (
            "debootstrap is not installed to build the sandbox image (apt-get install debootstrap)"
        )
    return None


def require_podman() -> None:
    reason = podman_unavailable()
    if reason is not None:
        pytest.skip(reason)


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, check=False)
    if check:
        assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr}"
    return done


@dataclass
class ContainerFleet(SandboxFleet):
    """A sandbox fleet of podman containers (`sandbox up --containers`)."""

    def up(self) -> ContainerFleet:
        (self.workspace / "patches").mkdir(parents=True, exist_ok=True)
        (self.workspace / "playbooks").mkdir(parents=True, exist_ok=True)
        args = ["sandbox", "up", "--count", str(self.size), "--containers"]
        args += ["--ssh"] if self.ssh else []
        run = self.opspatch(*args, timeout=900)
        assert run.code == 0, run.stdout + run.stderr
        from opspatch.config.inventory import load_inventory

        inventory = load_inventory(self.state / "inventories" / "sandbox.toml")
        self.hosts = {h.name: h for h in inventory.hosts}
        return self

    def container(self, name: str) -> str:
        settings = self.hosts[name].container
        assert settings is not None
        return settings.name

    def inspect(self, name: str) -> dict[str, Any]:
        document = json.loads(podman("container", "inspect", self.container(name)).stdout)
        assert isinstance(document, list)
        found: dict[str, Any] = document[0]
        return found

    def read(self, name: str, path: str = CONTAINER_EAGLE) -> bytes:
        """A file inside the host's container, read with the runtime itself (not opspatch)."""
        done = subprocess.run(
            ["podman", "exec", self.container(name), "cat", path], capture_output=True, check=True
        )
        return done.stdout

    def sha(self, name: str) -> str:
        return hashlib.sha256(self.read(name)).hexdigest()

    def recreate(self, name: str) -> None:
        """Remove the host's container and let `sandbox up` create it again from the image (as
        `compose up` or a Kubernetes restart would: the writable layer is gone)."""
        podman("rm", "--force", "--time", "0", self.container(name))
        run = self.opspatch("sandbox", "up", timeout=300)
        assert run.code == 0, run.stdout + run.stderr
