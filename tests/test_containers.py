"""Engines in containers (issue 21): the inventory key, the container transport, the runtime's
restart, and the incident and its fix on a fleet of real podman containers.

The first half is pure (commands as data, the runtime's inspect document, the inventory); the
second runs against real podman (`sandbox up --containers --ssh`, one fleet of 2 containers, a
canary and one more, shared by the module to bound CI time; each test leaves the fleet healthy and
patched).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.config.inventory.show import host_to_json, inventory_show_table
from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch
from opspatch.core.host import ContainerRestart, ContainerSettings
from opspatch.errors import ContainerError, InputError, SpecError
from opspatch.hosts.image import (
    LABEL_EARLIER_BAKES,
    BakedFile,
    ImageIdentity,
    bake_labels,
    baked_history,
    build_context,
    read_baked_labels,
)
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.hosts.transport.base import Command
from opspatch.hosts.transport.container import (
    ContainerIdentity,
    ContainerTransport,
    exec_command,
    parse_inspect,
    restart_command,
)
from opspatch.hosts.transport.local import LocalTransport
from opspatch.runs.commands.bake import default_tag
from opspatch.runs.commands.status import describe_baked
from opspatch.runs.judgments.patchset import baked_in
from opspatch.sandbox.checkout import checkout_files
from opspatch.sandbox.dist import STANDIN_VERSION
from tests.clirunner import opspatch
from tests.containerkit import CONTAINER_EAGLE, ContainerFleet, podman, require_podman
from tests.fleetkit import EAGLE_RELPATH
from tests.sshfleet import find_sshd

pytestmark = pytest.mark.pure

PODMAN = ContainerSettings(runtime="podman", name="sglang-0")
EAGLE_PATCH = Path(__file__).resolve().parents[1] / "patches" / "eagle-init-guard.toml"
PODMAN_DENIED = """#!/bin/sh
echo 'Error: cannot re-exec process: open /run/containers/storage: permission denied' >&2
exit 125
"""
"""A `podman` that refuses as podman does when the user may not use its storage."""

# ---------------------------------------------------------------------------------------------
# commands as data, the runtime's words


def test_exec_runs_the_argv_inside_the_pinned_container_and_passes_env_by_name() -> None:
    command = Command(("python3", "-c", "pass"), env={"HF_TOKEN": "s3cret", "A": "1"})

    wrapped = exec_command(PODMAN, "abc123", command)

    assert wrapped.argv == (
        "podman", "exec", "-i", "--env", "A", "--env", "HF_TOKEN", "abc123", "python3", "-c", "pass"
    )  # fmt: skip
    assert wrapped.render().startswith("env A=1 HF_TOKEN=s3cret podman exec -i")
    assert "s3cret" not in wrapped.masked()  # the value stays out of logs and argv
    assert restart_command(PODMAN, "abc123", 2.4).argv == (
        "podman", "restart", "--time", "2", "abc123"
    )  # fmt: skip


def test_inspect_document_gives_id_creation_time_image_and_state() -> None:
    podman_doc = [
        {
            "Id": "f00d" * 16,
            "Created": "2026-12-02T01:43:47.27Z",
            "ImageName": "localhost/engine:1",
            "State": {"Running": True, "Status": "running"},
        }
    ]
    docker_doc = [
        {
            "Id": "beef" * 16,
            "Created": "2026-12-01T00:00:00Z",
            "Config": {"Image": "lmsysorg/sglang:v0.5.4"},
            "State": {"Running": False, "Status": "exited"},
        }
    ]

    seen = parse_inspect(PODMAN, json.dumps(podman_doc).encode())
    other = parse_inspect(PODMAN, json.dumps(docker_doc).encode())

    assert (seen.id, seen.created, seen.image, seen.running) == (
        "f00d" * 16, "2026-12-02T01:43:47.27Z", "localhost/engine:1", True
    )  # fmt: skip
    assert (other.image, other.running, other.status) == ("lmsysorg/sglang:v0.5.4", False, "exited")
    with pytest.raises(ValueError):
        parse_inspect(PODMAN, b"[]")


# ---------------------------------------------------------------------------------------------
# the inventory

INVENTORY = """
[defaults]
transport = "local"
container = { runtime = "podman", name = "sglang-0" }
[defaults.engine]
python = "/usr/bin/python3"
restart = { kind = "container", stop_timeout = 5, pid_file = "/run/sglang/server.pid" }

[hosts.gpu-01]

[hosts.gpu-02]
container = { runtime = "docker", name = "sglang-b" }

