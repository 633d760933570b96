"""Host-side operations, each over the local transport and over real SSH (`remote_target`).

The "host" is this machine either way, so the tests can look at the files, modes, owners and
processes the operations produced.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.metadata
import importlib.util
import os
import py_compile
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from opspatch.core.host import CommandRestart
from opspatch.errors import (
    InputError,
    LockHeld,
    PreimageMismatch,
    RemoteOperationError,
    TargetError,
)
from opspatch.hosts.agent.facts import parse_nvidia_smi
from opspatch.hosts.agent.files import purge_stale_bytecode
from opspatch.hosts.channel import OwnProcessEndpoint
from opspatch.hosts.operations import BOOTSTRAP, HostOperations, open_transport
from opspatch.hosts.transport.base import Command
from opspatch.sandbox.sshd import SshFleet

pytestmark = pytest.mark.process

if TYPE_CHECKING:
    from tests.sshfleet import HostMaker, Target


NOBODY = 65534


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def leftovers(folder: Path, keep: set[str]) -> list[str]:
    """Files in `folder` other than `keep` (temp files a failed write must not leave)."""
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def make_fake_sglang(root: Path, worker_source: bytes) -> Path:
    """A site folder with an `sglang` package whose import would fail, and its dist-info."""
    package = root / "sglang"
    (package / "srt" / "speculative").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('sglang must not be imported')\n")
    (package / "srt" / "__init__.py").write_text("raise RuntimeError('nor sglang.srt')\n")
    (package / "srt" / "speculative" / "__init__.py").write_text("")
    worker = package / "srt" / "speculative" / "eagle_worker_v2.py"
    worker.write_bytes(worker_source)
    dist = root / "sglang-0.5.23.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    digest = hashlib.sha256(worker_source).digest()
    recorded = base64.urlsafe_b64encode(digest).decode().rstrip("=")
    (dist / "RECORD").write_text(
        f"sglang/srt/speculative/eagle_worker_v2.py,sha256={recorded},{len(worker_source)}\n"
        "sglang-0.5.23.dist-info/RECORD,,\n"
    )
    return worker


def engine_with_env(remote_target: Target, **env: str) -> HostOperations:
    host = replace(remote_target.host, engine=replace(remote_target.host.engine, env=env))
    return remote_target.with_host(host)


# ---------------------------------------------------------------------------------------------
# The agent itself


def test_the_bootstrap_is_small_and_stable() -> None:
    assert len(BOOTSTRAP) < 600
    ast.parse(BOOTSTRAP, feature_version=(3, 8))


def test_bytecode_purge_matches_only_the_module_own_cache_files(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("x = 1\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    names = [
        "mod.cpython-311.pyc",
        "mod.cpython-38.opt-1.pyc",
        "mod_other.cpython-311.pyc",
        "module.cpython-311.pyc",
        "mod.cpython-311.pyc.tmp",
    ]
    for name in names:
        (cache / name).write_bytes(b"")
    removed, failed = purge_stale_bytecode(str(source))
    assert sorted(Path(p).name for p in removed) == names[:2]
    assert failed == []
    assert sorted(p.name for p in cache.iterdir()) == sorted(names[2:])


def execs(target: Target, requests: int) -> int:
    """The execs `requests` agent requests cost on `target`: none where the controller's own
    interpreter answers them in-process (a local host running this Python)."""
    return 0 if isinstance(target.ops.endpoint, OwnProcessEndpoint) else requests


# ---------------------------------------------------------------------------------------------
# facts, resolve, read, inspect


def test_inspect_is_one_exec_and_imports_nothing(remote_target: Target, tmp_path: Path) -> None:
    source = b"class EAGLEWorkerV2:\n    def __init__(self):\n        self.a = 1\n"
    worker = make_fake_sglang(tmp_path / "site", source)
    ops = engine_with_env(remote_target, PYTHONPATH=str(tmp_path / "site"))
    inspection = ops.inspect("sglang.srt.speculative.eagle_worker_v2", timeout=60)
    assert remote_target.transport.exec_count == 1
    assert inspection.facts.sglang_version == "0.5.23"
    assert inspection.facts.python_executable == sys.executable
    module = inspection.module
    assert module is not None
    assert module["origin"] == str(worker)
    assert module["distribution"] == "sglang" and module["distribution_version"] == "0.5.23"
    assert module["record_sha256"] == sha(source)
    assert inspection.file.content == source
    assert inspection.file.sha256 == sha(source)


def test_facts_report_python_and_package_versions(remote_target: Target) -> None:
    facts = remote_target.ops.facts(timeout=60)
    assert facts.python_version == ".".join(map(str, sys.version_info[:3]))
    assert facts.sglang_version is None  # not installed in this interpreter
    if importlib.util.find_spec("torch") is not None:
        assert facts.torch_version == importlib.metadata.version("torch")
    assert facts.hostname
    # which machine it is, however it was reached (the ledger's host identity)
    machine_id = Path("/etc/machine-id")
    if machine_id.is_file() and machine_id.read_text().strip():
        assert facts.machine_id == machine_id.read_text().strip()


# Installed as `sitecustomize` in the engine's environment: at exit, every interpreter started
# with it (the agent and any child it runs) appends one line saying which engine modules
# (torch, sglang) it imported.
_IMPORT_WITNESS = """
import atexit, json, sys
def _record():
    with open({out!r}, "a") as handle:
        found = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "sglang"))
        handle.write(json.dumps(found) + "\\n")
