"""The real engine's shared environment: built once per release, cached outside the repository."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opspatch.errors import IndexUnreachable, InputError
from opspatch.sandbox.real.release import (
    TORCHVISION_META,
    base_requirements,
    constraints_file,
    guard_torchvision_meta,
)

ENGINE_CACHE_ENV = "OPSPATCH_ENGINE_CACHE"
STAMP = "opspatch-base.json"
DEFAULT_INDEX = "https://pypi.org/simple"
CHECK_IMPORTS = "import torch, torchvision, triton, transformers, tokenizers, fastapi, zmq"


def engine_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where real engines are cached (see the module's doc); not created here."""
    env = os.environ if environ is None else environ
    if env.get(ENGINE_CACHE_ENV):
        return Path(env[ENGINE_CACHE_ENV]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "opspatch" / "engines"
    return Path(env.get("HOME") or Path.home()) / ".cache" / "opspatch" / "engines"


@dataclass(frozen=True)
class BuildEvent:
    """One line of a build's progress: step `step` of `steps` (`title`), and what it is doing."""

    step: int
    steps: int
    title: str
    detail: str = ""
    logged: bool = False
    """Worth its own line where no spinner shows the latest (a log, a pipe): a batch of
    downloads begun or kept, where pip's own lines are not."""


BuildProgress = Callable[[BuildEvent], None]


def no_progress(_: BuildEvent) -> None:
    """A build progress callback that shows nothing."""


@dataclass(frozen=True)
class BaseEnv:
    """A complete shared environment of release `version`."""

    path: Path
    version: str
    key: str

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        (found,) = sorted(self.path.glob("lib/python3*/site-packages"))
        return found


def _python_tag() -> str:
    return f"py{sys.version_info.major}{sys.version_info.minor}"


def base_key(requirements: Sequence[str], constraints: str) -> str:
    """What a shared environment is made of, hashed: its requirements, its pins, the
    interpreter that runs it, and the edit made to torchvision."""
    digest = hashlib.sha256()
    for part in (*requirements, constraints, sys.version, guard_torchvision_meta.__doc__ or ""):
        digest.update(part.encode("utf-8") + b"\0")
    return digest.hexdigest()[:12]


def package_index(environ: Mapping[str, str] | None = None) -> str:
    """The index pip asks: `PIP_INDEX_URL`, else PyPI."""
    env = os.environ if environ is None else environ
    return (env.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def index_reachable(index: str, timeout: float = 15.0) -> bool:
    """Whether the index answers at all (any HTTP status counts: it is there)."""
    try:
        with urllib.request.urlopen(f"{index}/pip/", timeout=timeout):  # noqa: S310 - pip's index
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def _pip_failed(what: str, tail: Sequence[str]) -> InputError:
    """The error for a pip run that failed: `IndexUnreachable` when the index does not answer
    (the usual reason), else pip's last words."""
    index = package_index()
    if not index_reachable(index):
        return IndexUnreachable(
            f"cannot reach the package index {index} to {what}; nothing was changed",
            hint="connect this machine to the index (or set PIP_INDEX_URL to one it reaches), "
            "then run the same command again: what was downloaded so far is kept",
        )
    said = "\n".join(f"  {line}" for line in tail[-12:])
    return InputError(f"could not {what}; pip said:\n{said}")


def _run_pip(
    argv: Sequence[str], what: str, report: Callable[[str], None], cwd: Path | None = None
) -> None:
    """Run pip, reporting each line that says what it does; raise `_pip_failed` on failure."""
    tail: deque[str] = deque(maxlen=40)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_PROGRESS_BAR": "off"}
    with subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=cwd,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip()
            tail.append(line)
            if line.startswith(("Collecting", "Saved", "Installing", "Successfully", "File was")):
                report(line)
    if process.returncode != 0:
        raise _pip_failed(what, list(tail))


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """Hold `path` exclusively (another build of the same thing waits, then finds it built)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_wheel(cache: Path, version: str, report: Callable[[str], None] = print) -> Path:
    """The cached wheel of SGLang `version`, downloaded once (`pip download --no-deps`).

    Raises:
        IndexUnreachable: not cached, and the index does not answer.
        InputError: pip could not download it otherwise.
    """
    wheels = cache / "wheels"
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", f"sglang=={version}"]
    _run_pip([*argv, "-d", str(wheels)], f"download the sglang {version} wheel", report)
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        raise InputError(f"pip download left no sglang {version} wheel in {wheels}")
    return found[0]


def wheel_metadata(wheel: Path, version: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(f"sglang-{version}.dist-info/METADATA").decode("utf-8")


def complete_base(cache: Path, version: str) -> BaseEnv | None:
    """The newest complete shared environment of `version` in the cache, or None. Looks only
    at stamps: needs neither the wheel nor the network."""
    found = []
    for stamp in (cache / "base").glob(f"sglang-{version}-*/{STAMP}"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            data = json.loads(stamp.read_text(encoding="utf-8"))
            if data["version"] == version and data["python"] == sys.version:
                found.append((stamp.stat().st_mtime, BaseEnv(stamp.parent, version, data["key"])))
    return max(found, key=lambda pair: pair[0])[1] if found else None


BUILD_STEPS = ("the release's wheel", "downloads", "a fresh environment", "install", "check")


def ensure_base(cache: Path, version: str, progress: BuildProgress = no_progress) -> BaseEnv:
    """The complete shared environment of release `version`, built when it is not cached.

    Raises:
        IndexUnreachable: something to download and the index does not answer.
        InputError: pip failed otherwise, or the built environment does not import.
    """
    # Long because: five steps in order, each a few lines; the order is the point
    steps = len(BUILD_STEPS)

    def say(step: int, detail: str = "", logged: bool = False) -> None:
        progress(BuildEvent(step, steps, BUILD_STEPS[step - 1], detail, logged))

    say(1)
    wheel = ensure_wheel(cache, version, lambda line: say(1, line))
    requirements = base_requirements(wheel_metadata(wheel, version))
    constraints = constraints_file(version)
    key = base_key(requirements, constraints.read_text(encoding="utf-8"))
    target = cache / "base" / f"sglang-{version}-{_python_tag()}-{key}"
    with _build_lock(target.with_name(target.name + ".lock")):
        if (target / STAMP).is_file():
            return BaseEnv(target, version, key)
        downloads = cache / "downloads" / key
        downloads.mkdir(parents=True, exist_ok=True)
        listed = downloads / "requirements.txt"
        listed.write_text("\n".join(requirements) + "\n", encoding="utf-8")
        pin = ["-r", str(listed), "-c", str(constraints)]
        say(2, f"{len(requirements)} requirements, pinned by {constraints.name}")
        _download_pins(downloads, constraints, lambda line, logged: say(2, line, logged))
        say(3, str(target))
        if target.exists():
            shutil.rmtree(target)  # an earlier build stopped part-way: start it afresh
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, timeout=600)
        install = ["install", "--no-index", "--find-links", str(downloads), *pin]
        python = str(target / "bin" / "python")
        _run_pip([python, "-m", "pip", *install], "install", lambda s: say(4, s))
        base = BaseEnv(target, version, key)
        meta = base.site_packages / TORCHVISION_META
        meta.write_text(guard_torchvision_meta(meta.read_text(encoding="utf-8")), "utf-8")
        say(5, CHECK_IMPORTS)
        _check_imports(base)
        stamp = {"version": version, "key": key, "python": sys.version, "built": time.time()}
        (target / STAMP).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
        shutil.rmtree(downloads, ignore_errors=True)
        return base


DOWNLOAD_BATCH = 16
"""Pins downloaded by one pip run: what a Ctrl-C can lose (pip keeps a run's files only once
all are fetched); fewer would add a pip start (a second or two) per batch."""


UNFROZEN_PINS = ("setuptools==84.2.1",)
"""Pins of the environment that `pip freeze` leaves out of a constraints file: torch requires
setuptools>=77.0.3 and a fresh venv holds an older one (3.11) or none (3.12+). The version is the
one the cached environments hold (resolved when they were built), so the cache key stays."""


def download_pins(constraints: Path) -> list[str]:
    """Every pin a build downloads: those of `constraints`, then `UNFROZEN_PINS`."""
    lines = constraints.read_text(encoding="utf-8").splitlines()
    pins = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return pins + list(UNFROZEN_PINS)


def _download_pins(downloads: Path, constraints: Path, report: Callable[[str, bool], None]) -> None:
    """Download every pin (the environment's whole closure, as built) into `downloads`, a
    batch per pip run, each batch's pins noted in `fetched.txt` once its files are there: a
    build stopped part-way fetches only the batches it lacks."""
    pins = download_pins(constraints)
    noted = downloads / "fetched.txt"
    fetched = set(noted.read_text(encoding="utf-8").split()) if noted.is_file() else set()
    wanted = [pin for pin in pins if pin not in fetched]
    if len(wanted) < len(pins):
        kept = len(pins) - len(wanted)
        report(f"{kept} of {len(pins)} pins kept from an earlier build", True)
    for start in range(0, len(wanted), DOWNLOAD_BATCH):
        batch = wanted[start : start + DOWNLOAD_BATCH]
        said = f"pins {start + 1}-{start + len(batch)} of {len(wanted)}: {batch[0]} ... {batch[-1]}"
        report(said, True)
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(downloads)]
        _run_pip([*argv, *batch], "download", lambda line: report(line, False))
        with open(noted, "a", encoding="utf-8") as note:
            note.write("".join(f"{pin}\n" for pin in batch))


def _check_imports(base: BaseEnv) -> None:
    done = subprocess.run(
        [str(base.python), "-c", CHECK_IMPORTS],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-6:]
        raise InputError(
            f"the engine environment {base.path} was built but does not import:\n  "
            + "\n  ".join(tail)
        )
