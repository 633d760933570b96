"""The sandbox's second install shape: each host's engine a git checkout installed editable
(`opspatch sandbox up --install editable`), as on the incident's host (`/root/sglang/python/...`,
`pip install -e python`).

The layout tests build a host folder directly (a venv, a real git repository, no engine); the
layout is compared with what pip and setuptools really write for the same checkout. The slow
tests drive the console script as an operator does: real engines, the incident, the fix with
`opspatch apply`, and git showing exactly what changed, over the local transport and over SSH.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch
from opspatch.core.spec import PatchSpec
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.sandbox.checkout import GIT_USER_EMAIL, GIT_USER_NAME, editable_files
from opspatch.sandbox.dist import installed_shape
from opspatch.sandbox.install import (
    engine_source_dir,
    host_venv_dir,
    make_host_python,
    venv_site_packages,
)
from opspatch.sandbox.sshd import find_sshd
from tests.clirunner import opspatch
from tests.fleetkit import EAGLE_RELPATH, REPO, SandboxFleet, wait_until

pytestmark = pytest.mark.process

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

EAGLE_MODULE = "sglang.srt.speculative.eagle_worker_v2"
ATTRIBUTE_ERROR = (
    "AttributeError: 'EAGLEWorkerV2' object has no attribute 'spec_disable_batch_threshold'"
)
SANDBOX_AUTHOR = f"{GIT_USER_NAME} <{GIT_USER_EMAIL}>"
COMMIT_SUBJECT = "sglang 0.5.23: the opspatch sandbox's stand-in engine"

requires_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(checkout: Path, *args: str) -> str:
    """`git -C checkout ARGS` as a user runs it; its stdout."""
    done = subprocess.run(
        ["git", "-C", str(checkout), *args], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode()


def git_bytes(checkout: Path, *args: str) -> bytes:
    done = subprocess.run(
        ["git", "-C", str(checkout), *args], capture_output=True, timeout=60, check=True
    )
    return done.stdout


def imported_files(python: Path, cwd: Path) -> list[str]:
    """What the host's interpreter really imports (`module.__file__`), run from `cwd` as the
    engine is, and the installed sglang distribution's version."""
    code = (
        "import importlib.metadata, sglang, sglang.srt.speculative.eagle_worker_v2 as m\n"
        "print(sglang.__file__); print(m.__file__); print(importlib.metadata.version('sglang'))\n"
    )
    done = subprocess.run(
        [str(python), "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def guard_spec() -> PatchSpec:
    return load_patch(REPO / "patches" / "eagle-init-guard.toml").spec


# -- the layout, no engine ----------------------------------------------------------------------


def test_editable_record_lists_the_pth_and_the_dist_info_files_only(tmp_path: Path) -> None:
    checkout = tmp_path / "sglang"
    files = editable_files(checkout, "0.5.23")
    dist_info = "sglang-0.5.23.dist-info"

    rows = files[f"{dist_info}/RECORD"].decode().splitlines()
    listed = [row.split(",", 1)[0] for row in rows]
    assert listed == sorted(listed)  # pip writes RECORD sorted
    assert set(listed) == set(files)  # every file written, RECORD too, and nothing else
    assert not [p for p in listed if p.startswith("sglang/")]  # never the package's source
    assert f"{dist_info}/RECORD,," in rows
    assert (
        files["__editable__.sglang-0.5.23.pth"] == f"{(checkout / 'python').resolve()}\n".encode()
    )
    direct_url = json.loads(files[f"{dist_info}/direct_url.json"])
    assert direct_url == {
        "url": (checkout / "python").resolve().as_uri(),
        "dir_info": {"editable": True},
    }


@requires_git
def test_an_editable_host_imports_sglang_from_a_clean_one_commit_checkout(tmp_path: Path) -> None:
    host_dir = tmp_path / "sandbox-01"
    python = make_host_python(host_dir, install="editable")
    checkout = host_dir / "sglang"

    # The engine's interpreter imports the checkout's files, run from the host's folder as the
    # engine is (where `sglang/`, the checkout, sits beside it).
    assert imported_files(python, host_dir) == [
        str(checkout / "python" / "sglang" / "__init__.py"),
        str(checkout / "python" / EAGLE_RELPATH),
        "0.5.23",
    ]
    site_packages = venv_site_packages(host_venv_dir(host_dir))
    assert installed_shape(site_packages) == "editable"
    assert not (site_packages / "sglang").exists()

    # One commit, by the sandbox, with the stand-in's source; bytecode from the import ignored.
    log = git(checkout, "log", "--format=%an <%ae>|%cn <%ce>|%s").splitlines()
    assert log == [f"{SANDBOX_AUTHOR}|{SANDBOX_AUTHOR}|{COMMIT_SUBJECT}"]
    assert git(checkout, "status", "--porcelain") == ""
    assert git(checkout, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert (
        git_bytes(checkout, "show", f"HEAD:python/{EAGLE_RELPATH}")
        == (engine_source_dir() / EAGLE_RELPATH).read_bytes()
    )
    project = tomllib.loads((checkout / "python" / "pyproject.toml").read_text())["project"]
    assert (project["name"], project["version"]) == ("sglang", "0.5.23")

    # Making the host again keeps its checkout as it is, local change included.
    target = checkout / "python" / EAGLE_RELPATH
    target.write_text(target.read_text() + "# a local change\n")
    make_host_python(host_dir, install="editable")
    assert target.read_text().endswith("# a local change\n")
    assert git(checkout, "status", "--porcelain") == f" M python/{EAGLE_RELPATH}\n"


@requires_git
def test_the_commit_never_uses_the_users_git_config_or_environment(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A user whose git would sign with a key that does not exist and run a hook that fails.
    hooks = isolated_home / "hooks"
    hooks.mkdir()
    (hooks / "pre-commit").write_text("#!/bin/sh\nexit 1\n")
    (hooks / "pre-commit").chmod(0o755)
    (isolated_home / ".gitconfig").write_text(
        "[user]\n\tname = Some One\n\temail = someone@example.invalid\n"
        f"[commit]\n\tgpgsign = true\n[gpg]\n\tprogram = /nonexistent/gpg\n"
        f"[core]\n\thooksPath = {hooks}\n[init]\n\tdefaultBranch = trunk\n"
    )
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Intruder")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "intruder@example.invalid")

    first = make_host_python(tmp_path / "sandbox-01", install="editable")
    second = make_host_python(tmp_path / "sandbox-02", install="editable")

    commits = []
    for python in (first, second):
        checkout = python.parents[2] / "sglang"
        assert git(checkout, "log", "--format=%an <%ae>|%cn <%ce>") == (
            f"{SANDBOX_AUTHOR}|{SANDBOX_AUTHOR}\n"
        )
        commits.append(git(checkout, "rev-parse", "HEAD").strip())
    assert commits[0] == commits[1]  # the same release has the same commit on every host


def _setuptools_can_build_editable() -> bool:
    if importlib.util.find_spec("setuptools") is None:
        return False
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    wheel_command = importlib.util.find_spec("wheel") is not None or major >= 71
    return major >= 64 and wheel_command  # PEP 660 editable wheels, and a bdist_wheel


@pytest.mark.slow  # a real pip build, ~10 s
@requires_git
@pytest.mark.skipif(
    not _setuptools_can_build_editable(), reason="needs setuptools>=64 with bdist_wheel"
)
def test_the_layout_is_what_pip_and_setuptools_write_for_the_same_checkout(tmp_path: Path) -> None:
    host_dir = tmp_path / "sandbox-01"
    make_host_python(host_dir, install="editable")
    checkout = host_dir / "sglang"
    ours = venv_site_packages(host_venv_dir(host_dir))

    # A throwaway environment where pip installs the same checkout with `pip install -e python`
    # (setuptools' compat editable mode: a path .pth), offline, with this machine's setuptools.
    venv = tmp_path / "pip-venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
        timeout=120,
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index"]
        + ["--no-deps", "--no-build-isolation", "--disable-pip-version-check"]
        + ["--config-settings", "editable_mode=compat", "-e", str(checkout / "python")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    theirs = venv_site_packages(venv)

    def sglang_entries(site_packages: Path) -> list[str]:
        return sorted(p.name for p in site_packages.iterdir() if "sglang" in p.name)

    assert (
        sglang_entries(ours)
        == sglang_entries(theirs)
        == [
            "__editable__.sglang-0.5.23.pth",
            "sglang-0.5.23.dist-info",
        ]
    )
    pth = "__editable__.sglang-0.5.23.pth"
    assert (ours / pth).read_bytes() == (theirs / pth).read_bytes()
    dist_info = "sglang-0.5.23.dist-info"
    for name in ("direct_url.json", "top_level.txt", "REQUESTED"):
        assert (ours / dist_info / name).read_bytes() == (theirs / dist_info / name).read_bytes()

    def record_paths(site_packages: Path) -> list[str]:
        rows = (site_packages / dist_info / "RECORD").read_text().splitlines()
        return [row.split(",", 1)[0] for row in rows]

    assert record_paths(ours) == record_paths(theirs)
    for field in ("Name: sglang", "Version: 0.5.23"):
        assert field in (theirs / dist_info / "METADATA").read_text().splitlines()
        assert field in (ours / dist_info / "METADATA").read_text().splitlines()
    # Both interpreters import the checkout; building from it left the checkout clean.
    assert (
        imported_files(venv / "bin" / "python", tmp_path)[:2]
        == imported_files(host_dir / "venv" / "bin" / "python", tmp_path)[:2]
    )
    assert git(checkout, "status", "--porcelain") == ""


# -- bad input ----------------------------------------------------------------------------------


def test_an_unknown_install_shape_gets_one_message_and_exit_2(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = opspatch(
        "sandbox", "up", "--install", "sdist", env={"OPSPATCH_STATE_DIR": str(state)}, cwd=tmp_path
    )

    assert run.code == 2
    assert run.stderr.startswith("error: --install 'sdist': expected wheel or editable\n")
    assert not (state / "sandbox").exists()


def test_editable_without_git_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = opspatch(
        "sandbox",
        "up",
        "--install",
        "editable",
        env={"OPSPATCH_STATE_DIR": str(state), "PATH": str(tmp_path / "no-git-here")},
        cwd=tmp_path,
    )

    assert run.code == 2, run.stderr
    assert "`--install editable` needs git, which is not installed" in run.stderr
    assert not (state / "sandbox" / "sandbox.json").exists()
    assert not (state / "sandbox" / "hosts").exists()


# -- the incident on an editable sandbox, end to end --------------------------------------------


def _outcomes(doc: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {h["host"]: h["outcome"] for h in doc["hosts"]}


@pytest.mark.engine
@requires_git
@pytest.mark.parametrize(
    "over_ssh", [False, pytest.param(True, marks=pytest.mark.ssh)], ids=["local", "ssh"]
)
def test_incident_fix_and_rollback_on_an_editable_sandbox_as_git_sees_them(
    tmp_path: Path, over_ssh: bool
) -> None:
    if over_ssh and find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")
    fleet = SandboxFleet(tmp_path, 1 if over_ssh else 2, ssh=over_ssh, install="editable").up()
    try:
        names = fleet.names
        head = {n: git(fleet.checkout(n), "rev-parse", "HEAD").strip() for n in names}
        pristine = {
            n: git_bytes(fleet.checkout(n), "show", f"HEAD:python/{EAGLE_RELPATH}") for n in names
        }

        # The sandbox says how it is installed; the inventory is the wheel shape's.
        status = fleet.opspatch("sandbox", "status", "--json")
        assert status.code == 0, status.stderr
        assert status.json()["install"] == "editable"
        for host in status.json()["hosts"]:
            assert host["install"] == "editable"
            assert host["checkout"] == str(fleet.checkout(host["host"]))
            carried = {p["patch"]: p for p in host["patches"]}["eagle-init-guard"]
            assert (carried["state"], carried["file"]) == (
                "not-applied",
                str(fleet.file(host["host"])),
            )
        for name in names:
            host = fleet.hosts[name]
            assert host.engine.python == str(fleet.host_dir(name) / "venv" / "bin" / "python")
            # The host's interpreter imports the checkout, over the inventory's transport too.
            assert imported_files(Path(host.engine.python), fleet.host_dir(name))[1] == str(
                fleet.file(name)
            )
            transport = open_transport(host)
            try:
                resolved = HostOperations(transport, host).resolve(EAGLE_MODULE, timeout=60)
            finally:
                transport.close()
            assert resolved["origin"] == str(fleet.file(name))
            assert git(fleet.checkout(name), "log", "--format=%an <%ae>|%s") == (
                f"{SANDBOX_AUTHOR}|{COMMIT_SUBJECT}\n"
            )
            assert git(fleet.checkout(name), "status", "--porcelain") == ""
        assert len(set(head.values())) == 1  # one release, one commit, on every host

        # The incident reproduces: a prefill answers, the first real decode crashes the server.
        first = names[0]
        assert fleet.generate(first, tokens=1) is not None
        assert fleet.generate(first, tokens=16) is None
        assert wait_until(lambda: fleet.pid(first) is None, 20)
        assert ATTRIBUTE_ERROR in fleet.log(first)

        # The fix: the version gate passes on the installed distribution's version (no RECORD
        # lists the checkout's files), every host is patched, restarted and decodes.
        run = fleet.opspatch(
            "apply", "eagle-init-guard", "--hosts", fleet.inventory, "--yes", "--json"
        )
        assert run.code == 0, run.stdout + run.stderr
        assert _outcomes(run.json()) == {n: "applied" for n in names}
        for host_doc in run.json()["hosts"]:
            assert host_doc["file"]["path"] == str(fleet.file(host_doc["host"]))
        for name in names:
            out = fleet.generate(name, tokens=16)
            assert out is not None and out["meta_info"]["spec_verify_ct"] > 0

            # git sees exactly the patch: one modified file, HEAD's text with the patch applied.
            checkout = fleet.checkout(name)
            assert git(checkout, "status", "--porcelain") == f" M python/{EAGLE_RELPATH}\n"
            expected = apply_patch(pristine[name], guard_spec())
            assert isinstance(expected, Applied)
            assert fleet.file(name).read_bytes() == expected.new_source
            diff = git(checkout, "diff", "--numstat")
            assert diff.endswith(f"\tpython/{EAGLE_RELPATH}\n") and len(diff.splitlines()) == 1
        states = fleet.opspatch(
            "status", "--hosts", fleet.inventory, "--patch", "eagle-init-guard", "--json"
        )
        assert states.code == 0, states.stderr
        assert {s["host"]: s["state"] for s in states.json()["status"]} == {
            n: "applied" for n in names
        }

        if not over_ssh:  # every engine runs the fixed code now
            _up_keeps_the_shape_and_refuses_the_other(fleet)

        # Rollback: HEAD's bytes back, and git sees a clean checkout again. HEAD is the
        # incident's code, which the restore's smoke decode crashes: not served (exit 1), and a
        # rollback halts after such a host, so each host is rolled back by name.
        for name in names:
            back = fleet.opspatch(
                "rollback", "eagle-init-guard", "--hosts", f"{fleet.inventory}:{name}", "--yes",
                "--json",
            )  # fmt: skip
            assert back.code == 1, back.stdout + back.stderr
            assert _outcomes(back.json()) == {name: "restored-not-serving"}
        for name in names:
            assert fleet.file(name).read_bytes() == pristine[name]
            assert git(fleet.checkout(name), "status", "--porcelain") == ""
            assert git(fleet.checkout(name), "rev-parse", "HEAD").strip() == head[name]
    finally:
        fleet.close()


def _up_keeps_the_shape_and_refuses_the_other(fleet: SandboxFleet) -> None:
    pids = {n: fleet.pid(n) for n in fleet.names}
    again = fleet.opspatch("sandbox", "up", "--json")
    assert again.code == 0, again.stderr
    assert again.json()["install"] == "editable"
    assert {h["host"]: h["outcome"] for h in again.json()["hosts"]} == {
        n: "already-running" for n in fleet.names
    }

    other = fleet.opspatch("sandbox", "up", "--install", "wheel")
    assert other.code == 2
    assert other.stderr.startswith(
        "error: the sandbox's hosts are installed as editable; "
        "`up --install wheel` would not reinstall them\n"
    )
    assert "opspatch sandbox down --purge" in other.stderr
    assert {n: fleet.pid(n) for n in fleet.names} == pids
    manifest = json.loads((fleet.state / "sandbox" / "sandbox.json").read_text())
    assert manifest["install"] == "editable"