atexit.register(_record)
"""


def test_facts_never_import_torch(remote_target: Target, tmp_path: Path) -> None:
    """On a GPU host, importing torch beside a running server takes seconds and GPU memory."""
    site = tmp_path / "witness"
    site.mkdir()
    out = tmp_path / "imported.json"
    (site / "sitecustomize.py").write_text(_IMPORT_WITNESS.format(out=str(out)))
    ops = engine_with_env(remote_target, PYTHONPATH=str(site))
    facts = ops.facts(timeout=60)
    assert out.read_text().splitlines() == ["[]"]  # one interpreter, nothing imported
    out.unlink()
    ops.inspect(path=str(site / "sitecustomize.py"), timeout=60)
    assert out.read_text().splitlines() == ["[]"]
    if importlib.util.find_spec("torch") is not None:  # installed, and still not imported
        assert facts.torch_version is not None


_NVIDIA_SMI_STUB = """#!/bin/sh
echo "$@" >> {calls}
{body}
"""


def nvidia_smi_stub(folder: Path, body: str) -> dict[str, str]:
    """An environment whose `nvidia-smi` is a stub script and whose NVML cannot be loaded (a
    `libnvidia-ml.so.1` that is not a library comes first), so the agent falls back to the
    stub even on a machine with a real driver."""
    folder.mkdir()
    stub = folder / "nvidia-smi"
    stub.write_text(_NVIDIA_SMI_STUB.format(calls=folder / "calls", body=body))
    stub.chmod(0o755)
    (folder / "libnvidia-ml.so.1").write_text("not a shared library\n")
    return {"PATH": f"{folder}:{os.environ['PATH']}", "LD_LIBRARY_PATH": str(folder)}


def test_gpu_facts_come_from_the_driver_tool(remote_target: Target, tmp_path: Path) -> None:
    rows = "printf 'NVIDIA H200, 550.54.15, 143771 MiB\\nNVIDIA H200, 550.54.15, 143771 MiB\\n'"
    env = nvidia_smi_stub(tmp_path / "bin", rows)
    facts = engine_with_env(remote_target, **env).facts(timeout=60)
    assert facts.gpu_names == ("NVIDIA H200", "NVIDIA H200")
    assert facts.gpu_memory_mib == (143771, 143771)
    assert facts.driver_version == "550.54.15"
    assert (facts.cuda_available, facts.cuda_device_count) == (True, 2)
    assert facts.notes == ()
    calls = (tmp_path / "bin" / "calls").read_text().splitlines()
    assert calls == ["--query-gpu=name,driver_version,memory.total --format=csv,noheader"]


# A stand-in for the driver's NVML library with the real entry points and signatures.
_FAKE_NVML = r"""
#include <stdio.h>
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef void *nvmlDevice_t;
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char *v, unsigned int n) { snprintf(v, n, "550.54.15"); return 0; }
int nvmlSystemGetCudaDriverVersion(int *v) { *v = 12040; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *c) { *c = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    *d = (void *)(unsigned long)(0x1000 + i); return 0;
}
int nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int n) {
    snprintf(name, n, "NVIDIA H200 #%lu", (unsigned long)d - 0x1000); return 0;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    m->total = 150754820096ULL; m->free = 1; m->used = 2; return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build a stand-in NVML")
def test_gpu_facts_come_from_nvml_first(remote_target: Target, tmp_path: Path) -> None:
    env = nvidia_smi_stub(tmp_path / "bin", "echo 'NVIDIA H100, 1.0, 1 MiB'")
    (tmp_path / "nvml.c").write_text(_FAKE_NVML)
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-o",
            str(tmp_path / "bin" / "libnvidia-ml.so.1"),
            str(tmp_path / "nvml.c"),
        ],
        check=True,
    )
    facts = engine_with_env(remote_target, **env).facts(timeout=60)
    assert facts.gpu_names == ("NVIDIA H200 #0", "NVIDIA H200 #1")
    assert facts.gpu_memory_mib == (143771, 143771)
    assert (facts.driver_version, facts.cuda_version) == ("550.54.15", "12.4")
    assert (facts.cuda_available, facts.cuda_device_count, facts.notes) == (True, 2, ())
    assert not (tmp_path / "bin" / "calls").exists()  # nvidia-smi was not needed


