"""Retiring a patch when upstream ships it, and where a patch came from (DEP-3 provenance).

The verdict (`analysis/upstream.py`) is judged on small sources by table, then on real SGLang
release files (a backport whose fix upstream merged in 0.5.5: fixed there and in every later
release that ships the file, not before), then end to end: `status` on a sandbox host upgraded
to a stand-in release that already has the fix, `check`'s provenance and its not-forwarded
warning, bad provenance values, and the DEP-3 headers of an exported mail.
"""

from __future__ import annotations

import email
from datetime import datetime, timezone
from pathlib import Path

import pytest

from opspatch.analysis.export import export_diff, render_mail
from opspatch.analysis.portability import ReleaseMatrix, evaluate_release
from opspatch.analysis.provenance import Provenance
from opspatch.analysis.upstream import part_verdict, upstream_verdict
from opspatch.config.patches import load_patch
from opspatch.core.edit import Applied, apply_patch
from opspatch.core.spec import PatchSpec, parse_patch
from opspatch.core.tomlsource import parse_toml
from opspatch.core.vocabulary import UpstreamState
from opspatch.errors import SpecError
from opspatch.sandbox.dist import EAGLE_WORKER_FILE, STANDIN_FIXED_IN, standin_files
from opspatch.sandbox.install import install_standin, venv_site_packages
from tests.clirunner import opspatch
from tests.fleetkit import SandboxFleet
from tests.patchkit import src
from tests.sglang_wheels import WheelUnavailable, release_file

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parent.parent
GUARD = REPO / "patches" / "eagle-init-guard.toml"
BACKPORTS = REPO / "tests" / "data" / "backports"

FIXED, NOT_FIXED, GONE = (
    UpstreamState.FIXED_UPSTREAM,
    UpstreamState.NOT_FIXED,
    UpstreamState.ANCHOR_GONE,
)

GUARD_BODY = """
[target]
module = "pkg.mod"

[[edits]]
kind = "insert"
scope = "W.__init__"
position = "start"
code = "self.x = 0"

[[postconditions]]
kind = "assigned-before-calls"
scope = "W.__init__"
attribute = "self.x"
"""


def _patch(header: str = "", body: str = GUARD_BODY) -> PatchSpec:
    text = f'id = "guard"\nsummary = "s"\nrationale = "r"\n{header}\n{body}'
    return parse_patch(parse_toml(text, "guard.toml"))


BEFORE = src(
    """
    class W:
        def __init__(self):
            self.load()
            self.x = 1
    """
)
FIXED_ANOTHER_WAY = src(  # upstream moved the assignment up; the patch's own line is not there
    """
    class W:
        def __init__(self):
            self.x = 1
            self.load()
    """
)
FIXED_AS_THE_PATCH = src(  # the patch's own statement, no opspatch marker: upstream took it
    """
    class W:
        def __init__(self):
            self.x = 0
            self.load()
            self.x = 1
    """
)
SCOPE_GONE = src(
    """
    class W:
        def setup(self):
            self.x = 1
    """
)


@pytest.mark.parametrize(
    ("source", "state", "why"),
    [
        (BEFORE, NOT_FIXED, "is not assigned in `W.__init__` before line 3"),
        (FIXED_ANOTHER_WAY, FIXED, "every postcondition already holds"),
        (FIXED_AS_THE_PATCH, FIXED, "every edit's code is already in the file"),
        (SCOPE_GONE, GONE, "scope `W.__init__` is not defined"),
    ],
    ids=["before-the-fix", "fixed-another-way", "fixed-as-the-patch", "scope-gone"],
)
def test_the_verdict_on_a_file_before_and_after_an_upstream_fix(
    source: bytes, state: UpstreamState, why: str
) -> None:
    verdict = part_verdict(_patch(), source)
    assert (verdict.state, why in verdict.reason) == (state, True), verdict.reason


def test_the_patch_applied_by_opspatch_is_not_an_upstream_fix() -> None:
    patch = _patch()
    applied = apply_patch(BEFORE, patch)
    assert isinstance(applied, Applied)
    verdict = part_verdict(patch, applied.new_source)
    assert verdict.state == NOT_FIXED and "opspatch's marker" in verdict.reason