[hosts.bare]
container = { runtime = "podman", name = "x" }
"""


def test_container_key_merges_like_other_keys_and_inventory_show_displays_it() -> None:
    inventory = parse_inventory(INVENTORY, "/inv/fleet.toml")

    first, second = inventory.host("gpu-01"), inventory.host("gpu-02")

    assert first.container == ContainerSettings("podman", "sglang-0")
    assert second.container == ContainerSettings("docker", "sglang-b")  # the host's wins whole
    assert first.engine.restart == ContainerRestart(
        stop_timeout=5.0, pid_file="/run/sglang/server.pid"
    )
    assert host_to_json(second)["container"] == {"runtime": "docker", "name": "sglang-b"}
    assert host_to_json(first)["engine"]["restart"]["kind"] == "container"
    table = inventory_show_table(inventory.hosts)
    column = table.columns.index("container")
    assert [row[column] for row in table.rows] == ["podman sglang-0", "docker sglang-b", "podman x"]
    assert isinstance(open_transport(first), ContainerTransport)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (
            '[hosts.a]\ntransport = "local"\n[hosts.a.engine]\nrestart = { kind = "container" }\n',
            1,
            "names no container",
        ),
        (
            '[hosts.a]\ntransport = "local"\nbecome = true\n'
            'container = { runtime = "podman", name = "c" }\n',
            1,
            "both a container and become",
        ),
        (
            '[hosts.a]\ntransport = "local"\ncontainer = { runtime = "podman", name = "-rm" }\n',
            3,
            "is not a container name",
        ),
        (
            '[hosts.a]\ntransport = "local"\ncontainer = { runtime = "kubectl", name = "c" }\n',
            3,
            "runtime",
        ),
    ],
    ids=["restart-without-container", "become", "bad-name", "unknown-runtime"],
)
def test_a_bad_container_setting_is_refused_at_its_line(text: str, line: int, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_inventory(text, "/inv/bad.toml")

    assert words in caught.value.render()
    assert f"bad.toml:{line}" in caught.value.render()


@pytest.mark.process
def test_a_runtime_not_installed_on_the_host_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the host's shell finds no docker there
    if shutil.which("docker") is not None:
        pytest.skip("docker is installed in /usr/bin here; this test needs a runtime that is not")
    transport = ContainerTransport(LocalTransport("gpu-01"), ContainerSettings("docker", "c"))

    with pytest.raises(ContainerError) as caught:
        transport.run(Command(("true",)), timeout=30)

    assert caught.value.reason == "runtime-missing"
    assert "container c (docker) cannot be reached: docker is not installed" in caught.value.message
    assert transport.exec_count == 0  # nothing was run in any container


@pytest.mark.process
def test_apply_preflight_refuses_a_runtime_the_login_user_may_not_use_and_changes_nothing(
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "podman"  # podman's own words when its storage is root's
    wrapper.write_text(PODMAN_DENIED)
    wrapper.chmod(0o755)
    workspace = tmp_path / "workspace"
    (workspace / "inventories").mkdir(parents=True)
    (workspace / "inventories" / "fleet.toml").write_text(
        '[defaults]\ntransport = "local"\ncontainer = { runtime = "podman", name = "sglang-0" }\n'
        '[defaults.engine]\npython = "/usr/bin/python3"\n'
        'restart = { kind = "container" }\n[hosts.gpu-01]\n'
    )

    run = opspatch(
        "apply", str(EAGLE_PATCH), "--hosts", "fleet", "--yes", "--json", cwd=workspace,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "OPSPATCH_STATE_DIR": str(tmp_path / "state")},
    )  # fmt: skip

    assert run.code == 2, run.stdout + run.stderr
    (host,) = run.json()["hosts"]
    assert (host["outcome"], host["reason"]) == ("failed", "runtime-not-allowed"), host
    assert "the login user may not use podman" in host["error"]  # what to fix, said once here
    assert "permission denied" in host["error"]  # the runtime's own words
    assert [s["step"] for s in host["steps"] if s["status"] == "ok"] == []  # nothing ran inside
    assert run.json()["refused"] is True


@pytest.mark.process
def test_sandbox_containers_refuse_the_wheel_shape_before_anything_starts(tmp_path: Path) -> None:
    run = opspatch(
        "sandbox", "up", "--containers", "--install", "wheel",
        env={"OPSPATCH_STATE_DIR": str(tmp_path)},
    )  # fmt: skip

    assert run.code == 2, run.stdout + run.stderr
    assert "`--install wheel` does not go with it" in run.stderr
    assert not (tmp_path / "sandbox" / "sandbox.json").exists()


# ---------------------------------------------------------------------------------------------
# bake: the build context, the labels, the refusals before anything is built


def _baked_file(path: str, mode: int = 0o100640) -> BakedFile:
    return BakedFile(path, b"x = 1\n", mode, 1000, 1001, "a" * 64, "b" * 64)


def test_bake_context_copies_each_file_with_its_mode_and_owner_and_the_labels_name_the_patch() -> (
    None
):
    files = [_baked_file("/sgl-workspace/sglang/python/a.py"), _baked_file("/opt/b.py", 0o100755)]
    base = ImageIdentity("podman", "lmsysorg/sglang:v0.5.4", "f00d" * 16, {})
    labels = bake_labels(
        patch_id="two-files", patch_sha256="c" * 64, files=files, run_id="R1", base=base
    )

    context = build_context(base.reference, files, labels, diff="--- a\n+++ b\n")
    containerfile = context["Containerfile"].decode()

    assert containerfile.splitlines()[2] == "FROM lmsysorg/sglang:v0.5.4"
    assert (
        'COPY --chown=1000:1001 --chmod=0640 ["files/sgl-workspace/sglang/python/a.py", '
        '"/sgl-workspace/sglang/python/a.py"]'
    ) in containerfile
    assert 'COPY --chown=1000:1001 --chmod=0755 ["files/opt/b.py", "/opt/b.py"]' in containerfile
    assert "RUN" not in containerfile  # the build needs no shell in the image
    assert context["files/opt/b.py"] == b"x = 1\n"
    assert set(context) == {
        "Containerfile", "files/sgl-workspace/sglang/python/a.py", "files/opt/b.py", "patch.diff"
    }  # fmt: skip
    said = read_baked_labels(labels)
    assert said is not None
    assert (said.patch_id, said.patch_sha256, said.run_id) == ("two-files", "c" * 64, "R1")
    assert said.post_image_of("/opt/b.py") == "b" * 64
    assert said.post_image_of("/opt/other.py") is None
    assert labels["org.opencontainers.image.base.name"] == "lmsysorg/sglang:v0.5.4"
    assert read_baked_labels({"io.buildah.version": "1.28"}) is None


def test_a_container_reads_as_baked_in_only_where_its_file_is_the_bytes_its_image_baked() -> None:
    path = "/sgl-workspace/sglang/python/a.py"
    base = ImageIdentity("podman", "engine:1", "f00d" * 16, {})
    labels = bake_labels(
        patch_id="p", patch_sha256="c" * 64, files=[_baked_file(path)], run_id="R1", base=base
    )
    container = ContainerIdentity(
        "podman", "sglang-0", "beef" * 16, "2026-12-02", "engine:1-p", True, "running", labels
    )

    baked = baked_in(container, path, "b" * 64)

    assert baked is not None and (baked.patch_id, baked.run_id) == ("p", "R1")
    assert "the fix came baked in: image engine:1-p was built with p by run R1" in (
        describe_baked(baked, container)
    )
    assert baked_in(container, path, "d" * 64) is None  # changed since the image was built
    assert baked_in(container, "/other.py", "b" * 64) is None
    assert baked_in(replace(container, labels={}), path, "b" * 64) is None
    assert baked_in(None, path, "b" * 64) is None


def test_a_bake_onto_a_baked_image_keeps_every_earlier_bake() -> None:
    """A on a.py, then B on b.py, then C on a.py again: each image's labels carry the bakes
    before it, newest first, and a container reads each file as baked by the newest bake that
    wrote it (a.py by C, b.py by B); nothing of A's record is lost."""
    a_py, b_py = "/sgl-workspace/sglang/python/a.py", "/opt/b.py"
    first = ImageIdentity("podman", "engine:1", "f00d" * 16, {"vendor": "lmsys"})
    a = bake_labels(
        patch_id="A", patch_sha256="1" * 64, files=[_baked_file(a_py)], run_id="R1", base=first
    )
    assert LABEL_EARLIER_BAKES not in a  # a first bake: nothing before it
    b = bake_labels(
        patch_id="B",
        patch_sha256="2" * 64,
        files=[replace(_baked_file(b_py), sha256_after="e" * 64)],
        run_id="R2",
        base=ImageIdentity("podman", "engine:1-A", "a0" * 32, {"vendor": "lmsys", **a}),
    )
    c = bake_labels(
        patch_id="C",
        patch_sha256="3" * 64,
        files=[replace(_baked_file(a_py), sha256_before="b" * 64, sha256_after="f" * 64)],
        run_id="R3",
        base=ImageIdentity("podman", "engine:1-A-B", "b0" * 32, {"vendor": "lmsys", **b}),
    )
    assert [bake.patch_id for bake in baked_history(c)] == ["C", "B", "A"]
    (earliest,) = [bake for bake in baked_history(c) if bake.patch_id == "A"]
    assert (earliest.run_id, earliest.base, earliest.post_image_of(a_py)) == (
        "R1",
        "engine:1",
        "b" * 64,
    )
    container = ContainerIdentity(
        "podman", "sglang-0", "beef" * 16, "2026-12-02", "engine:1-A-B-C", True, "running", c
    )
    on_a, on_b = baked_in(container, a_py, "f" * 64), baked_in(container, b_py, "e" * 64)
    assert on_a is not None and on_a.patch_id == "C"
    assert on_b is not None and on_b.patch_id == "B"  # an earlier bake's file, still known
    assert baked_in(container, a_py, "b" * 64) is None  # A's bytes there were baked over by C