def test_a_failing_driver_tool_is_a_note_not_an_error(
    remote_target: Target, tmp_path: Path
) -> None:
    env = nvidia_smi_stub(tmp_path / "bin", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    facts = engine_with_env(remote_target, **env).facts(timeout=60)
    assert facts.gpu_names == () and facts.cuda_available is None
    assert facts.notes == ("nvidia-smi exited 9: NVIDIA-SMI has failed",)


def test_nvidia_smi_rows_are_parsed_with_or_without_units() -> None:
    parsed = parse_nvidia_smi(
        "NVIDIA H200, 550.54.15, 143771 MiB\nNVIDIA A100-SXM4-80GB, 550.54.15, 81920\n\n"
    )
    assert parsed == {
        "names": ["NVIDIA H200", "NVIDIA A100-SXM4-80GB"],
        "memory_mib": [143771, 81920],
        "count": 2,
        "driver_version": "550.54.15",
    }
    assert parse_nvidia_smi("")["count"] == 0


def test_read_reports_bytes_hash_mode_owner_and_symlink(
    remote_target: Target, tmp_path: Path
) -> None:
    real = tmp_path / "real.py"
    real.write_bytes(b"x = 1\r\n")
    real.chmod(0o640)
    link = tmp_path / "link.py"
    link.symlink_to(real)
    remote = remote_target.ops.read(str(link), timeout=60)
    assert remote.content == b"x = 1\r\n"
    assert remote.sha256 == sha(b"x = 1\r\n")
    assert remote.realpath == str(real)
    assert remote.symlink_target == str(real)
    assert remote.mode == 0o640
    assert (remote.uid, remote.gid) == (os.getuid(), os.getgid())
    assert remote.size == 7


def test_read_of_a_missing_file_is_a_remote_error_with_a_code(remote_target: Target) -> None:
    with pytest.raises(RemoteOperationError) as caught:
        remote_target.ops.read("/nonexistent/opspatch/x.py", timeout=60)
    assert caught.value.code == "not-found"
    assert caught.value.host == remote_target.host.name and caught.value.step == "read"


def test_a_module_that_does_not_resolve_names_host_and_module(remote_target: Target) -> None:
    with pytest.raises(TargetError) as caught:
        remote_target.ops.resolve("sglang.srt.speculative.eagle_worker_v2", timeout=60)
    assert remote_target.host.name in caught.value.message
    assert "'sglang.srt.speculative.eagle_worker_v2'" in caught.value.message
    assert caught.value.exit_code == 2


def test_modules_resolve_from_the_server_folder_not_the_login_folder(
    remote_target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path / "server"
    (workdir / "decoy_engine").mkdir(parents=True)
    (workdir / "decoy_engine" / "__init__.py").write_text("")
    monkeypatch.chdir(workdir)  # where the local transport's shell starts
    with pytest.raises(TargetError):
        remote_target.ops.resolve("decoy_engine", timeout=60)
    restart = CommandRestart(start="./serve", pid_file=str(tmp_path / "pid"), workdir=str(workdir))
    host = replace(remote_target.host, engine=replace(remote_target.host.engine, restart=restart))
    resolved = remote_target.with_host(host).resolve("decoy_engine", timeout=60)
    assert resolved["origin"] == str(workdir / "decoy_engine" / "__init__.py")
    assert resolved["is_package"]


def test_a_missing_interpreter_names_host_and_path(remote_target: Target) -> None:
    host = replace(
        remote_target.host,
        engine=replace(remote_target.host.engine, python="/opt/no such/python;true"),
    )
    with pytest.raises(InputError) as caught:
        remote_target.with_host(host).facts(timeout=60)
    assert remote_target.host.name in caught.value.message
    assert "'/opt/no such/python;true'" in caught.value.message
    assert caught.value.exit_code == 2


def test_an_inventory_without_engine_python_is_refused_before_any_exec(
    remote_target: Target,
) -> None:
    host = replace(remote_target.host, engine=replace(remote_target.host.engine, python=None))
    with pytest.raises(InputError, match="engine.python"):
        remote_target.with_host(host).read("/etc/hostname", timeout=60)
    assert remote_target.transport.exec_count == 0


# ---------------------------------------------------------------------------------------------
# swap


@pytest.fixture
def module_file(tmp_path: Path) -> Path:
    folder = tmp_path / "pkg"
    folder.mkdir()
    path = folder / "mod.py"
    path.write_bytes(b"VALUE = 1\n")
    return path


def test_read_then_swap_is_two_execs_and_keeps_mode_and_owner(
    remote_target: Target, module_file: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another owner needs root")
    os.chown(module_file, NOBODY, NOBODY)
    module_file.chmod(0o640)
    before = remote_target.ops.read(str(module_file), timeout=60)
    result = remote_target.ops.swap(
        str(module_file), expected_sha256=before.sha256, new_content=b"VALUE = 2\n", timeout=60
    )
    assert remote_target.transport.exec_count == execs(remote_target, 2)
    assert module_file.read_bytes() == b"VALUE = 2\n"
    info = module_file.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (NOBODY, NOBODY, 0o640)
    assert (result.sha256_before, result.sha256_after) == (sha(b"VALUE = 1\n"), sha(b"VALUE = 2\n"))
    assert result.changed
    assert result.backup_path is not None
    assert Path(result.backup_path).read_bytes() == b"VALUE = 1\n"
    assert Path(result.backup_path).parent == Path(remote_target.host.state_dir) / "backups"
    assert leftovers(module_file.parent, {"mod.py"}) == []


def test_swap_purges_stale_bytecode_so_the_new_code_runs(
    remote_target: Target, module_file: Path
) -> None:
    folder = module_file.parent
    py_compile.compile(str(module_file), doraise=True)
    stale = list((folder / "__pycache__").glob("mod.*.pyc"))
    assert stale
    stat_before = module_file.stat()
    result = remote_target.ops.swap(
        str(module_file),
        expected_sha256=sha(b"VALUE = 1\n"),
        new_content=b"VALUE = 9\n",
        timeout=60,
    )
    assert sorted(result.purged_bytecode) == sorted(str(p) for p in stale)
    # Same size, same mtime: exactly the case where a timestamp pyc would be trusted.
    os.utime(module_file, ns=(stat_before.st_atime_ns, stat_before.st_mtime_ns))
    output = subprocess.run(
        [sys.executable, "-c", "import mod; print(mod.VALUE)"],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    )
    assert output.stdout.strip() == "9"


def test_swap_refuses_a_changed_preimage_and_writes_nothing(
    remote_target: Target, module_file: Path
) -> None:
    with pytest.raises(PreimageMismatch) as caught:
        remote_target.ops.swap(
            str(module_file), expected_sha256=sha(b"other"), new_content=b"VALUE = 2\n", timeout=60
        )
    assert caught.value.code == "preimage-mismatch"
    assert caught.value.data["actual"] == sha(b"VALUE = 1\n")
    assert caught.value.host == remote_target.host.name and caught.value.step == "swap"
    assert module_file.read_bytes() == b"VALUE = 1\n"
    assert leftovers(module_file.parent, {"mod.py"}) == []
    assert not (Path(remote_target.host.state_dir) / "backups").exists()


def test_swap_refuses_text_the_host_python_cannot_compile(
    remote_target: Target, module_file: Path
) -> None:
    with pytest.raises(RemoteOperationError) as caught:
        remote_target.ops.swap(
            str(module_file),
            expected_sha256=sha(b"VALUE = 1\n"),
            new_content=b"VALUE = 1\ndef broken(:\n",
            timeout=60,
        )
    assert caught.value.code == "compile-failed"
    assert caught.value.data["lineno"] == 2
    assert module_file.read_bytes() == b"VALUE = 1\n"
    assert leftovers(module_file.parent, {"mod.py"}) == []


def test_swap_through_a_symlink_patches_the_real_file_and_keeps_the_link(
    remote_target: Target, tmp_path: Path
) -> None:
    real = tmp_path / "store" / "mod.py"
    real.parent.mkdir()
    real.write_bytes(b"A = 1\n")
    link = tmp_path / "site" / "mod.py"
    link.parent.mkdir()
    link.symlink_to(real)
    result = remote_target.ops.swap(
        str(link), expected_sha256=sha(b"A = 1\n"), new_content=b"A = 2\n", timeout=60
    )
    assert result.realpath == str(real)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes() == b"A = 2\n"


def test_crlf_and_non_utf8_bytes_round_trip_exactly(remote_target: Target, tmp_path: Path) -> None:
    original = b"# -*- coding: latin-1 -*-\r\nname = '\xe9t\xe9'\r\nif name:\r\n\tflag = 1\r\n"
    patched = original.replace(b"\xe9t\xe9", b"\xe9t\xe9 \xa7") + b"extra = 1\r\n"
    path = tmp_path / "latin.py"
    path.write_bytes(original)
    assert remote_target.ops.read(str(path), timeout=60).content == original
    remote_target.ops.swap(
        str(path), expected_sha256=sha(original), new_content=patched, timeout=60
    )
    assert path.read_bytes() == patched
    assert remote_target.ops.read(str(path), timeout=60).content == patched
    restored = remote_target.ops.restore(
        str(path), pre_sha256=sha(original), current_sha256=sha(patched), timeout=60
    )
    assert path.read_bytes() == original
    assert restored["source"] == "backup"


# ---------------------------------------------------------------------------------------------
# Failed writes (a tiny tmpfs: root ignores directory permissions, a full or read-only
# filesystem does not)


@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path]:
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "opspatch-test", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


@pytest.mark.root
def test_a_full_disk_leaves_the_original_and_no_temp_file(
    remote_target: Target, tiny_filesystem: Path
) -> None:
    path = tiny_filesystem / "mod.py"
    path.write_bytes(b"VALUE = 1\n")
    too_big = b"VALUE = 2\n" + b"# padding\n" * 20000  # ~200 KB on a 64 KB filesystem
    with pytest.raises(RemoteOperationError) as caught:
        remote_target.ops.swap(
            str(path), expected_sha256=sha(b"VALUE = 1\n"), new_content=too_big, timeout=60
        )
    assert caught.value.code == "write-failed"
    assert caught.value.data["errno"] == "ENOSPC"
    assert path.read_bytes() == b"VALUE = 1\n"
    assert leftovers(tiny_filesystem, {"mod.py"}) == []


@pytest.mark.root
def test_a_read_only_directory_refuses_the_swap_and_leaves_the_file(
    remote_target: Target, tiny_filesystem: Path
) -> None:
    path = tiny_filesystem / "mod.py"
    path.write_bytes(b"VALUE = 1\n")
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_filesystem)], check=True)
    with pytest.raises(RemoteOperationError) as caught:
        remote_target.ops.swap(
            str(path), expected_sha256=sha(b"VALUE = 1\n"), new_content=b"VALUE = 2\n", timeout=60
        )
    assert caught.value.code == "write-failed"
    assert caught.value.data["errno"] == "EROFS"
    assert path.read_bytes() == b"VALUE = 1\n"
    assert leftovers(tiny_filesystem, {"mod.py"}) == []


