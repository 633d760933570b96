"""Real SGLang source files as test data (never imported).

The wheels are fetched by an explicit step, `python3 -m tests.sglang_wheels` (`pip download
--no-deps sglang==V` for every release of `TEST_RELEASES` not yet cached, into a cache outside
the repository: `~/.cache/opspatch-tests`, or `$OPSPATCH_TEST_CACHE`), which `scripts/test.sh`
runs before pytest. A test only reads the cache: the wheel's `sglang/srt/speculative/` folder and
its dist-info unpacked (`sglang_site`), or any one file read from the wheel (`release_file`).
A wheel not in the cache (not fetched, or PyPI unreachable when it was) makes the caller skip
with the reason, and no test starts pip: a fast-tier test that did would start a process its
tier does not allow, on every fresh machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

# Resolved at import time, before the isolated-HOME fixture runs: the cache must survive runs.
CACHE = Path(os.environ.get("OPSPATCH_TEST_CACHE") or Path("~/.cache/opspatch-tests").expanduser())
EAGLE_RELPATH = "sglang/srt/speculative/eagle_worker_v2.py"


class WheelUnavailable(Exception):
    pass


def wheel_of(version: str) -> Path:
    """The cached wheel of SGLang `version` (nothing is downloaded here: `fetch_wheel`).

    Raises:
        WheelUnavailable: the wheel is not in the cache, with the step that fetches it.
    """
    found = sorted((CACHE / "wheels").glob(f"sglang-{version}-*.whl"))
    if not found:
        raise WheelUnavailable(
            f"sglang {version} is not in the test cache {CACHE / 'wheels'}: "
            "`python3 -m tests.sglang_wheels` fetches the wheels the tests read"
        )
    return found[0]


def fetch_wheel(version: str) -> Path:
    """The wheel of SGLang `version`, downloaded into the cache unless it is there.

    Raises:
        WheelUnavailable: the wheel could not be downloaded (offline), with pip's last words.
    """
    try:
        return wheel_of(version)
    except WheelUnavailable:
        pass
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            f"sglang=={version}",
            "-d",
            str(wheels),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if result.returncode != 0 or not found:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise WheelUnavailable(f"pip download sglang=={version} failed: {tail[0]}")
    return found[0]


def cached_release_file(version: str, relpath: str) -> bytes:
    """`release_file` that never downloads: for fast-tier tests, which must not reach PyPI
    (`.ci/run` fills the cache first with `python3 -m tests.sglang_wheels`).

    Raises:
        WheelUnavailable: the wheel is not in the cache (saying how to fill it).
        KeyError: the release does not ship `relpath`.
    """
    found = sorted((CACHE / "wheels").glob(f"sglang-{version}-*.whl"))
    if not found:
        raise WheelUnavailable(
            f"sglang {version} is not in {CACHE / 'wheels'}: run `python3 -m tests.sglang_wheels`"
        )
    with zipfile.ZipFile(found[0]) as wheel:
        return wheel.read(relpath)


def release_file(version: str, relpath: str) -> bytes:
    """The bytes of `relpath` (e.g. `sglang/srt/managers/scheduler.py`) in SGLang `version`'s
    wheel, read from the cached wheel (nothing is extracted).

    Raises:
        WheelUnavailable: not in the cache (`python3 -m tests.sglang_wheels` fetches it).
        KeyError: the release does not ship `relpath`.
    """
    with zipfile.ZipFile(wheel_of(version)) as wheel:
        return wheel.read(relpath)


def sglang_site(version: str) -> Path:
    """A folder holding `sglang/srt/speculative/...` and `sglang-<version>.dist-info/`.

    Raises:
        WheelUnavailable: the wheel is not in the cache, with the step that fetches it.
    """
    site = CACHE / "sites" / version
    if (site / EAGLE_RELPATH).is_file():
        return site
    partial = site.with_name(site.name + ".partial")
    with zipfile.ZipFile(wheel_of(version)) as wheel:
        members = [
            name
            for name in wheel.namelist()
            if name.startswith("sglang/srt/speculative/")
            or name.startswith(f"sglang-{version}.dist-info/")
        ]
        wheel.extractall(partial, members)
    partial.rename(site)
    return site


RELEASE_VERSIONS = ("0.5.4", "0.5.10", "0.5.23")


def seed_release_cache(root: Path, versions: tuple[str, ...] = RELEASE_VERSIONS) -> Path:
    """A release cache (`opspatch.runs.commands.check_releases` layout) holding the test wheels of `versions`
    as hard links, so `check --releases` runs offline. Raises WheelUnavailable when one is not
    in the test cache."""
    import os
    import shutil

    for version in versions:
        sglang_site(version)
    wheels = root / "sglang" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for version in versions:
        (wheel,) = (CACHE / "wheels").glob(f"sglang-{version}-*.whl")
        try:
            os.link(wheel, wheels / wheel.name)
        except OSError:
            shutil.copy(wheel, wheels / wheel.name)
    return root


# Every release whose wheel a test reads, fetched by `python3 -m tests.sglang_wheels` (which
# `scripts/test.sh` runs first): a test never starts pip (the tiers' check would rightly fail a
# pure test for it), it skips naming that step.
TEST_RELEASES = (
    "0.4.7",
    "0.5.3",
    "0.5.4",
    "0.5.4.post1",
    "0.5.5",
    "0.5.6",
    "0.5.7",
    "0.5.8",
    "0.5.9",
    "0.5.10",
    "0.5.11",
    "0.5.12",
    "0.5.13",
    "0.5.20",
    "0.5.22",
    "0.5.23",
)


def prefetch(versions: tuple[str, ...] = TEST_RELEASES) -> list[str]:
    """Download every wheel of `versions` not yet cached, four at a time; the failures' words
    (offline: the tests that need them skip with the reason)."""
    from concurrent.futures import ThreadPoolExecutor

    def fetch(version: str) -> str | None:
        try:
            fetch_wheel(version)
        except WheelUnavailable as exc:
            return str(exc)
        return None

    with ThreadPoolExecutor(4) as pool:
        return [failure for failure in pool.map(fetch, versions) if failure]


if __name__ == "__main__":
    for failure in prefetch():
        print(f"warning: {failure}", file=sys.stderr)