def test_a_bake_onto_an_image_whose_bake_record_is_unreadable_is_refused() -> None:
    base = ImageIdentity("podman", "engine:1-A", "a0" * 32, {LABEL_EARLIER_BAKES: "not json"})
    with pytest.raises(InputError, match=LABEL_EARLIER_BAKES):
        bake_labels(
            patch_id="B",
            patch_sha256="2" * 64,
            files=[_baked_file("/b.py")],
            run_id="R2",
            base=base,
        )
    assert baked_history({"io.opspatch.patch": "A", LABEL_EARLIER_BAKES: "[1]"})[0].patch_id == "A"


@pytest.mark.parametrize(
    ("image", "tag"),
    [
        ("lmsysorg/sglang:v0.5.4", "lmsysorg/sglang:v0.5.4-eagle-init-guard"),
        ("registry:5000/sglang", "registry:5000/sglang:latest-eagle-init-guard"),
        ("sglang@sha256:" + "0" * 64, "sglang:latest-eagle-init-guard"),
    ],
)
def test_bake_default_tag_is_the_image_tag_and_the_patch_id(image: str, tag: str) -> None:
    assert default_tag(image, "eagle-init-guard") == tag


@pytest.mark.process
@pytest.mark.parametrize("runtime", ["missing", "denied"])
def test_bake_refuses_a_runtime_missing_or_not_allowed_and_builds_nothing(
    tmp_path: Path, runtime: str
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if runtime == "denied":  # podman's own words when the user may not use its storage
        wrapper = bin_dir / "podman"
        wrapper.write_text(PODMAN_DENIED)
        wrapper.chmod(0o755)
    context = tmp_path / "context"

    run = opspatch(
        "bake", str(EAGLE_PATCH), "--image", "lmsysorg/sglang:v0.5.4", "--dockerfile", str(context),
        env={"PATH": str(bin_dir), "OPSPATCH_STATE_DIR": str(tmp_path / "state")},
    )  # fmt: skip

    assert run.code == 2, run.stdout + run.stderr
    said = {
        "missing": "podman is not installed here",
        "denied": "this user may not use podman (Error: cannot re-exec process",
    }[runtime]
    assert f"cannot inspect image lmsysorg/sglang:v0.5.4: {said}" in run.stderr
    assert "nothing was built" in run.stderr
    assert not context.exists()


RUNC_RLIMIT = (
    "Error: runc: runc create failed: unable to start container process: error during container "
    "init: error setting rlimits for ready process: error setting rlimit type 7: operation not "
    "permitted: OCI permission denied"
)
"""runc's words (seen here, as root) when podman's default ulimits exceed the hard limits."""
PODMAN_WITH_IMAGES = """#!/bin/sh
# podman with the images named in $OPSPATCH_TEST_IMAGES, whose containers cannot start here
# for the reason in $OPSPATCH_TEST_RUN_FAILS
if [ "$1 $2" = "image inspect" ]; then
    case " $OPSPATCH_TEST_IMAGES " in
        *" $3 "*) echo '[{"Id": "sha256:0123456789abcdef", "Labels": null}]'; exit 0;;
    esac
    echo "Error: $3: image not known" >&2
    exit 125
fi
if [ "$1" = "run" ]; then echo "$OPSPATCH_TEST_RUN_FAILS" >&2; exit 126; fi
exit 0
"""


def _bake_with_podman(tmp_path: Path, images: str, *args: str) -> Any:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text(PODMAN_WITH_IMAGES)
    (bin_dir / "podman").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "OPSPATCH_STATE_DIR": str(tmp_path / "state"),
        "OPSPATCH_TEST_IMAGES": images,
        "OPSPATCH_TEST_RUN_FAILS": RUNC_RLIMIT,
    }
    return opspatch("bake", str(EAGLE_PATCH), "--image", "lmsysorg/sglang:v0.5.4", *args, env=env)


@pytest.mark.process
def test_bake_names_the_rlimit_podman_could_not_set_and_how_to_give_it_one(
    tmp_path: Path,
) -> None:
    """runc's "operation not permitted" for an rlimit is no user's permission: it is said so,
    with the setting that fixes it, to root as to anyone."""
    run = _bake_with_podman(tmp_path, "lmsysorg/sglang:v0.5.4")

    assert run.code == 2, run.stdout + run.stderr
    assert "podman could not set RLIMIT_NOFILE for the container, higher than this machine " \
        "allows (Error: runc: runc create failed" in run.stderr  # fmt: skip
    assert "may not use podman" not in run.stderr
    assert "default_ulimits" in run.stderr and "CONTAINERS_CONF=FILE" in run.stderr
    assert "docs/containers.md" in run.stderr and "nothing was built" in run.stderr


@pytest.mark.process
def test_bake_dockerfile_refuses_a_tag_that_exists_and_writes_nothing(tmp_path: Path) -> None:
    context = tmp_path / "context"

    run = _bake_with_podman(
        tmp_path, "lmsysorg/sglang:v0.5.4 localhost/mine:1",
        "--tag", "localhost/mine:1", "--dockerfile", str(context),
    )  # fmt: skip

    assert run.code == 2, run.stdout + run.stderr
    assert "image localhost/mine:1 exists already; nothing was written" in run.stderr
    assert "podman rmi localhost/mine:1" in run.stderr
    assert not context.exists()