# ---------------------------------------------------------------------------------------------
# restore


def test_restore_gives_identical_bytes_from_the_backup_or_from_given_bytes(
    remote_target: Target, module_file: Path
) -> None:
    original = module_file.read_bytes()
    swapped = remote_target.ops.swap(
        str(module_file), expected_sha256=sha(original), new_content=b"B = 2\n", timeout=60
    )
    first = remote_target.ops.restore(
        str(module_file), pre_sha256=sha(original), current_sha256=swapped.sha256_after, timeout=60
    )
    assert module_file.read_bytes() == original
    assert (first["source"], first["changed"]) == ("backup", True)

    remote_target.ops.swap(
        str(module_file), expected_sha256=sha(original), new_content=b"B = 2\n", timeout=60
    )
    for backup in (Path(remote_target.host.state_dir) / "backups").iterdir():
        backup.unlink()  # the host lost its backups: the ledger's copy is sent instead
    second = remote_target.ops.restore(
        str(module_file), pre_sha256=sha(original), content=original, timeout=60
    )
    assert module_file.read_bytes() == original
    assert second["source"] == "given"

    again = remote_target.ops.restore(str(module_file), pre_sha256=sha(original), timeout=60)
    assert (again["source"], again["changed"]) == ("already", False)


def test_restore_refuses_wrong_bytes_and_files_someone_else_changed(
    remote_target: Target, module_file: Path
) -> None:
    original = module_file.read_bytes()
    remote_target.ops.swap(
        str(module_file), expected_sha256=sha(original), new_content=b"B = 2\n", timeout=60
    )
    for backup in (Path(remote_target.host.state_dir) / "backups").iterdir():
        backup.unlink()
    with pytest.raises(RemoteOperationError) as wrong:
        remote_target.ops.restore(
            str(module_file), pre_sha256=sha(original), content=b"not it\n", timeout=60
        )
    assert wrong.value.code == "backup-hash-mismatch"
    with pytest.raises(RemoteOperationError) as missing:
        remote_target.ops.restore(str(module_file), pre_sha256=sha(original), timeout=60)
    assert missing.value.code == "backup-missing"
    module_file.write_bytes(b"C = 3\n")  # someone else edited it after our swap
    with pytest.raises(RemoteOperationError) as theirs:
        remote_target.ops.restore(
            str(module_file),
            pre_sha256=sha(original),
            content=original,
            current_sha256=sha(b"B = 2\n"),
            timeout=60,
        )
    assert theirs.value.code == "not-our-file"
    assert module_file.read_bytes() == b"C = 3\n"
    forced = remote_target.ops.restore(
        str(module_file),
        pre_sha256=sha(original),
        content=original,
        current_sha256=sha(b"B = 2\n"),
        force=True,
        timeout=60,
    )
    assert forced["kept_copy"] is not None and Path(forced["kept_copy"]).read_bytes() == b"C = 3\n"
    assert module_file.read_bytes() == original


