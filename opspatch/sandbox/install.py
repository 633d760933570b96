"""Install the stand-in engine into a sandbox host the way pip installs a distribution.

The stand-in's source ships as package data (`engine_src/sglang/`). A sandbox host gets its own
virtual environment whose site-packages holds a copy under the top-level name `sglang`, with a
`sglang-<version>.dist-info` (METADATA, INSTALLER, WHEEL, top_level.txt and a RECORD of sha256
hashes), so everything opspatch does to a real host (read the version from the dist-info, resolve
the module file with the host's interpreter, notice edits against RECORD) works unchanged.

The stand-in is never installed into the controller's own environment: `install_standin` refuses
the running interpreter's site-packages directories.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from opspatch.errors import HostError, InputError

STANDIN_VERSION = "0.5.23"
DIST_NAME = "sglang"
INSTALLER_NAME = "opspatch"
TORCH_PTH_NAME = "_opspatch_controller_torch.pth"
_VERSION_PATTERN = re.compile(r"^[0-9]+(\.[0-9]+)*([._+-]?[A-Za-z0-9]+)*$")
_VERSION_FILE = "sglang/version.py"


def engine_source_dir() -> Path:
    """The directory holding the stand-in's `sglang` package (package data of opspatch)."""
    return Path(__file__).resolve().parent / "engine_src"


def record_hash(data: bytes) -> str:
    """A RECORD hash field as pip writes it: `sha256=` + urlsafe base64 without padding."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def record_line(relative_path: str, data: bytes) -> str:
    """One RECORD row: `path,sha256=...,size` (paths are relative to site-packages, with /)."""
    return f"{relative_path},{record_hash(data)},{len(data)}"


def standin_files(version: str) -> dict[str, bytes]:
    """Every file of the stand-in package, keyed by its path relative to site-packages.

    Bytecode caches are left out; `sglang/version.py` carries `version`.
    """
    _check_version(version)
    root = engine_source_dir()
    files: dict[str, bytes] = {}
    for path in sorted(_package_files(root / DIST_NAME)):
        relative = path.relative_to(root).as_posix()
        files[relative] = path.read_bytes()
    files[_VERSION_FILE] = f'__version__ = "{version}"\n'.encode("ascii")
    return files


def dist_info_files(version: str, package_files: dict[str, bytes]) -> dict[str, bytes]:
    """The dist-info directory's files, RECORD last and listing every installed file."""
    _check_version(version)
    dist_info = f"{DIST_NAME}-{version}.dist-info"
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {DIST_NAME}\n"
        f"Version: {version}\n"
        "Summary: Stand-in SGLang engine of the opspatch sandbox (tiny CPU model)\n"
        "Requires-Python: >=3.10\n"
        "Requires-Dist: torch\n"
    )
    wheel = (
        "Wheel-Version: 1.0\n"
        f"Generator: {INSTALLER_NAME}\n"
        "Root-Is-Purelib: true\n"
        "Tag: py3-none-any\n"
    )
    meta: dict[str, bytes] = {
        f"{dist_info}/METADATA": metadata.encode("utf-8"),
        f"{dist_info}/INSTALLER": f"{INSTALLER_NAME}\n".encode("ascii"),
        f"{dist_info}/WHEEL": wheel.encode("ascii"),
        f"{dist_info}/top_level.txt": f"{DIST_NAME}\n".encode("ascii"),
    }
    rows = [record_line(path, data) for path, data in {**package_files, **meta}.items()]
    rows.append(f"{dist_info}/RECORD,,")
    meta[f"{dist_info}/RECORD"] = ("\n".join(rows) + "\n").encode("utf-8")
    return meta


def install_standin(site_packages: Path, version: str = STANDIN_VERSION) -> Path:
    """Install the stand-in into `site_packages`; returns the installed `sglang` package dir.

    Replaces an existing `sglang` package and every `sglang-*.dist-info` there, as a reinstall
    with pip would. Files are staged in a temporary directory inside `site_packages` and renamed
    into place, so a failure part-way leaves no half-copied package under the final name.

    Raises InputError for a malformed version or when `site_packages` belongs to the running
    interpreter (the stand-in must never shadow a real `sglang` on the controller).
    """
    _check_version(version)
    site_packages = site_packages.resolve()
    _refuse_controller_site_packages(site_packages)
    site_packages.mkdir(parents=True, exist_ok=True)

    package_files = standin_files(version)
    all_files = {**package_files, **dist_info_files(version, package_files)}
    staging = Path(tempfile.mkdtemp(prefix=".opspatch-standin-", dir=site_packages))
    try:
        for relative, data in all_files.items():
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o644)
        for old in _installed_dist_dirs(site_packages):
            _remove(old)
        for top_level in sorted({relative.split("/", 1)[0] for relative in all_files}):
            os.replace(staging / top_level, site_packages / top_level)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
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
    return host_dir / "venv"


def make_host_python(host_dir: Path, version: str = STANDIN_VERSION) -> Path:
    """Give a sandbox host its own interpreter with the stand-in installed; returns `bin/python`.

    Creates `host_dir/venv` (`python -m venv --without-pip`, well under a second) if it does not
    exist, points it at the controller's torch with a `.pth` line (processed after the venv's own
    site-packages, so the host's `sglang` always wins), and installs the stand-in unless some
    `sglang` distribution is already there. An existing installation is kept as it is, patched or
    not: making a host twice never undoes what was done to it.

    Raises InputError when the controller has no torch (install `opspatch[sandbox]`), HostError
    when the virtual environment cannot be created.
    """
    torch_parent = controller_torch_dir()
    venv_dir = host_venv_dir(host_dir)
    python = venv_dir / "bin" / "python"
    if not python.exists():
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
    site_packages = venv_site_packages(venv_dir)
    (site_packages / TORCH_PTH_NAME).write_text(f"{torch_parent}\n", encoding="utf-8")
    if not any(_installed_dist_dirs(site_packages)):
        install_standin(site_packages, version)
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


def _check_version(version: str) -> None:
    if not _VERSION_PATTERN.match(version):
        raise InputError(f"not a valid distribution version: {version!r}")


def _package_files(directory: Path) -> Iterator[Path]:
    for path in directory.rglob("*"):
        if "__pycache__" in path.parts or path.suffix == ".pyc" or not path.is_file():
            continue
        yield path


def _installed_dist_dirs(site_packages: Path) -> Iterator[Path]:
    package = site_packages / DIST_NAME
    if package.exists() or package.is_symlink():
        yield package
    yield from sorted(site_packages.glob(f"{DIST_NAME}-*.dist-info"))


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path)


def _refuse_controller_site_packages(site_packages: Path) -> None:
    own = {Path(p).resolve() for p in site.getsitepackages()}
    user_site = site.getusersitepackages()
    if user_site:
        own.add(Path(user_site).resolve())
    if site_packages in own:
        raise InputError(
            f"refusing to install the stand-in engine into {site_packages}: it is opspatch's own "
            "environment, where a package named sglang would shadow a real one",
            hint="install it into a sandbox host's virtual environment (make_host_python)",
        )
