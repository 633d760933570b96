"""A proven fix stays proven when a later patch's rollback puts its bytes back (issue 42, item
19): `status` called it "never proven (run R ended staged-back here)" after a `rollback
--restart never` of another patch on the same file, and likewise after a rollback that restarted
and decoded (`restored`), whose smoke is itself a proof of those bytes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from opspatch.config.patches import load_patch
from opspatch.core.policy import Playbook
from opspatch.core.spec import LoadedPatch
from opspatch.ledger.store import Ledger
from opspatch.runs.commands.rollback import rollback_hosts
from opspatch.runs.commands.status import fleet_status
from tests.scriptedkit import REPO, FakeHost, Fleet

pytestmark = pytest.mark.scripted

LATER = """
id = "later-fix"
summary = "a second fix of the same file, applied after the first"
rationale = "so that its rollback puts the first fix's bytes back"

[target]
module = "sglang.srt.speculative.eagle_worker_v2"
distribution = "sglang"
versions = ">=0.4"

[[edits]]
kind = "insert"
scope = "EAGLEWorkerV2.draft_model_path"
position = "start"
code = "_ = 1"
"""


@dataclass
class Story:
    """One scripted host that carries eagle-init-guard, proven by `first_run`, then `later-fix`
    (the fleet's patch) on top of it."""

    fleet: Fleet
    guard: LoadedPatch
    first_run: str

    def rollback_later(self, *, restart: bool) -> str:
        report = rollback_hosts(
            ledger=self.fleet.ledger,
            hosts=[h.host() for h in self.fleet.hosts],
            factory=self.fleet.factory,
            playbook=Playbook(),
            patch=self.fleet.patch,
            restart_engine=restart,
        )
        (outcome,) = report.hosts
        assert outcome.outcome == ("restored" if restart else "staged-back"), outcome
        return report.run_id or ""

    def guard_status(self) -> str:
        host = self.fleet.hosts[0].host()
        (said,) = fleet_status([host], [self.guard], self.fleet.factory, self.fleet.ledger)
        assert said.state in ("applied", "staged"), said
        return said.detail


@pytest.fixture
def story(tmp_path: Path) -> Iterator[Story]:
    (tmp_path / "later-fix.toml").write_text(LATER, encoding="utf-8")
    ledger = Ledger.open(tmp_path / "ledger.sqlite3")
    try:
        guard = load_patch(REPO / "patches" / "eagle-init-guard.toml")
        fleet = Fleet([FakeHost.installed("h1", tmp_path / "h1")], ledger, guard)
        first = fleet.apply()
        assert first.exit_code == 0
        fleet.patch = load_patch(tmp_path / "later-fix.toml")
        assert fleet.apply().exit_code == 0
        yield Story(fleet, guard, first.run_id or "")
    finally:
        ledger.close()


def test_a_later_patch_staged_back_leaves_the_fix_proven(story: Story) -> None:
    story.rollback_later(restart=False)
    detail = story.guard_status()
    assert "never proven" not in detail, detail
    assert detail.startswith(f"as written by run {story.first_run}, proven by its smoke decode")


def test_a_later_patch_restored_proves_the_fix_by_its_own_smoke(story: Story) -> None:
    restored = story.rollback_later(restart=True)
    detail = story.guard_status()
    assert detail.startswith(
        f"written by run {story.first_run}, proven by run {restored}'s smoke decode"
    ), detail