def test_postconditions_about_code_the_patch_does_not_edit_prove_nothing() -> None:
    unrelated = GUARD_BODY.replace(
        'scope = "W.__init__"\nattribute', 'scope = "V.__init__"\nattribute'
    )
    source = BEFORE + src(
        """
        class V:
            def __init__(self):
                self.x = 1
        """
    )
    verdict = part_verdict(_patch(body=unrelated), source)
    assert verdict.state == NOT_FIXED and "none is about a scope the patch edits" in verdict.reason


def test_a_patch_without_postconditions_is_fixed_only_when_its_code_is_there() -> None:
    body = GUARD_BODY.split("[[postconditions]]")[0]
    assert part_verdict(_patch(body=body), FIXED_ANOTHER_WAY).state == NOT_FIXED
    assert part_verdict(_patch(body=body), FIXED_AS_THE_PATCH).state == FIXED


def test_a_delete_alone_is_no_proof_of_an_upstream_fix() -> None:
    body = '[target]\nmodule = "pkg.mod"\n[[edits]]\nkind = "delete"\nscope = "W.__init__"\n'
    body += 'select = { matches = "self.load()" }\n'
    verdict = part_verdict(_patch(body=body), SCOPE_GONE.replace(b"setup", b"__init__"))
    assert verdict.state == NOT_FIXED


def test_a_diff_that_reverse_applies_is_fixed_upstream() -> None:
    diff = (
        "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,4 +1,4 @@\n class W:\n"
        "     def __init__(self):\n-        self.load()\n         self.x = 1\n"
        "+        self.load()\n"
    )
    body = f'[target]\nmodule = "pkg.mod"\n[[edits]]\nkind = "diff"\ndiff = """\n{diff}"""\n'
    patch = _patch(body=body)
    assert part_verdict(patch, BEFORE).state == NOT_FIXED
    verdict = part_verdict(patch, FIXED_ANOTHER_WAY)
    assert verdict.state == FIXED and "its reverse applies" in verdict.reason


def test_fixed_in_is_cross_checked_against_the_file_not_trusted() -> None:
    patch = _patch('upstream = { fixed_in = "2.0" }')
    agrees = part_verdict(patch, FIXED_ANOTHER_WAY, "2.1")
    assert agrees.state == FIXED and agrees.disagreement is None
    claimed = part_verdict(patch, BEFORE, "2.0")  # fixed_in says fixed; the file says not
    assert claimed.state == NOT_FIXED
    assert claimed.disagreement is not None
    assert "upstream.fixed_in says 2.0 ships the fix, but the file of 2.0" in claimed.disagreement
    early = part_verdict(patch, FIXED_ANOTHER_WAY, "1.9")
    assert early.state == FIXED and "first shipped in 2.0" in (early.disagreement or "")
    assert part_verdict(patch, BEFORE, "1.9").disagreement is None


def test_the_guard_on_the_standin_releases_before_and_from_the_fixed_one() -> None:
    guard = load_patch(GUARD)
    module = guard.spec.target.module
    for version, state in (("0.5.23", NOT_FIXED), (STANDIN_FIXED_IN, FIXED), ("0.6.0", FIXED)):
        source = standin_files(version)[EAGLE_WORKER_FILE]
        assert upstream_verdict(guard, {module: source}, version).state == state, version
    assert upstream_verdict(guard, {}, "0.5.24").state == GONE  # the release has no such file


# -- real SGLang release files ---------------------------------------------------------------


def _release(version: str, relpath: str) -> bytes:
    try:
        return release_file(version, relpath)
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang {version} wheel not available (offline?): {exc}")