@pytest.mark.parametrize(
    ("words", "limit"),
    [
        (RUNC_RLIMIT, "RLIMIT_NOFILE"),
        ("error setting rlimit type 6: operation not permitted", "RLIMIT_NPROC"),
        ("crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI permission denied",
         "RLIMIT_NOFILE"),
        ("Error: cannot re-exec process: open /run/containers/storage: permission denied", None),
    ],
)  # fmt: skip
def test_a_refused_rlimit_is_told_from_a_refused_user(words: str, limit: str | None) -> None:
    from opspatch.hosts.transport.container import refused_rlimit

    assert refused_rlimit(words) == limit


def _hard_nofile_can_be_raised() -> bool:
    raise_it = (
        "import resource; s, h = resource.getrlimit(resource.RLIMIT_NOFILE); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (h + 1, h + 1))"
    )
    done = subprocess.run([sys.executable, "-c", raise_it], capture_output=True, check=False)
    return done.returncode == 0


@pytest.mark.podman
def test_bake_with_real_podman_asked_for_more_files_than_allowed_names_the_limit(
    tmp_path: Path,
) -> None:
    """Real podman and runc, a containers.conf whose nofile is one above this process's hard
    limit (what podman's defaults are on such machines): the bake says which limit, not that
    root may not use podman. Then `--dockerfile` onto that existing image's tag is refused."""
    require_podman()
    if _hard_nofile_can_be_raised():
        pytest.skip("this user may raise its hard RLIMIT_NOFILE: podman could set any limit")
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    tag = f"localhost/opspatch-rlimit-test:{tmp_path.name[-24:].lower()}"
    root = tmp_path / "image"
    root.mkdir()
    (root / "marker").write_text("an image with no shell: the run fails before it starts\n")
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True)
    subprocess.run(["podman", "import", "-", tag], input=tar.stdout, capture_output=True,
                   check=True)  # fmt: skip
    conf = tmp_path / "containers.conf"
    conf.write_text(
        f'[engine]\nruntime = "runc"\n[containers]\n'
        f'default_ulimits = ["nofile={hard + 1}:{hard + 1}"]\n'
    )
    env = {"CONTAINERS_CONF": str(conf), "OPSPATCH_STATE_DIR": str(tmp_path / "state")}
    try:
        run = opspatch("bake", str(EAGLE_PATCH), "--image", tag, "--tag", f"{tag}-baked", env=env)
        context = tmp_path / "context"
        onto = opspatch("bake", str(EAGLE_PATCH), "--image", tag, "--tag", tag,
                        "--dockerfile", str(context), env=env)  # fmt: skip
    finally:
        podman("rmi", "--force", tag, check=False)

    assert run.code == 2, run.stdout + run.stderr
    assert "podman could not set RLIMIT_NOFILE for the container" in run.stderr, run.stderr
    assert "rlimit type 7" in run.stderr  # runc's own words
    assert "may not use podman" not in run.stderr
    assert podman("ps", "-a", "-q", "--filter", "name=opspatch-bake-").stdout == ""
    assert onto.code == 2, onto.stdout + onto.stderr
    assert f"image {tag} exists already; nothing was written" in onto.stderr
    assert not context.exists()


# ---------------------------------------------------------------------------------------------
# real podman: one fleet of 2 containers, reached locally and over each host's sshd

FAST = """
name = "fast"
canary = 1
batch = "50%"
max_in_flight = 2
max_failures = 1
[timeouts]
lock = 20
inspect = 60
swap = 30
restart = 60
ready = 60
smoke = 60
restore = 30
"""

BREAK_AT_IMPORT = textwrap.dedent(
    """
    id = "break-at-import"
    summary = "breaks the engine"
    rationale = "test fault injection"
    [target]
    module = "sglang.srt.speculative.eagle_worker_v2"
    versions = ">=0.5.4"
    [[edits]]
    kind = "insert"
    scope = "<module>"
    position = "end"
    code = '''
    raise RuntimeError("broken by a test patch")
    '''
    """
)

PRISTINE = checkout_files(STANDIN_VERSION)[f"python/{EAGLE_RELPATH}"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerFleet]:
    require_podman()
    if find_sshd() is None:
        pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)")
    root = tmp_path_factory.mktemp("containers")
    fleet = ContainerFleet(root, 2, ssh=True)
    try:
        fleet.up()
        copy = fleet.workspace / "patches" / "break-at-import.toml"
        copy.write_text(BREAK_AT_IMPORT)
        fleet.write_playbook("fast", FAST)
        yield fleet
    finally:
        fleet.close()


def _outcomes(doc: dict[str, Any]) -> dict[str, str]:
    return {h["host"]: h["outcome"] for h in doc["hosts"]}


def _status(fleet: ContainerFleet, hosts: str = "sandbox") -> dict[str, dict[str, Any]]:
    run = fleet.opspatch("status", "--hosts", hosts, "--json")
    assert run.code == 0, run.stdout + run.stderr
    return {s["host"]: s for s in run.json()["status"] if s["patch"] == "eagle-init-guard"}


