"""check --releases: the portability matrix of a patch over real SGLang releases.

The release cache is seeded from the wheels tests/sglang_wheels.py downloads (skipped with the
reason when offline) and the matrix is computed offline from it, so these tests do not depend on
the index; the `network` tests ask PyPI itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from opspatch.analysis.portability import evaluate_release
from opspatch.analysis.proofs import ReleaseProofs, combined_coverage, proof_coverage, proof_key
from opspatch.config.patches import load_patch
from opspatch.core.spec import PatchSpec
from opspatch.errors import InputError
from opspatch.runs.commands.check_releases import (
    check_releases,
    list_releases,
    parse_index_json,
    release_module_source,
)
from opspatch.runs.commands.releasecache import read_proofs, release_cache_dir, release_coverage
from tests.patchkit import make_patch, src
from tests.sglang_wheels import (
    CACHE,
    EAGLE_RELPATH,
    WheelUnavailable,
    seed_release_cache,
    sglang_site,
)

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parent.parent
VERSIONS = ["0.5.4", "0.5.10", "0.5.23"]


@pytest.fixture(scope="module")
def guard() -> PatchSpec:
    return load_patch(REPO / "patches" / "eagle-init-guard.toml").spec


@pytest.fixture
def seeded_cache(tmp_path: Path) -> Path:
    """A release cache holding the test wheels of 0.5.4, 0.5.10 and 0.5.23 (hard links)."""
    try:
        return seed_release_cache(tmp_path / "cache", tuple(VERSIONS))
    except WheelUnavailable as exc:
        pytest.skip(f"SGLang wheel not available (offline?): {exc}")


def test_eagle_init_guard_is_green_on_every_release(guard: PatchSpec, seeded_cache: Path) -> None:
    matrix = check_releases(guard, versions=VERSIONS, cache=seeded_cache, offline=True)
    assert [r.version for r in matrix.results] == VERSIONS
    for result in matrix.results:
        assert result.in_range and result.ok, result
        assert (result.applies, result.validates, result.postconditions) == (True, True, True)
        assert (result.idempotent, result.reverse) == (True, True)
        assert result.lines_added == 6  # markers, default, its blank line, assignment
    assert matrix.exit_code == 0 and matrix.unchecked == ()
    assert "every release checked in range passes" in matrix.render()
    # only the target module was extracted, once per release
    extracted = sorted(p.relative_to(seeded_cache).as_posix() for p in seeded_cache.rglob("*.py"))
    assert extracted == [
        f"sglang/{v}/sglang/srt/speculative/eagle_worker_v2.py" for v in sorted(VERSIONS)
    ]


def test_the_patch_range_lists_the_cached_releases_when_offline(
    guard: PatchSpec, seeded_cache: Path
) -> None:
    matrix = check_releases(guard, cache=seeded_cache, offline=True)
    assert matrix.listed_from == "cache"
    assert [r.version for r in matrix.results] == VERSIONS
    assert matrix.notes == ("offline: releases listed from the cache",)
    narrowed = check_releases(guard, spec=">=0.5.5", cache=seeded_cache, offline=True)
    assert [r.version for r in narrowed.results] == ["0.5.10", "0.5.23"]


def clear_cache_pool_patch(versions: str = ">=0.5.4") -> PatchSpec:
    """A patch anchored on EAGLEWorkerV2.clear_cache_pool, which exists in 0.5.4 and 0.5.10, not
    in 0.5.23."""
    return make_patch(
        """
        [[edits]]
        kind = "insert"
        scope = "EAGLEWorkerV2.clear_cache_pool"
        position = "end"
        code = "return None"
        """,
        header=f"""
