"""The stand-in distribution: its files, and the installed-distribution formats pip writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

from packaging.version import Version

from opspatch.errors import InputError

STANDIN_VERSION = "0.5.23"
STANDIN_FIXED_IN = "0.5.24"
"""Stand-in releases from this one on ship the incident's fix upstream-style (`upstream_fixed`):
what a host upgraded past the fix runs, so `status` can be seen calling a patch fixed-upstream."""
DIST_NAME = "sglang"
INSTALLER_NAME = "opspatch"
_VERSION_PATTERN = re.compile(r"^[0-9]+(\.[0-9]+)*([._+-]?[A-Za-z0-9]+)*$")
_VERSION_FILE = "sglang/version.py"

InstallShape = Literal["wheel", "editable"]
"""How a sandbox host's engine is installed: like a wheel (the package in site-packages, every
file hashed in RECORD), or as a git checkout installed editable (`checkout.py`)."""

INSTALL_SHAPES: tuple[InstallShape, ...] = ("wheel", "editable")


def engine_source_dir() -> Path:
    """The directory holding the stand-in's `sglang` package (package data of opspatch)."""
    return Path(__file__).resolve().parent / "engine_src"


def dist_info_dir(version: str) -> str:
    """`sglang-<version>.dist-info`, the metadata folder's name in site-packages."""
    return f"{DIST_NAME}-{version}.dist-info"


def metadata_text(version: str) -> str:
    """The core metadata (`METADATA`) of the stand-in distribution."""
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {DIST_NAME}\n"
        f"Version: {version}\n"
        "Summary: Stand-in SGLang engine of the opspatch sandbox (tiny CPU model)\n"
        "Requires-Python: >=3.10\n"
        "Requires-Dist: torch\n"
    )


def wheel_text() -> str:
    """The `WHEEL` file of a pure-Python wheel built by opspatch."""
    return (
        "Wheel-Version: 1.0\n"
        f"Generator: {INSTALLER_NAME}\n"
        "Root-Is-Purelib: true\n"
        "Tag: py3-none-any\n"
    )


def standin_files(version: str) -> dict[str, bytes]:
    """Every file of the stand-in package, keyed by its path relative to the folder holding the
    `sglang` package (site-packages for a wheel, `python/` for a checkout).

    Bytecode caches are left out; `sglang/version.py` carries `version`.
    """
    check_version(version)
    root = engine_source_dir()
    files: dict[str, bytes] = {}
    for path in sorted(_package_files(root / DIST_NAME)):
        relative = path.relative_to(root).as_posix()
        files[relative] = path.read_bytes()
    files[_VERSION_FILE] = f'__version__ = "{version}"\n'.encode("ascii")
    if Version(version) >= Version(STANDIN_FIXED_IN):
        files[EAGLE_WORKER_FILE] = upstream_fixed(files[EAGLE_WORKER_FILE])
    return files


EAGLE_WORKER_FILE = "sglang/srt/speculative/eagle_worker_v2.py"
_LATE_ASSIGNMENT = b"""
        self.init_cuda_graphs()

        # Dynamic speculation disable: above this many running requests, decode without
        # speculation, which costs more than it saves under high concurrency. 0 = never.
        self.spec_disable_batch_threshold = server_args.spec_disable_batch_threshold
"""
_ARGUMENTS = b"""
        # Parse arguments
"""
_EARLY_ASSIGNMENT = b"""
        # Dynamic speculation disable: above this many running requests, decode without
        # speculation, which costs more than it saves under high concurrency. 0 = never.
        # Assigned first: the calls below can fail part-way (CUDA graph capture).
        self.spec_disable_batch_threshold = server_args.spec_disable_batch_threshold

        # Parse arguments
"""
_CLASS_LINE = b"class EAGLEWorkerV2(BaseSpecWorker):\n"
_CLASS_DEFAULT = (
    b"    # for subclasses that skip __init__ and instances whose __init__ stopped part-way\n"
)
_CLASS_DEFAULT += b"    spec_disable_batch_threshold = 0\n\n"


