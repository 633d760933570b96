"""The real engine's environment build (issue 41 §1), through `opspatch sandbox prepare` itself,
against a local package index of tiny stand-in wheels (the real build downloads 3 GB for
minutes): a Ctrl-C in the middle of the downloads resumed by the next run (each batch kept
before is not fetched again), a line per step and per batch of downloads on a pipe, and one
clear message, exit 2, when the package index cannot be reached.

The index serves a tiny wheel for the release (`sglang`, no requirements of its own) and for
each pin of its constraints; the fake torch also carries the other modules the build's import
check names. The models are made by real torch only, so their cache entry is laid down
beforehand: every step of the environment runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from opspatch.sandbox.processes import free_port
from opspatch.sandbox.real.build import DOWNLOAD_BATCH, STAMP, BaseEnv, base_key, download_pins
from opspatch.sandbox.real.models import models_key
from opspatch.sandbox.real.release import (
    DEFAULT_REAL_RELEASE,
    TORCHVISION_META,
    base_requirements,
    constraints_file,
)
from tests.clirunner import opspatch
from tests.fleetkit import wait_until

pytestmark = pytest.mark.process

VERSION = DEFAULT_REAL_RELEASE
HELD_AFTER = DOWNLOAD_BATCH + 4
"""Wheels served before the index holds one: the release's, a whole batch, part of the next."""
IMPORTED = ("transformers", "tokenizers", "fastapi", "zmq")
"""Modules the build's import check names beyond the three requirements (in the fake torch)."""
META_LINES = (
    "import torch\nimport torchvision.extension\n\n"
    '@torch.library.register_fake("torchvision::nms")\ndef _nms(): ...\n\n'
    '@torch.library.register_fake("torchvision::qnms")\ndef _qnms(): ...\n'
)


def _pins() -> dict[str, tuple[str, str]]:
    """Each pin a build downloads by its normalized name: (name, version)."""
    pins = {}
    for pin in download_pins(constraints_file(VERSION)):
        name, _, version = pin.partition("==")
        pins[_normalized(name)] = (name, version)
    return pins


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _wheel(
    folder: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()
) -> Path:
    """A pure-Python wheel holding `files`, with its dist-info."""
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    info = f"{stem}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    wheel = (
        "Wheel-Version: 1.0\nGenerator: opspatch-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    entries = {**files, f"{info}/METADATA": metadata, f"{info}/WHEEL": wheel}
    record = "".join(f"{path},,\n" for path in entries) + f"{info}/RECORD,,\n"
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in {**entries, f"{info}/RECORD": record}.items():
            archive.writestr(member, text)
    return path


def _metadata(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name)


@dataclass
class LocalIndex:
    """A PEP 503 index on loopback serving `wheels` (by normalized name) and, as PyPI does,
    each one's metadata apart (PEP 658), files cacheable as PyPI's are; it logs each file it
    served in full, and with `hold` set keeps the first wheel asked for after `HELD_AFTER`
    unanswered until `release` is set."""

    wheels: dict[str, Path]
    served: list[str] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    hold: bool = False
    holding: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                parts = self.path.strip("/").split("/")
                if parts[:1] == ["simple"] and len(parts) == 2 and parts[1] in index.wheels:
                    name = index.wheels[parts[1]].name
                    digest = hashlib.sha256(_metadata(index.wheels[parts[1]])).hexdigest()
                    said = f'data-dist-info-metadata="sha256={digest}" data-core-metadata="sha256={digest}"'
                    body = f'<html><body><a href="/files/{name}" {said}>{name}</a></body></html>'
                    self._send(body.encode(), "text/html", "max-age=600")
                elif parts[:1] == ["files"] and len(parts) == 2 and parts[1].endswith(".metadata"):
                    path = next(
                        p for p in index.wheels.values() if f"{p.name}.metadata" == parts[1]
                    )
                    self._send(_metadata(path), "text/plain", "max-age=600")
                elif parts[:1] == ["files"] and len(parts) == 2:
                    self._file(parts[1])
                else:
                    self.send_error(404)

            def _file(self, name: str) -> None:
                index.asked.append(name)
                if index.hold and len(set(index.served)) >= HELD_AFTER and name not in index.served:
                    index.holding.set()
                    index.release.wait(120)
                    return  # the connection closes with no answer
                path = next(p for p in index.wheels.values() if p.name == name)
                immutable = "max-age=365000000, immutable, public"
                self._send(path.read_bytes(), "application/octet-stream", immutable)
                index.served.append(name)

            def _send(self, body: bytes, kind: str, cache: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", cache)
                self.end_headers()
                self.wfile.write(body)

        return Handler


@pytest.fixture
def index(tmp_path: Path) -> Iterator[LocalIndex]:
    folder = tmp_path / "files"
    folder.mkdir()
    special = {
        "torch": {f"{name}/__init__.py": "" for name in ("torch", *IMPORTED)},
        "triton": {"triton/__init__.py": ""},
        "torchvision": {
            "torchvision/__init__.py": "",
            "torchvision/extension.py": "",
            TORCHVISION_META: META_LINES,
        },
    }
    # every pin of the environment, each a tiny wheel (the build fetches the whole closure)
    # torch requires a newer setuptools than a fresh venv holds, as the real one does
    requires = {"torch": ("setuptools>=77.0.3",)}
    wheels = {
        key: _wheel(folder, name, version, special.get(key, {}), requires.get(key, ()))
        for key, (name, version) in _pins().items()
    }
    wheels["sglang"] = _wheel(folder, "sglang", VERSION, {"sglang/__init__.py": ""})
    served = LocalIndex(wheels)
    server = ThreadingHTTPServer(("127.0.0.1", free_port("127.0.0.1", set())), served.handler())
    served.url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        served.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def cache(tmp_path: Path, index: LocalIndex) -> Path:
    """An empty engine cache, but for the models of the environment the index's wheels make."""
    cache = tmp_path / "engines"
    with zipfile.ZipFile(index.wheels["sglang"]) as archive:
        metadata = archive.read(f"sglang-{VERSION}.dist-info/METADATA").decode()
    key = base_key(base_requirements(metadata), constraints_file(VERSION).read_text())
    models = cache / "models" / models_key(BaseEnv(cache / "base", VERSION, key))
    for part in ("target", "draft"):
        (models / part).mkdir(parents=True)
    (models / "report.json").write_text("{}")
    return cache


def _env(tmp_path: Path, cache: Path, index_url: str) -> dict[str, str]:
    return {
        "OPSPATCH_ENGINE_CACHE": str(cache),
        "PIP_INDEX_URL": index_url,
        # this machine's pip finds torch on its disk and more indexes: here only the local one
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_FIND_LINKS": "",
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"),
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "20",
    }


WITH_CTRL_C = (
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])",
)
"""Python run with SIGINT's default action, as a terminal's foreground job has it: a test run
started in the background by a shell without job control (`cmd &`) inherits SIGINT ignored,
and Python then never turns it into KeyboardInterrupt (seen: pip read on for 20 s)."""