id = "{{id}}"
summary = "anchored on a method"
rationale = "tests"
[target]
module = "sglang.srt.speculative.eagle_worker_v2"
versions = "{versions}"
""",
    )


def test_a_method_one_release_lacks_fails_for_exactly_that_release(
    seeded_cache: Path,
) -> None:
    patch = clear_cache_pool_patch()
    matrix = check_releases(patch, versions=VERSIONS, cache=seeded_cache, offline=True)
    assert [r.version for r in matrix.failed] == ["0.5.23"]
    failed = matrix.failed[0]
    assert failed.applies is False
    assert failed.field == "edits[0].scope"
    assert "scope `EAGLEWorkerV2.clear_cache_pool` is not defined in this file" in failed.reason
    assert failed.candidates  # the nearest names the release has instead
    assert matrix.exit_code == 1
    table = matrix.render()
    assert "FAILED in range: 0.5.23" in table
    assert "0.5.23: edits[0].scope: scope `EAGLEWorkerV2.clear_cache_pool`" in table


def test_releases_not_in_the_cache_are_reported_not_checked(
    guard: PatchSpec, seeded_cache: Path
) -> None:
    matrix = check_releases(guard, versions=["0.5.4", "0.5.11"], cache=seeded_cache, offline=True)
    assert [r.version for r in matrix.results] == ["0.5.4"]
    assert [(u.version, u.reason) for u in matrix.unchecked] == [
        ("0.5.11", "not in the cache, and offline")
    ]
    assert "not checked: 0.5.11: not in the cache, and offline" in matrix.render()
    assert matrix.exit_code == 0
    assert matrix.to_json()["unchecked"] == [
        {"version": "0.5.11", "reason": "not in the cache, and offline"}
    ]


def test_release_module_source_for_export(guard: PatchSpec, seeded_cache: Path) -> None:
    pristine = release_module_source(guard.target, "0.5.10", cache=seeded_cache, offline=True)
    assert pristine == (sglang_site("0.5.10") / EAGLE_RELPATH).read_bytes()
    with pytest.raises(InputError, match=r"sglang 0.5.11: cannot fetch the release: not in the"):
        release_module_source(guard.target, "0.5.11", cache=seeded_cache, offline=True)
    other = guard.target.model_copy(update={"module": "sglang.srt.not_there"})
    with pytest.raises(InputError, match=r"sglang 0.5.10 has no sglang/srt/not_there.py"):
        release_module_source(other, "0.5.10", cache=seeded_cache, offline=True)


def test_a_bad_spec_is_an_input_error(guard: PatchSpec, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is not a version range"):
        check_releases(guard, spec="0.5.4+", cache=tmp_path, offline=True)


def test_cache_location(tmp_path: Path) -> None:
    assert release_cache_dir({"OPSPATCH_CACHE": str(tmp_path)}) == tmp_path
    assert release_cache_dir({"HOME": "/home/ops"}) == Path("/home/ops/.cache/opspatch/releases")
    assert release_cache_dir({"HOME": "/home/ops", "XDG_CACHE_HOME": "/var/cache/ops"}) == Path(
        "/var/cache/ops/opspatch/releases"
    )


def test_index_answer_parsing() -> None:
    answer = {
        "releases": {
            "0.5.3": [{"filename": "sglang-0.5.3-py3-none-any.whl", "yanked": False}],
            "0.5.4": [
                {"filename": "sglang-0.5.4-py3-none-any.whl", "yanked": False},
                {"filename": "sglang-0.5.4.tar.gz", "yanked": False},
            ],
            "0.5.5": [{"filename": "sglang-0.5.5-py3-none-any.whl", "yanked": True}],
            "0.5.6": [],
            "0.5.7": [{"filename": "sglang-0.5.7.tar.gz", "yanked": False}],
            "0.6.0rc1": [{"filename": "sglang-0.6.0rc1-py3-none-any.whl", "yanked": False}],
            "not-a-version": [{"filename": "x.whl", "yanked": False}],
        }
    }
    listing = parse_index_json(answer, SpecifierSet(">=0.5.4"))
    assert listing.versions == ("0.5.4", "0.5.7")  # yanked, empty and pre-releases left out
    assert listing.wheels["0.5.7"] == ()
    assert listing.wheels["0.5.4"] == ("sglang-0.5.4-py3-none-any.whl",)


# -- the pure judgement ---------------------------------------------------------------------------


def test_evaluate_release_stages_on_small_sources() -> None:
    patch = make_patch(
        """
        [[edits]]
        kind = "insert"
        scope = "W.__init__"
        code = "self.x = 0"

        [[postconditions]]
        kind = "assigned-before-calls"
        scope = "W.__init__"
        attribute = "self.x"
        """
    )
    good = src(
        """
        class W:
            def __init__(self):
                self.y = make()
        """
    )
    result = evaluate_release(patch, "1.0", good)
    assert result.ok and result.verdict == "ok"
    already = evaluate_release(patch, "1.1", result_source(patch, good))
    assert already.already_applied and already.verdict == "already-applied" and already.ok
    missing = evaluate_release(patch, "1.2", src("class W:\n    pass\n"))
    assert missing.applies is False and missing.field == "edits[0].scope"
    assert "scope `W.__init__` is not defined in this file" in missing.reason


def test_a_postcondition_that_fails_is_its_own_stage() -> None:
    patch = make_patch(
        """
        [[edits]]
        kind = "insert"
        scope = "W.__init__"
        position = "end"
        code = "self.x = 0"

        [[postconditions]]
        kind = "assigned-before-calls"
        scope = "W.__init__"
        attribute = "self.x"
        """
    )
    result = evaluate_release(
        patch, "1.0", src("class W:\n    def __init__(self):\n        go()\n")
    )
    assert (result.applies, result.validates, result.postconditions) == (True, True, False)
    assert "is not assigned in `W.__init__` before line 3" in result.reason
    assert not result.ok


def result_source(patch: PatchSpec, source: bytes) -> bytes:
    from opspatch.core.edit import Applied, apply_patch

    outcome = apply_patch(source, patch)
    assert isinstance(outcome, Applied)
    return outcome.new_source


# -- the real index -------------------------------------------------------------------------------


@pytest.mark.network
def test_real_index_lists_releases_with_their_wheels(tmp_path: Path) -> None:
    listing = list_releases("sglang", SpecifierSet(">=0.5.4,<0.5.5"), cache=tmp_path)
    if listing.listed_from != "index":
        pytest.skip(f"PyPI not reachable: {listing.note}")
    assert listing.versions[:2] == ("0.5.4", "0.5.4.post1")
    assert listing.wheels["0.5.4"] == ("sglang-0.5.4-py3-none-any.whl",)


@pytest.mark.network
@pytest.mark.process  # pip fetches the wheel when the persistent cache lacks it
def test_real_download_of_a_release_without_the_module(guard: PatchSpec) -> None:
    """0.5.3 predates eagle_worker_v2.py: pip fetches the wheel once (into the persistent test
    cache) and the release is reported as lacking the module, outside the patch's range."""
    cache = CACHE / "releases"
    matrix = check_releases(guard, versions=["0.5.3"], cache=cache)
    if matrix.unchecked:
        pytest.skip(f"0.5.3 could not be fetched: {matrix.unchecked[0].reason}")
    (result,) = matrix.results
    assert not result.in_range and result.applies is False
    assert "has no sglang/srt/speculative/eagle_worker_v2.py" in result.reason
    assert matrix.exit_code == 0  # outside the range: reported, not failed
    assert list((cache / "sglang" / "wheels").glob("sglang-0.5.3-*.whl"))


