"""A sandbox host's own environment for real SGLang: small, on top of the shared one."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from opspatch.core.wheelrecord import record_file
from opspatch.errors import HostError
from opspatch.sandbox.dist import installed_entries
from opspatch.sandbox.install import ensure_venv, venv_site_packages
from opspatch.sandbox.real.build import BaseEnv
from opspatch.sandbox.real.release import engine_files_dir

ENGINE_BASE_PTH = "_opspatch_engine_base.pth"
CPU_LAYER_DIST = "opspatch_sandbox_cpu"
CPU_LAYER_VERSION = "1.0"
CPU_PLUGIN_NAME = "opspatch_sandbox_cpu"
"""The platform plugin's entry-point name: `SGLANG_PLUGINS`, when set, must name it too."""
CPU_PACKAGES = ("sgl_kernel", "opspatch_sandbox_cpu")


def cpu_layer_files() -> dict[str, bytes]:
    """Every file of the CPU layer's distribution as installed in site-packages (relative path
    -> bytes): its two packages (bytecode left out) and its dist-info, RECORD last."""
    root = engine_files_dir()
    files: dict[str, bytes] = {}
    for package in CPU_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    dist_info = f"{CPU_LAYER_DIST}-{CPU_LAYER_VERSION}.dist-info"
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {CPU_LAYER_DIST}\nVersion: {CPU_LAYER_VERSION}\n"
        "Summary: opspatch's CPU kernel layer (sgl_kernel) and platform plugin for SGLang\n"
    ).encode("ascii")
    files[f"{dist_info}/INSTALLER"] = b"opspatch\n"
    files[f"{dist_info}/top_level.txt"] = ("\n".join(CPU_PACKAGES) + "\n").encode("ascii")
    files[f"{dist_info}/entry_points.txt"] = (
        f"[sglang.srt.plugins]\n{CPU_PLUGIN_NAME} = opspatch_sandbox_cpu:install\n"
    ).encode("ascii")
    files[f"{dist_info}/RECORD"] = record_file(files, f"{dist_info}/RECORD")
    return files


def install_cpu_layer(site_packages: Path) -> None:
    """Write the CPU layer into `site_packages` in place of any earlier one, staged beside it
    and renamed into place."""
    files = cpu_layer_files()
    staging = Path(tempfile.mkdtemp(prefix=".opspatch-cpu-layer-", dir=site_packages))
    try:
        for relative, data in files.items():
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        old = [site_packages / name for name in CPU_PACKAGES]
        old += sorted(site_packages.glob(f"{CPU_LAYER_DIST}-*.dist-info"))
        for path in old:
            if path.exists():
                shutil.rmtree(path)
        for top_level in sorted({relative.split("/", 1)[0] for relative in files}):
            os.replace(staging / top_level, site_packages / top_level)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def make_real_host_python(host_dir: Path, base: BaseEnv, wheel: Path) -> Path:
    """Give a sandbox host its environment for real SGLang (see the module's doc); returns its
    `bin/python`. Keeps an installed `sglang` as it is.

    Raises:
        HostError: the venv cannot be made, or pip cannot install the wheel.
    """
    python = ensure_venv(host_dir)
    site_packages = venv_site_packages(python.parent.parent)
    (site_packages / ENGINE_BASE_PTH).write_text(f"{base.site_packages}\n", encoding="utf-8")
    if not any(installed_entries(site_packages)):
        # pip itself comes from the shared environment, through the .pth
        argv = [str(python), "-m", "pip", "install", "--no-deps", "--no-compile", "--no-index"]
        done = subprocess.run(
            [*argv, "--disable-pip-version-check", "--quiet", str(wheel)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            raise HostError(
                f"pip could not install {wheel.name}: "
                f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}",
                host=host_dir.name,
                step="sandbox-venv",
            )
    install_cpu_layer(site_packages)
    return python