def _built(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"base/sglang-{VERSION}-*/{STAMP}"))


def test_a_build_stopped_by_ctrl_c_resumes_showing_each_step_on_a_pipe(
    tmp_path: Path, index: LocalIndex, cache: Path
) -> None:
    env = {**os.environ, "COLUMNS": "200", **_env(tmp_path, cache, index.url)}
    argv = [*WITH_CTRL_C, "-m", "opspatch.cli", "sandbox", "prepare", "--engine", "sglang"]
    index.hold = True
    # its own session: the SIGINT goes to the whole group, pip included, as a terminal's does
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    ) as first:
        try:
            assert index.holding.wait(300), "the build never asked for a wheel to hold"
            os.killpg(first.pid, signal.SIGINT)
            assert wait_until(lambda: first.poll() is not None, timeout=120), "it did not stop"
        finally:
            index.release.set()
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
        stderr = first.stderr.read().decode() if first.stderr else ""
    assert first.returncode == 130, stderr  # a Ctrl-C outside a run (docs/cli.md)
    assert _built(cache) == []
    kept = {path.name for path in cache.glob("downloads/*/*.whl")} | {
        path.name for path in cache.glob("wheels/*.whl")
    }
    assert len(kept) == DOWNLOAD_BATCH + 1, kept  # the release's wheel and the whole first batch
    assert kept <= set(index.served)
    index.hold = False
    index.served.clear()

    again = opspatch("sandbox", "prepare", "--engine", "sglang", env=env, timeout=600)
    assert again.code == 0, again.stderr
    assert len(_built(cache)) == 1
    assert kept.isdisjoint(index.served), kept & set(index.served)
    # what a log of the resumed build shows: each step once, a line per batch, none per file
    steps = [line for line in again.stderr.splitlines() if line.startswith("[")]
    titles = [line.split("]")[0] + "]" for line in steps]
    assert list(dict.fromkeys(titles)) == [
        "[1/5 the release's wheel]",
        "[2/5 downloads]",
        "[3/5 a fresh environment]",
        "[4/5 install]",
        "[5/5 check]",
    ]
    pins, left = len(_pins()), len(_pins()) - DOWNLOAD_BATCH
    assert [line for line in steps if line.startswith("[2/5 downloads]")][:3] == [
        "[2/5 downloads] 3 requirements, pinned by sglang-0.5.23.txt",
        f"[2/5 downloads] {DOWNLOAD_BATCH} of {pins} pins kept from an earlier build",
        f"[2/5 downloads] pins 1-{DOWNLOAD_BATCH} of {left}: "
        + " ... ".join(_batch_ends(DOWNLOAD_BATCH)),
    ]
    batches = [line for line in steps if line.startswith("[2/5 downloads] pins ")]
    assert len(batches) == -(-left // DOWNLOAD_BATCH)
    assert len([line for line in steps if line.startswith("[2/5")]) == 2 + len(batches)
    (stamp,) = _built(cache)
    assert f"environment {stamp.parent}" in again.stdout
    # the build's own edit reached the environment
    meta = next(stamp.parent.glob(f"lib/python3*/site-packages/{TORCHVISION_META}"))
    assert "opspatch: CPU torch" in meta.read_text()


def _batch_ends(first: int) -> tuple[str, str]:
    """The first and last pin of the batch that starts at pin `first` (0-based)."""
    batch = download_pins(constraints_file(VERSION))[first : first + DOWNLOAD_BATCH]
    return batch[0], batch[-1]


def test_an_unreachable_index_is_one_message_and_exit_2(tmp_path: Path, cache: Path) -> None:
    closed = f"http://127.0.0.1:{free_port('127.0.0.1', set())}/simple"
    run = opspatch("sandbox", "prepare", "--engine", "sglang", env=_env(tmp_path, cache, closed))
    assert run.code == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: cannot reach the package index {closed} to download the sglang "
        f"{VERSION} wheel; nothing was changed"
    ]
    assert "then run the same command again" in run.stderr
    assert "Traceback" not in run.stderr
    assert _built(cache) == []
    assert not list(cache.glob("wheels/*.whl"))