def test_a_real_backport_is_fixed_upstream_from_the_release_that_merged_it() -> None:
    """cuda-graph-pp-proxy-dtype: upstream's fix first shipped in 0.5.5; the file is in every
    release up to 0.5.13 (it moved after), and check --releases marks the same releases."""
    loaded = load_patch(BACKPORTS / "cuda-graph-pp-proxy-dtype.toml")
    part = loaded.spec
    relpath = part.target.module_relpaths()[0]
    expected = {"0.5.3": NOT_FIXED, "0.5.4": NOT_FIXED}
    expected |= {f"0.5.{minor}": FIXED for minor in range(5, 14)}
    found = {}
    for version in expected:
        source = _release(version, relpath)
        verdict = upstream_verdict(loaded, {part.target.module: source}, version)
        assert verdict.disagreement is None, verdict.disagreement  # fixed_in = "0.5.5" agrees
        found[version] = verdict.state
        if version in ("0.5.4", "0.5.5"):
            result = evaluate_release(part, version, source)
            assert result.fixed_upstream == (version == "0.5.5")
            assert result.verdict == ("fixed-upstream" if version == "0.5.5" else "ok")
    assert found == expected
    matrix = ReleaseMatrix(
        part.id,
        "sglang",
        "",
        "given",
        tuple(evaluate_release(part, v, _release(v, relpath)) for v in ("0.5.4", "0.5.5")),
    )
    assert "fixed upstream in: 0.5.5 (the patch is not needed there)" in matrix.render()
    assert matrix.to_json()["fixed_upstream"] == ["0.5.5"]


def test_a_real_patch_set_is_fixed_upstream_only_where_every_file_is() -> None:
    """eagle-draft-positions-after-forward: three modules, fixed together upstream in 0.5.12."""
    loaded = load_patch(BACKPORTS / "eagle-draft-positions-after-forward.toml")
    for version, state in (("0.5.11", NOT_FIXED), ("0.5.12", FIXED)):
        sources = {
            p.target.module: _release(version, p.target.module_relpaths()[0]) for p in loaded.parts
        }
        verdict = upstream_verdict(loaded, sources, version)
        assert verdict.state == state, verdict.reason
        assert {f.state for f in verdict.files} == {state}
        assert len(verdict.files) == len(loaded.parts)
    one_gone = dict(sources)
    del one_gone[loaded.parts[-1].target.module]
    verdict = upstream_verdict(loaded, one_gone, "0.5.12")
    assert (
        verdict.state == GONE
        and f"the release has no {loaded.parts[-1].target.module_relpaths()[0]}" in verdict.reason
    )


# -- provenance --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "field", "says"),
    [
        ('upstream = { pr = "the fix" }', "upstream.pr", "is not a pull request: give its URL"),
        ('upstream = { commit = "xyz123" }', "upstream.commit", "give 7 to 40 lower-case hex"),
        ('upstream = { fixed_in = "next" }', "upstream.fixed_in", "is not a version"),
        ('forwarded = "maybe"', "forwarded", "'no' (not sent upstream yet) or 'not-needed: <why>'"),
        ('forwarded = "not-needed:"', "forwarded", "is not a forwarding"),
        ('bug = "it crashes"', "bug", "give the bug's URL or owner/repo#N"),
        ('last_update = "Dec 1"', "last_update", "write YYYY-MM-DD"),
        ("last_update = 2026-12-01T10:00:00", "last_update", "write the date only"),
        ('origin = " "', "origin", "say who wrote the patch and from what incident"),
    ],
)
def test_a_bad_provenance_value_is_refused_at_its_file_line_and_field(
    line: str, field: str, says: str
) -> None:
    with pytest.raises(SpecError) as caught:
        _patch(line)
    assert caught.value.message.startswith(f"guard.toml:4: {field}: "), caught.value.message
    assert says in caught.value.message


def test_good_provenance_values_load() -> None:
    patch = _patch(
        'upstream = { pr = "sgl-project/sglang#12345", commit = "0a1b2c3d", fixed_in = "0.5.24" }\n'
        'forwarded = "https://github.com/sgl-project/sglang/pull/12345"\n'
        'bug = "https://github.com/sgl-project/sglang/issues/1"\nlast_update = "2026-12-01"'
    )
    assert patch.upstream is not None and patch.upstream.fixed_in == "0.5.24"
    assert not Provenance.of(patch).not_forwarded and patch.last_update is not None
    assert Provenance.of(_patch('forwarded = "not-needed: a local feature"')).warning is None
    assert Provenance.of(_patch("")).warning is not None  # no forwarded: not sent upstream