def upstream_fixed(eagle_worker: bytes) -> bytes:
    """The stand-in's `eagle_worker_v2.py` as a release that fixed the incident would ship it:
    the threshold assigned before the calls that can fail, and a class-level default. Written
    differently from `eagle-init-guard` (no `= 0` at the start of `__init__`, no marker), as an
    upstream fix would be, so only the patch's postconditions can tell it is fixed."""
    if any(eagle_worker.count(text) != 1 for text in (_LATE_ASSIGNMENT, _ARGUMENTS, _CLASS_LINE)):
        raise AssertionError("the stand-in's EAGLEWorkerV2.__init__ is not the incident's any more")
    fixed = eagle_worker.replace(_LATE_ASSIGNMENT, b"\n        self.init_cuda_graphs()\n")
    fixed = fixed.replace(_ARGUMENTS, _EARLY_ASSIGNMENT)
    return fixed.replace(_CLASS_LINE, _CLASS_LINE + _CLASS_DEFAULT)


def check_version(version: str) -> None:
    """Raises InputError unless `version` looks like a distribution version."""
    if not _VERSION_PATTERN.match(version):
        raise InputError(f"not a valid distribution version: {version!r}")


def _package_files(directory: Path) -> Iterator[Path]:
    for path in directory.rglob("*"):
        if "__pycache__" in path.parts or path.suffix == ".pyc" or not path.is_file():
            continue
        yield path


def installed_entries(site_packages: Path) -> Iterator[Path]:
    """What an installed `sglang` occupies in `site_packages`, in either shape: the package
    folder (a wheel), every `sglang-*.dist-info`, and an editable install's `.pth` file."""
    package = site_packages / DIST_NAME
    if package.exists() or package.is_symlink():
        yield package
    yield from sorted(site_packages.glob(f"{DIST_NAME}-*.dist-info"))
    yield from sorted(site_packages.glob(f"__editable__.{DIST_NAME}-*.pth"))


def installed_shape(site_packages: Path) -> InstallShape | None:
    """How `sglang` is installed in `site_packages`: `editable` when its dist-info's
    `direct_url.json` says so (PEP 610, as pip records `pip install -e`), `wheel` for a dist-info
    without that, None when there is none."""
    shape: InstallShape | None = None
    for dist_info in site_packages.glob(f"{DIST_NAME}-*.dist-info"):
        shape = "wheel"
        try:
            direct_url = json.loads((dist_info / "direct_url.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(direct_url, dict) and (direct_url.get("dir_info") or {}).get("editable"):
            return "editable"
    return shape


def remove(path: Path) -> None:
    """Remove a file, a symlink or a folder tree."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path)


def replace_installed(
    site_packages: Path, files: Mapping[str, bytes], *, staging_prefix: str
) -> None:
    """Install `files` (relative path -> bytes) into `site_packages` in place of whatever
    `sglang` is there (`installed_entries`). They are written into a staging folder beside it
    first, so an install that fails while writing leaves the old one whole."""
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix, dir=site_packages))
    try:
        for relative, data in files.items():
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o644)
        for old in installed_entries(site_packages):
            remove(old)
        for top_level in sorted({relative.split("/", 1)[0] for relative in files}):
            os.replace(staging / top_level, site_packages / top_level)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def refuse_controller_site_packages(site_packages: Path) -> None:
    """Raises InputError when `site_packages` belongs to the running interpreter: the stand-in
    must never shadow a real `sglang` in opspatch's own environment."""
    own = {Path(p).resolve() for p in site.getsitepackages()}
    user_site = site.getusersitepackages()
    if user_site:
        own.add(Path(user_site).resolve())
    if site_packages.resolve() in own:
        raise InputError(
            f"refusing to install the stand-in engine into {site_packages}: it is opspatch's own "
            "environment, where a package named sglang would shadow a real one",
            hint="install it into a sandbox host's virtual environment (make_host_python)",
        )
