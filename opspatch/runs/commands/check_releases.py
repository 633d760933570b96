"""Fetch the released files of a patch's target and check the patch on each (`check --releases`)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from opspatch.analysis.portability import (
    ReleaseMatrix,
    ReleaseResult,
    UncheckedRelease,
    evaluate_release,
    missing_module_result,
)
from opspatch.analysis.proofs import sort_versions
from opspatch.core.spec import PatchSpec, Target
from opspatch.errors import InputError
from opspatch.runs.commands.releasecache import normalize_name, record_proofs, release_cache_dir

DEFAULT_INDEX = "https://pypi.org"
INDEX_TIMEOUT_S = 20.0
DOWNLOAD_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ReleaseListing:
    """The releases in range, where the list came from, and what each offers."""

    versions: tuple[str, ...]
    listed_from: str  # "index" | "cache"
    wheels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # version -> filenames
    note: str = ""


def parse_index_json(data: Mapping[str, object], specifier: SpecifierSet) -> ReleaseListing:
    """The releases of a PyPI JSON answer in `specifier` with a file not yanked."""
    releases = data.get("releases")
    if not isinstance(releases, dict):
        raise ValueError("the index answer has no `releases`")
    wheels: dict[str, tuple[str, ...]] = {}
    for version, files in releases.items():
        live = [f for f in files if isinstance(f, dict) and not f.get("yanked")]
        if not live:
            continue
        try:
            Version(version)
        except InvalidVersion:
            continue
        wheels[version] = tuple(
            str(f["filename"]) for f in live if str(f.get("filename", "")).endswith(".whl")
        )
    chosen = list(specifier.filter(wheels))
    return ReleaseListing(
        versions=tuple(sort_versions(chosen)),
        listed_from="index",
        wheels={v: wheels[v] for v in chosen},
    )


def _cached_versions(cache: Path, distribution: str) -> set[str]:
    root = cache / normalize_name(distribution)
    prefix = normalize_name(distribution) + "-"
    found = (
        {p.name for p in root.iterdir() if p.is_dir() and p.name not in ("wheels", "proofs")}
        if root.is_dir()
        else set()
    )
    for wheel in (root / "wheels").glob("*.whl"):
        if wheel.name.startswith(prefix):
            found.add(wheel.name[len(prefix) :].split("-", 1)[0])
    return found


def list_releases(
    distribution: str,
    specifier: SpecifierSet,
    *,
    cache: Path,
    offline: bool = False,
    index_url: str = DEFAULT_INDEX,
) -> ReleaseListing:
    """From the index, or from the cache when offline or it cannot be reached (`note`)."""
    note = "offline: releases listed from the cache"
    if not offline:
        url = f"{index_url.rstrip('/')}/pypi/{normalize_name(distribution)}/json"
        try:
            with urllib.request.urlopen(url, timeout=INDEX_TIMEOUT_S) as answer:
                return parse_index_json(json.load(answer), specifier)
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
            note = f"the index could not be read ({exc}): releases listed from the cache"
    cached = [v for v in specifier.filter(_cached_versions(cache, distribution))]
    return ReleaseListing(tuple(sort_versions(cached)), "cache", {}, note)


def _wheel_tag_args(filename: str) -> list[str]:
    """pip's --platform/--python-version/--implementation/--abi for one wheel's tags."""
    parts = filename[: -len(".whl")].split("-")
    python, abi, platform = parts[-3], parts[-2], parts[-1]
    args = ["--platform", platform.split(".")[0]]
    match = re.match(r"^(cp|pp|py)(\d)(\d+)?", python)
    if match:
        args += ["--implementation", match.group(1)]
        args += ["--python-version", match.group(2) + (match.group(3) or "")]
    if abi != "none":
        args += ["--abi", abi]
    return args


def _pip_download(
    pip: Sequence[str], requirement: str, target: Path, extra: Sequence[str] = ()
) -> str | None:
    """Run pip download; None on success, else pip's last line."""
    command = [*pip, "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", requirement, "-d", str(target), *extra]  # fmt: skip
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"pip download could not run: {exc}"
    if result.returncode == 0:
        return None
    tail = (result.stderr or result.stdout).strip().splitlines()
    return tail[-1] if tail else f"pip download exited {result.returncode}"


def _find_wheel(wheels_dir: Path, distribution: str, version: str) -> Path | None:
    found = sorted(wheels_dir.glob(f"{normalize_name(distribution)}-{version}-*.whl"))
    return found[0] if found else None


