"""The fleet file and the pure decision `plan --fleet`, `sync` and `drift` share: table cases
over `runs.commands.sync.decide` and `drift_cause` (no processes), and every bad fleet file refused at its
file, line and field with exit 2 (the real console script for that)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from opspatch.config.fleet import DesiredPatch, load_fleet
from opspatch.config.lookup import Workspace
from opspatch.config.patches import load_patch
from opspatch.core.edit import detect
from opspatch.core.host import EngineSettings, Host, Unit
from opspatch.core.vocabulary import Detected, DriftCause, PatchState, Rotation, SyncAction
from opspatch.errors import InputError, Location, SpecError
from opspatch.runs.commands.status import PatchStatus, combine_set, why_unknown
from opspatch.runs.commands.sync import WrittenBefore, decide, drift_cause
from opspatch.runs.judgments.views import SYNC, Coverage
from opspatch.sandbox.dist import STANDIN_VERSION
from opspatch.sandbox.install import standin_files
from tests.clirunner import opspatch
from tests.fleetkit import EAGLE_RELPATH, INVENTORY

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parent.parent
PATCH = load_patch(REPO / "patches" / "eagle-init-guard.toml")
HOST = Host.local("gpu-01", "/state", EngineSettings())
ENTRY = DesiredPatch(PATCH, ("gpu-01",), ">=0.5.4,<0.5.24", Location("fleet.toml", 2, "x"))
PRE, POST = "a" * 64, "b" * 64


def status(
    state: str,
    *,
    release: str | None = "0.5.23",
    carried: Detected | None = None,
    sha: str = PRE,
    recreated: bool | None = None,
) -> PatchStatus:
    return PatchStatus(
        "gpu-01",
        "eagle-init-guard",
        PatchState(state),
        "/site/eagle_worker_v2.py",
        sha,
        "said by status",
        release=release,
        carried=carried,
        recreated=recreated,
    )


@pytest.mark.parametrize(
    ("state", "carried", "release", "action"),
    [
        ("applied", Detected.APPLIED, "0.5.23", SyncAction.NOTHING),
        ("not-applied", Detected.NOT_APPLIED, "0.5.23", SyncAction.APPLY),
        ("staged", Detected.APPLIED, "0.5.23", SyncAction.RESTART),
        # the ledger no longer explains the file: what it carries decides
        ("drifted", Detected.NOT_APPLIED, "0.5.23", SyncAction.APPLY),
        ("drifted", Detected.UNKNOWN, "0.5.23", SyncAction.NEEDS_PORT),
        ("drifted", Detected.APPLIED, "0.5.23", SyncAction.NOTHING),
        ("unknown", Detected.UNKNOWN, "0.5.23", SyncAction.NEEDS_PORT),
        ("not-applicable", None, "0.5.23", SyncAction.NEEDS_PORT),
        ("partial", Detected.PARTIAL, "0.5.23", SyncAction.BY_HAND),
        ("unreachable", None, None, SyncAction.UNREACHABLE),
        # the entry's range, before what the file carries
        ("not-applied", Detected.NOT_APPLIED, "0.5.24", SyncAction.OUTSIDE_RANGE),
        ("not-applied", Detected.NOT_APPLIED, None, SyncAction.BY_HAND),
    ],
)
def test_decide_says_what_sync_does_about_a_desired_patch(
    state: str, carried: Detected | None, release: str | None, action: SyncAction
) -> None:
    row = decide(ENTRY, status(state, carried=carried, release=release), HOST)
    assert row is not None
    assert row.action == action, row
    assert row.desired
    assert (row.command is None) == (action in (SyncAction.NOTHING, SyncAction.OUTSIDE_RANGE))


SERVING = {"server_running": True, "rotation": Rotation.IN_ROTATION}


@pytest.mark.parametrize(
    ("unserved", "words"),
    [
        ({"server_running": False}, ["its server is not running"]),
        ({"rotation": Rotation.OUT_OF_ROTATION}, ["does not list its worker healthy"]),
        (
            {"server_running": False, "rotation": Rotation.OUT_OF_ROTATION},
            ["its server is not running and its router does not list its worker healthy"],
        ),
    ],
)
def test_a_fix_on_disk_that_the_host_does_not_serve_is_for_recover_not_at_goal(
    unserved: dict[str, object], words: list[str]
) -> None:
    """`sync --check` exits 0 only when every fix is served: a down engine, a worker out of its
    router's rotation, or both, is `recover` (the fix is there: sync writes nothing), naming
    the command in the row and in the detail `sync --check` prints."""
    there = replace(status("applied", carried=Detected.APPLIED), **SERVING)  # type: ignore[arg-type]
    row = decide(ENTRY, replace(there, **unserved), HOST)  # type: ignore[arg-type]
    assert row is not None and row.action == SyncAction.RECOVER, row
    assert not row.action.at_goal
    assert row.command == "opspatch recover --hosts gpu-01"
    assert "`opspatch recover --hosts gpu-01`" in row.detail
    assert "sync writes nothing there" in row.detail and "said by status" in row.detail
    for said in words:
        assert said in row.detail, row.detail
    # the file is what the ledger and the fleet file expect: no drift cause, whatever wrote it
    assert drift_cause(row, there, written()) is None
    assert drift_cause(row, there, None) is None


def test_a_fix_on_disk_that_is_served_is_at_goal() -> None:
    there = replace(status("applied", carried=Detected.APPLIED), **SERVING)  # type: ignore[arg-type]
    row = decide(ENTRY, there, HOST)
    assert row is not None and row.action == SyncAction.NOTHING and row.action.at_goal
    assert row.command is None
    # not known (no router, or one that could not be asked; a host not inspected) claims nothing
    unknown = replace(there, rotation=None, server_running=None)
    assert decide(ENTRY, unknown, HOST) == replace(row, state=unknown.state)


def test_a_drifted_file_that_kept_the_fix_on_a_down_host_keeps_its_files_cause() -> None:
    """drift is about files: the hand edit is still one when the server is also down. The row
    is not at goal, but names no recover: recover leaves a file the ledger does not explain
    alone (needs-attention), so it would not start that server."""
    edited = replace(status("drifted", carried=Detected.APPLIED, sha=POST), server_running=False)
    row = decide(ENTRY, edited, HOST)
    assert row is not None and row.action == SyncAction.RECOVER and not row.action.at_goal
    assert row.command == "opspatch diagnose --hosts gpu-01"
    assert "not opspatch's file" in row.detail and "start the server by its own" in row.detail
    assert drift_cause(row, edited, written()) == DriftCause.HAND_EDIT


def test_a_release_that_ships_the_fix_on_a_down_host_is_not_at_goal() -> None:
    """fixed-upstream is at goal only while the host serves it: a down engine is said (sync
    --check exits 1), sync writes nothing, and no drift is claimed (the file is right)."""
    shipped = replace(status("fixed-upstream"), server_running=False)
    row = decide(ENTRY, shipped, HOST)
    assert row is not None and row.action == SyncAction.RECOVER and not row.action.at_goal
    assert row.command == "opspatch diagnose --hosts gpu-01"
    assert "the release's own file" in row.detail and "its server is not running" in row.detail
    assert drift_cause(row, shipped, written()) is None
    served = decide(ENTRY, replace(shipped, **SERVING), HOST)  # type: ignore[arg-type]
    assert served is not None and served.action == SyncAction.FIXED_UPSTREAM


@pytest.mark.parametrize(
    "state",
    ["not-applied", "staged", "unknown"],
)
def test_a_host_that_does_not_serve_is_decided_by_its_file_when_the_fix_is_not_simply_there(
    state: str,
) -> None:
    """Only a fix that is there is turned into recover when not served: a missing fix is still
    applied (the apply's own restart starts the engine), a staged one restarted, a port still
    a port."""
    live = status(state, carried=Detected.APPLIED if state == "staged" else None)
    served = decide(ENTRY, live, HOST)
    down = decide(ENTRY, replace(live, server_running=False), HOST)
    assert served is not None and down is not None
    assert down.action == served.action != SyncAction.RECOVER


def test_the_table_says_an_action_for_every_status_word() -> None:
    # drifted alone is decided by what the file carries; a word added to PatchState or Detected
    # must be given its action here, not fall through to by-hand
    for state in PatchState:
        for carried in (*Detected, None):
            action = SYNC(state, carried, False, False, True, Coverage.ALL, True)
            assert action is not None, (state, carried)
    by_carried = {
        c: SYNC(PatchState.DRIFTED, c, False, False, True, Coverage.ALL, True) for c in Detected
    }
    assert by_carried == {
        Detected.APPLIED: SyncAction.NOTHING,
        Detected.NOT_APPLIED: SyncAction.APPLY,
        Detected.PARTIAL: SyncAction.BY_HAND,
        Detected.UNKNOWN: SyncAction.NEEDS_PORT,
    }


def test_a_fixed_upstream_status_is_left_alone_and_called_redundant() -> None:
    assert SYNC(PatchState.FIXED_UPSTREAM, None, False, False, True, Coverage.ALL, True) == (
        SyncAction.FIXED_UPSTREAM
    )
    assert SyncAction.FIXED_UPSTREAM.at_goal and not SyncAction.APPLY.at_goal


def test_a_needs_port_row_says_nothing_is_written_and_names_the_release() -> None:
    row = decide(ENTRY, status("unknown", carried=Detected.UNKNOWN, release="0.5.20"), HOST)
    assert row is not None
    assert "no longer fits release 0.5.20" in row.detail
    assert "nothing is written" in row.detail
    assert row.command == "opspatch plan eagle-init-guard --hosts gpu-01"


def test_a_needs_port_names_each_edit_whose_anchor_is_gone_by_field_kind_and_scope() -> None:
    # a release that renamed the class the patch edits (the stand-in, class renamed)
    source = standin_files(STANDIN_VERSION)[EAGLE_RELPATH]
    renamed = source.replace(b"class EAGLEWorkerV2(", b"class EAGLEWorkerV3(")
    said = why_unknown(PATCH.spec, detect(renamed, PATCH.spec))
    row = decide(ENTRY, replace(status("unknown", carried=Detected.UNKNOWN), detail=said), HOST)
    assert row is not None and row.action == SyncAction.NEEDS_PORT
    assert (
        "edits[0] (insert in EAGLEWorkerV2): scope `EAGLEWorkerV2` is not defined in this file; "
        "nearest: EAGLEWorkerV3 (line "
    ) in row.detail, row.detail
    assert "edits[1] (insert in EAGLEWorkerV2.__init__): scope" in row.detail, row.detail
    assert why_unknown(PATCH.spec, detect(b"def (:\n", PATCH.spec)).startswith(
        "the file does not parse"
    )  # no edit to name: the file's own problem
    assert why_unknown(PATCH.spec, detect(source, PATCH.spec)) == "no edit is present"


def test_a_patch_not_desired_is_extra_when_there_and_unsaid_when_not() -> None:
    extra = decide(None, status("applied", carried=Detected.APPLIED), HOST)
    assert extra is not None and extra.action == SyncAction.EXTRA and not extra.desired
    assert extra.command == "opspatch rollback eagle-init-guard --hosts gpu-01"
    assert decide(None, status("not-applied", carried=Detected.NOT_APPLIED), HOST) is None


def test_a_host_not_inspected_is_a_row_whether_the_patch_is_desired_there_or_not() -> None:
    """Before, an unreachable host with no desired patch had no row, so `plan --fleet --hosts H`
    and `sync --check --hosts H` exited 0 on a host nobody could read, and `drift` said "no
    drift"."""
    row = decide(None, status("unreachable", release=None), HOST)
    assert row is not None and row.action == SyncAction.UNREACHABLE and not row.desired
    assert row.command == "opspatch diagnose --hosts gpu-01"
    assert not row.action.at_goal


def written(action: str = "patch", release: str | None = "0.5.23") -> WrittenBefore:
    return WrittenBefore("r1", action, PRE, release)


@pytest.mark.parametrize(
    ("live", "before", "cause"),
    [
        (status("not-applied", carried=Detected.NOT_APPLIED), written(), DriftCause.REINSTALLED),
        (
            status("drifted", carried=Detected.UNKNOWN, release="0.5.30", sha=POST),
            written(),
            DriftCause.UPGRADED,
        ),
        (
            status("drifted", carried=Detected.APPLIED, sha=POST),
            written(),
            DriftCause.HAND_EDIT,
        ),
        (
            status("not-applied", carried=Detected.NOT_APPLIED, recreated=True),
            written(),
            DriftCause.RECREATED_CONTAINER,
        ),
        (status("not-applied", carried=Detected.NOT_APPLIED), None, DriftCause.PATCH_MISSING),
        (
            status("not-applied", carried=Detected.NOT_APPLIED),
            written("restore"),
            DriftCause.PATCH_MISSING,
        ),
        (status("applied", carried=Detected.APPLIED), written(), None),
        (status("staged", carried=Detected.APPLIED), written(), None),
    ],
)
def test_drift_cause_says_why_a_file_is_not_what_is_expected(
    live: PatchStatus, before: WrittenBefore | None, cause: DriftCause | None
) -> None:
    row = decide(ENTRY if live.release != "0.5.30" else _open_entry(), live, HOST)
    assert row is not None
    assert drift_cause(row, live, before) == cause


def test_a_unit_node_outside_the_entrys_range_is_blamed_as_a_lone_host_there() -> None:
    """A node whose file lacks the fix, on a release the entry leaves out, is no `patch-missing`:
    the entry does not want the fix there, as on a lone host (the node's words used to be read
    as if every release were covered)."""
    lone = status("not-applied", carried=Detected.NOT_APPLIED, release="0.5.24")
    lone_row = decide(ENTRY, lone, HOST)
    assert lone_row is not None and lone_row.action == SyncAction.OUTSIDE_RANGE
    node = replace(status("applied", release="0.5.24"), node_state=PatchState.NOT_APPLIED)
    node_row = decide(ENTRY, node, HOST)
    assert node_row is not None and node_row.action == SyncAction.OUTSIDE_RANGE
    assert drift_cause(lone_row, lone, None) is None
    assert drift_cause(node_row, node, None) is None
    # inside the range the same node lacks the fix: that is drift, whoever wrote last
    inside = replace(node, release="0.5.23")
    inside_row = decide(ENTRY, inside, HOST)
    assert inside_row is not None
    assert drift_cause(inside_row, inside, None) == DriftCause.PATCH_MISSING


def _open_entry() -> DesiredPatch:
    return DesiredPatch(PATCH, ("gpu-01",), "", Location("fleet.toml", 2, "x"))


def test_an_extra_patch_is_drift_of_its_own_cause() -> None:
    live = status("applied", carried=Detected.APPLIED)
    row = decide(None, live, HOST)
    assert row is not None
    assert drift_cause(row, live, written()) == DriftCause.PATCH_EXTRA


def test_covers_reads_the_range_as_pep_440() -> None:
    assert ENTRY.covers("0.5.4") and ENTRY.covers("0.5.23.post1")
    assert not ENTRY.covers("0.5.24") and not ENTRY.covers("0.5.3")
    with pytest.raises(InputError, match="not a release version"):
        ENTRY.covers("latest")


# -- the file ----------------------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    (tmp_path / "patches").mkdir()
    (tmp_path / "inventories").mkdir()
    shutil.copy(REPO / "patches" / "eagle-init-guard.toml", tmp_path / "patches")
    (tmp_path / "inventories" / "lab.toml").write_text(INVENTORY)
    return Workspace(tmp_path, tmp_path / "state")


def test_a_fleet_file_resolves_its_patches_and_selections(workspace: Workspace) -> None:
    (workspace.root / "fleet.toml").write_text(
        '[[patches]]\nid = "eagle-init-guard"\nhosts = ["canary", "lab:gpu-0*"]\n'
        'releases = ">=0.5.4"\n'
    )
    desired = load_fleet(workspace)
    (entry,) = desired.entries
    assert entry.patch.spec.id == "eagle-init-guard"
    assert entry.hosts == ("gpu-01", "gpu-02")  # each host once, in selection order
    assert sorted(desired.hosts) == ["gpu-01", "gpu-02"]
    assert desired.desired_on("gpu-02") == (entry,)


BAD_FILES = [
    (
        '[[patches]]\nid = "eagle-init-gard"\nhosts = ["lab"]\n',
        "fleet.toml:2: patches[0].id: no patch named 'eagle-init-gard'",
        "did you mean eagle-init-guard?",
    ),
    (
        '[[patches]]\nid = "eagle-init-guard"\nhosts = ["lab:gpu-fleet"]\n',
        "fleet.toml:3: patches[0].hosts[0]: 'gpu-fleet' is not a host or group of inventory 'lab'",
        "inventory show",
    ),
    (
        '[[patches]]\nid = "eagle-init-guard"\nhosts = ["lab"]\nreleases = "<<0.5.24"\n',
        "fleet.toml:4: patches[0].releases: '<<0.5.24' is not a release range",
        'releases = ">=0.5.4,<0.5.24"',
    ),
    (
        '[[patches]]\nid = "eagle-init-guard"\nhost = ["lab"]\n',
        "fleet.toml:3: patches[0].host: unknown key 'host'",
        "did you mean 'hosts'?",
    ),
    (
        '[[patches]]\nid = "eagle-init-guard"\nhosts = "lab"\n',
        "fleet.toml:3: patches[0].hosts: must be a list of host selections",
        None,
    ),
    (
        '[[patches]]\nid = "eagle-init-guard"\nhosts = ["lab"]\n'
        '[[patches]]\nid = "eagle-init-guard"\nhosts = ["canary"]\n',
        "fleet.toml:5: patches[1].id: patch 'eagle-init-guard' is listed twice (first at line 2)",
        "one entry per patch",
    ),
]


@pytest.mark.parametrize(("text", "message", "hint"), BAD_FILES)
def test_a_bad_fleet_file_is_one_message_at_its_line_and_field(
    workspace: Workspace, text: str, message: str, hint: str | None
) -> None:
    (workspace.root / "fleet.toml").write_text(text)
    with pytest.raises(SpecError) as caught:
        load_fleet(workspace)
    assert caught.value.message.startswith(f"{workspace.root}/{message}"), caught.value.message
    if hint is not None:
        assert caught.value.hint is not None and hint in caught.value.hint, caught.value.hint


@pytest.mark.parametrize("command", [("plan", "--fleet"), ("sync", "--yes"), ("drift",)])
def test_every_fleet_command_refuses_a_bad_fleet_file_with_exit_2(
    workspace: Workspace, command: tuple[str, ...]
) -> None:
    (workspace.root / "fleet.toml").write_text(BAD_FILES[0][0])
    run = opspatch(
        *command, cwd=workspace.root, env={"OPSPATCH_STATE_DIR": str(workspace.state_dir)}
    )
    assert run.code == 2, run.stdout + run.stderr
    assert f"{workspace.root}/{BAD_FILES[0][1]}" in run.stderr
    # refused before a ledger or a host was touched
    assert not workspace.state_dir.exists() or not any(workspace.state_dir.rglob("*.sqlite3"))


def test_a_patch_set_carries_what_its_files_carry_together(tmp_path: Path) -> None:
    from tests.fleetkit import HEADER, SET_ID, TARGET_A, TARGET_B

    path = tmp_path / f"{SET_ID}.toml"
    path.write_text(HEADER + TARGET_A + TARGET_B)
    patch_set = load_patch(path)

    def part(carried: Detected, state: str) -> PatchStatus:
        return replace(status(state, carried=carried), patch=SET_ID)

    whole = combine_set(
        patch_set,
        HOST,
        [part(Detected.APPLIED, "applied"), part(Detected.APPLIED, "applied")],
    )
    assert (whole.carried, whole.release) == (Detected.APPLIED, "0.5.23")
    broken = combine_set(
        patch_set,
        HOST,
        [part(Detected.NOT_APPLIED, "not-applied"), part(Detected.UNKNOWN, "unknown")],
    )
    assert broken.carried == Detected.UNKNOWN
    row = decide(replace(ENTRY, patch=patch_set), broken, HOST)
    assert row is not None and row.action == SyncAction.NEEDS_PORT


def test_a_patch_set_partial_on_a_node_of_a_unit_names_the_unit_in_its_remedies(
    tmp_path: Path,
) -> None:
    """A set half swapped on a node: recover and rollback take a unit whole (a node alone is
    refused), so both remedies name the unit. Before, both named the node."""
    from tests.fleetkit import HEADER, SET_ID, TARGET_A, TARGET_B

    path = tmp_path / f"{SET_ID}.toml"
    path.write_text(HEADER + TARGET_A + TARGET_B)
    patch_set = load_patch(path)
    node = replace(HOST, unit=Unit("u1", ("gpu-00", "gpu-01")))
    files = [
        replace(status(word, carried=carried), patch=SET_ID)
        for word, carried in (("applied", Detected.APPLIED), ("not-applied", Detected.NOT_APPLIED))
    ]
    half = combine_set(patch_set, node, files)
    assert half.state == PatchState.PARTIAL, half
    assert "`opspatch recover --hosts u1`" in half.detail, half.detail
    assert f"`opspatch rollback {patch_set.reference} --hosts u1`" in half.detail, half.detail
    assert "--hosts gpu-01" not in half.detail
    alone = combine_set(patch_set, HOST, files)
    assert "`opspatch recover --hosts gpu-01`" in alone.detail, alone.detail


def _unreachable_workspace(workspace: Workspace) -> dict[str, str]:
    """gpu-01 (local, inspected) is desired the patch; far-01 is an SSH host on a port nothing
    listens on (refused at once): it cannot be inspected."""
    from tests.standin import free_port

    (workspace.root / "inventories" / "far.toml").write_text(
        f'[hosts.far-01]\naddress = "127.0.0.1"\nport = {free_port()}\nuser = "nobody"\n'
    )
    (workspace.root / "fleet.toml").write_text(
        '[[patches]]\nid = "eagle-init-guard"\nhosts = ["far"]\n'
    )
    return {"OPSPATCH_STATE_DIR": str(workspace.state_dir)}


def test_drift_names_a_host_it_could_not_inspect_and_exits_1(workspace: Workspace) -> None:
    """Before: "no drift: every file is what the ledger and fleet.toml expect", exit 0, for a
    fleet whose only host could not be read."""
    env = _unreachable_workspace(workspace)
    text = opspatch("drift", cwd=workspace.root, env=env)
    assert text.code == 1, text.stdout + text.stderr
    assert "no drift" not in text.stdout
    assert "not inspected (drift unknown): far-01" in text.stdout
    assert "far-01: eagle-init-guard: [far-01] " in text.stdout  # the detail as said, unmangled
    assert "opspatch diagnose --hosts far-01" in text.stdout
    doc = opspatch("drift", "--json", cwd=workspace.root, env=env)
    assert doc.code == 1
    assert doc.json()["drift"] == []
    unreachable = doc.json()["unreachable"]  # a row per patch of the workspace
    assert {(r["host"], r["action"]) for r in unreachable} == {("far-01", "unreachable")}
    assert "eagle-init-guard" in {r["patch"] for r in unreachable}


@pytest.mark.parametrize("command", [("plan", "--fleet"), ("sync", "--check"), ("drift",)])
def test_a_host_not_inspected_fails_every_fleet_view_though_nothing_is_desired_there(
    workspace: Workspace, command: tuple[str, ...]
) -> None:
    """`--hosts far-01` where fleet.toml desires nothing on far-01: before, no row at all and
    exit 0 from all three."""
    env = _unreachable_workspace(workspace)
    (workspace.root / "fleet.toml").write_text(
        '[[patches]]\nid = "eagle-init-guard"\nhosts = ["lab:gpu-01"]\n'
    )
    run = opspatch(*command, "--hosts", "far-01", "--json", cwd=workspace.root, env=env)
    assert run.code == 1, run.stdout + run.stderr
    rows = run.json().get("rows") or run.json().get("unreachable")
    assert rows and {(r["host"], r["action"], r["desired"]) for r in rows} == {
        ("far-01", "unreachable", False)
    }


@pytest.mark.parametrize(
    "command", [("plan", "--fleet"), ("sync", "--check"), ("sync", "--yes"), ("drift",)]
)
@pytest.mark.parametrize("text", ["", "[team]\nrequire_approval = false\n"])
def test_a_fleet_file_that_lists_no_patch_is_refused_not_passed(
    workspace: Workspace, command: tuple[str, ...], text: str
) -> None:
    """Before, an empty fleet.toml passed `sync --check` ("every host is as fleet.toml wants
    it", exit 0): a truncated file turned a timer green while it checked nothing."""
    (workspace.root / "fleet.toml").write_text(text)
    run = opspatch(
        *command, cwd=workspace.root, env={"OPSPATCH_STATE_DIR": str(workspace.state_dir)}
    )
    assert run.code == 2, run.stdout + run.stderr
    assert run.stderr.startswith(
        f"error: {workspace.root}/fleet.toml lists no patch, so it selects no host"
    ), run.stderr
    assert "[[patches]]" in run.stderr
    assert not workspace.state_dir.exists() or not any(workspace.state_dir.rglob("*.sqlite3"))
