"""Install the stand-in engine into a sandbox host the way pip installs a distribution."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from opspatch.core.wheelrecord import record_file, record_hash
from opspatch.errors import HostError, InputError
from opspatch.sandbox.checkout import install_editable
from opspatch.sandbox.dist import (
    DIST_NAME,
    INSTALL_SHAPES,
    INSTALLER_NAME,
    STANDIN_VERSION,
    InstallShape,
    check_version,
    dist_info_dir,
    engine_source_dir,
    installed_entries,
    metadata_text,
    refuse_controller_site_packages,
    replace_installed,
    standin_files,
    wheel_text,
)

__all__ = [
    "INSTALL_SHAPES",
    "STANDIN_VERSION",
    "TORCH_PTH_NAME",
    "InstallShape",
    "controller_torch_dir",
    "dist_info_files",
    "engine_source_dir",
    "ensure_venv",
    "host_venv_dir",
    "install_standin",
    "make_host_python",
    "record_hash",
    "standin_files",
    "venv_site_packages",
]

TORCH_PTH_NAME = "_opspatch_controller_torch.pth"


def dist_info_files(version: str, package_files: dict[str, bytes]) -> dict[str, bytes]:
    """The dist-info directory's files, RECORD last and listing every installed file."""
    check_version(version)
    dist_info = dist_info_dir(version)
    meta: dict[str, bytes] = {
        f"{dist_info}/METADATA": metadata_text(version).encode("utf-8"),
        f"{dist_info}/INSTALLER": f"{INSTALLER_NAME}\n".encode("ascii"),
        f"{dist_info}/WHEEL": wheel_text().encode("ascii"),
        f"{dist_info}/top_level.txt": f"{DIST_NAME}\n".encode("ascii"),
    }
    meta[f"{dist_info}/RECORD"] = record_file({**package_files, **meta}, f"{dist_info}/RECORD")
    return meta


def install_standin(site_packages: Path, version: str = STANDIN_VERSION) -> Path:
    """Install the stand-in into `site_packages`; returns the installed `sglang` package dir.

    Replaces an existing `sglang` package and every `sglang-*.dist-info` there, as a reinstall
    with pip would. Files are staged in a temporary directory inside `site_packages` and renamed
    into place, so a failure part-way leaves no half-copied package under the final name.

    Raises InputError for a malformed version or when `site_packages` belongs to the running
    interpreter (the stand-in must never shadow a real `sglang` on the controller).
    """
    check_version(version)
    site_packages = site_packages.resolve()
    refuse_controller_site_packages(site_packages)
    site_packages.mkdir(parents=True, exist_ok=True)

    package_files = standin_files(version)
    all_files = {**package_files, **dist_info_files(version, package_files)}
    replace_installed(site_packages, all_files, staging_prefix=".opspatch-standin-")
    return site_packages / DIST_NAME


def venv_site_packages(venv_dir: Path) -> Path:
    """The site-packages directory of a POSIX virtual environment."""
    candidates = sorted(venv_dir.glob("lib/python3*/site-packages"))
    if len(candidates) != 1:
        raise HostError(
            f"expected one lib/python3.*/site-packages under {venv_dir}, found {len(candidates)}",
            host=venv_dir.parent.name,
            step="sandbox-venv",
        )
    return candidates[0]


def host_venv_dir(host_dir: Path) -> Path:
    """The host's own virtual environment: `<host>/venv`."""
    return host_dir / "venv"


def make_host_python(
    host_dir: Path, version: str = STANDIN_VERSION, install: InstallShape = "wheel"
) -> Path:
    """Give a sandbox host its own interpreter with the stand-in installed; returns `bin/python`.

    Creates `host_dir/venv` (`python -m venv --without-pip`, well under a second) if it does not
    exist, points it at the controller's torch with a `.pth` line (processed after the venv's own
    site-packages and after an editable install's `__editable__.sglang-*.pth`, which sorts first,
    so the host's `sglang` always wins), and installs the stand-in in the `install` shape unless
    some `sglang` distribution is already there. An existing installation is kept as it is, in
    whatever shape, patched or not: making a host twice never undoes what was done to it.

    Raises InputError when the controller has no torch (install `opspatch[sandbox]`) or, for the
    editable shape, no git; HostError when the virtual environment or the checkout cannot be
    made.
    """
    torch_parent = controller_torch_dir()
    python = ensure_venv(host_dir)
    site_packages = venv_site_packages(python.parent.parent)
    (site_packages / TORCH_PTH_NAME).write_text(f"{torch_parent}\n", encoding="utf-8")
    if not any(installed_entries(site_packages)):
        if install == "editable":
            install_editable(host_dir, site_packages, version)
        else:
            install_standin(site_packages, version)
    return python


def ensure_venv(host_dir: Path) -> Path:
    """`<host>/venv` (`python -m venv --without-pip`, well under a second) unless it exists;
    its `bin/python`.

    Raises:
        HostError: the virtual environment cannot be made.
    """
    venv_dir = host_venv_dir(host_dir)
    python = venv_dir / "bin" / "python"
    if python.exists():
        return python
    host_dir.mkdir(parents=True, exist_ok=True)
    completed = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if completed.returncode != 0:
        raise HostError(
            f"could not create a virtual environment in {venv_dir}: "
            f"{(completed.stderr or completed.stdout).strip()}",
            host=host_dir.name,
            step="sandbox-venv",
        )
    return python


def controller_torch_dir() -> Path:
    """The directory that contains the controller's `torch` package (torch is not imported)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise InputError(
            "torch is not installed in opspatch's environment; the sandbox engine needs it",
            hint="pip install 'opspatch[sandbox]'",
        )
    return Path(spec.origin).resolve().parent.parent