@pytest.mark.process
def test_check_shows_provenance_and_warns_about_a_patch_not_forwarded(tmp_path: Path) -> None:
    run = opspatch("check", "eagle-init-guard", cwd=tmp_path)
    assert run.code == 0, run.stderr  # a warning, not a failure
    assert "      origin: INC-EAGLE-INIT: the serving team's hot fix" in run.stdout
    assert "      forwarded: no\n" in run.stdout
    assert (
        'warning eagle-init-guard: not forwarded upstream (says forwarded = "no"): the fix is '
        "lost on every reinstall until upstream has it"
    ) in " ".join(run.stderr.split())

    ws = tmp_path / "ws"
    (ws / "patches").mkdir(parents=True)
    sent = GUARD.read_text().replace(
        'forwarded = "no"', 'forwarded = "https://github.com/sgl-project/sglang/pull/1"'
    )
    (ws / "patches" / "eagle-init-guard.toml").write_text(sent)
    run = opspatch("check", "eagle-init-guard", "--json", cwd=ws)
    (doc,) = run.json()["patches"]
    assert doc["provenance"]["forwarded"] == "https://github.com/sgl-project/sglang/pull/1"
    assert doc["provenance"]["warning"] is None


def test_export_fills_the_mails_dep3_headers_from_the_provenance() -> None:
    guard = load_patch(GUARD).spec.model_copy(
        update={"bug": "sgl-project/sglang#1", "upstream": _patch(
            'upstream = { commit = "0a1b2c3d", fixed_in = "0.5.24" }'
        ).upstream}
    )  # fmt: skip
    change = export_diff(guard, standin_files("0.5.23")[EAGLE_WORKER_FILE])
    mail = render_mail(
        change,
        guard,
        author="Ops <ops@example.com>",
        date=datetime(2026, 12, 2, tzinfo=timezone.utc),
    )
    headers = email.message_from_string(mail.split("\n", 1)[1])
    assert headers["Origin"] == guard.origin
    assert headers["Bug"] == "sgl-project/sglang#1"
    assert headers["Forwarded"] == "no"
    assert headers["Applied-Upstream"] == "0.5.24, 0a1b2c3d"
    assert headers["Last-Update"] == "2026-12-02"
    assert headers["From"] == "Ops <ops@example.com>"
    # a pull request alone may still be open: not "applied upstream"
    proposed = guard.model_copy(
        update={"upstream": _patch('upstream = { pr = "sgl-project/sglang#2" }').upstream}
    )
    mail = render_mail(
        export_diff(proposed, standin_files("0.5.23")[EAGLE_WORKER_FILE]),
        proposed,
        author="Ops <ops@example.com>",
        date=datetime(2026, 12, 2, tzinfo=timezone.utc),
    )
    assert "Applied-Upstream" not in email.message_from_string(mail.split("\n", 1)[1])


# -- status on the sandbox ---------------------------------------------------------------------


@pytest.mark.engine
def test_status_says_fixed_upstream_on_a_host_upgraded_to_a_release_with_the_fix(
    tmp_path: Path,
) -> None:
    """sandbox-02 is patched by opspatch, then upgraded to the stand-in 0.5.24 (its pristine
    file has the fix, written upstream's way): status says fixed-upstream there, not drifted;
    sandbox-01, on 0.5.23 and never patched, stays not-applied."""
    fleet = SandboxFleet(tmp_path, 2).up()
    try:
        applied = fleet.opspatch(
            "apply", "eagle-init-guard", "--hosts", "sandbox-02", "--yes", "--json"
        )
        assert applied.code == 0, applied.stdout + applied.stderr
        python = Path(fleet.hosts["sandbox-02"].engine.python or "")
        install_standin(venv_site_packages(python.parent.parent), STANDIN_FIXED_IN)

        run = fleet.opspatch(
            "status", "--hosts", fleet.inventory, "--patch", "eagle-init-guard", "--json"
        )
        assert run.code == 0, run.stdout + run.stderr
        states = {s["host"]: s for s in run.json()["status"]}
        assert {h: s["state"] for h, s in states.items()} == {
            "sandbox-01": "not-applied",
            "sandbox-02": "fixed-upstream",
        }
        assert states["sandbox-02"]["detail"].startswith(
            f"sglang {STANDIN_FIXED_IN} ships the fix (the edit would not be needed"
        )
    finally:
        fleet.close()