def _guarded(fleet: ContainerFleet) -> None:
    run = fleet.opspatch("apply", "eagle-init-guard", "--hosts", "sandbox", "--yes", "--json")
    assert run.code == 0, run.stdout + run.stderr
    assert set(_outcomes(run.json()).values()) <= {"applied", "already-applied"}


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
@pytest.mark.timeout(900)  # the module's fleet: the first run on a machine builds the image
def test_incident_in_containers_diagnosed_fixed_rolled_back_and_fixed_again_over_ssh(
    fleet: ContainerFleet,
) -> None:
    names = fleet.names
    assert {fleet.sha(n) for n in names} == {fleet.sha(names[0])}
    assert fleet.read(names[0]) == PRISTINE  # the image's editable checkout, as committed

    # sandbox status names each host's container as podman knows it
    status = fleet.opspatch("sandbox", "status", "--json").json()
    for host in status["hosts"]:
        assert host["container"] == {
            "runtime": "podman",
            "name": fleet.container(host["host"]),
            "id": fleet.inspect(host["host"])["Id"],
        }

    text = fleet.opspatch("sandbox", "status").stdout
    assert f"container {fleet.inspect(names[0])['Id'][:12]} (running)" in text

    # the first decode crashes every engine; diagnose names the cause inside the container
    smoke = fleet.opspatch("smoke", "--hosts", "sandbox", "--json")
    assert smoke.code == 1, smoke.stdout + smoke.stderr
    diagnose = fleet.opspatch("diagnose", "--hosts", "sandbox")
    assert "AttributeError: 'EAGLEWorkerV2' object has no attribute" in diagnose.stdout
    assert f'File "{CONTAINER_EAGLE}", line' in diagnose.stdout
    assert "patch eagle-init-guard declares it fixes AttributeError" in diagnose.stdout

    # the fix, inside each container, proven by the smoke decode
    apply = fleet.opspatch("apply", "eagle-init-guard", "--hosts", "sandbox", "--yes", "--json")
    assert apply.code == 0, apply.stdout + apply.stderr
    assert set(_outcomes(apply.json()).values()) == {"applied"}
    assert all(fleet.generate(n) is not None for n in names)
    patched = {fleet.sha(n) for n in names}
    assert len(patched) == 1
    assert fleet.read(names[0]) != PRISTINE

    # rollback restores the image's bytes exactly (onto the crashing code: not serving, exit 1)
    rollback = fleet.opspatch("rollback", "eagle-init-guard", "--hosts", "sandbox", "--yes")
    assert rollback.code == 1, rollback.stdout + rollback.stderr
    assert fleet.read(names[0]) == PRISTINE

    # the same fix over SSH: podman exec run through each host's sshd
    again = fleet.opspatch("apply", "eagle-init-guard", "--hosts", "sandbox-ssh", "--yes", "--json")
    assert again.code == 0, again.stdout + again.stderr
    assert set(_outcomes(again.json()).values()) <= {"applied", "already-applied"}
    assert {fleet.sha(n) for n in names} == patched
    over_ssh = _status(fleet, "sandbox-ssh")
    assert {s["state"] for s in over_ssh.values()} == {"applied"}
    assert all(fleet.generate(n) is not None for n in names)


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
def test_a_patch_that_breaks_the_engine_at_import_is_rolled_back_inside_the_canary(
    fleet: ContainerFleet,
) -> None:
    _guarded(fleet)
    canary, *others = fleet.names
    before = {n: fleet.sha(n) for n in fleet.names}
    started = {n: fleet.inspect(n)["State"]["StartedAt"] for n in others}

    run = fleet.opspatch(
        "apply", "break-at-import", "--hosts", "sandbox", "--playbook", "fast", "--yes", "--json"
    )

    assert run.code == 1, run.stdout + run.stderr
    outcomes = _outcomes(run.json())
    assert outcomes[canary] == "rolled-back"
    assert all(outcomes[n] == "skipped" for n in others)
    assert {n: fleet.sha(n) for n in fleet.names} == before  # restored byte-identically
    assert {n: fleet.inspect(n)["State"]["StartedAt"] for n in others} == started  # untouched
    out = fleet.generate(canary)
    assert out is not None and out["meta_info"]["spec_verify_ct"] > 0


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
def test_runtime_restart_keeps_the_fix_and_a_recreated_container_loses_it(
    fleet: ContainerFleet,
) -> None:
    _guarded(fleet)
    host = fleet.names[1]
    first_id = fleet.inspect(host)["Id"]

    podman("restart", "--time", "2", fleet.container(host))
    assert fleet.inspect(host)["Id"] == first_id
    assert _status(fleet)[host]["state"] == "applied"  # the writable layer kept the file

    fleet.recreate(host)
    recreated = fleet.inspect(host)
    assert recreated["Id"] != first_id
    gone = _status(fleet)[host]
    assert (gone["state"], gone["recreated"]) == ("not-applied", True)
    diagnose = fleet.opspatch("diagnose", "--hosts", f"sandbox:{host}", "--json")
    findings = diagnose.json()["hosts"][0]["findings"]
    assert [f["kind"] for f in findings].count("container-recreated") == 1

    run = fleet.opspatch(
        "apply", "eagle-init-guard", "--hosts", f"sandbox:{host}", "--yes", "--json"
    )
    assert run.code == 0, run.stdout + run.stderr
    assert _outcomes(run.json()) == {host: "applied"}
    assert _status(fleet)[host]["state"] == "applied"


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
def test_sync_finds_a_container_recreated_from_its_image_and_puts_the_fix_back_proven(
    fleet: ContainerFleet,
) -> None:
    """The fleet file wants the fix on every host (issue 24): a container recreated from its
    image lost it with its writable layer; `sync --check` and `drift` name it, `sync` restores
    it on that host alone and proves it with the smoke decode."""
    fleet_file = fleet.workspace / "fleet.toml"
    fleet_file.write_text('[[patches]]\nid = "eagle-init-guard"\nhosts = ["sandbox"]\n')
    host, other = fleet.names[1], fleet.names[0]
    try:
        _guarded(fleet)  # as the test above leaves it: both patched
        assert fleet.opspatch("sync", "--check").code == 0
        fleet.recreate(host)
        assert fleet.read(host) == PRISTINE

        check = fleet.opspatch("sync", "--check")
        assert check.code == 1, check.stdout + check.stderr
        (line,) = check.stdout.splitlines()
        assert line.startswith(f"{host}: eagle-init-guard: apply: the container was recreated"), (
            line
        )
        drift = fleet.opspatch("drift", "--json")
        assert drift.code == 1, drift.stdout + drift.stderr
        assert [(d["host"], d["cause"], d["command"]) for d in drift.json()["drift"]] == [
            (host, "recreated-container", f"opspatch sync --hosts {host}")
        ]

        started = fleet.inspect(other)["State"]["StartedAt"]
        sync = fleet.opspatch("sync", "--yes", "--json")
        assert sync.code == 0, sync.stdout + sync.stderr
        (run,) = sync.json()["runs"]
        assert run["command"] == "sync"
        (outcome,) = run["hosts"]
        assert (outcome["host"], outcome["outcome"]) == (host, "applied"), outcome
        assert [s["status"] for s in outcome["steps"] if s["step"] == "smoke"] == ["ok"], outcome
        assert fleet.inspect(other)["State"]["StartedAt"] == started  # already right: untouched
        assert fleet.read(host) != PRISTINE
        out = fleet.generate(host)
        assert out is not None and out["meta_info"]["spec_verify_ct"] > 0
        assert fleet.opspatch("sync", "--check").code == 0
    finally:
        fleet_file.unlink()


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
def test_preflight_refuses_a_missing_or_stopped_container_and_changes_nothing(
    fleet: ContainerFleet,
) -> None:
    _guarded(fleet)
    before = {n: fleet.sha(n) for n in fleet.names}
    inventories = fleet.state / "inventories"
    text = (inventories / "sandbox.toml").read_text()
    missing_name = fleet.names[-1]
    (inventories / "wrong.toml").write_text(
        text.replace(fleet.container(missing_name), "opspatch-no-such")
    )
    # a patch that would change every file it reached: refused, it reaches none
    apply = ("apply", "break-at-import", "--playbook", "fast", "--yes", "--json", "--hosts")

    missing = fleet.opspatch(*apply, "wrong")

    assert missing.code == 2, missing.stdout + missing.stderr
    outcome = {h["host"]: h for h in missing.json()["hosts"]}[missing_name]
    assert outcome["reason"] == "container-missing"
    assert {n: fleet.sha(n) for n in fleet.names} == before

    stopped = fleet.names[1]
    podman("stop", "--time", "0", fleet.container(stopped))
    try:
        refused = fleet.opspatch(*apply, "sandbox")
        assert refused.code == 2, refused.stdout + refused.stderr
        outcome = {h["host"]: h for h in refused.json()["hosts"]}[stopped]
        assert outcome["reason"] == "container-not-running"
    finally:
        up = fleet.opspatch("sandbox", "up", timeout=300)
        assert up.code == 0, up.stdout + up.stderr
    assert {n: fleet.sha(n) for n in fleet.names} == before  # `up` restarted the same layer


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
def test_the_swap_refuses_a_container_recreated_since_the_run_pinned_it(
    fleet: ContainerFleet,
) -> None:
    _guarded(fleet)
    host = fleet.hosts[fleet.names[-1]]
    ops = HostOperations(open_transport(host), host)
    seen = ops.inspect(path=CONTAINER_EAGLE, timeout=60)  # pins the container, as preflight does
    fleet.recreate(host.name)

    with pytest.raises(ContainerError) as caught:
        ops.swap(
            CONTAINER_EAGLE,
            expected_sha256=seen.file.sha256,
            new_content=seen.file.content + b"\n# not written\n",
            timeout=60,
        )

    assert caught.value.reason == "container-recreated"
    assert fleet.read(host.name) == PRISTINE  # nothing was written into the new container
    _guarded(fleet)