# ---------------------------------------------------------------------------------------------
# what check --releases proved, recorded for plain check


def test_check_releases_records_the_releases_a_patch_passed_on(seeded_cache: Path) -> None:
    patch = clear_cache_pool_patch()
    check_releases(patch, versions=VERSIONS, cache=seeded_cache, offline=True)
    proofs = read_proofs(patch, seeded_cache)
    assert proofs is not None and proofs.key == proof_key(patch)
    assert (proofs.listed, proofs.proven) == (tuple(VERSIONS), ("0.5.4", "0.5.10"))
    assert proofs.full_ranges == ()  # the releases were given, not listed from the index

    coverage = release_coverage((patch,), seeded_cache)
    assert (coverage.proven, coverage.unproven) == (("0.5.4", "0.5.10"), ("0.5.23",))
    assert coverage.warning == (
        "versions '>=0.5.4' covers releases it is not proven on: 0.5.23: "
        f"run `opspatch check {patch.id} --releases`"
    )
    # narrowed to the releases it passed on: nothing unproven among the listed, but the range
    # was never listed in full, which is said
    narrowed = patch.model_copy(
        update={"target": patch.target.model_copy(update={"versions": "<0.5.23"})}
    )
    assert proof_key(narrowed) == proof_key(patch)  # the range is not part of the proof
    kept = release_coverage((narrowed,), seeded_cache)
    assert kept.unproven == () and kept.proven == ("0.5.4", "0.5.10")
    assert kept.warning is not None and "not listed in full from the index" in kept.warning


