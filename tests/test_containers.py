"""Engines in containers (issue 21): the inventory key, the container transport, the runtime's
restart, and the incident and its fix on a fleet of real podman containers.

The first half is pure (commands as data, the runtime's inspect document, the inventory); the
second runs against real podman (`sandbox up --containers --ssh`, one fleet of 2 containers, a
canary and one more, shared by the module to bound CI time; each test leaves the fleet healthy and
patched).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opspatch.config.inventory import parse_inventory
from opspatch.config.inventory.show import host_to_json, inventory_show_table
from opspatch.core.host import ContainerRestart, ContainerSettings
from opspatch.errors import ContainerError, SpecError
from opspatch.hosts.operations import HostOperations, open_transport
from opspatch.hosts.transport.base import Command
from opspatch.hosts.transport.container import (
    ContainerTransport,
    exec_command,
    parse_inspect,
    restart_command,
)
from opspatch.hosts.transport.local import LocalTransport
from opspatch.sandbox.checkout import checkout_files
from opspatch.sandbox.dist import STANDIN_VERSION
from tests.clirunner import opspatch
from tests.containerkit import CONTAINER_EAGLE, ContainerFleet, podman, require_podman
from tests.fleetkit import EAGLE_RELPATH
from tests.sshfleet import find_sshd

PODMAN = ContainerSettings(runtime="podman", name="sglang-0")

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


def test_a_runtime_not_installed_on_the_host_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the host's shell finds no docker there
    if shutil.which("docker") is not None:
        pytest.skip("docker is installed in /usr/bin here; this test needs a runtime that is not")
    transport = ContainerTransport(LocalTransport("gpu-01"), ContainerSettings("docker", "c"))

    with pytest.raises(ContainerError) as caught:
        transport.run(Command(("true",)), timeout=30)

    assert caught.value.reason == "no-runtime"
    assert "container c (docker) cannot be reached: docker is not installed" in caught.value.message
    assert transport.exec_count == 0  # nothing was run in any container


def test_sandbox_containers_refuse_the_wheel_shape_before_anything_starts(tmp_path: Path) -> None:
    run = opspatch(
        "sandbox", "up", "--containers", "--install", "wheel",
        env={"OPSPATCH_STATE_DIR": str(tmp_path)},
    )  # fmt: skip

    assert run.code == 2, run.stdout + run.stderr
    assert "`--install wheel` does not go with it" in run.stderr
    assert not (tmp_path / "sandbox" / "sandbox.json").exists()


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    assert gone["state"] == "not-applied"
    assert "the container was recreated since run" in gone["detail"]
    assert "the fix is no longer there" in gone["detail"]
    assert recreated["Id"][:12] in gone["detail"]
    diagnose = fleet.opspatch("diagnose", "--hosts", f"sandbox:{host}", "--json")
    findings = diagnose.json()["hosts"][0]["findings"]
    said = [f["detail"] for f in findings if f["kind"] == "container-recreated"]
    assert len(said) == 1 and "the container was recreated since run" in said[0]

    run = fleet.opspatch(
        "apply", "eagle-init-guard", "--hosts", f"sandbox:{host}", "--yes", "--json"
    )
    assert run.code == 0, run.stdout + run.stderr
    assert _outcomes(run.json()) == {host: "applied"}
    assert _status(fleet)[host]["state"] == "applied"


@pytest.mark.slow
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
    error = {h["host"]: h["error"] for h in missing.json()["hosts"]}[missing_name]
    assert "container opspatch-no-such (podman) does not exist" in error
    assert "no such container" in error  # the runtime's own words
    assert {n: fleet.sha(n) for n in fleet.names} == before

    stopped = fleet.names[1]
    podman("stop", "--time", "0", fleet.container(stopped))
    try:
        refused = fleet.opspatch(*apply, "sandbox")
        assert refused.code == 2, refused.stdout + refused.stderr
        error = {h["host"]: h["error"] for h in refused.json()["hosts"]}[stopped]
        assert f"container {fleet.container(stopped)} (podman) is not running" in error
    finally:
        up = fleet.opspatch("sandbox", "up", timeout=300)
        assert up.code == 0, up.stdout + up.stderr
    assert {n: fleet.sha(n) for n in fleet.names} == before  # `up` restarted the same layer


@pytest.mark.slow
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

    assert "was recreated since this run first reached it" in caught.value.message
    assert fleet.read(host.name) == PRISTINE  # nothing was written into the new container
    _guarded(fleet)