# ---------------------------------------------------------------------------------------------
# bake on the fleet's own image: a new container from the baked image, the context built by hand

DOES_NOT_FIT = textwrap.dedent(
    """
    id = "does-not-fit"
    summary = "anchored on a function the image does not have"
    rationale = "test: a patch that does not fit the image's file"
    [target]
    module = "sglang.srt.speculative.eagle_worker_v2"
    versions = ">=0.5.4"
    [[edits]]
    kind = "insert"
    scope = "EAGLEWorkerV2.no_such_method"
    position = "start"
    code = "pass"
    """
)


def _bake(fleet: ContainerFleet, *args: str) -> Any:
    """`opspatch bake ARGS` with the sandbox's containers.conf (runc, the ulimits this machine
    allows), as an operator's podman would have its own."""
    conf = _podman_conf(fleet)["CONTAINERS_CONF"]
    return opspatch(
        "bake", *args, "--json", cwd=fleet.workspace, env={**fleet.env, "CONTAINERS_CONF": conf}
    )


def _podman_conf(fleet: ContainerFleet) -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(fleet.state / "sandbox" / "containers.conf")}


def _in_image(fleet: ContainerFleet, tag: str, *argv: str) -> bytes:
    """What `argv` prints in a throwaway container of image `tag`."""
    done = subprocess.run(
        ["podman", "run", "--rm", "--network=none", "--entrypoint", argv[0], tag, *argv[1:]],
        env=_podman_conf(fleet),
        capture_output=True,
        check=True,
    )
    return done.stdout