def test_a_release_checked_again_takes_its_new_verdict(seeded_cache: Path) -> None:
    guard = load_patch(REPO / "patches" / "eagle-init-guard.toml").spec
    check_releases(guard, versions=["0.5.4", "0.5.11"], cache=seeded_cache, offline=True)
    first = release_coverage((guard,), seeded_cache)
    assert (first.proven, first.unproven) == (("0.5.4",), ("0.5.11",))  # 0.5.11 not checked
    check_releases(guard, versions=["0.5.10"], cache=seeded_cache, offline=True)
    second = release_coverage((guard,), seeded_cache)
    assert (second.proven, second.unproven) == (("0.5.4", "0.5.10"), ("0.5.11",))


def test_proofs_hold_for_the_edits_they_were_found_for() -> None:
    patch = clear_cache_pool_patch()
    proofs = ReleaseProofs(patch.id, proof_key(patch), ("0.5.4",), ("0.5.4",), (">=0.5.4",))
    assert proof_coverage(patch, proofs).warning is None  # listed in full and passed
    reworded = patch.model_copy(update={"rationale": "said better", "summary": "also"})
    assert proof_coverage(reworded, proofs).warning is None
    respelled = patch.model_copy(
        update={"target": patch.target.model_copy(update={"versions": ">= 0.5.4"})}
    )
    assert proof_coverage(respelled, proofs).warning is None  # the same range, written apart
    edit = patch.edits[0].model_copy(update={"code": "return 0"})
    changed = patch.model_copy(update={"edits": [edit]})
    assert proof_key(changed) != proof_key(patch)
    assert proof_coverage(changed, proofs).warning == (
        f"versions '>=0.5.4' is not proven on any release: run `opspatch check {patch.id} "
        "--releases`"
    )
    assert proof_coverage(patch, None).proven == ()


def test_a_range_listed_in_full_from_an_index_and_passed_is_proven(seeded_cache: Path) -> None:
    """A real HTTP index on loopback lists the three releases (the wheels are in the cache)."""
    import http.server
    import json
    import threading

    answer = json.dumps(
        {
            "releases": {
                v: [{"filename": f"sglang-{v}-py3-none-any.whl", "yanked": False}] for v in VERSIONS
            }
        }
    ).encode()

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the handler's API)
            self.send_response(200 if self.path == "/pypi/sglang/json" else 404)
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    guard = load_patch(REPO / "patches" / "eagle-init-guard.toml").spec
    try:
        matrix = check_releases(
            guard, cache=seeded_cache, index_url=f"http://127.0.0.1:{server.server_port}"
        )
    finally:
        server.shutdown()
        server.server_close()
    assert matrix.listed_from == "index" and matrix.exit_code == 0
    coverage = release_coverage((guard,), seeded_cache)
    assert coverage.proven == tuple(VERSIONS) and coverage.listed_in_full
    assert coverage.warning is None


def test_a_fix_in_several_files_is_proven_where_every_file_is() -> None:
    """One fix in two modules (a patch set's parts): each file has its own proofs."""
    first = clear_cache_pool_patch()
    second = first.model_copy(
        update={
            "target": first.target.model_copy(
                update={"module": "sglang.srt.speculative.eagle_worker"}
            )
        }
    )
    listed = ("0.5.4", "0.5.10", "0.5.23")
    one = ReleaseProofs(first.id, proof_key(first), listed, listed, (">=0.5.4",))
    other = ReleaseProofs(first.id, proof_key(second), listed, ("0.5.4", "0.5.23"), (">=0.5.4",))
    coverage = combined_coverage([proof_coverage(first, one), proof_coverage(second, other)])
    assert (coverage.proven, coverage.unproven) == (("0.5.4", "0.5.23"), ("0.5.10",))
    assert coverage.warning is not None and "not proven on: 0.5.10" in coverage.warning
    unrecorded = combined_coverage([proof_coverage(first, one), proof_coverage(second, None)])
    # a file never checked: nothing is proven for the fix
    assert unrecorded.proven == () and "is not proven on any release" in str(unrecorded.warning)