# ---------------------------------------------------------------------------------------------
# The host lock


def test_lock_contention_names_the_holder_and_unlock_is_owner_only(remote_target: Target) -> None:
    first = remote_target.ops.lock(run_id="run-1", owner="alice@ctl", ttl_seconds=600, timeout=30)
    assert remote_target.transport.exec_count == execs(remote_target, 1)
    assert (first["holder"].get("owner"), first["holder"].get("run_id")) == ("alice@ctl", "run-1")
    assert first["previous"] is None and not first["refreshed"]
    with pytest.raises(LockHeld) as caught:
        remote_target.ops.lock(run_id="run-2", owner="bob@ctl", ttl_seconds=600, timeout=30)
    assert caught.value.data["owner"] == "alice@ctl"
    assert caught.value.data["run_id"] == "run-1"
    assert "alice@ctl" in caught.value.message and "run-1" in caught.value.message
    with pytest.raises(RemoteOperationError) as not_ours:
        remote_target.ops.unlock(run_id="run-2", timeout=30)
    assert not_ours.value.code == "lock-not-ours"
    again = remote_target.ops.lock(run_id="run-1", owner="alice@ctl", ttl_seconds=600, timeout=30)
    assert again["refreshed"]
    count = remote_target.transport.exec_count
    released = remote_target.ops.unlock(run_id="run-1", timeout=30)
    assert remote_target.transport.exec_count == count + execs(remote_target, 1)
    assert released["released"] and released["previous"] is not None
    assert not (Path(remote_target.host.state_dir) / "lock.json").exists()
    assert remote_target.ops.unlock(run_id="run-1", timeout=30)["reason"] == "not-held"


