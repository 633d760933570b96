"""`check_compiles` runs in the preflight's thread pool: it must leave the process-wide warning
filters as it found them however many threads call it at once."""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Iterator

import pytest

from opspatch.core.validate import check_compiles

pytestmark = pytest.mark.pure


@pytest.fixture
def fast_thread_switches() -> Iterator[None]:
    """Switch threads as often as possible, so an unguarded save/restore interleaves."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_parallel_compile_checks_leave_the_warning_filters_intact(
    fast_thread_switches: None,
) -> None:
    before = list(warnings.filters)
    # an invalid escape makes compile() warn, which is what the checker silences
    source = b"pattern = '\\d+'\n" * 50
    broken = b"def f(:\n"
    problems: list[list[str]] = []

    def work() -> None:
        for _ in range(200):
            assert check_compiles(source, "ok.py", (3, 8)) == []
        problems.append(check_compiles(broken, "broken.py", None))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert list(warnings.filters) == before
    assert len(problems) == 8 and all(p and "does not compile" in p[0] for p in problems)
