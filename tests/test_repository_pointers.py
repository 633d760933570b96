"""The README stays short and true, and nothing in the repository points outside it (issue 42,
item 24: the README was 13.8 KB, and `patches/eagle-init-guard.toml` named a design document in
a folder beside the repository, which a clone does not have)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parent.parent
README_LIMIT = 12_000
"""Bytes: what opspatch is, the install, the two commands, a tour, links into docs/."""

OUTSIDE = re.compile(r"\.\./shared|/work/(?:shared|main|wt)\b|shared/docs/")
"""Where the project's own workplace keeps things a clone has not got."""

TEXT = {".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".txt", ".cfg", ".ini", ".json", ""}
SKIPPED = {".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}
RECORDS = ROOT / "bench" / "results"
"""Benchmark results record the paths of the machine that measured them: data, not pointers."""


def repository_texts() -> list[Path]:
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [
            d
            for d in subfolders
            if d not in SKIPPED
            and not (d.startswith(".") and d != ".ci")
            and Path(folder, d) != RECORDS
        ]
        found.extend(Path(folder, f) for f in files if f not in SKIPPED and Path(f).suffix in TEXT)
    return found


def test_the_readme_is_short() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes: move detail into docs/"


def test_every_doc_the_readme_names_exists() -> None:
    named = set(re.findall(r"docs/[\w.-]+\.md", (ROOT / "README.md").read_text()))
    assert named and all((ROOT / doc).is_file() for doc in named), named


def test_nothing_points_outside_the_repository() -> None:
    here = Path(__file__).resolve()
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in repository_texts()
        if path != here
        for number, line in enumerate(
            path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1
        )
        if OUTSIDE.search(line)
    ]
    assert not hits, "\n".join(hits)