@pytest.fixture
def baked_tags(fleet: ContainerFleet) -> Iterator[list[str]]:
    """Tags a test builds, removed by their exact names at its end."""
    tags: list[str] = []
    yield tags
    for tag in tags:
        podman("rmi", "--force", tag, check=False)


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
def test_a_baked_image_started_as_a_new_container_serves_the_fix_and_reads_as_baked_in(
    fleet: ContainerFleet, baked_tags: list[str]
) -> None:
    from opspatch.ledger.store import Ledger
    from opspatch.sandbox.containers import podman_env, run_container
    from opspatch.sandbox.layout import SandboxLayout

    _guarded(fleet)  # the host has a run's patch on record: a recreate would say the fix is gone
    host = fleet.names[-1]
    engine_image = fleet.inspect(host)["ImageName"]
    tag = f"localhost/opspatch-bake-test:{fleet.container(host)}"
    baked_tags.append(tag)

    run = _bake(fleet, "eagle-init-guard", "--image", engine_image, "--tag", tag)

    assert run.code == 0, run.stdout + run.stderr
    outcome = run.json()["hosts"][0]
    assert (outcome["host"], outcome["outcome"]) == (tag, "baked")
    post = outcome["file"]["sha256_after"]
    labels = json.loads(podman("image", "inspect", tag).stdout)[0]["Labels"]
    assert labels["io.opspatch.patch"] == "eagle-init-guard"
    assert labels["io.opspatch.pre-image-sha256"] == hashlib.sha256(PRISTINE).hexdigest()
    assert labels["io.opspatch.post-image-sha256"] == post
    assert labels["io.opspatch.files"] == CONTAINER_EAGLE
    assert labels["org.opencontainers.image.base.name"] == engine_image
    stat = ("stat", "-c", "%a %u %g", CONTAINER_EAGLE)
    assert _in_image(fleet, tag, *stat) == _in_image(
        fleet, engine_image, *stat
    )  # mode and owner kept
    versions = Ledger.open(fleet.ledger_path).file_history(tag, CONTAINER_EAGLE)
    assert [(v.run_id, v.sha256_after) for v in versions] == [(run.json()["run_id"], post)]
    assert versions[0].container is not None
    assert versions[0].container.id == json.loads(podman("image", "inspect", tag).stdout)[0]["Id"]
    assert podman("ps", "-a", "-q", "--filter", "name=opspatch-bake-").stdout == ""

    # the host's container recreated from the baked image: it serves the fix from the start
    layout = SandboxLayout(fleet.state)
    podman("rm", "--force", "--time", "0", fleet.container(host))
    run_container(layout, host, fleet.port(host), tag, podman_env(layout))
    try:
        up = fleet.opspatch("sandbox", "up", timeout=300)  # waits for the engine to be ready
        assert up.code == 0, up.stdout + up.stderr
        out = fleet.generate(host)
        assert out is not None and out["meta_info"]["spec_verify_ct"] > 0
        assert fleet.sha(host) == post

        said = _status(fleet)[host]
        assert said["state"] == "applied", said
        assert "the fix came baked in: image" in said["detail"]
        assert "recreated" not in said["detail"]
        diagnose = fleet.opspatch("diagnose", "--hosts", f"sandbox:{host}", "--json")
        report = diagnose.json()["hosts"][0]
        assert not [f for f in report["findings"] if f["kind"] == "container-recreated"]
        (eagle,) = [f for f in report["files"] if f["path"] == CONTAINER_EAGLE]
        assert eagle["state"] == "patched-by-opspatch"
        assert "baked into the container's image by run" in eagle["detail"]
    finally:
        fleet.recreate(host)  # back on the fleet's own image, as the other tests expect
        _guarded(fleet)


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
def test_a_patch_baked_onto_a_baked_image_keeps_the_first_bakes_record(
    fleet: ContainerFleet, baked_tags: list[str], tmp_path: Path
) -> None:
    """eagle-init-guard baked into one image, then two-modules baked onto that image: the
    second image carries both fixes, and its labels both bakes (the earlier one, with its run
    and its post-image, under io.opspatch.earlier-bakes), so no recreate or status loses the
    first."""
    engine_image = fleet.inspect(fleet.names[0])["ImageName"]
    first = f"localhost/opspatch-bake-test:first-{tmp_path.name[-24:]}"
    second = f"localhost/opspatch-bake-test:second-{tmp_path.name[-24:]}"
    baked_tags.extend([second, first])
    guard = _bake(fleet, "eagle-init-guard", "--image", engine_image, "--tag", first)
    assert guard.code == 0, guard.stdout + guard.stderr
    fleet.write_patch("two-modules", TWO_MODULES)
    try:
        onto = _bake(fleet, "two-modules", "--image", first, "--tag", second)
    finally:
        (fleet.workspace / "patches" / "two-modules.toml").unlink()  # the module's other tests
    assert onto.code == 0, onto.stdout + onto.stderr

    labels = json.loads(podman("image", "inspect", second).stdout)[0]["Labels"]
    assert labels["io.opspatch.patch"] == "two-modules"
    (earlier,) = json.loads(labels[LABEL_EARLIER_BAKES])
    assert earlier["io.opspatch.patch"] == "eagle-init-guard"
    assert earlier["io.opspatch.run"] == guard.json()["run_id"]
    assert (
        earlier["io.opspatch.post-image-sha256"] == guard.json()["hosts"][0]["file"]["sha256_after"]
    )
    assert [bake.patch_id for bake in baked_history(labels)] == ["two-modules", "eagle-init-guard"]
    eagle = _in_image(fleet, second, "cat", CONTAINER_EAGLE).decode()
    assert "_OPSPATCH_SET_A = 1" in eagle
    assert _in_image(fleet, first, "cat", CONTAINER_EAGLE).decode() in eagle.replace(
        "\n_OPSPATCH_SET_A = 1", ""
    )  # the first bake's fix is still there, under the second's addition


INSPECT_FAILS_AFTER_BUILD = """#!/bin/sh
# podman, except that `image inspect $TAG` fails once the tag was looked up before (the bake's
# check that it is free): the inspection of the image just built fails, as on a sick storage
if [ "$1 $2 $3" = "image inspect $OPSPATCH_TEST_TAG" ]; then
    if [ -e "$OPSPATCH_TEST_LOOKED" ]; then
        echo "Error: reading image: input/output error" >&2
        exit 125
    fi
    touch "$OPSPATCH_TEST_LOOKED"
fi
exec "$OPSPATCH_TEST_PODMAN" "$@"
"""


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
def test_a_bake_whose_built_image_cannot_be_inspected_fails_and_leaves_no_image(
    fleet: ContainerFleet, baked_tags: list[str], tmp_path: Path
) -> None:
    """A failed bake leaves nothing behind: the image built but not inspectable is untagged
    again, said in the outcome, so the same bake can run again (its tag is free)."""
    engine_image = fleet.inspect(fleet.names[0])["ImageName"]
    tag = f"localhost/opspatch-bake-test:sick-{tmp_path.name[-24:]}"
    baked_tags.append(tag)
    wrapper = tmp_path / "bin" / "podman"
    wrapper.parent.mkdir()
    wrapper.write_text(INSPECT_FAILS_AFTER_BUILD)
    wrapper.chmod(0o755)
    sick = {
        "PATH": f"{wrapper.parent}:{os.environ['PATH']}",
        "OPSPATCH_TEST_TAG": tag,
        "OPSPATCH_TEST_LOOKED": str(tmp_path / "looked"),
        "OPSPATCH_TEST_PODMAN": str(shutil.which("podman")),
        "CONTAINERS_CONF": _podman_conf(fleet)["CONTAINERS_CONF"],
    }

    run = opspatch("bake", "eagle-init-guard", "--image", engine_image, "--tag", tag, "--json",
                   cwd=fleet.workspace, env={**fleet.env, **sick})  # fmt: skip

    assert run.code == 1, run.stdout + run.stderr
    outcome = run.json()["hosts"][0]
    assert outcome["outcome"] == "failed", outcome
    assert outcome["reason"] == "step-failed"
    # what was left behind and cleaned up is the sentence's alone (the docstring's "said")
    assert f"the image was built as {tag} but could not be inspected" in outcome["error"]
    assert "input/output error" in outcome["error"]
    assert "the tag was removed again" in outcome["error"]
    assert podman("image", "exists", tag, check=False).returncode != 0
    assert podman("ps", "-a", "-q", "--filter", "name=opspatch-bake-").stdout == ""
    again = _bake(fleet, "eagle-init-guard", "--image", engine_image, "--tag", tag)
    assert again.code == 0, again.stdout + again.stderr  # the tag was free to bake again