def test_an_expired_lock_is_taken_over_and_the_previous_holder_reported(
    remote_target: Target,
) -> None:
    remote_target.ops.lock(run_id="crashed-run", owner="alice@ctl", ttl_seconds=0.2, timeout=30)
    time.sleep(0.4)
    taken = remote_target.ops.lock(run_id="run-2", owner="bob@ctl", ttl_seconds=600, timeout=30)
    assert taken["previous"] is not None
    assert taken["previous"].get("run_id") == "crashed-run"
    assert taken["holder"].get("run_id") == "run-2"


def test_swap_with_a_lock_run_id_refuses_when_the_lock_is_not_ours(
    remote_target: Target, module_file: Path
) -> None:
    remote_target.ops.lock(run_id="someone-else", owner="carol@ctl", ttl_seconds=600, timeout=30)
    with pytest.raises(RemoteOperationError) as caught:
        remote_target.ops.swap(
            str(module_file),
            expected_sha256=sha(b"VALUE = 1\n"),
            new_content=b"VALUE = 2\n",
            lock_run_id="my-run",
            timeout=60,
        )
    assert caught.value.code == "lock-lost"
    assert module_file.read_bytes() == b"VALUE = 1\n"


# ---------------------------------------------------------------------------------------------
# Shell metacharacters: quoted, never interpreted


