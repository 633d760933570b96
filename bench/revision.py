"""A past revision of opspatch unpacked beside this checkout, to measure "before" and "after"
in one benchmark run (issue 44): `git archive` of its `opspatch/` into a temporary folder,
byte-compiled as an install is. Put it first on PYTHONPATH and this checkout after it: its
`opspatch` is then the old one, while `tests/` (the patch generator, the wheel cache) stays
this checkout's."""

from __future__ import annotations

import compileall
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEFORE_ISSUE_44 = "3e9e2ce"
"""The last commit before issue 44's speed-ups (planning re-parsed the file after every edit;
every exec of `apply --file` started an agent interpreter)."""


@contextmanager
def unpacked(revision: str) -> Iterator[Path]:
    """A folder holding `opspatch/` as it was at `revision`, removed on the way out."""
    folder = Path(tempfile.mkdtemp(prefix="opspatch-rev-"))
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", revision, "opspatch"],
            capture_output=True,
            check=True,
        ).stdout
        tar = folder / "rev.tar"
        tar.write_bytes(archive)
        with tarfile.open(tar) as opened:
            opened.extractall(folder, filter="data")
        tar.unlink()
        compileall.compile_dir(folder / "opspatch", quiet=1)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def environment(code: Path | None) -> dict[str, str]:
    """The environment a measured process runs in: `code` (an unpacked revision) ahead of this
    checkout on PYTHONPATH, or this checkout alone."""
    path = [str(code)] if code is not None else []
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(REPO)])}