def fetch_wheel(
    distribution: str,
    version: str,
    *,
    cache: Path,
    offline: bool,
    listed_wheels: Sequence[str] = (),
    pip: Sequence[str] = (sys.executable, "-m", "pip"),
) -> Path | str:
    """The cached wheel of one release, downloading it once; a string says why there is none."""
    wheels_dir = cache / normalize_name(distribution) / "wheels"
    cached = _find_wheel(wheels_dir, distribution, version)
    if cached is not None:
        return cached
    if offline:
        return "not in the cache, and offline"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    requirement = f"{distribution}=={version}"
    problem = _pip_download(pip, requirement, wheels_dir)
    if problem is not None and listed_wheels:
        problem = _pip_download(pip, requirement, wheels_dir, _wheel_tag_args(listed_wheels[0]))
    found = _find_wheel(wheels_dir, distribution, version)
    if found is not None:
        return found
    return problem or "pip download found no wheel"


def extract_module(wheel: Path, target: Target, version: str, cache: Path) -> Path | None:
    """The target's module file in the wheel, extracted atomically into the cache once."""
    relpaths = target.module_relpaths()
    destination = cache / normalize_name(target.distribution) / version
    for relpath in relpaths:
        if (there := destination / relpath).is_file():
            return there
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for relpath in relpaths:
            if relpath in names:
                there = destination / relpath
                there.parent.mkdir(parents=True, exist_ok=True)
                partial = there.with_name(there.name + ".partial")
                partial.write_bytes(archive.read(relpath))
                partial.replace(there)
                return there
    return None


def release_module_source(
    target: Target,
    version: str,
    *,
    cache: Path | None = None,
    offline: bool = False,
    pip: Sequence[str] = (sys.executable, "-m", "pip"),
) -> bytes:
    """What `export PATCH --release VERSION` diffs against, fetched once into the cache."""
    cache = cache or release_cache_dir()
    wheel = fetch_wheel(target.distribution, version, cache=cache, offline=offline, pip=pip)
    if isinstance(wheel, str):
        raise InputError(
            f"{target.distribution} {version}: cannot fetch the release: {wheel}",
            hint=f"check the version, or run once online to fill the cache ({cache})",
        )
    try:
        module = extract_module(wheel, target, version, cache)
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(f"cannot read {wheel}: {exc}", hint="delete it and fetch again") from None
    if module is None:
        raise InputError(
            f"{target.distribution} {version} has no {target.module_relpaths()[0]} ({wheel.name})",
            hint="choose a release inside the patch's version range",
        )
    return module.read_bytes()


def check_releases(
    patch: PatchSpec,
    *,
    spec: str | None = None,
    versions: Sequence[str] | None = None,
    cache: Path | None = None,
    offline: bool = False,
    index_url: str = DEFAULT_INDEX,
    pip: Sequence[str] = (sys.executable, "-m", "pip"),
) -> ReleaseMatrix:
    """Every release in the patch's range (or `spec`, or exactly `versions`), each fetched once
    into the cache and evaluated."""
    cache = cache or release_cache_dir()
    target = patch.target
    range_text = spec if spec is not None else target.versions
    try:
        specifier = SpecifierSet(range_text)
    except InvalidSpecifier:
        raise InputError(
            f"{range_text!r} is not a version range", hint="e.g. --releases '>=0.5.4,<0.6'"
        ) from None
    if versions is not None:
        listing = ReleaseListing(tuple(sort_versions(list(versions))), "given")
        range_text = ", ".join(listing.versions)
    else:
        listing = list_releases(
            target.distribution, specifier, cache=cache, offline=offline, index_url=index_url
        )
    results: list[ReleaseResult] = []
    unchecked: list[UncheckedRelease] = []
    for version in listing.versions:
        listed = listing.wheels.get(version, ())
        if listing.listed_from == "index" and not listed:
            unchecked.append(UncheckedRelease(version, "the index has no wheel (sdist only)"))
            continue
        wheel = fetch_wheel(
            target.distribution, version, cache=cache, offline=offline,
            listed_wheels=listed, pip=pip,
        )  # fmt: skip
        if isinstance(wheel, str):
            unchecked.append(UncheckedRelease(version, wheel))
            continue
        try:
            module = extract_module(wheel, target, version, cache)
        except (zipfile.BadZipFile, OSError) as exc:
            unchecked.append(UncheckedRelease(version, f"cannot read {wheel.name}: {exc}"))
            continue
        if module is None:
            results.append(missing_module_result(patch, version, wheel.name))
            continue
        results.append(evaluate_release(patch, version, module.read_bytes()))
    notes = (listing.note,) if listing.note else ()
    matrix = ReleaseMatrix(
        patch_id=patch.id,
        distribution=target.distribution,
        range=range_text,
        listed_from=listing.listed_from,
        results=tuple(results),
        unchecked=tuple(unchecked),
        notes=notes,
    )
    problem = record_proofs(patch, matrix, cache)
    if problem is not None:
        matrix = dataclasses.replace(matrix, notes=(*matrix.notes, problem))
    return matrix
