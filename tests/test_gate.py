"""The version gate decides on the version of the distribution that owns the file (table cases)."""

from __future__ import annotations

import pytest

from opspatch.core.gate import version_gate
from opspatch.core.spec import Target

pytestmark = pytest.mark.pure

FILE = "/srv/venv/lib/python3.11/site-packages/vllm/worker/fix_me.py"


def target(distribution: str = "vllm", versions: str = ">=0.6,<0.7") -> Target:
    return Target(module="vllm.worker.fix_me", distribution=distribution, versions=versions)


@pytest.mark.parametrize(
    ("owner", "owner_version", "installed", "expect"),
    [
        # the owner's version decides, for any distribution (not only sglang)
        ("vllm", "0.6.3", None, None),
        ("vllm", "0.7.1", None, "vllm 0.7.1 is outside the versions this patch is for"),
        ("vLLM", "0.7.1", "0.6.3", "vllm 0.7.1 is outside"),
        # a file owned by another distribution never passes on the target's version
        ("vllm-fork", "0.6.3", "0.6.3", "belongs to vllm-fork 0.6.3, not to vllm"),
        # no RECORD lists the file (editable checkout): the installed version decides
        (None, None, "0.6.9", None),
        (None, None, "0.5.0", "vllm 0.5.0 is outside"),
        # nothing known: refused, never silently passed
        (None, None, None, "cannot tell which version of vllm provides"),
    ],
)
def test_the_gate_uses_the_version_of_the_owning_distribution(
    owner: str | None, owner_version: str | None, installed: str | None, expect: str | None
) -> None:
    problem = version_gate(
        target(), FILE, owner=owner, owner_version=owner_version, installed_version=installed
    )
    if expect is None:
        assert problem is None
    else:
        assert problem is not None and expect in problem


def test_no_range_means_no_version_check_but_the_module_path_still_counts() -> None:
    assert (
        version_gate(
            target(versions=""), FILE, owner=None, owner_version=None, installed_version=None
        )
        is None
    )
    wrong = version_gate(
        target(versions=""), "/srv/other.py", owner=None, owner_version=None, installed_version=None
    )
    assert wrong is not None and "is not vllm.worker.fix_me" in wrong
