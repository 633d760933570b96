"""The sandbox's base patches (`opspatch.sandbox.real.basepatches`): applied by opspatch's own
apply to a host before its engine first starts, recorded in the ledger as a run of playbook
`sandbox-base`, the file staged (no engine to restart). Shown here on a stand-in host (the
machinery is the engine's own; the real engine's list is empty until the incident's build
joins it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opspatch.config import paths
from opspatch.config.patches import load_patch
from opspatch.core.edit import detect
from opspatch.ledger.store import Ledger
from opspatch.sandbox.layout import SandboxLayout, quiet
from opspatch.sandbox.manifest import HostRecord, Manifest
from opspatch.sandbox.real.basepatches import apply_base_patches
from tests.fleetkit import EAGLE_RELPATH
from tests.standin import make_host

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parent.parent


def test_a_base_patch_is_applied_staged_and_recorded(tmp_path: Path) -> None:
    layout = SandboxLayout(paths.state_dir())
    host = make_host(layout.host_dir("sandbox-01"))
    manifest = Manifest((HostRecord("sandbox-01", 30999),))
    patch = load_patch(REPO / "patches" / "eagle-init-guard.toml")

    apply_base_patches(layout, manifest, "sandbox-01", (patch,), quiet)

    source = (host.site_packages / EAGLE_RELPATH).read_bytes()
    assert detect(source, patch.spec).state == "applied"
    with Ledger.open(paths.default_ledger_location()) as ledger:
        (run,) = ledger.list_runs()
        detail = ledger.get_run(run.run_id)
    assert run.playbook == "sandbox-base" and run.patch_id == "eagle-init-guard"
    assert [h.outcome for h in detail.hosts] == ["staged"]


def test_no_base_patch_changes_nothing_and_records_nothing(tmp_path: Path) -> None:
    layout = SandboxLayout(paths.state_dir())
    apply_base_patches(
        layout, Manifest((HostRecord("sandbox-01", 30999),)), "sandbox-01", (), quiet
    )
    assert not Path(paths.default_ledger_location()).exists()  # type: ignore[arg-type]