def test_metacharacters_in_paths_and_host_names_are_never_interpreted(
    remote_target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "odd $(touch pwned) dir"
    folder.mkdir()
    path = folder / "a b;$(touch pwned)'.py"
    path.write_bytes(b"X = 1\n")
    host = replace(remote_target.host, name="gpu;$(touch pwned)`touch pwned`")
    ops = remote_target.with_host(host)
    assert ops.read(str(path), timeout=60).content == b"X = 1\n"
    ops.swap(str(path), expected_sha256=sha(b"X = 1\n"), new_content=b"X = 2\n", timeout=60)
    assert path.read_bytes() == b"X = 2\n"
    with pytest.raises(PreimageMismatch) as caught:
        ops.swap(str(path), expected_sha256=sha(b"X = 1\n"), new_content=b"X = 3\n", timeout=60)
    assert caught.value.host == "gpu;$(touch pwned)`touch pwned`"
    remote_home = shell_home(remote_target)
    for candidate in (tmp_path, folder, remote_home):
        assert not (candidate / "pwned").exists(), candidate


def shell_home(remote_target: Target) -> Path:
    """The folder the host's shell starts in (where a relative `touch pwned` would land)."""
    out = remote_target.transport.run(Command(("sh", "-c", "pwd")), timeout=30).stdout
    return Path(out.decode().strip())


@pytest.mark.ssh
def test_ssh_and_local_hosts_report_the_same_file(
    make_inventory_host: HostMaker, tmp_path: Path, ssh_fleet: SshFleet
) -> None:
    path = tmp_path / "same.py"
    path.write_bytes(b"S = 1\n")
    results = []
    for kind in ("local", "ssh"):
        host = make_inventory_host(kind, fleet=ssh_fleet, state_dir=tmp_path / kind)
        transport = open_transport(host)
        try:
            results.append(HostOperations(transport, host).read(str(path), timeout=60))
        finally:
            transport.close()
    assert results[0] == results[1]