TWO_MODULES = textwrap.dedent(
    """
    id = "two-modules"
    summary = "one fix in two modules"
    rationale = "test: a patch set baked into one image"
    [[targets]]
    module = "sglang.srt.speculative.eagle_worker_v2"
    versions = ">=0.5.4"
    [[targets.edits]]
    kind = "insert"
    scope = "<module>"
    position = "end"
    code = "_OPSPATCH_SET_A = 1"
    [[targets]]
    module = "sglang.srt.managers.scheduler"
    [[targets.edits]]
    kind = "insert"
    scope = "<module>"
    position = "end"
    code = "_OPSPATCH_SET_B = 2"
    """
)


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
def test_bake_dockerfile_context_of_a_patch_set_built_by_hand_gives_the_planned_bytes(
    fleet: ContainerFleet, baked_tags: list[str], tmp_path: Path
) -> None:
    engine_image = fleet.inspect(fleet.names[0])["ImageName"]
    fleet.write_patch("two-modules", TWO_MODULES)
    tag = f"localhost/opspatch-bake-test:context-{tmp_path.name[-24:]}"
    baked_tags.append(tag)
    context = tmp_path / "context"

    run = _bake(fleet, "two-modules", "--image", engine_image, "--tag", tag,
                "--dockerfile", str(context))  # fmt: skip

    assert run.code == 0, run.stdout + run.stderr
    outcome = run.json()["hosts"][0]
    assert outcome["outcome"] == "baked"
    assert podman("image", "exists", tag, check=False).returncode != 0  # written, not built
    command = outcome["note"].split("build it with: ", 1)[1]
    assert command == f"podman build --network=none -t {tag} -f {context}/Containerfile {context}"
    assert (context / "patch.diff").read_text().startswith("---")
    files = outcome["file"]["set"]["files"]
    assert len(files) == 2

    subprocess.run(command.split(), env=_podman_conf(fleet), capture_output=True, check=True)

    for file in files:
        baked = _in_image(fleet, tag, "cat", file["path"])
        assert hashlib.sha256(baked).hexdigest() == file["sha256_post"] != file["sha256_pre"]
        assert baked == (context / "files" / file["path"].lstrip("/")).read_bytes()
    labels = json.loads(podman("image", "inspect", tag).stdout)[0]["Labels"]
    assert labels["io.opspatch.patch"] == "two-modules"
    # the diff is `git apply`-able in the image's editable checkout, to the same bytes
    applied = subprocess.run(
        ["podman", "run", "--rm", "--network=none", "--volume", f"{context}:/context:ro",
         "--entrypoint", "sh", engine_image, "-c",
         "cd /sgl-workspace/sglang && git apply --directory=python /context/patch.diff && "
         "sha256sum " + " ".join(f["path"] for f in files)],
        env=_podman_conf(fleet), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert [line.split()[0] for line in applied.stdout.splitlines()] == [
        f["sha256_post"] for f in files
    ]
    assert labels["io.opspatch.files"].split() == [f["path"] for f in files]
    assert labels["io.opspatch.post-image-sha256"].split() == [f["sha256_post"] for f in files]
    (fleet.workspace / "patches" / "two-modules.toml").unlink()  # the module's other tests' view


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
def test_bake_of_a_patch_that_does_not_fit_or_of_no_image_is_refused_and_builds_nothing(
    fleet: ContainerFleet,
) -> None:
    engine_image = fleet.inspect(fleet.names[0])["ImageName"]
    fleet.write_patch("does-not-fit", DOES_NOT_FIT)
    tag = "localhost/opspatch-bake-test:does-not-fit"

    misfit = _bake(fleet, "does-not-fit", "--image", engine_image, "--tag", tag)
    missing = _bake(fleet, "eagle-init-guard", "--image", "localhost/opspatch-no-such:1")

    assert misfit.code == 2, misfit.stdout + misfit.stderr
    assert f"the patch does not fit image {engine_image}" in misfit.stderr
    assert "does-not-fit.toml:" in misfit.stderr and "no_such_method" in misfit.stderr
    assert "nothing was built" in misfit.stderr
    assert podman("image", "exists", tag, check=False).returncode != 0
    assert podman("ps", "-a", "-q", "--filter", "name=opspatch-bake-").stdout == ""
    assert missing.code == 2, missing.stdout + missing.stderr
    assert "image localhost/opspatch-no-such:1 not found by podman" in missing.stderr
    (fleet.workspace / "patches" / "does-not-fit.toml").unlink()


# ---------------------------------------------------------------------------------------------
# a container killed mid-swap

KILL_AFTER_SWAP = """#!/bin/sh
# podman, except that the first exec carrying a swap (while {armed} exists) runs, then the
# container is killed and started again (as a restart policy would) and the exec's reply is lost.
if [ "$1" = "exec" ] && [ -e {armed} ]; then
    cat > {request}
    if grep -q '"op": "swap"' {request}; then
        rm -f {armed}
        {podman} "$@" < {request} > /dev/null 2>&1
        {podman} kill {container} > /dev/null 2>&1
        {podman} start {container} > /dev/null 2>&1
        exit 137
    fi
    exec {podman} "$@" < {request}
fi
exec {podman} "$@"
"""


@pytest.mark.podman
@pytest.mark.ssh
@pytest.mark.engine
def test_a_container_killed_mid_swap_is_read_back_through_a_new_exec_before_the_run_says_more(
    fleet: ContainerFleet, tmp_path: Path
) -> None:
    _guarded(fleet)
    host = fleet.names[-1]
    before, first_id = fleet.sha(host), fleet.inspect(host)["Id"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    armed = tmp_path / "armed"
    armed.touch()
    wrapper = bin_dir / "podman"
    wrapper.write_text(
        KILL_AFTER_SWAP.format(
            armed=armed,
            request=tmp_path / "request.json",
            podman=shutil.which("podman"),
            container=fleet.container(host),
        )
    )
    wrapper.chmod(0o755)

    run = opspatch(
        "apply", "break-at-import", "--hosts", f"sandbox:{host}", "--playbook", "fast", "--yes",
        "--json", cwd=fleet.workspace,
        env={**fleet.env, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )  # fmt: skip

    assert not armed.exists()  # the fault fired, on the swap's exec
    assert run.code == 1, run.stdout + run.stderr
    (outcome,) = run.json()["hosts"]
    assert outcome["outcome"] == "rolled-back", outcome
    assert outcome["reason"] == "step-failed"
    steps = {s["step"]: s for s in outcome["steps"]}
    # the swap had written the file: the read-back through a new exec saw the post-image
    assert steps["reconcile"]["status"] == "ok"
    patched = apply_patch(
        fleet.read(host), load_patch(fleet.workspace / "patches" / "break-at-import.toml").parts[0]
    )
    assert isinstance(patched, Applied)
    assert steps["reconcile"]["detail"] == f"file is {patched.sha256_after[:12]}"
    assert fleet.sha(host) == before  # then restored byte-identically
    assert fleet.inspect(host)["Id"] == first_id  # the same container, started again
    assert fleet.generate(host) is not None
